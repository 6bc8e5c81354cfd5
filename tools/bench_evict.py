#!/usr/bin/env python3
"""The size bound under concurrent writers: N processes put Triton-sized groups into one store
with a small ``KCACHE_MAX_SIZE`` for a while; the store's bytes on disk are sampled throughout
and after the writers exit.

    python tools/bench_evict.py --writers 8 --bound 64MB --seconds 60 [--json OUT.json]
    python tools/bench_evict.py --writers 4 --bound 2MB --seconds 5 --repeats 3

Each writer puts groups of seven files (ttir, ttgir, llir, ptx, cubin, json, source) sized as
the kernels of tests/kernels compile to for sm_90: seven in ten 25-55 KB (elementwise and
reduction kernels), three in ten 150-320 KB (matmuls), as fast as it can (``--think-ms`` adds a
pause), and after every put looks up a random key put before by any writer, checking the bytes
(of ``read`` and of the file a library would open) against the key's one true content.

Sampled every ``--sample-ms`` (default 100 ms) by walking the store (each inode once; entries'
members, as the bound counts them: their records, a few hundred bytes each, are left out):

* committed: ``entries/`` (what the bound counts);
* in flight: entries being written in ``tmp/`` (at most one per live writer);
* held: removed entries still in ``trash/`` (a live process was handed their files: they go
  when it lets go, or are being deleted right now) and the writers' private served and scratch
  folders in ``tmp/``: files of live processes, gone when they exit; reported, not bounded.

Reported (median over ``--repeats``, each run a fresh store): the peak of committed bytes and of
committed plus in-flight bytes over the bound; committed bytes over the bound when the last
writer has exited and 1 s and 5 s later, and how long after that exit the store was at or under
its bound; put latency p50 / p99 / max over every put of every writer; puts per second; lookups
that hit; wrong bytes (must be 0). Targets (issue 25): committed plus in-flight bytes at most
1.25x the bound plus one entry per writer (what live writers have in flight); at or under the
bound within 5 s of the last writer's exit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SUFFIXES = ("ttir", "ttgir", "llir", "ptx", "cubin", "json", "source")
_BLOCK = random.Random(25).randbytes(1 << 20)


def parse_size(text: str) -> int:
    t = text.strip().upper().replace("IB", "B")
    for unit, mult in (("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("B", 1)):
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * mult)
    return int(t)


def group(key: str) -> dict[str, bytes]:
    """The one true content of ``key``: seven members whose sizes and bytes follow from it."""
    r = random.Random(key)
    total = r.randint(150, 320) * 1024 if r.random() < 0.3 else r.randint(25, 55) * 1024
    shares = [r.random() + 0.2 for _ in SUFFIXES]
    out = {}
    for i, (suffix, share) in enumerate(zip(SUFFIXES, shares)):
        n = max(64, int(total * share / sum(shares)))
        off = r.randrange(len(_BLOCK) - n)
        tag = f"{key}:{i}:".encode()
        out[f"kernel.{suffix}"] = (tag + _BLOCK[off : off + n])[:n]
    return out


# ------------------------------------------------------------------------------------- writer
def writer_main(a: argparse.Namespace) -> int:
    if a.exit_budget is not None:
        from kcache.store import tunables

        tunables.EXIT_EVICT_S = a.exit_budget
    from kcache.store import Store

    store = Store.open(a.dir, max_size=a.bound)
    me = a.index
    lat: list[float] = []
    res: dict[str, Any] = {"puts": 0, "put_none": 0, "hits": 0, "misses": 0, "wrong": [], "errors": []}
    res["largest"] = res["bytes"] = 0
    Path(f"{a.go}.ready.{me}").touch()
    while not os.path.exists(a.go):
        time.sleep(0.002)
    end = time.monotonic() + a.seconds
    rng = random.Random(me)
    i = 0
    while (i < a.puts) if a.puts else (time.monotonic() < end):
        key = f"w{me}/k{i}"
        files = group(key)
        res["largest"] = max(res["largest"], sum(len(v) for v in files.values()))
        t = time.perf_counter()
        try:
            hit = store.put("triton", key, files, compile_s=0.5)
        except Exception as e:  # put never raises: this would be a bug
            res["errors"].append(repr(e))
            hit = None
        lat.append((time.perf_counter() - t) * 1e6)
        if hit is None:
            res["put_none"] += 1
        else:
            res["puts"] += 1
            res["bytes"] += sum(len(v) for v in files.values())
        i += 1
        # A lookup of a key any writer may have put by now (most are evicted: a miss is fine).
        other = f"w{rng.randrange(a.writers)}/k{rng.randrange(max(1, i))}"
        try:
            h = store.get("triton", other, files=rng.random() < 0.5)
        except Exception as e:
            res["errors"].append(repr(e))
            h = None
        if h is None:
            res["misses"] += 1
        else:
            res["hits"] += 1
            want = group(other)
            for name, data in want.items():
                if h.read(name) != data:
                    res["wrong"].append(f"{other} {name}: read")
            if h._paths is not None:
                for name, p in h.paths.items():
                    with open(p, "rb") as f:
                        if f.read() != want[name]:
                            res["wrong"].append(f"{other} {name}: file")
        if a.think_ms:
            time.sleep(a.think_ms / 1000)
    res["latency_us"] = lat
    res["counts"] = store.counts.process_totals()
    Path(a.out).write_text(json.dumps(res))
    return 0  # the store closes at exit (what every program does): its exit eviction runs then


# ------------------------------------------------------------------------------------- sampler
def du(root: Path) -> int:
    """The store's folder as ``du`` counts it: the blocks (st_blocks x 512) of every file and
    folder under it, each inode once, following no link (what a disk quota sees)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(root)]
    while stack:
        path = stack.pop()
        try:
            it = os.scandir(path)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                k = (st.st_dev, st.st_ino)
                if k not in seen:
                    seen.add(k)
                    total += st.st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    with contextlib.suppress(OSError):
        total += os.lstat(root).st_blocks * 512
    return total


def measure(root: Path) -> dict[str, int]:
    """Bytes under the store, each inode once: committed (entries/), in flight (entries being
    written in tmp/) and held (trash/, and the served and scratch folders in tmp/), members'
    sizes; and ``du``, the whole folder's blocks (see :func:`du`)."""
    seen: set[tuple[int, int]] = set()
    out = {"committed": 0, "inflight": 0, "held": 0, "du": du(root)}

    def walk(path: str, what: str) -> None:
        try:
            it = os.scandir(path)
        except OSError:
            return
        with it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if e.is_dir(follow_symlinks=False):
                    kind = what
                    if what == "tmp":
                        kind = "held" if e.name.startswith(("served.", "scratch.")) else "inflight"
                    walk(e.path, kind)
                elif e.is_file(follow_symlinks=False) and what != "tmp" and e.name != "__kcache__.rec":
                    k = (st.st_dev, st.st_ino)
                    if k not in seen:
                        seen.add(k)
                        out[what] += st.st_size

    walk(str(root / "entries"), "committed")
    walk(str(root / "trash"), "held")
    walk(str(root / "tmp"), "tmp")
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else 0.0


def run_once(work: Path, a: argparse.Namespace) -> dict[str, Any]:
    root = work / "store"
    go = str(work / "go")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    procs = []
    for i in range(a.writers):
        cmd = [sys.executable, str(Path(__file__).resolve()), "writer", "--dir", str(root), "--index", str(i)]
        cmd += ["--writers", str(a.writers), "--bound", str(a.bound), "--seconds", str(a.seconds)]
        cmd += ["--go", go, "--out", str(work / f"w{i}.json"), "--think-ms", str(a.think_ms)]
        if a.exit_budget is not None:
            cmd += ["--exit-budget", str(a.exit_budget)]
        if a.puts:
            cmd += ["--puts", str(a.puts)]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    deadline = time.monotonic() + 120
    while sum(os.path.exists(f"{go}.ready.{i}") for i in range(a.writers)) < a.writers:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            raise RuntimeError("writers did not start: " + " ".join(p.stderr.read()[-500:] for p in procs))
        time.sleep(0.01)
    Path(go).touch()
    t0 = time.monotonic()
    samples: list[tuple[float, dict[str, int]]] = []
    step = a.sample_ms / 1000
    while any(p.poll() is None for p in procs):
        samples.append((time.monotonic() - t0, measure(root)))
        time.sleep(step)
    t_exit = time.monotonic() - t0  # the last writer has gone (its exit eviction done)
    wrote_s = t_exit if a.puts else a.seconds
    after: list[tuple[float, dict[str, int]]] = []
    while time.monotonic() - t0 < t_exit + 5.0:
        after.append((time.monotonic() - t0 - t_exit, measure(root)))
        time.sleep(0.05)
    errs = []
    results = []
    for i, p in enumerate(procs):
        _, err = p.communicate()
        if p.returncode != 0 or "Traceback" in err:
            errs.append(f"writer {i}: rc={p.returncode} {err[-1500:]}")
            continue
        results.append(json.loads((work / f"w{i}.json").read_text()))
    lat = [x for r in results for x in r["latency_us"]]
    bound = a.bound
    peak_c = max((s["committed"] for _, s in samples), default=0)
    peak_all = max((s["committed"] + s["inflight"] for _, s in samples), default=0)
    peak_inflight = max((s["inflight"] for _, s in samples), default=0)
    under_at = next((t for t, s in after if s["committed"] <= bound), None)
    peak_du = max((s["du"] for _, s in samples), default=0)

    def at(t: float) -> float:
        x = [s["committed"] for tt, s in after if tt <= t]
        return (x[-1] if x else after[0][1]["committed"]) / bound

    largest = max((r["largest"] for r in results), default=0)
    allowance = 1.25 * bound + a.writers * (
        largest + 4096
    )  # in flight: one entry per writer (and its record)
    return {
        "writers_ok": len(results),
        "errors": errs + [e for r in results for e in r["errors"]],
        "seconds": wrote_s,
        "puts": sum(r["puts"] for r in results),
        "put_none": sum(r["put_none"] for r in results),
        "puts_per_s": sum(r["puts"] for r in results) / wrote_s,
        "bytes_put": sum(r["bytes"] for r in results),
        "hits": sum(r["hits"] for r in results),
        "misses": sum(r["misses"] for r in results),
        "wrong_bytes": sum(len(r["wrong"]) for r in results),
        "wrong_examples": [w for r in results for w in r["wrong"]][:5],
        "evictions": sum(r["counts"].get("store", {}).get("evictions", 0) for r in results),
        "put_p50_us": pct(lat, 0.5),
        "put_p99_us": pct(lat, 0.99),
        "put_max_us": max(lat) if lat else 0.0,
        "samples": len(samples),
        "peak_committed_ratio": peak_c / bound,
        "peak_with_inflight_ratio": peak_all / bound,
        "peak_inflight_bytes": peak_inflight,
        "largest_entry_bytes": largest,
        "peak_held_bytes": max((s["held"] for _, s in samples), default=0),
        "peak_du_ratio": peak_du / bound,
        # What the last writer to exit left: its exit (eviction, letting go of what it held) is
        # over when it has gone; nothing runs after it.
        "at_exit_du_ratio": after[0][1]["du"] / bound if after else None,
        "after_5s_du_ratio": after[-1][1]["du"] / bound if after else None,
        "at_exit_ratio": after[0][1]["committed"] / bound if after else None,
        "after_1s_ratio": at(1.0) if after else None,
        "after_5s_ratio": after[-1][1]["committed"] / bound if after else None,
        "under_bound_after_exit_s": under_at,
        "peak_ok": peak_all <= allowance,
        "after_exit_ok": under_at is not None and under_at <= 5.0,
        "du_ok": peak_du <= 1.5 * bound and bool(after) and after[0][1]["du"] <= 1.25 * bound,
        "trace": [[round(t, 3), x["committed"], x["inflight"], x["held"], x["du"]] for t, x in samples]
        + [[round(t_exit + t, 3), x["committed"], x["inflight"], x["held"], x["du"]] for t, x in after],
        "exit_at_s": round(t_exit, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("writer")
    w.add_argument("--dir", required=True)
    w.add_argument("--index", type=int, required=True)
    w.add_argument("--writers", type=int, required=True)
    w.add_argument("--bound", type=int, required=True)
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--go", required=True)
    w.add_argument("--out", required=True)
    w.add_argument("--think-ms", type=float, default=0.0)
    w.add_argument("--exit-budget", type=float)
    w.add_argument("--puts", type=int, default=0)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--bound", default="64MB", help="KCACHE_MAX_SIZE of every writer (e.g. 64MB)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the writers write")
    ap.add_argument("--puts", type=int, default=0, help="each writer puts this many groups instead (tests)")
    ap.add_argument("--think-ms", type=float, default=0.0, help="pause after every put and lookup")
    ap.add_argument("--sample-ms", type=float, default=100.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--exit-budget", type=float, help="the writers' EXIT_EVICT_S (tests: generous)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    a = ap.parse_args(argv)
    if a.cmd == "writer":
        return writer_main(a)
    a.bound = parse_size(a.bound) if isinstance(a.bound, str) else a.bound
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kcache-bench-evict-"))
    runs = []
    try:
        for rep in range(a.repeats):
            work = base / f"run{rep}"
            work.mkdir(parents=True)
            r = run_once(work, a)
            runs.append(r)
            print(
                f"run {rep + 1}: {r['puts']} puts ({r['puts_per_s']:.0f}/s), peak {r['peak_committed_ratio']:.2f}x "
                f"({r['peak_with_inflight_ratio']:.2f}x with in flight), at exit {r['at_exit_ratio']:.2f}x, "
                f"+5 s {r['after_5s_ratio']:.2f}x, put p50/p99/max {r['put_p50_us'] / 1000:.2f}/"
                f"{r['put_p99_us'] / 1000:.2f}/{r['put_max_us'] / 1000:.1f} ms, wrong {r['wrong_bytes']}, "
                f"evictions {r['evictions']:.0f}, errors {len(r['errors'])}; du peak {r['peak_du_ratio']:.2f}x, "
                f"at exit {r['at_exit_du_ratio']:.2f}x, +5 s {r['after_5s_du_ratio']:.2f}x",
                flush=True,
            )
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    med = {
        k: statistics.median(r[k] for r in runs if r[k] is not None) for k in keys if runs[0][k] is not None
    }
    summary = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "writers": a.writers,
        "bound": a.bound,
        "seconds": a.seconds,
        "think_ms": a.think_ms,
        "repeats": a.repeats,
        "median": med,
        "all_peak_ok": all(r["peak_ok"] for r in runs),
        "all_after_exit_ok": all(r["after_exit_ok"] for r in runs),
        "all_du_ok": all(r["du_ok"] for r in runs),
        "wrong_bytes": sum(r["wrong_bytes"] for r in runs),
        "errors": [e for r in runs for e in r["errors"]][:10],
        "runs": runs,
    }
    print(
        f"\n{a.writers} writers, bound {a.bound / 2**20:.1f} MiB, {a.seconds:.0f} s, median of {a.repeats}: "
        f"peak {med['peak_committed_ratio']:.2f}x the bound ({med['peak_with_inflight_ratio']:.2f}x with "
        f"in flight), {med['at_exit_ratio']:.2f}x at the last exit, {med['after_5s_ratio']:.2f}x 5 s later; "
        f"put p50 {med['put_p50_us'] / 1000:.2f} ms, p99 {med['put_p99_us'] / 1000:.2f} ms, max "
        f"{med['put_max_us'] / 1000:.1f} ms; {med['puts_per_s']:.0f} puts/s; wrong bytes "
        f"{summary['wrong_bytes']}"
    )
    print(
        f"  the folder (du): peak {med['peak_du_ratio']:.2f}x the bound, {med['at_exit_du_ratio']:.2f}x at the "
        f"last exit, {med['after_5s_du_ratio']:.2f}x 5 s later"
    )
    print(
        f"  {'met' if summary['all_du_ok'] else 'MISSED'}: the folder within 1.5x the bound while they write and "
        "1.25x when the last has exited (every run)"
    )
    print(
        f"  {'met' if summary['all_peak_ok'] else 'MISSED'}: at most 1.25x the bound plus one entry per writer "
        "in flight (every run)"
    )
    print(
        f"  {'met' if summary['all_after_exit_ok'] else 'MISSED'}: at or under the bound within 5 s of the exit"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    return 0 if summary["wrong_bytes"] == 0 and not summary["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
