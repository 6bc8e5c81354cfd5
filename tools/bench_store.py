#!/usr/bin/env python
"""Benchmark of kcache's local store against Triton's FileCacheManager and plain file reads.

Measures (issue 7, point 8), all in one run so that the machine's state is shared:

- hit latency: ``Store.get`` (reads the record and every member, checks sizes and crc32), the
  same plus reading the members' bytes back (what Triton does with the paths it gets), Triton's
  ``FileCacheManager`` (construct, ``get_group``, read every file: what ``triton.compile`` does on
  a hit) and, as the floor, plain ``open``/``read`` of the same member files;
- the first hit of an entry in a process (``kcache first get+read``: its files are made for this
  process then) next to its second (``kcache again get+read``), each beside FileCacheManager on
  the same entry, on entries this process has not looked up before (page cache warm for both);
  and once the process holds as many entry folders as it may (192), the first hit served
  through private links (``kcache first, past held``), beside FileCacheManager;
- the first hit in a fresh process: a new interpreter that opens the store and gets one entry
  with its files, against one that builds a FileCacheManager and gets one group (imports before
  the clock, everything after: folders, threads);
- put latency: ``Store.put`` of a group, FileCacheManager's ``put`` of each file plus
  ``put_group``, and plain writes of the same files into a new directory (no rename, no checks);
- for Triton-shaped groups (6 files, about 4 KB) with 1,000, 10,000 and 100,000 entries in the
  store, and for 100 KB and 2 MB groups with 1,000 entries;
- ``kcache stats --json`` and ``kcache inspect --limit 50`` wall time (subprocess, so including
  interpreter start-up) at the largest size, and the in-process cost of what they compute.

p50 and p99 are taken over the samples of one pass; with ``--runs R`` each figure is the median
over R passes. Stores are filled through the store API (``Store.put`` / ``FileCacheManager.put``)
in parallel processes, one per CPU.

    python tools/bench_store.py             # the full run (1k, 10k, 100k entries; several minutes)
    python tools/bench_store.py --quick     # a smaller run (300 and 3,000 entries)
    python tools/bench_store.py --json      # machine-readable results on stdout
    python tools/bench_store.py --fresh-only --fresh-reps 31 --against ../other-checkout
                                            # only a fresh process's first hit, A/B beside another
                                            # checkout of kcache (same store, same rotation)
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import datetime
import hashlib
import importlib.metadata
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A Triton group: the files triton.compile stores for one kernel (its __grp__ index aside), sized
# like those of a small elementwise kernel: about 4 KB in all.
SHAPE_4K = (
    ("add_kernel.ttir", 560),
    ("add_kernel.ttgir", 780),
    ("add_kernel.llir", 940),
    ("add_kernel.ptx", 820),
    ("add_kernel.cubin", 760),
    ("add_kernel.json", 236),
)
GROUP_NAME = "add_kernel.json"  # triton.compile looks a kernel up by its metadata file
#: The holds a process takes before its table of descriptors (256) must grow: the "past held"
#: figures are the first hits after this many.
FIRST_HELD = 192
KIND = "triton"

_BLOCK = random.Random(0).randbytes(4 << 20)


def shape_for(total: int) -> tuple[tuple[str, int], ...]:
    """The 4 KB shape, or one of ``total`` bytes with the binary (cubin, ptx) taking the rest."""
    if total <= 4096:
        return SHAPE_4K
    small = sum(n for name, n in SHAPE_4K if not name.endswith((".cubin", ".ptx")))
    rest = total - small
    return tuple(
        (
            name,
            rest * 2 // 3
            if name.endswith(".cubin")
            else rest - rest * 2 // 3
            if name.endswith(".ptx")
            else n,
        )
        for name, n in SHAPE_4K
    )


def group_files(i: int, shape: tuple[tuple[str, int], ...]) -> dict[str, bytes]:
    """Deterministic, distinct content for entry ``i``."""
    out = {}
    for j, (name, size) in enumerate(shape):
        tag = f"{i}:{j}:".encode()
        off = (i * 7919 + j * 104729) % (len(_BLOCK) - size)
        out[name] = (tag + _BLOCK[off : off + size])[:size]
    return out


def store_key(i: int) -> str:
    return f"bench-{i}"


def triton_key(i: int) -> str:
    """A key shaped like Triton's: base32 of a sha256."""
    return base64.b32encode(hashlib.sha256(f"bench-{i}".encode()).digest()).decode().rstrip("=")


# ---------------------------------------------------------------------------------- filling
def _fill_kcache(root: str, start: int, stop: int, total: int) -> float:
    from kcache.store import Store

    s = Store.open(root, max_size=1 << 50)
    shape = shape_for(total)
    t = time.perf_counter()
    for i in range(start, stop):
        if s.put(KIND, store_key(i), group_files(i, shape), compile_s=0.5) is None:
            raise RuntimeError("put failed")
    s.close()
    return time.perf_counter() - t


def _fcm(cache_dir: str) -> type:
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    from triton import knobs
    from triton.runtime.cache import FileCacheManager

    knobs.cache.dir = cache_dir
    return FileCacheManager


def _fcm_put(fcm: type, i: int, files: dict[str, bytes]) -> None:
    m = fcm(triton_key(i))
    paths = {name: m.put(data, name, binary=True) for name, data in files.items()}
    m.put_group(GROUP_NAME, paths)


def _fill_fcm(cache_dir: str, start: int, stop: int, total: int) -> float:
    fcm = _fcm(cache_dir)
    shape = shape_for(total)
    t = time.perf_counter()
    for i in range(start, stop):
        _fcm_put(fcm, i, group_files(i, shape))
    return time.perf_counter() - t


def fill(
    pool: concurrent.futures.Executor, fn: Callable, where: str, start: int, stop: int, total: int
) -> float:
    """Entries [start, stop) through the store's own API, split over the pool. Returns wall s."""
    if stop <= start:
        return 0.0
    n = getattr(pool, "_max_workers", 1)
    step = -(-(stop - start) // n)
    t = time.perf_counter()
    futs = [pool.submit(fn, where, a, min(a + step, stop), total) for a in range(start, stop, step)]
    for f in futs:
        f.result()
    return time.perf_counter() - t


# ---------------------------------------------------------------------------------- timing
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t) / 1000.0  # µs


def read_files(paths) -> int:
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            n += len(f.read())
    return n


class Bench:
    def __init__(self, work: Path, runs: int, quick: bool, log: Callable[[str], None]) -> None:
        from kcache.store import Store

        self.work = work
        self.runs = runs
        self.quick = quick
        self.log = log
        self.results: list[dict[str, Any]] = []
        self.admin: dict[str, Any] = {}
        self.fill_rates: list[dict[str, Any]] = []
        self.pool = concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1)
        self.Store = Store

    def close(self) -> None:
        self.pool.shutdown()

    def dataset(self, label: str, total: int, sizes: list[int], hit_samples: int, put_samples: int) -> None:
        kroot = self.work / f"kcache-{label}"
        froot = self.work / f"fcm-{label}"
        have = 0
        next_new = 10**9  # keys for put samples: never collide with the filled ones
        for n in sizes:
            t_k = fill(self.pool, _fill_kcache, str(kroot), have, n, total)
            t_f = fill(self.pool, _fill_fcm, str(froot), have, n, total)
            if n > have:
                self.fill_rates.append(
                    {
                        "group": label,
                        "entries": n - have,
                        "kcache_puts_per_s": round((n - have) / t_k),
                        "fcm_groups_per_s": round((n - have) / t_f),
                    }
                )
                self.log(
                    f"  filled {label} to {n} entries: kcache {n - have} puts in {t_k:.1f}s, "
                    f"FileCacheManager in {t_f:.1f}s ({self.pool._max_workers} processes)"
                )
            have = n
            row = self.measure(label, total, kroot, froot, n, hit_samples, put_samples, next_new)
            next_new += put_samples * (self.runs + 1)
            self.results.append(row)
            self.log(
                "  "
                + ", ".join(
                    f"{k} p50 {v['p50']:.0f}us"
                    for k, v in row["hit"].items()
                    if isinstance(v, dict) and "p50" in v
                )
            )

    def measure(
        self,
        label: str,
        total: int,
        kroot: Path,
        froot: Path,
        n: int,
        hit_samples: int,
        put_samples: int,
        new0: int,
    ) -> dict[str, Any]:
        store = self.Store.open(kroot, max_size=1 << 50)
        fcm = _fcm(str(froot))
        rng = random.Random(n)
        sample = rng.sample(range(n), min(hit_samples, n))
        names = [name for name, _ in shape_for(total)]
        # The plain floor reads the very files a kcache hit reads (the members, not the record).
        plain_paths = {
            i: [os.path.join(store.entry_dir(store.entry_id(KIND, store_key(i))), nm) for nm in names]
            for i in sample
        }

        def k_get(i: int) -> None:
            if store.get(KIND, store_key(i)) is None:
                raise RuntimeError("kcache miss in the benchmark")

        def k_get_read(i: int) -> None:
            h = store.get(KIND, store_key(i))
            read_files(h.paths.values())

        def f_get(i: int) -> None:
            g = fcm(triton_key(i)).get_group(GROUP_NAME)
            if not g:
                raise RuntimeError("FileCacheManager miss in the benchmark")
            read_files(g.values())

        def plain(i: int) -> None:
            read_files(plain_paths[i])

        hit_impls = {
            "plain read": plain,
            "kcache get": k_get,
            "kcache get+read": k_get_read,
            "FileCacheManager": f_get,
        }
        # Before the main pass (through another store object: nothing of it served yet), on any
        # entries: the main pass's sample may take every entry of a small store.
        first = self.first_hits(kroot, fcm, n, set(), hit_samples, names, f_get)
        for fn in hit_impls.values():  # warm-up pass: every variant reads warm page cache
            for i in sample:
                fn(i)
        hit_runs: dict[str, list[tuple[float, float]]] = {k: [] for k in hit_impls}
        order = list(hit_impls)
        for _ in range(self.runs):
            rng.shuffle(sample)
            times: dict[str, list[float]] = {k: [] for k in hit_impls}
            for j, i in enumerate(sample):
                # Interleaved, in a rotating order: each variant sees the same machine state.
                for k in order[j % len(order) :] + order[: j % len(order)]:
                    times[k].append(timed(lambda fn=hit_impls[k], i=i: fn(i)))
            for k, xs in times.items():
                hit_runs[k].append((pct(xs, 0.5), pct(xs, 0.99)))

        shape = shape_for(total)
        pdir = self.work / f"plainwrite-{label}-{n}"
        pdir.mkdir()

        def k_put(i: int, files: dict[str, bytes]) -> None:
            if store.put(KIND, store_key(i), files, compile_s=0.5) is None:
                raise RuntimeError("kcache put failed")

        def f_put(i: int, files: dict[str, bytes]) -> None:
            _fcm_put(fcm, i, files)

        def plain_put(i: int, files: dict[str, bytes]) -> None:
            d = os.path.join(pdir, str(i))
            os.mkdir(d)
            for name, data in files.items():
                with open(os.path.join(d, name), "wb") as f:
                    f.write(data)

        put_impls = {"plain write": plain_put, "kcache put": k_put, "FileCacheManager": f_put}
        put_runs: dict[str, list[tuple[float, float]]] = {k: [] for k in put_impls}
        nxt = new0
        for _ in range(self.runs):
            times = {k: [] for k in put_impls}
            for j in range(put_samples):
                files = group_files(nxt, shape)
                for k in order_rot(list(put_impls), j):
                    times[k].append(timed(lambda fn=put_impls[k], i=nxt, f=files: fn(i, f)))
                nxt += 1
            for k, xs in times.items():
                put_runs[k].append((pct(xs, 0.5), pct(xs, 0.99)))
        shutil.rmtree(pdir, ignore_errors=True)
        store.close()

        def summarise(runs: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
            return {
                k: {
                    "p50": statistics.median(r[0] for r in v),
                    "p99": statistics.median(r[1] for r in v),
                    "p50_runs": [round(r[0], 1) for r in v],
                }
                for k, v in runs.items()
            }

        return {
            "group": label,
            "group_bytes": sum(s for _, s in shape),
            "files": len(shape),
            "entries": n,
            "hit_samples": len(sample),
            "put_samples": put_samples,
            "hit": summarise(hit_runs),
            "first_hit": summarise(first),
            "put": summarise(put_runs),
        }

    def first_hits(
        self,
        kroot: Path,
        fcm: type,
        n: int,
        taken: set[int],
        samples: int,
        names: list[str],
        f_get: Callable[[int], None],
    ) -> dict[str, list[tuple[float, float]]]:
        """The first and second hit (with the files Triton opens, read) of entries this process
        never looked up, each next to FileCacheManager on the same entry (and the plain read, the
        floor), through a store object of their own. Every entry's files are read once first
        (page cache warm for both caches). Returns the runs' (p50, p99)."""
        store = self.Store.open(kroot, max_size=1 << 50)

        def k_get_read(i: int) -> None:
            h = store.get(KIND, store_key(i), files=True)  # as Triton's manager asks
            read_files(h.paths.values())

        def plain(i: int) -> None:
            d = store.entry_dir(store.entry_id(KIND, store_key(i)))
            read_files([os.path.join(d, nm) for nm in names])

        rng = random.Random(n + 1)
        free = [i for i in range(n) if i not in taken]
        rng.shuffle(free)
        # (a process holds at most 192 entry folders, then makes private links: see served.py)
        per = max(10, min(samples // 2, len(free) // self.runs, 150 // self.runs))
        out: dict[str, list[tuple[float, float]]] = {}
        contenders = {
            "first": [("kcache first get+read", k_get_read), ("kcache again get+read", k_get_read)],
            "fcm": [("FileCacheManager", f_get)],
            "plain": [("plain read", plain)],
        }
        self.rounds([free[r * per : (r + 1) * per] for r in range(self.runs)], plain, f_get, contenders, out)
        self.past_held(store, free[self.runs * per :], per, out, k_get_read, plain, f_get)
        store.close()
        return out

    def past_held(
        self,
        store: Any,
        free: list[int],
        per: int,
        out: dict[str, list[tuple[float, float]]],
        k_get_read: Callable[[int], None],
        plain: Callable[[int], None],
        f_get: Callable[[int], None],
    ) -> None:
        """The first hit once this process has taken FIRST_HELD holds (past them, a hit's files
        were private links, a folder and a link per member; now held folders once the flush
        thread has grown the table of descriptors), next to FileCacheManager on the same
        entries: what a process pays per kernel past its first FIRST_HELD. Skipped when the
        store has too few entries left."""
        if len(free) < FIRST_HELD + per * self.runs:
            return
        for i in free[:FIRST_HELD]:  # the first holds (untimed)
            k_get_read(i)
        rest = free[FIRST_HELD:]
        contenders = {
            "first": [("kcache first, past held", k_get_read)],
            "fcm": [("FileCacheManager, past held", f_get)],
        }
        self.rounds([rest[r * per : (r + 1) * per] for r in range(self.runs)], plain, f_get, contenders, out)

    @staticmethod
    def rounds(
        batches: list[list[int]],
        plain: Callable[[int], None],
        f_get: Callable[[int], None],
        contenders: dict[str, list[tuple[str, Callable[[int], None]]]],
        out: dict[str, list[tuple[float, float]]],
    ) -> None:
        """One run per batch of entries: their files read first, through both caches' folders
        (page cache warm for both; no kcache lookup yet), then each contender timed on each entry
        in a rotating order (a contender's timings one after the other: a first hit, then the
        second); each label's (p50, p99) of the run appended to ``out``."""
        for batch in batches:
            if not batch:
                break
            for i in batch:
                plain(i)
                with contextlib.suppress(Exception):
                    f_get(i)
            times: dict[str, list[float]] = {label: [] for group in contenders.values() for label, _ in group}
            for j, i in enumerate(batch):
                for what in order_rot(list(contenders), j):
                    for label, fn in contenders[what]:
                        times[label].append(timed(lambda fn=fn, i=i: fn(i)))
            for label, xs in times.items():
                out.setdefault(label, []).append((pct(xs, 0.5), pct(xs, 0.99)))

    def admin_commands(self, label: str, n: int) -> None:
        from kcache.maintenance.stats import store_stats

        kroot = self.work / f"kcache-{label}"
        cli = Path(__file__).resolve().parents[1] / "kcache" / "cli.py"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE")}
        out: dict[str, Any] = {"entries": n}
        if cli.exists():
            for name, args in (("stats", ["stats", "--json"]), ("inspect", ["inspect", "--limit", "50"])):
                walls = []
                for _ in range(max(3, self.runs)):
                    t = time.perf_counter()
                    r = subprocess.run(
                        [sys.executable, "-m", "kcache", args[0], "--dir", str(kroot), *args[1:]],
                        capture_output=True,
                        text=True,
                        env=env,
                    )
                    walls.append(time.perf_counter() - t)
                    if r.returncode != 0:
                        raise RuntimeError(f"kcache {name} failed: {r.stderr.strip()[-500:]}")
                    if name == "stats":
                        entries = json.loads(r.stdout)["entries"]
                        if entries < n:
                            raise RuntimeError(f"kcache stats saw {entries} entries, expected {n}")
                out[f"cli_{name}_s"] = statistics.median(walls)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import kcache.cli"], env=env, check=True)
            out["cli_import_s"] = time.perf_counter() - t
        store = self.Store.open(kroot, max_size=1 << 50)
        stats_t, rows_t = [], []
        for _ in range(max(3, self.runs)):
            store.disk.catalogue._index = None  # a cold open, as a fresh `kcache` process would have
            t = time.perf_counter()
            st = store_stats(store)
            stats_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            rows = list(store.index().rows(limit=50))
            rows_t.append(time.perf_counter() - t)
        assert st["entries"] >= n and len(rows) == 50
        out["store_stats_s"] = statistics.median(stats_t)
        out["index_rows50_s"] = statistics.median(rows_t)
        store.close()
        self.admin = out


FRESH_CHILD = r"""
import json, os, sys, time
which, root, key, group_name, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
import kcache.store  # imports before the clock: what a process with kcache loaded has
from triton import knobs
from triton.runtime.cache import FileCacheManager
import hashlib
hashlib.sha256(b"key").hexdigest()  # Triton hashes its key (sha256) before it asks a cache manager
t0 = time.perf_counter()
if which == "kcache":
    st = kcache.store.Store.open(root, max_size=1 << 50)
    t1 = time.perf_counter()
    h = st.get("triton", key, files=True)
    paths = h.paths.values()
else:
    knobs.cache.dir = root
    m = FileCacheManager(key)
    t1 = time.perf_counter()
    paths = m.get_group(group_name).values()
t2 = time.perf_counter()
for p in paths:
    with open(p, "rb") as f:
        f.read()
t3 = time.perf_counter()
print(json.dumps({"total": (t3 - t0) * 1e6, "open": (t1 - t0) * 1e6, "get": (t2 - t1) * 1e6, "read": (t3 - t2) * 1e6}))
"""


def _child_result(
    code: str, args: tuple[str, ...], env: dict[str, str], cwd: Path, what: str
) -> dict[str, Any]:
    """Run ``python -c code *args`` and return the JSON of its last line of output. ``cwd``: a
    folder that is not a checkout (``-c`` puts the working folder first on sys.path)."""
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd)
    if p.returncode != 0:
        raise RuntimeError(f"{what}: {p.stderr[-800:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def fresh_process_first_hit(
    kroot: Path, froot: Path, n: int, reps: int, against: str | None = None
) -> dict[str, Any]:
    """The first hit of a fresh process: a new interpreter (imports done) opens the store and gets
    one entry with its files, or builds a FileCacheManager and gets one group; alternating.
    ``against``: another checkout of kcache, timed in the same rotation on the same store
    (``kcache@against``), for an A/B of a change. Each figure is split into opening (the store;
    FileCacheManager's constructor), the lookup with its paths, and reading the files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    here = str(Path(__file__).resolve().parents[1])
    names = json.dumps([name for name, _ in SHAPE_4K])
    rng = random.Random(7)
    who = ["kcache", "FileCacheManager"] + (["kcache@against"] if against else [])
    times: dict[str, list[float]] = {w: [] for w in who}
    parts: dict[str, dict[str, list[float]]] = {w: {"open": [], "get": [], "read": []} for w in who}
    for r in range(reps):
        i = rng.randrange(n)
        for w in order_rot(who, r):
            fcm = w == "FileCacheManager"
            root, key = (str(froot), triton_key(i)) if fcm else (str(kroot), store_key(i))
            env["PYTHONPATH"] = against if w == "kcache@against" and against else here
            args = ("fcm" if fcm else "kcache", root, key, GROUP_NAME, names)
            got = _child_result(FRESH_CHILD, args, env, kroot.parent, f"fresh-process first hit ({w})")
            times[w].append(got["total"])
            for k in parts[w]:
                parts[w][k].append(got[k])
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {
        "reps": reps,
        "median_us": med,
        "ratio": med["kcache"] / med["FileCacheManager"],
        "parts_median_us": {w: {k: statistics.median(v) for k, v in ps.items()} for w, ps in parts.items()},
        "all_us": times,
    }
    if against:
        out["against"] = against
        out["ratio_against"] = med["kcache@against"] / med["FileCacheManager"]
    return out


def first_hit_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One process's first hits, as ``--first-only`` runs it once per checkout and round (with
    that checkout's kcache first on the path): ``held`` entries timed (kcache's first hit with
    its files read, its second, FileCacheManager's on the same entry, in a rotating order; page
    cache warm for both), then ``filler`` looked up untimed (up to FIRST_HELD holds), then
    ``past`` timed the same way. Returns medians in µs and how many hits held their folder."""
    from kcache.store import Store

    kroot, froot, total = spec["kroot"], spec["froot"], spec["total"]
    names = [name for name, _ in shape_for(total)]
    fcm = _fcm(froot)
    store = Store.open(kroot, max_size=1 << 50)
    held: list[bool] = []

    def k(i: int) -> None:
        h = store.get(KIND, store_key(i), files=True)
        read_files(h.paths.values())
        held.append(getattr(h, "_pin", None) is not None)

    def f(i: int) -> None:
        g = fcm(triton_key(i)).get_group(GROUP_NAME)
        read_files(g.values())

    def plain(i: int) -> None:
        d = store.entry_dir(store.entry_id(KIND, store_key(i)))
        read_files([os.path.join(d, nm) for nm in names])

    out: dict[str, Any] = {}

    def one_pass(ids: list[int], tag: str) -> None:
        for i in ids:  # page cache warm for both, no kcache lookup yet
            plain(i)
            f(i)
        first, again, fcm_t = [], [], []
        del held[:]
        for j, i in enumerate(ids):
            if j % 2:
                first.append(timed(lambda i=i: k(i)))
                again.append(timed(lambda i=i: k(i)))
                fcm_t.append(timed(lambda i=i: f(i)))
            else:
                fcm_t.append(timed(lambda i=i: f(i)))
                first.append(timed(lambda i=i: k(i)))
                again.append(timed(lambda i=i: k(i)))
        out[tag] = {
            "first": statistics.median(first),
            "again": statistics.median(again),
            "fcm": statistics.median(fcm_t),
            "ratio": statistics.median(first) / statistics.median(fcm_t),
            "held": sum(held[::2]),
            "n": len(ids),
        }

    one_pass(spec["held"], "held")
    for i in spec["filler"]:
        k(i)
    one_pass(spec["past"], "past")
    store.close()
    return out


FIRST_CHILD = "import json, sys; sys.path.append(sys.argv[1]); import bench_store as b; print(json.dumps(b.first_hit_child(json.loads(sys.argv[2]))))"


def first_hits_ab(
    kroot: Path, froot: Path, total: int, n: int, rounds: int, per: int, against: str | None
) -> dict[str, Any]:
    """``--first-only``: the first hits of a process (see :func:`first_hit_child`), one child
    process per checkout and round, in a rotating order, each on entries of its own (none looked
    up before: a first hit refreshes its entry's last use, which a second process would not
    pay); each child's ratio is to FileCacheManager in the same process, side by side."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    here = str(Path(__file__).resolve().parents[1])
    tools = str(Path(__file__).resolve().parent)
    who = ["kcache"] + (["kcache@against"] if against else [])
    ids = list(range(n))
    random.Random(11).shuffle(ids)
    need = FIRST_HELD + per
    reused = n < need * rounds * len(who)
    pos = 0
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in who}
    for r in range(rounds):
        for w in order_rot(who, r):
            take = [ids[(pos + j) % n] for j in range(need)]
            pos += need
            spec = {
                "kroot": str(kroot),
                "froot": str(froot),
                "total": total,
                "held": take[:per],
                "filler": take[per:FIRST_HELD],
                "past": take[FIRST_HELD:],
            }
            env["PYTHONPATH"] = against if w == "kcache@against" and against else here
            runs[w].append(
                _child_result(FIRST_CHILD, (tools, json.dumps(spec)), env, kroot.parent, f"first hits ({w})")
            )
    summary: dict[str, Any] = {}
    for w, rs in runs.items():
        summary[w] = {
            tag: {
                k: statistics.median(x[tag][k] for x in rs)
                for k in ("first", "again", "fcm", "ratio", "held")
            }
            | {"ratio_runs": [round(x[tag]["ratio"], 3) for x in rs], "n": rs[0][tag]["n"]}
            for tag in ("held", "past")
        }
    return {"rounds": rounds, "per": per, "entries_reused": reused, "summary": summary, "runs": runs}


def order_rot(xs: list[str], j: int) -> list[str]:
    j %= len(xs)
    return xs[j:] + xs[:j]


# ---------------------------------------------------------------------------------- report
def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("msgpack", "triton", "xxhash"):
        try:
            __import__(mod)
            out[mod] = importlib.metadata.version(mod)
        except ImportError:
            out[mod] = "absent"
        except importlib.metadata.PackageNotFoundError:
            out[mod] = "?"
    import kcache
    from kcache.store import records

    out["kcache"] = kcache.__version__
    out["hit_checksum"] = "xxh3" if records.xxh3 is not None else "crc32"
    return out


def targets(
    results: list[dict[str, Any]], admin: dict[str, Any], fresh: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    out = []

    def add(name: str, value: float, limit: float, unit: str = "x") -> None:
        out.append(
            {"target": name, "value": round(value, 3), "limit": limit, "unit": unit, "met": value <= limit}
        )

    small = sorted((r for r in results if r["group"] == "4KB"), key=lambda r: r["entries"])
    for r in results:
        h = r["hit"]
        tag = f"{r['group']} @ {r['entries']}"
        add(f"hit p50 / plain read ({tag})", h["kcache get"]["p50"] / h["plain read"]["p50"], 1.5)
        add(f"hit p50 / FileCacheManager ({tag})", h["kcache get"]["p50"] / h["FileCacheManager"]["p50"], 1.0)
        f = r.get("first_hit")
        if f and f["FileCacheManager"]["p50"]:
            fcm = f["FileCacheManager"]["p50"]
            add(
                f"first hit with files p50 / FileCacheManager ({tag})",
                f["kcache first get+read"]["p50"] / fcm,
                1.2,
            )
            add(
                f"second hit with files p50 / FileCacheManager ({tag})",
                f["kcache again get+read"]["p50"] / fcm,
                1.0,
            )
            past = f.get("kcache first, past held")
            if past and f["FileCacheManager, past held"]["p50"]:
                add(
                    f"first hit past the held folders p50 / FileCacheManager ({tag})",
                    past["p50"] / f["FileCacheManager, past held"]["p50"],
                    1.2,
                )
    for r in results:
        if r["group"] == "100KB":
            add(
                f"put p50 at 100 KB ({r['entries']} entries)",
                r["put"]["kcache put"]["p50"] / 1000.0,
                2.0,
                "ms",
            )
    if len(small) >= 2:
        a, b = small[0], small[-1]
        add(
            f"hit p50 slowdown {a['entries']} -> {b['entries']} entries",
            b["hit"]["kcache get"]["p50"] / a["hit"]["kcache get"]["p50"],
            1.5,
        )
        add(
            f"put p50 slowdown {a['entries']} -> {b['entries']} entries",
            b["put"]["kcache put"]["p50"] / a["put"]["kcache put"]["p50"],
            1.5,
        )
    if fresh:
        add("first hit of a fresh process / FileCacheManager's", fresh["ratio"], 2.0)
    for k in ("cli_stats_s", "cli_inspect_s", "store_stats_s", "index_rows50_s"):
        if k in admin:
            add(f"{k} at {admin['entries']} entries", admin[k], 2.0, "s")
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'group':>6} {'entries':>8} | {'op':5} {'implementation':21} | {'p50 us':>9} {'p99 us':>9} | {'vs floor':>8}",
        "-" * 82,
    ]
    for r in results:
        for op, floor in (("hit", "plain read"), ("first_hit", "plain read"), ("put", "plain write")):
            if op not in r:
                continue
            base = r[op][floor]["p50"]
            tag = {"first_hit": "first"}.get(op, op)
            for impl, v in r[op].items():
                lines.append(
                    f"{r['group']:>6} {r['entries']:>8} | {tag:5} {impl:21} | {v['p50']:9.1f} {v['p99']:9.1f} | "
                    f"{v['p50'] / base:7.2f}x"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller stores and fewer samples")
    ap.add_argument("--json", action="store_true", help="results as JSON on stdout")
    ap.add_argument("--runs", type=int, default=3, help="measurement passes per figure (median)")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--sizes", help="entry counts for the 4 KB groups, e.g. 1000,10000,100000")
    ap.add_argument(
        "--crc32-only",
        action="store_true",
        help="store and check without xxh3, as a process without the xxhash module does",
    )
    ap.add_argument(
        "--fresh-only",
        action="store_true",
        help="only the first hit of a fresh process (a store of the smallest size; --fresh-reps each)",
    )
    ap.add_argument(
        "--fresh-reps", type=int, help="fresh processes per contender (default 21; 9 with --quick)"
    )
    ap.add_argument(
        "--first-only",
        action="store_true",
        help="only the first hits of an entry in a process, held and past the first 192, one child "
        "process per checkout and run (--runs), beside FileCacheManager (see --group, --first-per)",
    )
    ap.add_argument(
        "--group", choices=["4KB", "100KB", "2MB"], default="4KB", help="the group size for --first-only"
    )
    ap.add_argument(
        "--first-per", type=int, default=100, help="entries timed per pass and child with --first-only"
    )
    ap.add_argument(
        "--against",
        metavar="CHECKOUT",
        help="another checkout of kcache (its root folder), timed beside this one in the fresh-process "
        "figure and with --first-only",
    )
    args = ap.parse_args(argv)
    if args.against and not (Path(args.against) / "kcache" / "__init__.py").is_file():
        ap.error(f"--against {args.against}: no kcache package there")
    if args.fresh_reps is not None and args.fresh_reps < 1:
        ap.error("--fresh-reps must be at least 1")
    if args.crc32_only:
        from kcache.store import records

        records.xxh3 = None  # the fill workers are forked after this, and inherit it
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    if args.sizes:
        try:
            sizes = sorted(int(x) for x in args.sizes.split(","))
        except ValueError:
            ap.error("--sizes takes integers, e.g. 1000,10000")
    else:
        sizes = [300, 3000] if args.quick else [1000, 10000, 100000]
    big_n = 300 if args.quick else 1000
    hit_s, put_s = (400, 200) if args.quick else (2000, 500)
    work = Path(args.dir or tempfile.mkdtemp(prefix="kcache-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    b = Bench(work, args.runs, args.quick, log)
    try:
        log(f"kcache store benchmark in {work} ({os.cpu_count()} CPUs, runs={args.runs})")
        if args.first_only:
            total = {"4KB": 4096, "100KB": 100 * 1024, "2MB": 2 * 1024 * 1024}[args.group]
            n = sizes[0] if args.sizes else (2000 if args.group != "2MB" else 600)
            kroot, froot = b.work / f"kcache-{args.group}", b.work / f"fcm-{args.group}"
            fill(b.pool, _fill_kcache, str(kroot), 0, n, total)
            fill(b.pool, _fill_fcm, str(froot), 0, n, total)
            load = os.getloadavg()
            got = first_hits_ab(kroot, froot, total, n, args.runs, args.first_per, args.against)
            for w, tags in got["summary"].items():
                for tag, v in tags.items():
                    log(
                        f"  {w} {tag:4}: first {v['first']:.1f} us (again {v['again']:.1f}), "
                        f"FileCacheManager {v['fcm']:.1f} us, {v['ratio']:.3f}x (runs {v['ratio_runs']}), "
                        f"held {v['held']:.0f} of {v['n']}"
                    )
            if args.json:
                print(
                    json.dumps(
                        {
                            "date": datetime.date.today().isoformat(),
                            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
                            f"{platform.system()} {platform.release()}",
                            "versions": versions(),
                            "group": args.group,
                            "entries": n,
                            "load_before": load,
                            "load_after": os.getloadavg(),
                            "first_hits": got,
                        },
                        indent=1,
                    ),
                    flush=True,
                )
            return 0
        if args.fresh_only:
            sizes = sizes[:1]
            kroot, froot = b.work / "kcache-4KB", b.work / "fcm-4KB"
            fill(b.pool, _fill_kcache, str(kroot), 0, sizes[0], 4096)
            fill(b.pool, _fill_fcm, str(froot), 0, sizes[0], 4096)
        else:
            b.dataset("4KB", 4096, sizes, hit_s, put_s)
        reps = args.fresh_reps or (9 if args.quick else 21)
        fresh = fresh_process_first_hit(
            b.work / "kcache-4KB", b.work / "fcm-4KB", sizes[0], reps, against=args.against
        )
        med, pm = fresh["median_us"], fresh["parts_median_us"]
        for w in med:
            log(
                f"  fresh process, first hit: {w} {med[w]:.0f} us (open {pm[w]['open']:.0f}, get "
                f"{pm[w]['get']:.0f}, read {pm[w]['read']:.0f})"
                + (
                    ""
                    if w == "FileCacheManager"
                    else f", {med[w] / med['FileCacheManager']:.2f}x FileCacheManager"
                )
            )
        if args.fresh_only:
            out = {
                "date": datetime.date.today().isoformat(),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
                "versions": versions(),
                "load_before": os.getloadavg(),
                "fresh_process_first_hit": fresh,
                "targets": targets([], {}, fresh),
            }
            if args.json:
                print(json.dumps(out, indent=1), flush=True)
            return 0
        b.admin_commands("4KB", sizes[-1])
        log(
            f"  admin at {sizes[-1]} entries: "
            + ", ".join(f"{k} {v:.3f}" for k, v in b.admin.items() if k != "entries")
        )
        b.dataset("100KB", 100 * 1024, [big_n], hit_s // 2, put_s // 2)
        b.dataset("2MB", 2 * 1024 * 1024, [big_n], max(100, hit_s // 10), max(50, put_s // 10))
        out = {
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}",
            "versions": versions(),
            "runs": args.runs,
            "quick": args.quick,
            "wall_s": round(time.time() - started, 1),
            "fill": b.fill_rates,
            "results": b.results,
            "fresh_process_first_hit": fresh,
            "admin": b.admin,
            "targets": targets(b.results, b.admin, fresh),
        }
        # Results first: removing a few hundred thousand files can take minutes.
        if args.json:
            print(json.dumps(out, indent=1), flush=True)
        else:
            print()
            print(table(b.results))
            print("admin (s):", json.dumps(b.admin))
            print()
            for t in out["targets"]:
                print(
                    f"{'ok  ' if t['met'] else 'MISS'} {t['target']}: {t['value']}{t['unit']} (limit {t['limit']}{t['unit']})"
                )
            sys.stdout.flush()
    finally:
        b.close()
        if not args.keep and not args.dir:
            log(f"removing {work}")
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
