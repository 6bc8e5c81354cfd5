#!/usr/bin/env python3
"""Cost per call of kcache's fusion-cache lookup, against a Thunder-style key and the floor.

What is timed, per call, for 1, 4 and 16 tensor arguments (CPU tensors of mixed layouts):

* ``floor``: read dtype, shape and stride() of each tensor into a tuple, one dict lookup;
* ``thunder``: a Thunder-style key: an ``lru_cache``'d (contiguity, stride order) function over
  (shape, stride), a tuple of its results plus the dtypes, then an ``lru_cache`` lookup from that
  tuple to the definition;
* ``kcache``: ``FusionCache.lookup(args)`` (runtime arguments -> definition, nothing executed),
  as shipped (torch's C++ tensor guard on the most recent entry, when available);
* ``kcache-py``: the same with ``use_guards=False`` (the pure Python path);
* ``runtime_key``: :func:`kcache.nvfuser.descriptors.runtime_key` on a call shape seen before;
* ``runtime_key-new`` / ``thunder-new``: on shapes never seen (every tensor of every call new:
  memos and lru caches cleared before each pass over a small pool of calls, meta tensors so
  that nothing is allocated);
  ``kcache-new``: ``FusionCache.lookup`` on such calls (same layouts, new sizes: the definition
  is found by descriptors, nothing is built).

And, as a worst case for the guard, ``alt``: calls alternating between two layouts.

Each figure is the median over ``--repeats`` runs of ``timeit`` with ``--loops`` calls each, the
methods interleaved within every repeat so that machine noise hits them alike.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kcache.nvfuser import FusionCache, descriptors  # noqa: E402
from kcache.nvfuser.descriptors import compute_tensor_descriptor, runtime_key  # noqa: E402


def _layouts(n: int, device: str = "cpu", salt: int = 0) -> list[Any]:
    """``n`` tensors of varied layouts: contiguous, transposed, channels_last, sliced, expanded."""
    out = []
    for i in range(n):
        k = i % 5
        a = 2 + salt
        if k == 0:
            t = torch.empty(a, 8, 16, device=device)
        elif k == 1:
            t = torch.empty(16, a + 3, device=device).t()
        elif k == 2:
            t = torch.empty(a, 4, 6, 6, device=device).to(memory_format=torch.channels_last)
        elif k == 3:
            t = torch.empty(a, 32, device=device)[:, 2:18]
        else:
            t = torch.empty(a, 1, 8, device=device).expand(a, 5, 8)
        out.append(t)
    return out


def _fresh_pool(n: int, calls: int) -> list[list[Any]]:
    """``calls`` argument lists of ``n`` meta tensors, each tensor's (sizes, strides) unique."""
    return [_layouts(n, "meta", salt=1000 + c * 7 + 3) for c in range(calls)]


def _make_methods(build: Any) -> dict[str, Any]:
    table: dict[Any, Any] = {}

    def floor(args: Any) -> Any:
        return table.get(tuple([(a.dtype, a.shape, a.stride()) for a in args]))

    @functools.lru_cache(maxsize=2048)
    def contiguity(shape: Any, stride: Any) -> tuple:
        c, o = compute_tensor_descriptor(shape, stride)
        return tuple(c), tuple(o)

    @functools.lru_cache(maxsize=256)
    def get_fd(descs: tuple) -> Any:
        return build(descs)

    def thunder(args: Any) -> Any:
        return get_fd(tuple([(a.dtype, *contiguity(a.shape, a.stride())) for a in args]))

    fc = FusionCache(build)
    fc_py = FusionCache(build, use_guards=False)
    return {
        "floor": (floor, table),
        "thunder": (thunder, (contiguity, get_fd)),
        "kcache": (fc.lookup, fc),
        "kcache-py": (fc_py.lookup, fc_py),
        "runtime_key": (runtime_key, None),
    }


def _alternate(fn: Any, calls: list[Any]) -> Any:
    def two() -> None:
        for a in calls:
            fn(a)

    return two


def _time(fn: Any, args: Any, loops: int) -> float:
    return timeit.Timer("fn(args)", globals={"fn": fn, "args": args}).timeit(loops) / loops


def _bench_new(
    methods: dict[str, Any], pool: list[list[Any]], repeats: int, passes: int
) -> dict[str, list[float]]:
    """Per-call cost on call shapes never seen: every tensor of every call in ``pool`` is new.

    Each pass clears the memos (kcache's, and the Thunder-style lru caches) and then makes one
    call per pool entry; a repeat is ``passes`` passes. The pool is small enough to stay in the
    CPU caches, as a tensor just produced by the previous op would be. The order of the methods
    rotates between repeats.
    """
    contiguity = methods["thunder"][1][0]
    thunder = methods["thunder"][0]
    fc = methods["kcache"][1]

    def rk_new() -> None:
        for _ in range(passes):
            descriptors.clear_memos()
            for a in pool:
                runtime_key(a)

    def th_new() -> None:
        for _ in range(passes):
            contiguity.cache_clear()
            for a in pool:
                thunder(a)

    def fc_new() -> None:
        for _ in range(passes):
            descriptors.clear_memos()
            fc._memo.clear()
            for a in pool:
                fc.lookup(a)

    fns = {"runtime_key-new": rk_new, "thunder-new": th_new, "kcache-new": fc_new}
    out: dict[str, list[float]] = {k: [] for k in fns}
    items = list(fns.items())
    for fn in fns.values():
        fn()
    for r in range(repeats):
        k = r % len(items)
        for name, fn in items[k:] + items[:k]:
            t0 = timeit.default_timer()
            fn()
            out[name].append((timeit.default_timer() - t0) / (len(pool) * passes))
    return out


def bench(sizes: list[int], repeats: int, loops: int, new_loops: int, new_passes: int) -> dict[str, Any]:
    def build(descs: tuple) -> Any:
        return ("definition", descs)

    results: dict[str, Any] = {}
    for n in sizes:
        args = tuple(_layouts(n))
        methods = _make_methods(build)
        floor_table = methods["floor"][1]
        floor_table[tuple([(a.dtype, a.shape, a.stride()) for a in args])] = build(runtime_key(args))
        for fn, _ in methods.values():  # warm every path (guards arm on the second call)
            for _ in range(3):
                fn(args)
        samples: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(repeats):
            for name, (fn, _) in methods.items():
                samples[name].append(_time(fn, args, loops))

        samples.update(_bench_new(methods, _fresh_pool(n, new_loops), repeats, new_passes))

        # Worst case for the guard: two layouts alternating (interleaved like the rest).
        other = tuple(_layouts(n, salt=1))
        floor_table[tuple([(a.dtype, a.shape, a.stride()) for a in other])] = build(runtime_key(other))
        twos = {
            name: _alternate(methods[name][0], [args, other]) for name in ("floor", "kcache", "kcache-py")
        }
        alt: dict[str, list[float]] = {name: [] for name in twos}
        for two in twos.values():
            for _ in range(3):
                two()
        for _ in range(repeats):
            for name, two in twos.items():
                alt[name].append(timeit.Timer(two).timeit(loops // 2) / (loops // 2) / 2)

        med = {k: statistics.median(v) for k, v in samples.items()}
        mins = {k: min(v) for k, v in samples.items()}
        amed = {k: statistics.median(v) for k, v in alt.items()}
        amin = {k: min(v) for k, v in alt.items()}
        fc = methods["kcache"][1]
        results[str(n)] = {
            "us": {k: v * 1e6 for k, v in med.items()},
            "us_min": {k: v * 1e6 for k, v in mins.items()},
            "us_alternating": {k: v * 1e6 for k, v in amed.items()},
            "us_alternating_min": {k: v * 1e6 for k, v in amin.items()},
            "ratio_to_floor": {k: med[k] / med["floor"] for k in methods},
            "thunder_over": {k: med["thunder"] / med[k] for k in ("kcache", "kcache-py", "runtime_key")},
            "fusion_cache_info": fc.cache_info(),
        }
    return results


def _meta(repeats: int, loops: int) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "repeats": repeats,
        "loops": loops,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _table(meta: dict[str, Any], res: dict[str, Any]) -> str:
    lines = [
        f"# {meta['date']}  Python {meta['python']}  torch {meta['torch']}  "
        f"{meta['cpus']} CPUs ({meta['cpu_model']})  median of {meta['repeats']} x {meta['loops']} calls",
        f"{'tensors':>7} {'method':<16} {'us/call':>9} {'min':>8} {'x floor':>8} {'thunder/x':>9}",
    ]
    for n, r in res.items():
        for k, us in r["us"].items():
            xf = r["ratio_to_floor"].get(k)
            th = r["thunder_over"].get(k)
            lines.append(
                f"{n:>7} {k:<16} {us:9.3f} {r['us_min'][k]:8.3f} "
                f"{'' if xf is None else f'{xf:8.3f}':>8} {'' if th is None else f'{th:9.3f}':>9}"
            )
        alt = r["us_alternating"]
        lines.append(
            f"{n:>7} {'alternating 2 layouts':<24} "
            + "  ".join(f"{k} {v:.3f}" for k, v in alt.items())
            + f"  (kcache x floor {alt['kcache'] / alt['floor']:.3f})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tensors", default="1,4,16", help="comma-separated argument counts")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--loops", type=int, default=20000, help="calls per timeit run")
    p.add_argument("--new-loops", type=int, default=64, help="call shapes in the never-seen pool")
    p.add_argument("--new-passes", type=int, default=20, help="passes over that pool per repeat")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    ns = p.parse_args(argv)
    try:
        sizes = [int(x) for x in ns.tensors.split(",") if x]
    except ValueError:
        p.error("--tensors: comma-separated integers")
    res = bench(sizes, ns.repeats, ns.loops, ns.new_loops, ns.new_passes)
    meta = _meta(ns.repeats, ns.loops)
    if ns.json:
        json.dump({"meta": meta, "results": res}, sys.stdout, indent=2)
        print()
    else:
        print(_table(meta, res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
