"""Chaos phases ``crash`` and ``concurrency``: processes killed and processes racing (see
tools/chaos.py's doc). Worker processes (:mod:`chaos_worker`, spawned as ``tools/chaos.py worker``)
are killed with SIGKILL after a random delay or at a write-side event, beside a loaded machine;
or race on one store in numbers. After each, every key is read back (:func:`read_back`), every
acknowledged put must still be there, and ``kcache verify --fix`` must leave a clean store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos_base import (
    CHAOS,
    KINDS,
    RECORD_NAME,
    capture_warnings,
    check_hit,
    env_without_kcache,
    key_name,
    open_store,
    scan_entries,
    verify,
    warning_kinds,
)

# ----------------------------------------------------------------------------------- reading back


def _end_journal_line(path: str) -> None:
    """Make sure the journal ends with a whole line before the next trial appends to it (a line
    left unfinished must not swallow the next one)."""
    try:
        with open(path, "rb+") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
                f.write(b"\n")
    except FileNotFoundError:
        pass


def journal_state(path: str) -> dict[tuple[str, str], str]:
    """(kind, key) -> 'A' (acknowledged, not since removed) or 'R' (a removal was started)."""
    state: dict[tuple[str, str], str] = {}
    try:
        data = Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return state
    for line in data.split("\n"):
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] in ("A", "R") and parts[1] in KINDS:
            state[(parts[1], parts[2])] = parts[0]
    return state


def read_back(root: str, keys: int, acked: dict[tuple[str, str], str] | None) -> Counter:
    """Read every key in a fresh store object: count correct hits, misses, wrong bytes, and
    acknowledged entries missing (when ``acked`` is given).

    An acknowledged entry that reads as a miss is ``acked_lost`` when its folder is gone from
    ``entries/`` (a durability bug), ``present_missed`` when the folder is there (a lookup that
    failed open: a busy lock, index or descriptor limit must never turn a present entry into a
    miss). ``failed_open`` counts the lookups that failed on an error (the store's ``errors``
    counter: a read, refused or serve failure), which a warning says once per process."""
    c: Counter = Counter()
    store = open_store(root)
    cap = capture_warnings()
    try:
        for kind in KINDS:
            for i in range(keys):
                key = key_name(i)
                hit = store.get(kind, key)
                if hit is None:
                    c["misses"] += 1
                    if acked is not None and acked.get((kind, key)) == "A":
                        ident = store.entry_id(kind, key)
                        present = os.path.isdir(os.path.join(root, "entries", ident[:2], ident))
                        c["present_missed" if present else "acked_lost"] += 1
                    continue
                bad = check_hit(kind, key, hit)
                if bad is None:
                    c["hits"] += 1
                else:
                    c["wrong"] += 1
    finally:
        logging.getLogger("kcache").removeHandler(cap)
        errors = sum(v.get("errors", 0) for v in store.counts.process_totals().values())
        store.close()
    c["corrupt_warnings"] += warning_kinds(cap.messages)["corrupt"]
    c["failed_open"] += int(errors)
    return c


# ----------------------------------------------------------------------------------- phases


def _spawn_worker(
    root: str,
    seed: int,
    *,
    keys: int,
    max_size: int,
    mix: str,
    journal: str | None = None,
    ops: int | None = None,
    kill_at: int = 0,
    grace: float | None = None,
    out: str | None = None,
    kill_log: str | None = None,
    events: str | None = None,
    warm: bool = False,
    scratch: str,
) -> subprocess.Popen:
    args = [sys.executable, str(CHAOS), "worker", "--dir", root, "--seed", str(seed), "--keys", str(keys)]
    args += ["--max-size", str(max_size), "--mix", mix, "--scratch", scratch]
    if journal:
        args += ["--journal", journal]
    if ops is not None:
        args += ["--ops", str(ops)]
    if kill_at:
        args += ["--kill-at", str(kill_at)]
    if grace is not None:
        args += ["--grace", str(grace)]
    if kill_log:
        args += ["--kill-log", kill_log]
    if events:
        args += ["--events", events]
    if warm:
        args.append("--warm")
    if out:
        args += ["--out", out]
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_without_kcache(PYTHONHASHSEED="0"),
    )


def _wait_ready(p: subprocess.Popen, timeout: float = 60.0) -> bool:
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    # Popen pipes block; a reader thread keeps the wait bounded.
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(p.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    line = box[0] if box else ""
    return line.strip() == "READY"


# A loaded machine beside the crash phase (CI runs on a shared 2-core box): busy loops and
# writers that fsync all the time, each ending when its parent goes (never left behind). They run
# while a trial's workers write, where the load decides where kills land (the workers' flush
# threads against their main threads; every kill point counts from the worker's READY), and wait
# while the parent starts the next workers and reads the store back: load there changed nothing
# and burned a core (17-24 s of CPU of the CI-sized phase's 31-38 s, 2026-12-06).
_LOAD_CPU = """
import os, sys, time
parent, on = int(sys.argv[1]), sys.argv[2]
while os.getppid() == parent:
    if not os.path.exists(on):
        time.sleep(0.01)
        continue
    for _ in range(200_000):
        pass
"""
_LOAD_IO = """
import os, sys, time
parent, on, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
block = os.urandom(1 << 16)
while os.getppid() == parent:
    if not os.path.exists(on):
        time.sleep(0.01)
        continue
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
"""


class Load:
    """The load processes of :func:`machine_load`: :meth:`on` while workers write, :meth:`off`
    between trials; ``windows`` counts the times it was turned on."""

    def __init__(self, where: Path) -> None:
        self.flag = where / "load-on"
        self.procs: list[subprocess.Popen] = []
        self.windows = 0

    def on(self) -> None:
        if self.procs and not self.flag.exists():
            self.flag.touch()
            self.windows += 1

    def off(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.flag.unlink()


@contextlib.contextmanager
def machine_load(n: int, where: Path) -> Any:
    """``n`` busy loops and ``n`` fsync-heavy writers beside the body of the ``with``, working
    while the :class:`Load` it yields is on."""
    load = Load(where)
    try:
        for i in range(n):
            for code, extra in ((_LOAD_CPU, []), (_LOAD_IO, [str(where / f"load-{i}.bin")])):
                load.procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code, str(os.getpid()), str(load.flag), *extra],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        yield load
    finally:
        load.off()
        for p in load.procs:
            p.kill()
        for p in load.procs:
            p.wait()


def phase_crash(
    base: Path, trials: int, seed: int, log: Callable[[str], None], load: int = 0
) -> dict[str, Any]:
    """The crash phase (see the module doc); ``load``: that many busy loops and as many
    fsync-heavy writers run beside the workers (what a loaded box does to their timing)."""
    with machine_load(load, base) as ld:
        out = _phase_crash(base, trials, seed, log, ld)
    out["load_processes"] = len(ld.procs)
    out["load_windows"] = ld.windows
    return out


def _phase_crash(
    base: Path, trials: int, seed: int, log: Callable[[str], None], load: Load | None = None
) -> dict[str, Any]:
    rng = random.Random(seed)
    keys = 48
    main_root = str(base / "crash-store")
    evict_root = str(base / "crash-evict-store")
    journal = str(base / "crash-journal.txt")
    kill_log = str(base / "kill-points.txt")
    scratch = str(base / "scratch")
    os.makedirs(scratch, exist_ok=True)
    res: Counter = Counter()
    failures: list[str] = []
    kill_where: Counter = Counter()
    t_start = time.perf_counter()
    for t in range(trials):
        evict_trial = t % 4 == 3
        root = evict_root if evict_trial else main_root
        point = t % 2 == 1
        procs = []
        n_workers = 2 if evict_trial else 1
        for w in range(n_workers):
            kill_at = rng.randint(1, 600) if (point and w == 0) else 0
            procs.append(
                _spawn_worker(
                    root,
                    seed * 100_003 + t * 7 + w,
                    keys=keys,
                    max_size=256 * 1024 if evict_trial else 1 << 40,
                    mix="crash",
                    journal=None if evict_trial else journal,
                    kill_at=kill_at,
                    grace=0.5 if evict_trial else None,
                    scratch=scratch,
                    kill_log=kill_log,
                )
            )
        for p in procs:
            if not _wait_ready(p):
                failures.append(
                    f"trial {t}: worker did not start: {p.stderr.read()[-2000:] if p.poll() is not None else ''}"
                )  # type: ignore[union-attr]
            elif load is not None:
                load.on()  # from the first worker's READY: it writes now
        victim = procs[0]
        if point:
            try:
                victim.wait(timeout=10)
            except subprocess.TimeoutExpired:
                victim.kill()
                res["kills_timer_fallback"] += 1
        else:
            time.sleep(rng.uniform(0.0, 0.35))
            victim.send_signal(signal.SIGKILL)
        for p in procs[1:]:
            time.sleep(rng.uniform(0.0, 0.1))
            p.send_signal(signal.SIGKILL)
        if load is not None:
            load.off()  # every worker is dead or killed: the parent reads back alone
        for p in procs:
            p.wait()
            err = p.stderr.read() if p.stderr else ""  # type: ignore[union-attr]
            if p.returncode == -signal.SIGKILL:
                res["kills"] += 1
                if point and p is victim:
                    res["kills_at_write_point"] += 1
            else:
                failures.append(f"trial {t}: worker exited {p.returncode}: {err[-2000:]}")
            if "Traceback" in err:
                failures.append(f"trial {t}: traceback in worker: {err[-2000:]}")
            p.stdout.close()  # type: ignore[union-attr]
            p.stderr.close()  # type: ignore[union-attr]
        res["trials"] += 1
        _end_journal_line(journal)
        # Every committed entry complete, every read exact, no acknowledged put lost.
        n, problems = scan_entries(root)
        res["torn_entries_visible"] += len(problems)
        failures += [f"trial {t}: {p}" for p in problems]
        rb = read_back(root, keys, None if evict_trial else journal_state(journal))
        for k in (
            "hits",
            "misses",
            "wrong",
            "acked_lost",
            "present_missed",
            "failed_open",
            "corrupt_warnings",
        ):
            res[f"read_{k}"] += rb[k]
        if rb["wrong"] or rb["acked_lost"] or rb["present_missed"]:
            failures.append(f"trial {t}: {dict(rb)}")
        if t % 25 == 24:
            log(f"crash: {t + 1}/{trials} trials, {dict(res)}")
    leftovers = sum(
        len(os.listdir(os.path.join(r, "tmp"))) for r in (main_root, evict_root) if os.path.isdir(r)
    )
    out: dict[str, Any] = {
        "seconds": round(time.perf_counter() - t_start, 1),
        **res,
        "tmp_leftovers_before_fix": leftovers,
    }
    for name, root in (("main", main_root), ("evict", evict_root)):
        if not os.path.isdir(root):
            continue
        before = verify(root, fix=False)
        fixed = verify(root, fix=True)
        after = verify(root, fix=False)
        types = Counter(p["type"] for p in before.get("problems", []))
        out[f"verify_{name}"] = {
            "problems_found": dict(types),
            "fix_seconds": round(fixed["seconds"], 3),
            "clean_after_fix": bool(after.get("ok")) and not after.get("problems"),
            "entries": after.get("entries"),
        }
        if not (after.get("ok") and not after.get("problems")):
            failures.append(f"verify --fix left problems in {name}: {after}")
        rb = read_back(root, keys, None)
        if rb["wrong"]:
            failures.append(f"after verify --fix: wrong bytes {dict(rb)}")
        out[f"final_read_{name}"] = {"hits": rb["hits"], "misses": rb["misses"], "wrong": rb["wrong"]}
        if os.listdir(os.path.join(root, "tmp")):
            failures.append(f"tmp/ not empty after verify --fix: {os.listdir(os.path.join(root, 'tmp'))[:5]}")
    out["failures"] = failures
    with contextlib.suppress(FileNotFoundError):
        kill_where.update(x for x in Path(kill_log).read_text().split() if x)
    out["kill_where"] = dict(kill_where)
    return out


def phase_concurrency(
    base: Path,
    procs: int,
    ops: int,
    seed: int,
    log: Callable[[str], None],
    max_size: int = 384 * 1024,
    grace: float = 1.0,
) -> dict[str, Any]:
    root = str(base / "concurrency-store")
    events = str(base / "events.txt")
    scratch = str(base / "scratch-c")
    os.makedirs(scratch, exist_ok=True)
    t0 = time.perf_counter()
    # Create the store first, so that the workers race on entries rather than on its creation.
    open_store(root).close()
    ps = []
    outs = []
    for w in range(procs):
        out = str(base / f"conc-{w}.json")
        outs.append(out)
        ps.append(
            _spawn_worker(
                root,
                seed * 7919 + w,
                keys=96,
                max_size=max_size,
                mix="concurrent",
                ops=ops,
                grace=grace,
                out=out,
                scratch=scratch,
                events=events,
            )
        )
    for p in ps:
        _wait_ready(p)
    failures: list[str] = []
    total: Counter = Counter()
    warnings: list[str] = []
    for p, out in zip(ps, outs):
        try:
            p.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            p.kill()
            failures.append("a worker timed out")
        err = p.stderr.read() if p.stderr else ""  # type: ignore[union-attr]
        if p.returncode != 0 or "Traceback" in err:
            failures.append(f"worker exited {p.returncode}: {err[-2000:]}")
        try:
            r = json.loads(Path(out).read_text())
        except (OSError, ValueError):
            failures.append(f"no result from a worker: {err[-1000:]}")
            continue
        total.update(r["counts"])
        total["errors"] += len(r["errors"])
        total["wrong"] += len(r["wrong"])
        failures += r["errors"][:5] + r["wrong"][:5]
        warnings += r["warnings"]
    run_s = time.perf_counter() - t0
    bytes_at_end = _store_bytes(root)
    wk = warning_kinds(warnings)
    if wk["corrupt"]:
        failures.append(f"false corruption alarms: {[w for w in warnings if w.startswith('corrupt')][:5]}")
    n, problems = scan_entries(root)
    failures += problems
    # The bound: with the grace period over, one eviction brings the store under it.
    import kcache.store.tunables as local

    saved, local.GRACE_S = local.GRACE_S, 0.0
    try:
        s = open_store(root, max_size=max_size)
        s.evict()
        s.close()
    finally:
        local.GRACE_S = saved
    bytes_evicted = _store_bytes(root)
    if bytes_evicted > max_size:
        failures.append(f"store holds {bytes_evicted} bytes after eviction, bound {max_size}")
    before = verify(root, fix=False)
    fixed = verify(root, fix=True)
    after = verify(root, fix=False)
    if not after.get("ok"):
        failures.append(f"verify not clean after the run: {after.get('problems')}")
    rb = read_back(root, 96, None)
    if rb["wrong"]:
        failures.append(f"wrong bytes read back: {dict(rb)}")
    res = {
        "processes": procs,
        "ops_per_process": ops,
        "seconds": round(run_s, 1),
        "ops": total["ops"],
        "errors_to_caller": total["errors"],
        "wrong_bytes": total["wrong"] + rb["wrong"],
        "verified_hits": total["verified_hits"],
        "misses": total["misses"],
        "puts_acked": total["acked"],
        "puts_skipped": total["put_none"],
        "removes": total["removed"],
        "verify_runs_during": total["verify_runs"],
        "verify_reports_while_live": {
            k.split(":", 1)[1]: v for k, v in total.items() if k.startswith("verify_live:")
        },
        "vanished_after_hit": total["vanished_after_hit"],
        "vanished_by_cause": attribute_vanished(events),
        "warnings": dict(wk),
        "entries_after": n,
        "problems_before_fix": dict(Counter(p["type"] for p in before.get("problems", []))),
        "verify_fix_seconds": round(fixed["seconds"], 3),
        "clean_after_fix": bool(after.get("ok")),
        "evictions": _evictions(root),
        "bytes_at_end": bytes_at_end,
        "bytes_after_final_eviction": bytes_evicted,
        "max_size": max_size,
        "grace_s": grace,
        "failures": failures,
    }
    log(f"concurrency: {json.dumps({k: v for k, v in res.items() if k != 'failures'})}")
    return res


def attribute_vanished(events: str) -> dict[str, int]:
    """For each hit whose files vanished before the caller read them: the removal that did it
    (a removal of that entry, by any process, between the lookup's start and the read's end)."""
    removals: dict[str, list[tuple[float, str]]] = {}
    vanished: list[tuple[float, float, str]] = []
    with contextlib.suppress(FileNotFoundError):
        for line in Path(events).read_text().splitlines():
            p = line.split()
            if len(p) == 4 and p[0] == "D":
                removals.setdefault(p[3], []).append((float(p[1]), p[2]))
            elif len(p) == 5 and p[0] == "V":
                vanished.append((float(p[1]), float(p[2]), p[4]))
    out: Counter = Counter()
    for t0, t1, ident in vanished:
        # A removal is logged just before it happens: one logged up to a second before the lookup
        # began may still have landed inside it.
        near = sorted((rt, why) for rt, why in removals.get(ident, []) if t0 - 1.0 <= rt <= t1)
        out[near[-1][1] if near else "unknown"] += 1
    return dict(out)


def _evictions(root: str) -> int | None:
    try:
        from kcache.maintenance.stats import store_stats

        s = open_store(root)
        try:
            return int(store_stats(s).get("evictions", 0))
        finally:
            s.close()
    except Exception:
        return None


def _store_bytes(root: str) -> int:
    n = 0
    for dp, _dn, fn in os.walk(os.path.join(root, "entries")):
        for f in fn:
            if f != RECORD_NAME:
                with contextlib.suppress(OSError):
                    n += os.lstat(os.path.join(dp, f)).st_size
    return n
