#!/usr/bin/env python
"""Chaos runs against the kcache store: crashes, corruption, concurrency, faults, Triton.

    python tools/chaos.py            # the CI-sized run (about a minute on 2 cores)
    python tools/chaos.py --full     # the figures of docs/reliability.md
    python tools/chaos.py --only crash,corrupt --json out.json

Every entry written here has content that is a pure function of its (kind, key): member names,
sizes and bytes are expanded from sha256 of the key. Whatever the store serves can therefore be
checked byte for byte, by any process, at any time: a hit is either exactly right or it is
"wrong bytes", which must never happen.

Phases (each counts the faults it injected and what it saw):

crash
    A worker process puts, groups, reads, removes, evicts and flushes random entries; the parent
    kills it with SIGKILL, either after a random delay or at the N-th write-side event (rename,
    mkdir, link, utime, unlink, a file write cut in half, an SQLite statement), chosen at random,
    so that kills land inside commits, index transactions and removals. After every trial the
    parent reads every key (a hit must be byte-exact), checks that every committed entry
    directory is complete, and that every put the worker acknowledged (``put`` returned a hit,
    and the worker logged it) is still there unless a removal of it was started. Every 4th trial
    runs two workers at once on a store with a tiny size bound (eviction on), one killed. At the
    end ``kcache verify --fix`` must leave a clean store. It runs beside a busy loop and an
    fsync-heavy writer (a loaded box); an acknowledged entry that reads as a miss is counted as
    lost when its folder is gone, and as a present entry read as a miss (a lookup that failed
    open) when it is not: both are failures.
corrupt
    Random damage to random entries (flipped byte, truncation, deleted member, garbage or
    foreign record, member or record replaced by a symlink, extra file) and to the index
    (garbage over its database, index deleted): each must be found by ``verify``, read as a miss
    with one warning, and leave a store that caches again.
concurrency
    8 processes x 2,000 mixed operations (puts, hits, groups, removals, eviction under a tiny
    size bound, verify, stats) on one store: no exception reaches the caller, no wrong bytes,
    no false alarm, verify clean after.
triton
    Real Triton compiles (``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``,
    no GPU needed) through ``KCACHE=1`` in 8 processes sharing kernels: every process gets
    byte-identical kernels, equal to a compile without kcache.
faults
    A full disk (a 2 MiB tmpfs when root can mount one, else RLIMIT_FSIZE), and the index held
    under ``BEGIN EXCLUSIVE`` by another process: puts and hits never raise, never serve wrong
    bytes, and never wait longer than the bound (see docs/reliability.md).
links
    (tools/chaos_links.py) the store's folders and files replaced by links to victim files, by
    this user and by a second one; a store swapped after it was opened; folders others can write;
    exports through planted names: no victim file changes, no planted launcher runs.
inputs
    (tools/chaos_inputs.py) poisoned machine-local answers in bundles and the shared tier, inputs
    that are FIFOs or devices, memory bombs, a process whose clock runs an hour ahead, a full disk.
hostile
    (tools/chaos_redis.py) a hostile Redis against concurrent real compiles on several "machines",
    with and without ``KCACHE_SECRET``: planted locks, faked heartbeats, huge values, bad records,
    ``CLIENT PAUSE``, ``DEBUG SLEEP``, SIGSTOP, ``FLUSHALL`` storms, restarts, ``noeviction``, a
    link that trickles bytes, a worker SIGKILLed: 0 crashes, 0 wrong bytes, 0 stalls beyond the
    bound (kcache's own time in Redis calls and fruitless waits, per process).

Exit status: 0 when every invariant held, 1 otherwise (the report says which).
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import functools
import hashlib
import json
import logging
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

KINDS = ("chaos", "chaos-group")
RECORD_NAME = "__kcache__.rec"

# ----------------------------------------------------------------------------------- content


def _expand(seed: bytes, size: int) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
        i += 1
    return bytes(out[:size])


@functools.lru_cache(maxsize=4096)
def expected(kind: str, key: str) -> dict[str, bytes]:
    """The one true content of (kind, key): member names, sizes and bytes derived from the key."""
    h = hashlib.sha256(f"{kind}\0{key}".encode()).digest()
    n = 1 if kind == "chaos" else 2 + h[0] % 5
    files = {}
    for i in range(n):
        s = hashlib.sha256(h + bytes([i])).digest()
        r = s[0]
        if r < 8:
            size = 0  # empty members exist (Triton writes some)
        elif r < 200:
            size = 1 + int.from_bytes(s[1:3], "big") % 4096  # Triton-sized
        elif r < 250:
            size = 4096 + int.from_bytes(s[1:4], "big") % (60 * 1024)
        else:
            size = 100 * 1024 + int.from_bytes(s[1:4], "big") % (156 * 1024)
        ext = ("cubin", "ptx", "json", "ttir", "llir", "bin")[s[4] % 6]
        files[f"m{i}.{ext}"] = _expand(s, size)
    return files


def key_name(i: int) -> str:
    return f"chaos/key-{i:04d}"


# ----------------------------------------------------------------------------------- helpers


def open_store(root: str | Path, max_size: int = 1 << 40) -> Any:
    from kcache.store import Store

    return Store.open(Path(root), max_size=max_size, network_fs=False)


def check_hit(kind: str, key: str, hit: Any) -> str | None:
    """None if ``hit`` serves exactly the expected content of (kind, key), else what is wrong.
    A member file that vanished after the hit was returned is reported as 'vanished:...'."""
    exp = expected(kind, key)
    if set(hit.paths) != set(exp):
        return f"members {sorted(hit.paths)} != {sorted(exp)}"
    for name, data in exp.items():
        got = hit.read(name)
        if got != data:
            return f"wrong bytes in {name} ({len(got)} bytes, expected {len(data)})"
        try:  # the file a library would open: must hold the same bytes, and stay
            with open(hit.paths[name], "rb") as f:
                on_disk = f.read()
        except FileNotFoundError:
            return f"vanished:{name}"
        if on_disk != data:
            return f"wrong bytes in the file of {name} ({len(on_disk)} bytes, expected {len(data)})"
    return None


def verify(root: str | Path, fix: bool) -> dict[str, Any]:
    """``kcache verify [--fix]`` on the store at ``root``: through the command line when it is
    there (what a user runs), else kcache.maintenance.verify. Adds 'seconds' and 'how'."""
    t0 = time.perf_counter()
    if _cli_available():
        args = [sys.executable, "-m", "kcache", "verify", "--dir", str(root), "--json"]
        if fix:
            args.insert(4, "--fix")
        p = subprocess.run(args, capture_output=True, text=True, timeout=600, env=_env_without_kcache())
        try:
            out = json.loads(p.stdout)
        except ValueError:
            out = {
                "ok": False,
                "error": f"rc={p.returncode} stdout={p.stdout[-500:]!r} stderr={p.stderr[-1500:]!r}",
            }
        out["rc"] = p.returncode
        out["how"] = "cli"
    else:
        from kcache import config, maintenance
        from kcache.integrations import entry_checks

        s = config.load(env={}, dir=str(root))
        st = maintenance.open_store(s, write=fix)
        try:
            out = maintenance.verify(st, fix=fix, checks=entry_checks())
        finally:
            maintenance.close_store(st)
        out["how"] = "maintenance"
    out["seconds"] = time.perf_counter() - t0
    return out


@functools.lru_cache(maxsize=1)
def _cli_available() -> bool:
    return (REPO / "kcache" / "cli.py").exists() and (REPO / "kcache" / "__main__.py").exists()


def _env_without_kcache(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env.update(extra)
    return env


def scan_entries(root: str | Path) -> tuple[int, list[str]]:
    """(entries, problems): every committed entry directory must be complete and exact."""
    from kcache.store.records import Record

    store = open_store(root)
    problems = []
    n = 0
    try:
        for ident in list(store.iter_entry_ids()):
            n += 1
            hit, why = store.read_any(ident, full=True)
            if hit is None:
                if why != "missing":  # "missing": removed between the listing and the read
                    problems.append(f"{ident[:12]}: {why}")
                continue
            rec: Record = hit.record
            if rec.kind in KINDS:
                bad = check_hit(rec.kind, rec.key, hit)
                if bad and not bad.startswith("vanished:"):
                    problems.append(f"{ident[:12]}: {bad}")
    finally:
        store.close()
    return n, problems


class WarningCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def capture_warnings() -> WarningCapture:
    h = WarningCapture()
    logging.getLogger("kcache").addHandler(h)
    return h


def quiet_kcache_logger() -> None:
    """kcache's warnings go to the captures only (the parent injects hundreds of faults)."""
    from kcache import log as klog

    klog.configure()
    lg = logging.getLogger("kcache")
    for h in list(lg.handlers):
        if type(h) is logging.StreamHandler:
            lg.removeHandler(h)


def warning_kinds(messages: list[str]) -> Counter:
    c: Counter = Counter()
    for m in messages:
        if m.startswith("corrupt "):
            c["corrupt"] += 1
        elif "index" in m:
            c["index"] += 1
        elif "cannot write" in m:
            c["write"] += 1
        elif "cannot read" in m:
            c["read"] += 1
        else:
            c["other"] += 1
    return c


# ----------------------------------------------------------------------------------- kill points


_REAL_WRITE = os.write


class KillPoints:
    """SIGKILL this process at the N-th write-side event. Events: os.rename/replace/mkdir/link/
    utime/unlink, shutil.rmtree, a write to a file opened for writing (cut in half: the first
    half is written, then the kill), and each SQLite statement the index runs."""

    def __init__(self, n: int, root: str, log: str | None = None) -> None:
        self.left = n
        self.root = os.path.abspath(root)
        self.log = log

    def tick(self, what: str) -> None:
        self.left -= 1
        if self.left <= 0:
            if self.log:  # where the kill landed, for the report
                fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                _REAL_WRITE(fd, f"{what}\n".encode())
                os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self, store: Any = None) -> None:
        kp = self

        def write(fd: int, data: Any) -> int:
            # The store writes members and records with os.write: cut the write in half, then
            # the kill point (a torn file, as power loss or SIGKILL mid-write would leave).
            if kp.left == 1 and len(data) > 1:
                _REAL_WRITE(fd, bytes(memoryview(data)[: len(data) // 2]))
            kp.tick("write")
            return _REAL_WRITE(fd, data)

        os.write = write  # type: ignore[assignment]
        for name in ("rename", "replace", "mkdir", "link", "utime", "unlink"):
            orig = getattr(os, name)

            def wrapped(*a: Any, __orig: Callable = orig, __name: str = name, **k: Any) -> Any:
                kp.tick(__name)
                return __orig(*a, **k)

            setattr(os, name, wrapped)
        orig_rmtree = shutil.rmtree

        def rmtree(*a: Any, **k: Any) -> Any:
            kp.tick("rmtree")
            return orig_rmtree(*a, **k)

        shutil.rmtree = rmtree  # type: ignore[assignment]
        real_open = builtins.open

        class HalfWriter:
            def __init__(self, f: Any) -> None:
                self._f = f

            def write(self, data: Any) -> Any:
                if kp.left <= 1 and len(data) > 1:
                    self._f.write(data[: len(data) // 2])
                    self._f.flush()
                kp.tick("write")
                return self._f.write(data)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._f, name)

            def __enter__(self) -> HalfWriter:
                return self

            def __exit__(self, *exc: Any) -> None:
                self._f.close()

        def open_(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
            f = real_open(file, mode, *a, **k)
            if any(c in mode for c in "wxa+") and isinstance(file, (str, os.PathLike)):
                if os.path.abspath(os.fspath(file)).startswith(kp.root):
                    return HalfWriter(f)
            return f

        builtins.open = open_  # type: ignore[assignment]
        from kcache.store import index as index_mod

        class TickingConnection:
            """The index's SQLite connection, with a kill point before every statement."""

            def __init__(self, conn: Any) -> None:
                self._conn = conn

            def execute(self, *a: Any, **k: Any) -> Any:
                kp.tick("sql")
                return self._conn.execute(*a, **k)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._conn, name)

        orig_init = index_mod.Index.__init__

        def init(self: Any, conn: Any, *a: Any, **k: Any) -> None:
            orig_init(self, TickingConnection(conn), *a, **k)

        index_mod.Index.__init__ = init  # type: ignore[method-assign]
        idx = getattr(store.disk.catalogue, "_index", None)
        if idx is not None:  # opened before the kill points: its statements count too
            idx.conn = TickingConnection(idx.conn)


# ----------------------------------------------------------------------------------- worker

OPS_CRASH = {"put": 30, "put_path": 8, "get": 35, "remove": 6, "flush": 8, "evict": 4, "stats": 2}
OPS_WRITERS = {"put": 45, "put_path": 10, "get": 40, "flush": 5}
OPS_CONCURRENT = {
    "put": 22,
    "put_path": 6,
    "get": 44,
    "remove": 5,
    "evict": 5,
    "flush": 8,
    "stats": 4,
    "verify": 1,
    "verify_fix": 1,
    "clear_older": 1,
}


class Worker:
    """Random operations on a store; counts what the caller saw."""

    def __init__(
        self,
        root: str,
        seed: int,
        keys: int,
        max_size: int,
        journal: str | None,
        ops: dict[str, int],
        scratch: str,
        events: str | None = None,
    ) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.keys = keys
        self.store = open_store(root, max_size=max_size)
        self.journal = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if journal else None
        self.names = list(ops)
        self.weights = list(ops.values())
        self.scratch = scratch
        self.c: Counter = Counter()
        self.errors: list[str] = []
        self.wrong: list[str] = []
        self.events = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if events else None
        self.current = ""
        self.evicting = False
        self.trace_removals(self.store)

    def log(self, line: str) -> None:
        # The journal is the parent's record of what was acknowledged, not the store under test:
        # written with the real write (one small O_APPEND write: a SIGKILL cannot tear it), never
        # through the kill points, which would cut a line in half and let the next trial's first
        # line run into it (a lost "R" line then made a removed entry look lost).
        if self.journal is not None:
            _REAL_WRITE(self.journal, (line + "\n").encode())

    def pick(self) -> tuple[str, str]:
        return self.rng.choice(KINDS), key_name(self.rng.randrange(self.keys))

    def trace_removals(self, store: Any) -> None:
        """Log every entry directory this process removes, with the operation that did it, so
        that a hit whose files vanish can be attributed (explicit removal or eviction)."""
        if self.events is None:
            return
        entries = store.disk.entries
        orig = entries.remove
        orig_evict = store.evict

        def remove(ident: str, *, later: bool = False) -> Any:
            why = "evict" if self.evicting or later else self.current
            self.event(f"D {time.time():.6f} {why} {ident}")
            return orig(ident, later=later)

        def evict(*a: Any, **k: Any) -> Any:
            self.evicting = True
            try:
                return orig_evict(*a, **k)
            finally:
                self.evicting = False

        entries.remove = remove
        store.evict = evict

    def event(self, line: str) -> None:
        if self.events is not None:
            os.write(self.events, (line + "\n").encode())

    def check(self, kind: str, key: str, hit: Any, what: str, t0: float) -> None:
        bad = check_hit(kind, key, hit)
        if bad is None:
            self.c["verified_hits"] += 1
        elif bad.startswith("vanished:"):
            self.c["vanished_after_hit"] += 1
            self.event(f"V {t0:.6f} {time.time():.6f} {what} {hit.record.id}")
        else:
            self.wrong.append(f"{what} {kind} {key}: {bad}")

    def op(self, name: str) -> None:
        st = self.store
        t0 = time.time()
        if name in ("put", "put_path"):
            kind, key = self.pick()
            files: dict[str, Any] = dict(expected(kind, key))
            if name == "put_path":
                d = os.path.join(self.scratch, f"{os.getpid()}-{self.c['ops']}")
                os.makedirs(d, exist_ok=True)
                for n, b in list(files.items()):
                    p = os.path.join(d, n)
                    with open(p, "wb") as f:
                        f.write(b)
                    files[n] = p
            hit = st.put(kind, key, files, components={"key": key, "pid": os.getpid()}, compile_s=0.01)
            if name == "put_path":
                shutil.rmtree(d, ignore_errors=True)
            if hit is None:
                self.c["put_none"] += 1
                return
            self.check(kind, key, hit, "put", t0)
            self.log(f"A {kind} {key}")
            self.c["acked"] += 1
        elif name == "get":
            kind, key = self.pick()
            hit = st.get(kind, key, {"key": key})
            if hit is None:
                self.c["misses"] += 1
            else:
                self.check(kind, key, hit, "get", t0)
        elif name == "remove":
            kind, key = self.pick()
            self.log(f"R {kind} {key}")
            st.remove([st.entry_id(kind, key)])
            self.c["removed"] += 1
        elif name == "flush":
            st.flush(force=True)
        elif name == "evict":
            st.evict()
        elif name == "stats":
            from kcache.maintenance.stats import store_stats

            try:
                store_stats(st)
            except Exception as e:  # the index may be busy: stats is a command, it may fail
                self.c[f"stats_failed:{type(e).__name__}"] += 1
        elif name in ("verify", "verify_fix"):
            from kcache import config, maintenance

            s = config.load(env={}, dir=self.root)
            ms = maintenance.open_store(s, write=name == "verify_fix")
            self.trace_removals(ms)
            orig_rs = getattr(ms, "remove_stray", None)

            def remove_stray(shard: str, name: str = "", member: str = "") -> bool:
                self.event(f"D {time.time():.6f} verify_fix:stray {name or shard}")
                return orig_rs(shard, name, member)  # type: ignore[misc]

            if orig_rs is not None:
                ms.remove_stray = remove_stray
            try:
                from kcache.integrations import entry_checks

                r = maintenance.verify(ms, fix=name == "verify_fix", checks=entry_checks())
            finally:
                maintenance.close_store(ms)
            # Nothing here is damaged: whatever verify reports while other processes write is
            # what it saw of their in-between states (counted, for the report; not an error).
            for prob in r["problems"]:
                self.c[f"verify_live:{prob['type']}"] += 1
            self.c["verify_runs"] += 1
        elif name == "clear_older":
            from kcache import maintenance

            maintenance.clear(st, older_than=3.0)
        self.c[f"op:{name}"] += 1

    def run(self, n_ops: int | None) -> None:
        i = 0
        while n_ops is None or i < n_ops:
            name = self.rng.choices(self.names, self.weights)[0]
            self.current = name
            try:
                self.op(name)
            except Exception:
                self.errors.append(f"{name}: {traceback.format_exc(limit=6)}")
            self.c["ops"] += 1
            i += 1


def worker_main(a: argparse.Namespace) -> int:
    import kcache.store.tunables as local

    if a.grace is not None:
        local.GRACE_S = a.grace
        local.TOUCH_EVERY_S = min(local.TOUCH_EVERY_S, a.grace / 4)
    cap = capture_warnings()
    ops = {"concurrent": OPS_CONCURRENT, "writers": OPS_WRITERS}.get(a.mix, OPS_CRASH)
    w = Worker(a.dir, a.seed, a.keys, a.max_size, a.journal, ops, a.scratch, a.events)
    if a.warm:  # the index opened before the kill points count (the first open runs a dozen statements)
        w.store.disk.catalogue.call(lambda idx: idx.total_bytes())
    if a.kill_at:
        KillPoints(a.kill_at, a.dir, a.kill_log).install(w.store)
    print("READY", flush=True)
    w.run(a.ops)
    w.store.close()
    if a.out:
        res = {
            "counts": dict(w.c),
            "errors": w.errors,
            "wrong": w.wrong,
            "warnings": cap.messages,
        }
        with open(a.out, "w") as f:
            json.dump(res, f)
    return 0


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
    args = [sys.executable, str(HERE), "worker", "--dir", root, "--seed", str(seed), "--keys", str(keys)]
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
        env=_env_without_kcache(PYTHONHASHSEED="0"),
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
# writers that fsync all the time, each ending when its parent goes (never left behind).
_LOAD_CPU = """
import os, sys
parent = int(sys.argv[1])
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""
_LOAD_IO = """
import os, sys
parent, path = int(sys.argv[1]), sys.argv[2]
block = os.urandom(1 << 16)
while os.getppid() == parent:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
"""


@contextlib.contextmanager
def machine_load(n: int, where: Path) -> Any:
    """``n`` busy loops and ``n`` fsync-heavy writers run beside the body of the ``with``."""
    procs: list[subprocess.Popen] = []
    try:
        for i in range(n):
            for code, extra in ((_LOAD_CPU, []), (_LOAD_IO, [str(where / f"load-{i}.bin")])):
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", code, str(os.getpid()), *extra],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def phase_crash(
    base: Path, trials: int, seed: int, log: Callable[[str], None], load: int = 0
) -> dict[str, Any]:
    """The crash phase (see the module doc); ``load``: that many busy loops and as many
    fsync-heavy writers run beside it (what a loaded box does to its timing)."""
    with machine_load(load, base):
        out = _phase_crash(base, trials, seed, log)
    out["load_processes"] = 2 * load
    return out


def _phase_crash(base: Path, trials: int, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
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


CORRUPTIONS = (
    "flip_member",
    "flip_record",
    "truncate_member",
    "truncate_record",
    "extend_member",
    "delete_member",
    "delete_record",
    "garbage_record",
    "foreign_record",
    "symlink_member",
    "symlink_record",
    "symlink_entry",
    "empty_member",
)


def corrupt_entry(store: Any, kind: str, key: str, how: str, rng: random.Random, outside: str) -> bool:
    """Damage the committed entry of (kind, key) in the way named. False if nothing to damage."""
    d = store.entry_dir(store.entry_id(kind, key))
    rec = os.path.join(d, RECORD_NAME)
    members = sorted(expected(kind, key))
    nonempty = [m for m in members if expected(kind, key)[m]]
    if how in ("flip_member", "truncate_member") and not nonempty:
        how = "delete_member"
    m = rng.choice(nonempty or members)
    mp = os.path.join(d, m)
    if how == "flip_member":
        b = bytearray(Path(mp).read_bytes())
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        Path(mp).write_bytes(bytes(b))
    elif how == "flip_record":
        b = bytearray(Path(rec).read_bytes())
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        Path(rec).write_bytes(bytes(b))
    elif how == "truncate_member":
        b = Path(mp).read_bytes()
        Path(mp).write_bytes(b[: rng.randrange(len(b))])
    elif how == "truncate_record":
        b = Path(rec).read_bytes()
        Path(rec).write_bytes(b[: rng.randrange(len(b))])
    elif how == "extend_member":
        with open(mp, "ab") as f:
            f.write(b"\0")
    elif how == "delete_member":
        os.unlink(mp)
    elif how == "delete_record":
        os.unlink(rec)
    elif how == "garbage_record":
        Path(rec).write_bytes(rng.randbytes(rng.randrange(1, 300)))
    elif how == "foreign_record":
        # A valid record of another entry: right format, wrong entry.
        other = store.entry_dir(store.entry_id(kind, key + "-other"))
        if not os.path.isdir(other):
            store.put(kind, key + "-other", expected(kind, key))
        shutil.copyfile(os.path.join(other, RECORD_NAME), rec)
    elif how == "symlink_member":
        tgt = os.path.join(outside, f"copy-{uuid.uuid4().hex[:8]}-{m}")
        Path(tgt).write_bytes(expected(kind, key)[m])  # the right bytes, behind a symlink
        os.unlink(mp)
        os.symlink(tgt, mp)
    elif how == "symlink_record":
        tgt = os.path.join(outside, f"rec-{uuid.uuid4().hex[:8]}")
        shutil.copyfile(rec, tgt)
        os.unlink(rec)
        os.symlink(tgt, rec)
    elif how == "symlink_entry":
        tgt = os.path.join(outside, f"entry-{uuid.uuid4().hex[:8]}")
        shutil.copytree(d, tgt, symlinks=True)
        shutil.rmtree(d)
        os.symlink(tgt, d)
    elif how == "empty_member":
        Path(mp).write_bytes(b"")
        if not expected(kind, key)[m]:
            os.unlink(mp)  # it was empty already: deleting it is the damage
    else:
        raise ValueError(how)
    return True


def phase_corrupt(
    base: Path,
    trials: int,
    seed: int,
    log: Callable[[str], None],
    index_rounds: int = 1,
    rebuild_entries: int = 0,
) -> dict[str, Any]:
    """Damage entries at random and the index; each must be detected and never served."""
    from kcache import log as klog

    rng = random.Random(seed + 1)
    root = str(base / "corrupt-store")
    outside = str(base / "outside")
    os.makedirs(outside, exist_ok=True)
    res: Counter = Counter()
    failures: list[str] = []
    by_type: Counter = Counter()
    t0 = time.perf_counter()
    keys = max(16, trials // 4)
    store = open_store(root)
    cap = capture_warnings()
    round_no = 0
    done = 0
    while done < trials:
        round_no += 1
        # Fill, damage a batch of distinct entries, verify (must find each), read (each a miss
        # with one warning), verify --fix (clean).
        for kind in KINDS:
            for i in range(keys):
                store.put(kind, key_name(i), expected(kind, key_name(i)))
        store.flush(force=True)
        batch = []
        pool = [(k, key_name(i)) for k in KINDS for i in range(keys)]
        rng.shuffle(pool)
        for kind, key in pool[: min(12, trials - done)]:
            how = CORRUPTIONS[(done + len(batch)) % len(CORRUPTIONS)]
            corrupt_entry(store, kind, key, how, rng, outside)
            batch.append((kind, key, how))
        v = verify(root, fix=False)
        flagged = {
            p["id"]
            for p in v.get("problems", [])
            if p["type"] in ("corrupt_entry", "stray_path", "stray_file")
        }
        for kind, key, how in batch:
            ident = store.entry_id(kind, key)
            res["injected"] += 1
            res["entry_damage"] += 1
            by_type[how] += 1
            if ident in flagged:
                res["found_by_verify"] += 1
            else:
                failures.append(f"verify missed {how} on {ident[:12]}: {v.get('problems')}")
            klog._warned.clear()
            cap.messages.clear()
            hit = store.get(kind, key)
            if hit is not None:
                bad = check_hit(kind, key, hit)
                failures.append(
                    f"{how}: damaged entry served ({bad or 'exact bytes, but from a damaged entry'})"
                )
                if bad:
                    res["wrong"] += 1
                continue
            warns = warning_kinds(cap.messages)["corrupt"]
            if warns == 1:
                res["one_warning_on_read"] += 1
            elif how == "delete_record" and warns == 0:
                res["silent_miss_no_record"] += 1  # nothing left to call an entry: a plain miss
            else:
                failures.append(f"{how}: {warns} corruption warnings on read: {cap.messages}")
            cap.messages.clear()
            if store.get(kind, key) is not None or cap.messages:
                failures.append(f"{how}: second read not a quiet miss: {cap.messages}")
            hit = store.put(kind, key, expected(kind, key))
            if hit is None or check_hit(kind, key, hit) is not None:
                failures.append(f"{how}: could not cache again after the damage")
            else:
                res["cached_again"] += 1
        done += len(batch)
        # Damage again (without reading) and let verify --fix clean it.
        for kind, key, how in batch[:4]:
            corrupt_entry(store, kind, key, how, rng, outside)
        f = verify(root, fix=True)
        a = verify(root, fix=False)
        res["verify_fix_runs"] += 1
        if not a.get("ok"):
            failures.append(f"verify --fix left {a.get('problems')}")
        res["worst_verify_fix_ms"] = max(res["worst_verify_fix_ms"], int(f["seconds"] * 1000))
        # The files the symlinks pointed at must still be there (never deleted through a link).
        for name in os.listdir(outside):
            if not os.path.exists(os.path.join(outside, name)):
                failures.append(f"a file outside the store was removed: {name}")
    # The index: garbage over its database, then deleted; a hit works meanwhile, caching goes on.
    store.close()
    idx_results: dict[str, Any] = {}
    kinds = ("garbage_db", "truncate_db", "delete_db_file", "delete_index", "garbage_wal")
    for how in [h for _ in range(index_rounds) for h in kinds]:
        store = open_store(root)
        store.put("chaos", "probe-before", expected("chaos", "probe-before"))
        store.close()
        db = os.path.join(root, "index", "kcache.sqlite")
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(db + suffix)
        t_rec = time.perf_counter()
        if how == "garbage_db":
            Path(db).write_bytes(rng.randbytes(8192))
        elif how == "delete_db_file":
            os.unlink(db)
        elif how == "garbage_wal":
            Path(db + "-wal").write_bytes(rng.randbytes(8192))
        elif how == "truncate_db":
            with open(db, "r+b") as fh:
                fh.truncate(1024 + rng.randrange(2048))
        else:
            shutil.rmtree(os.path.join(root, "index"))
        klog._warned.clear()
        cap.messages.clear()
        res["injected"] += 1
        res["index_damage"] += 1
        by_type[how] += 1
        store = open_store(root)
        hit = store.get("chaos", "probe-before")
        served_while_broken = hit is not None and check_hit("chaos", "probe-before", hit) is None
        new = store.put("chaos", f"probe-after-{how}", expected("chaos", f"probe-after-{how}"))
        store.flush(force=True)
        hit2 = store.get("chaos", f"probe-after-{how}")
        stats_ok = True
        try:
            from kcache.maintenance.stats import store_stats

            store_stats(store)
        except Exception:
            stats_ok = False
        store.close()
        t_recovered = time.perf_counter() - t_rec
        v = verify(root, fix=True)
        a = verify(root, fix=False)
        prev = idx_results.get(how)
        idx_results[how] = {
            "times": (prev["times"] + 1) if prev else 1,
            "hit_while_broken": served_while_broken and (prev is None or prev["hit_while_broken"]),
            "put_then_hit_after": new is not None and hit2 is not None,
            "stats_after": stats_ok,
            "warnings": len(cap.messages),
            "recovery_ms": max(round(t_recovered * 1000, 1), prev["recovery_ms"] if prev else 0),
            "verify_fix_ms": max(round(v["seconds"] * 1000, 1), prev["verify_fix_ms"] if prev else 0),
            "clean_after_fix": bool(a.get("ok")) and (prev is None or prev["clean_after_fix"]),
        }
        if not (served_while_broken and idx_results[how]["put_then_hit_after"] and a.get("ok")):
            failures.append(f"index {how}: {idx_results[how]}")
        if len(cap.messages) > 1:
            failures.append(f"index {how}: {len(cap.messages)} warnings: {cap.messages}")
    logging.getLogger("kcache").removeHandler(cap)
    rebuild: dict[str, Any] = {}
    if rebuild_entries:
        # Recovery at scale: the index of a store of many entries deleted, then verify --fix.
        big = str(base / "rebuild-store")
        st = open_store(big)
        for i in range(rebuild_entries):
            st.put("chaos", f"rebuild/{i}", {"k.cubin": _expand(i.to_bytes(4, "big"), 2048), "k.json": b"{}"})
        st.close()
        shutil.rmtree(os.path.join(big, "index"))
        v = verify(big, fix=True)
        a = verify(big, fix=False)
        rebuild = {
            "entries": rebuild_entries,
            "verify_fix_s": round(v["seconds"], 2),
            "verify_s": round(a["seconds"], 2),
            "clean_after_fix": bool(a.get("ok")),
            "indexed_after": a.get("entries"),
        }
        if not a.get("ok"):
            failures.append(f"rebuild at scale: {a.get('problems', [])[:3]}")
    out = {
        "seconds": round(time.perf_counter() - t0, 1),
        **res,
        "by_type": dict(by_type),
        "index": idx_results,
        "rebuild_at_scale": rebuild,
        "failures": failures,
    }
    log(f"corrupt: {dict(res)}")
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


# ----------------------------------------------------------------------------------- triton

tl: Any = None  # triton.language, bound in the Triton worker only


def _k_add(x, y, o, n, BLOCK: tl.constexpr):  # noqa: ANN001
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)


def _k_scale(x, o, n, s, BLOCK: tl.constexpr):  # noqa: ANN001
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) * s, mask=m)


def _k_rowsum(x, o, stride, BLOCK: tl.constexpr):  # noqa: ANN001
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    tl.store(o + r, tl.sum(tl.load(x + r * stride + c), axis=0))


KERNELS = {
    "add": (_k_add, {"x": "*{t}", "y": "*{t}", "o": "*{t}", "n": "i32", "BLOCK": "constexpr"}),
    "scale": (_k_scale, {"x": "*{t}", "o": "*{t}", "n": "i32", "s": "fp32", "BLOCK": "constexpr"}),
    "rowsum": (_k_rowsum, {"x": "*{t}", "o": "*{t}", "stride": "i32", "BLOCK": "constexpr"}),
}


def kernel_specs(n: int) -> list[tuple[str, str, int, int]]:
    """(kernel, dtype, BLOCK, arch) for the first n kernels of a fixed list."""
    out = []
    for block in (64, 128, 256, 512):
        for name in KERNELS:
            for t in ("fp32", "fp16"):
                out.append((name, t, block, 90))
    return out[:n]


def compile_kernel(spec: tuple[str, str, int, int], arch: int | None = None) -> Any:
    """Compile one kernel of :data:`KERNELS` for ``cuda:<arch>`` (no GPU needed)."""
    global tl
    import triton.language as _tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tl = _tl
    name, t, block, a = spec
    signature = {k: v.format(t=t) for k, v in KERNELS[name][1].items()}
    src = ASTSource(_jitted(name), signature, {"BLOCK": block})
    return triton_compile(src, GPUTarget("cuda", arch or a, 32))


@functools.cache
def _jitted(name: str) -> Any:
    import triton

    return triton.jit(KERNELS[name][0])


def triton_compile(src: Any, target: Any) -> Any:
    import triton

    return triton.compile(src, target=target)


def kernel_digest(k: Any) -> dict[str, str]:
    """sha256 of every artifact of a compiled kernel (its asm dict) and its metadata hash."""
    out = {
        ext: hashlib.sha256(v if isinstance(v, bytes) else str(v).encode()).hexdigest()
        for ext, v in k.asm.items()
    }
    out["hash"] = k.hash
    return out


def triton_worker_main(a: argparse.Namespace) -> int:
    specs = kernel_specs(a.kernels)
    rng = random.Random(a.seed)
    rng.shuffle(specs)
    cap = capture_warnings()
    res: dict[str, Any] = {"kernels": {}, "errors": [], "seconds": {}}
    import triton  # noqa: F401  (the KCACHE hook attaches here)

    import kcache

    res["enabled"] = kcache.is_enabled()
    for rnd in range(a.rounds):
        for spec in specs:
            t0 = time.perf_counter()
            try:
                k = compile_kernel(tuple(spec))
                d = kernel_digest(k)
            except Exception:
                res["errors"].append(traceback.format_exc(limit=8))
                continue
            name = "/".join(map(str, spec))
            prev = res["kernels"].get(name)
            if prev is not None and prev != d:
                res["errors"].append(f"{name}: round {rnd} differs from round 0")
            res["kernels"][name] = d
            res["seconds"][f"{rnd}:{name}"] = time.perf_counter() - t0
    store = kcache.active_store()
    if store is not None:
        store.flush(force=True)
        res["process_counts"] = {k: v for k, v in store.counts.process_totals().items()}
    res["warnings"] = cap.messages
    with open(a.out, "w") as f:
        json.dump(res, f)
    return 0


def phase_triton(
    base: Path, procs: int, kernels: int, seed: int, log: Callable[[str], None]
) -> dict[str, Any]:
    root = str(base / "triton-store")
    t0 = time.perf_counter()
    failures: list[str] = []
    home = str(base / "triton-home")
    os.makedirs(home, exist_ok=True)

    def spawn(i: int, kc: bool, out: str, rounds: int) -> subprocess.Popen:
        env = _env_without_kcache(
            HOME=home,
            TRITON_CACHE_DIR=str(base / (f"triton-plain-{i}" if not kc else "triton-unused")),
            PYTHONHASHSEED="0",
        )
        if kc:
            env.update(KCACHE="1", KCACHE_DIR=root)
        args = [
            sys.executable,
            str(HERE),
            "triton-worker",
            "--kernels",
            str(kernels),
            "--seed",
            str(seed + i),
        ]
        args += ["--out", out, "--rounds", str(rounds)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    # Reference: the same kernels compiled by Triton alone (its own file cache, fresh).
    ref_out = str(base / "triton-ref.json")
    ref = spawn(-1, False, ref_out, 1)
    _, err = ref.communicate(timeout=1800)
    if ref.returncode != 0:
        failures.append(f"reference compile failed: {err[-2000:]}")
        return {"failures": failures}
    reference = json.loads(Path(ref_out).read_text())["kernels"]
    t_ref = time.perf_counter() - t0
    t1 = time.perf_counter()
    ps, outs = [], []
    for i in range(procs):
        out = str(base / f"triton-{i}.json")
        outs.append(out)
        ps.append(spawn(i, True, out, 2))
    results = []
    for p in ps:
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0 or "Traceback" in err:
            failures.append(f"triton worker exited {p.returncode}: {err[-3000:]}")
        if "kcache: WARNING" in err:
            failures.append(f"warning in a triton worker: {err[-1500:]}")
    for out in outs:
        try:
            results.append(json.loads(Path(out).read_text()))
        except (OSError, ValueError) as e:
            failures.append(f"no result: {e}")
    run_s = time.perf_counter() - t1
    mismatches = 0
    hits = misses = 0
    for r in results:
        if not r.get("enabled"):
            failures.append("kcache was not enabled in a worker")
        failures += r["errors"][:3]
        for name, d in r["kernels"].items():
            if d != reference.get(name):
                mismatches += 1
                failures.append(f"{name}: differs from the reference compile")
        c = r.get("process_counts", {}).get("triton", {})
        hits += int(c.get("hits", 0))
        misses += int(c.get("misses", 0))
    entries = 0
    with contextlib.suppress(FileNotFoundError):
        for shard in os.listdir(os.path.join(root, "entries")):
            entries += len(os.listdir(os.path.join(root, "entries", shard)))
    v = verify(root, fix=False)
    if not v.get("ok"):
        failures.append(f"verify after triton run: {v.get('problems')}")
    res = {
        "processes": procs,
        "kernels": kernels,
        "compiles": procs * kernels * 2,
        "reference_seconds": round(t_ref, 1),
        "seconds": round(run_s, 1),
        "kernel_mismatches": mismatches,
        "triton_group_hits": hits,
        "triton_group_misses": misses,
        "entries": entries,
        "verify_ok": bool(v.get("ok")),
        "failures": failures,
    }
    log(f"triton: {json.dumps({k: v for k, v in res.items() if k != 'failures'})}")
    return res


# ----------------------------------------------------------------------------------- faults


def _tmpfs(path: str, size: str = "2m") -> bool:
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", path], capture_output=True
    )
    return r.returncode == 0


def _grow_tmpfs(path: str, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", path], capture_output=True, check=True)


def _umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True)


FULL_DISK_CHILD = r"""
import json, os, resource, signal, sys, time, logging
sys.path.insert(0, {repo!r})
sys.argv = ["chaos"]
import importlib.util
spec = importlib.util.spec_from_file_location("chaos", {here!r})
chaos = importlib.util.module_from_spec(spec); spec.loader.exec_module(chaos)
if {fsize}:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
cap = chaos.capture_warnings()
st = chaos.open_store({root!r})
res = dict(puts=0, none=0, hits=0, wrong=0, errors=[], worst_put_ms=0.0)
for i in range({n}):
    kind = chaos.KINDS[i % 2]; key = chaos.key_name(i)
    t = time.perf_counter()
    try:
        h = st.put(kind, key, chaos.expected(kind, key))
    except Exception as e:
        res["errors"].append(repr(e)); continue
    res["worst_put_ms"] = max(res["worst_put_ms"], (time.perf_counter() - t) * 1000)
    res["puts"] += 1
    if h is None:
        res["none"] += 1
    for j in range(0, i + 1, 7):
        k2, key2 = chaos.KINDS[j % 2], chaos.key_name(j)
        try:
            g = st.get(k2, key2)
        except Exception as e:
            res["errors"].append(repr(e)); continue
        if g is not None:
            bad = chaos.check_hit(k2, key2, g)
            if bad: res["wrong"] += 1
            else: res["hits"] += 1
st.close()
res["warnings"] = cap.messages
print(json.dumps(res))
"""


def phase_faults(base: Path, rounds: int, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    failures: list[str] = []
    out: dict[str, Any] = {}
    # 1. Full disk: a 2 MiB tmpfs (root), else a 256 KiB RLIMIT_FSIZE.
    full: Counter = Counter()
    worst = 0.0
    how = None
    for r in range(rounds):
        mnt = str(base / f"full-{r}")
        mounted = _tmpfs(mnt)
        how = "tmpfs 2 MiB" if mounted else "RLIMIT_FSIZE 256 KiB"
        root = os.path.join(mnt, "store")
        code = FULL_DISK_CHILD.format(
            repo=str(REPO), here=str(HERE), fsize=0 if mounted else 256 * 1024, root=root, n=120
        )
        try:
            p = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=600,
                env=_env_without_kcache(),
            )
            if p.returncode != 0 or "Traceback" in p.stderr:
                failures.append(f"full disk child: rc={p.returncode} {p.stderr[-2000:]}")
                continue
            res = json.loads(p.stdout.strip().splitlines()[-1])
            full["rounds"] += 1
            full["puts"] += res["puts"]
            full["puts_refused_full"] += res["none"]
            full["hits_checked"] += res["hits"]
            full["wrong"] += res["wrong"]
            full["errors"] += len(res["errors"])
            full["warnings"] += len(res["warnings"])
            worst = max(worst, res["worst_put_ms"])
            if res["errors"] or res["wrong"]:
                failures.append(f"full disk: {res}")
            if res["none"] == 0:
                failures.append("full disk: the disk never filled up")
            if len([w for w in res["warnings"] if "cannot write" in w]) > 2:
                failures.append(f"full disk: too many warnings: {res['warnings']}")
            # On the still-full disk, verify --fix must answer (it may be unable to rebuild an
            # index the full disk kept from being written); once the operator has made room, it
            # must leave a clean store.
            vv = verify(root, fix=True)
            if "error" in vv or vv.get("rc") not in (0, 1, None):
                failures.append(f"full disk: verify --fix on the full disk failed: {vv}")
            if mounted:
                _grow_tmpfs(mnt, "4m")
            vv = verify(root, fix=True)
            aa = verify(root, fix=False)
            if not aa.get("ok"):
                failures.append(
                    f"full disk: verify --fix did not clean up: {aa.get('problems')} / {vv.get('problems')}"
                )
        finally:
            if mounted:
                _umount(mnt)
    out["full_disk"] = {"how": how, **full, "worst_put_ms": round(worst, 1)}
    # 2. The index locked by another process (BEGIN EXCLUSIVE) for longer than any timeout.
    root = str(base / "locked-store")
    st = open_store(root)
    for i in range(8):
        st.put("chaos", key_name(i), expected("chaos", key_name(i)))
    st.close()
    db = os.path.join(root, "index", "kcache.sqlite")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3,sys,time\n"
            f"c=sqlite3.connect({db!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\nprint('LOCKED', flush=True)\ntime.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "LOCKED":
        failures.append("could not take the exclusive lock")
    lat: list[float] = []
    errors = wrong = 0
    cap = capture_warnings()
    from kcache import log as klog

    klog._warned.clear()
    try:
        t_open = time.perf_counter()
        st = open_store(root)
        lat.append(time.perf_counter() - t_open)
        for i in range(rounds * 20):
            kind, key = KINDS[i % 2], key_name(100 + i)
            t = time.perf_counter()
            try:
                h = st.put(kind, key, expected(kind, key))
                g = st.get("chaos", key_name(i % 8))
                st.flush()  # as a program does (at most once a second); forced flushes retry at once
            except Exception:
                errors += 1
                failures.append(traceback.format_exc(limit=5))
                continue
            lat.append(time.perf_counter() - t)
            time.sleep(0.06)  # spread over more than one back-off period (5 s)
            if h is None or check_hit(kind, key, h) or g is None or check_hit("chaos", key_name(i % 8), g):
                wrong += 1
        t = time.perf_counter()
        st.close()
        lat.append(time.perf_counter() - t)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        logging.getLogger("kcache").removeHandler(cap)
    out["locked_index"] = {
        "operations": len(lat),
        "worst_ms": round(max(lat) * 1000, 1),
        "p50_ms": round(sorted(lat)[len(lat) // 2] * 1000, 2),
        "seconds": round(sum(lat) + 0.06 * len(lat), 1),
        "waits_over_200ms": sum(x > 0.2 for x in lat),
        "errors": errors,
        "wrong_or_missed": wrong,
        "warnings": len(cap.messages),
    }
    if errors or wrong:
        failures.append(f"locked index: {out['locked_index']}")
    if len(cap.messages) > 1:
        failures.append(f"locked index: more than one warning: {cap.messages}")
    v = verify(root, fix=True)
    a = verify(root, fix=False)
    out["locked_index"]["verify_fix_ms_after"] = round(v["seconds"] * 1000, 1)
    if not a.get("ok"):
        failures.append(f"locked index: not clean after verify --fix: {a.get('problems')}")
    out["failures"] = failures
    log(f"faults: {json.dumps({k: v for k, v in out.items() if k != 'failures'})}")
    return out


# ----------------------------------------------------------------------------------- main

SIZES = {
    # name: (crash trials, corruptions, conc procs, conc ops, triton procs, triton kernels, fault rounds)
    "ci": (24, 26, 4, 300, 4, 3, 1),
    "full": (250, 208, 8, 2000, 8, 12, 5),
}


def run(phases: list[str], size: str, seed: int, base: Path, log: Callable[[str], None]) -> dict[str, Any]:
    ct, cc, cp, co, tp, tk, fr = SIZES[size]
    report: dict[str, Any] = {
        "size": size,
        "seed": seed,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "phases": {},
    }
    t0 = time.perf_counter()
    for ph in phases:
        d = base / ph
        d.mkdir(parents=True, exist_ok=True)
        if ph == "crash":
            report["phases"][ph] = phase_crash(d, ct, seed, log, load=1)  # a loaded box, as CI is
        elif ph == "corrupt":
            full = size == "full"
            report["phases"][ph] = phase_corrupt(
                d, cc, seed, log, index_rounds=4 if full else 1, rebuild_entries=5000 if full else 0
            )
        elif ph == "concurrency":
            report["phases"][ph] = phase_concurrency(d, cp, co, seed, log)
        elif ph == "triton":
            report["phases"][ph] = phase_triton(d, tp, tk, seed, log)
        elif ph == "faults":
            report["phases"][ph] = phase_faults(d, fr, seed, log)
        elif ph == "links":  # issues 16 and 17: planted links, swapped folders, second user
            sys.path.insert(0, str(HERE.parent))
            from chaos_links import phase_links

            report["phases"][ph] = phase_links(d, seed, log)
        elif ph == "inputs":  # issue 18: hostile bundles, memory bombs, clock skew, full disks
            sys.path.insert(0, str(HERE.parent))
            from chaos_inputs import phase_inputs

            report["phases"][ph] = phase_inputs(d, seed, log)
        elif ph == "hostile":  # issue 24: a hostile or failing Redis under concurrent compiles
            sys.path.insert(0, str(HERE.parent))
            from chaos_redis import phase_hostile

            report["phases"][ph] = phase_hostile(d, seed, log, size)
        else:
            raise SystemExit(f"unknown phase {ph!r}")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["summary"] = summarize(report)
    return report


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    p = report["phases"]
    cr, co, cc, tr, fa, ho = (
        p.get(k, {}) for k in ("crash", "corrupt", "concurrency", "triton", "faults", "hostile")
    )
    faults = {
        "sigkill_after_random_delay": cr.get("kills", 0) - cr.get("kills_at_write_point", 0),
        "sigkill_at_write_point": cr.get("kills_at_write_point", 0),
        "entry_damage": co.get("entry_damage", 0),
        "index_damage": co.get("index_damage", 0),
        "writes_into_full_disk": fa.get("full_disk", {}).get("puts_refused_full", 0),
        "operations_on_locked_index": fa.get("locked_index", {}).get("operations", 0),
        "hostile_redis_acts": sum(r.get("acts", 0) for r in ho.get("rounds", [])),
    }
    recovery = {
        "verify_fix_after_crashes_s": max(
            [cr.get(f"verify_{n}", {}).get("fix_seconds", 0.0) for n in ("main", "evict")]
        ),
        "verify_fix_after_concurrency_s": cc.get("verify_fix_seconds", 0.0),
        "verify_fix_after_damage_s": co.get("worst_verify_fix_ms", 0) / 1000,
        "index_rebuild_verify_fix_s": max(
            [v["verify_fix_ms"] / 1000 for v in co.get("index", {}).values()] or [0]
        ),
        "index_rebuild_5000_entries_s": co.get("rebuild_at_scale", {}).get("verify_fix_s", 0.0),
        "first_put_and_hit_with_broken_index_s": max(
            [v["recovery_ms"] / 1000 for v in co.get("index", {}).values()] or [0]
        ),
    }
    failures = sum(len(x.get("failures", [])) for x in p.values())
    crashed = [
        f for x in p.values() for f in x.get("failures", []) if "Traceback" in str(f) or "exited" in str(f)
    ]
    return {
        "crash_trials": cr.get("trials", 0),
        "faults_injected": sum(faults.values()),
        "faults": faults,
        "wrong_bytes_served": cr.get("read_wrong", 0)
        + co.get("wrong", 0)
        + cc.get("wrong_bytes", 0)
        + tr.get("kernel_mismatches", 0)
        + fa.get("full_disk", {}).get("wrong", 0)
        + fa.get("locked_index", {}).get("wrong_or_missed", 0)
        + ho.get("wrong_bytes", 0),
        "errors_to_caller": cc.get("errors_to_caller", 0)
        + fa.get("full_disk", {}).get("errors", 0)
        + fa.get("locked_index", {}).get("errors", 0)
        + len(crashed),
        "acked_entries_lost": cr.get("read_acked_lost", 0),
        "stalls_beyond_bound": ho.get("stalls", 0),
        "present_entries_read_as_miss": cr.get("read_present_missed", 0),
        "worst_recovery_s": round(max(recovery.values()), 3),
        "recovery": {k: round(v, 3) for k, v in recovery.items()},
        "failures": failures,
        "ok": failures == 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--dir", required=True)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--keys", type=int, default=48)
    w.add_argument("--max-size", type=int, default=1 << 40)
    w.add_argument("--mix", choices=("crash", "concurrent", "writers"), default="crash")
    w.add_argument("--journal")
    w.add_argument("--ops", type=int)
    w.add_argument("--kill-at", type=int, default=0)
    w.add_argument("--grace", type=float)
    w.add_argument("--kill-log")
    w.add_argument("--events")
    w.add_argument("--warm", action="store_true")
    w.add_argument("--out")
    w.add_argument("--scratch", required=True)
    tw = sub.add_parser("triton-worker")
    tw.add_argument("--kernels", type=int, default=4)
    tw.add_argument("--seed", type=int, default=0)
    tw.add_argument("--rounds", type=int, default=2)
    tw.add_argument("--out", required=True)
    ap.add_argument(
        "--full", action="store_true", help="the long run whose figures docs/reliability.md reports"
    )
    ap.add_argument(
        "--only",
        help="comma-separated phases: crash,corrupt,concurrency,triton,faults,links,inputs,hostile",
    )
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--dir", help="work directory (default: a fresh temporary one, removed after)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args(argv)
    if a.cmd == "worker":
        return worker_main(a)
    if a.cmd == "triton-worker":
        return triton_worker_main(a)
    phases = (
        a.only.split(",")
        if a.only
        else ["crash", "corrupt", "concurrency", "triton", "faults", "links", "inputs", "hostile"]
    )
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kcache-chaos-"))
    base.mkdir(parents=True, exist_ok=True)

    quiet_kcache_logger()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        report = run(phases, "full" if a.full else "ci", a.seed, base, log)
    finally:
        if not a.keep and not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(report, indent=2, default=str)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(json.dumps(report["summary"], indent=2))
    for ph, r in report["phases"].items():
        for f in r.get("failures", [])[:10]:
            print(f"FAIL {ph}: {str(f)[:3000]}", file=sys.stderr)
    return 0 if report["summary"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
