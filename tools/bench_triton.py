#!/usr/bin/env python3
"""Triton kernels cold and warm, through kcache and through Triton's own cache (CPU, no GPU).

    python tools/bench_triton.py [--repeats 5] [--json OUT.json]
    python tools/bench_triton.py --ab-only [--repeats 5]   # only the per-kernel A/B, in minutes

Each measurement is a fresh process (``python -m kernels.run --specs all --key-first``, from
tests/kernels) compiling the 10-kernel set for ``cuda:90`` (elementwise, reduction, three
``tl.dot`` matmul configurations, a helper call, constexpr branches, divisibility):

* ``kcache cold``: ``KCACHE=1`` on a fresh store; ``kcache warm``: on the store a first run filled;
* ``triton cold``: no kcache, a fresh ``TRITON_CACHE_DIR``; ``triton warm``: the one a run filled.

Reported, median of ``--repeats`` (the four conditions interleaved in every round):

* ``kernels``: the time to get all 10 compiled kernels in the process, once Triton's key is known
  (``triton_key()`` is called first and timed on its own): what the cache itself changes;
* ``hit path``: in the same processes, 10 more passes over the same kernels (all served from the
  cache now, page cache warm): the cost of a hit without a fresh process's noise;
* ``process``: the process's whole wall time, start to exit (interpreter, imports, key, kernels);
* ``triton_key``: ``triton_key()`` in the same processes: Triton's own (it hashes libtriton, about
  415 MB) and kcache's memo (the digest from the store).

And, per round, one more process (``KCACHE=1`` on the warm store, ``TRITON_CACHE_DIR`` the warm
Triton folder) that compiles the 10 kernels ``--ab-passes`` times, each time through kcache and
through Triton's own ``FileCacheManager``, alternating which goes first (``knobs.cache.manager_class``
and kcache's two wrappers of ``triton.compiler.compiler`` swapped per compile): a warm kernel's
whole ``triton.compile`` both ways in the same process, the same machine state. Reported: the
median time per kernel each way and their ratio, the median over rounds (``per kernel``).

Targets: a warm kernel through kcache at most 1.0x Triton's own warm cache (``per kernel``, and
the ``hit path``); kcache warm within 1.05x of Triton warm (``kernels``: a fresh process's first
pass); warm at most 5% of cold (``kernels``); the triton_key saving is shown on its own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PASSES = 11  # the first pass is the fresh process's; the other 10 time the steady hit path
sys.path.insert(0, str(REPO / "tests"))

from kernels.harness import PYTHON, clean_env  # noqa: E402
from kernels.specs import SPECS  # noqa: E402

NO_WARMUP: dict[str, str] = {}  # --no-warmup: kcache's gluon import thread off (KCACHE_NO_TRITON_WARMUP=1)


def bench_env(tmp: Path, kcache_dir: Path | None, **extra: str) -> dict[str, str]:
    """The tests' clean environment with this checkout first on the path: the children time this
    checkout's kcache, not whichever one is installed (another checkout's editable install)."""
    env = clean_env(tmp, kcache_dir=kcache_dir, **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env["PYTHONPATH"]])
    return env


def run_once(tmp: Path, out: Path, kcache_dir: Path | None, triton_dir: Path) -> dict[str, Any]:
    env = bench_env(tmp, kcache_dir, TRITON_CACHE_DIR=str(triton_dir), **NO_WARMUP)
    cmd = [
        PYTHON,
        "-m",
        "kernels.run",
        "--out",
        str(out),
        "--specs",
        "all",
        "--key-first",
        "--passes",
        str(PASSES),
    ]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=str(tmp), capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    r = json.loads(out.read_text())
    compiled = sum(x["cache_hit"] is False for x in r["results"])
    errors = sum(x["error"] is not None for x in r["results"])
    return {
        "process_s": wall,
        "kernels_s": r["t_compile_all"],
        # later passes over the same kernels in the same process (the cold ones compiled them in
        # the first pass): the hit path without a fresh process's noise
        "hit_path_s": statistics.median(r["pass_times"][1:]) if len(r["pass_times"]) > 1 else None,
        "key_s": r["t_key"],
        "import_s": r["t_import_triton"],
        "compiled": compiled,
        "errors": errors,
        "kcache_hits": r["process"].get("triton", {}).get("hits", 0),
    }


AB_CHILD = r"""
import json, statistics, sys, time
import triton
from triton import knobs
import triton.compiler.compiler as cc
from triton.runtime.cache import FileCacheManager
from kernels.specs import SPECS, compile_spec
from kernels.compat import triton_key_module
triton_key_module().triton_key()
import kcache
from kcache.triton.manager import KcacheCacheManager

passes = int(sys.argv[1])
k_compile, k_key = cc.compile, cc.get_cache_key  # kcache's wrappers (KCACHE=1 installed them)
modes = {
    "kcache": (KcacheCacheManager, k_key, k_compile),
    "triton": (FileCacheManager, getattr(k_key, "__wrapped__", k_key), getattr(k_compile, "__wrapped__", k_compile)),
}
def use(m):
    knobs.cache.manager_class, cc.get_cache_key, cc.compile = modes[m]
names = list(SPECS)
for m in modes:  # the first hits (each file read once, each entry verified once)
    use(m)
    for n in names:
        compile_spec(SPECS[n], arch=90, backend="cuda", options={})
time.sleep(1.1)
times = {m: [] for m in modes}
for p in range(passes):
    for n in names:
        for m in (("kcache", "triton") if p % 2 else ("triton", "kcache")):
            use(m)
            t = time.perf_counter_ns()
            compile_spec(SPECS[n], arch=90, backend="cuda", options={})
            times[m].append((time.perf_counter_ns() - t) / 1000)
print(json.dumps({m: statistics.median(v) for m, v in times.items()}))
"""


def ab_once(tmp: Path, warm_store: Path, warm_triton: Path, passes: int) -> dict[str, float]:
    """One process, warm kernels through kcache and Triton's own cache alternately (see the
    module doc). Returns the median microseconds per kernel each way."""
    env = bench_env(tmp, warm_store, TRITON_CACHE_DIR=str(warm_triton))
    proc = subprocess.run(
        [PYTHON, "-c", AB_CHILD, str(passes)],
        env=env,
        cwd=str(tmp),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ab_round(root: Path, rep: int, warm_store: Path, warm_triton: Path, passes: int) -> dict[str, float]:
    """Round ``rep``'s A/B process (:func:`ab_once` in a folder of its own), its figures printed."""
    d = root / f"ab-{rep}"
    d.mkdir()
    x = ab_once(d, warm_store, warm_triton, passes)
    print(
        f"  round {rep + 1} per kernel, one process: kcache {x['kcache']:.0f} us, Triton "
        f"{x['triton']:.0f} us ({x['kcache'] / x['triton']:.3f}x)",
        flush=True,
    )
    return x


def write_json(path: str | None, repeats: int, **fields: Any) -> None:
    """The report as JSON at ``path`` (when given): date, versions, repeats, then ``fields``."""
    if not path:
        return
    import triton

    head = {
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "triton": triton.__version__,
        "repeats": repeats,
    }
    Path(path).write_text(json.dumps(head | fields, indent=1))


def ab_only(root: Path, warm_store: Path, warm_triton: Path, a: argparse.Namespace) -> int:
    """``--ab-only``: the per-kernel A/B alone (see the module doc), ``--repeats`` processes."""
    ab = [ab_round(root, rep, warm_store, warm_triton, a.ab_passes) for rep in range(a.repeats)]
    ratio = statistics.median(x["kcache"] / x["triton"] for x in ab)
    print(
        f"kcache / Triton, a warm kernel, alternating in one process: {ratio:.3f}x (median of {len(ab)}; target <= 1.0)"
    )
    write_json(a.json, a.repeats, per_kernel_ab_us=ab, kcache_vs_triton_per_kernel=ratio)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ab-passes", type=int, default=20, help="passes of the in-process A/B, per round")
    ap.add_argument(
        "--no-warmup",
        action="store_true",
        help="KCACHE_NO_TRITON_WARMUP=1: no gluon import thread beside the first kernels (an AOT "
        "process like this one never needs gluon; a JIT program imports it at its first launch)",
    )
    ap.add_argument(
        "--ab-only",
        action="store_true",
        help="only the in-process A/B (a warm kernel through kcache and through Triton's own cache), "
        "--repeats processes of --ab-passes passes each: the per-kernel target in a few minutes",
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.no_warmup:
        NO_WARMUP["KCACHE_NO_TRITON_WARMUP"] = "1"
    root = Path(tempfile.mkdtemp(prefix="kcache-bench-triton-"))
    n = len(SPECS)
    conds = ["kcache cold", "kcache warm", "triton cold", "triton warm"]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in conds}
    ab: list[dict[str, float]] = []
    try:
        warm_store, warm_triton = root / "warm-store", root / "warm-triton"
        # fill the warm caches (not measured)
        run_once(root, root / "fill-k.json", warm_store, root / "unused-triton")
        run_once(root, root / "fill-t.json", None, warm_triton)
        if a.ab_only:
            return ab_only(root, warm_store, warm_triton, a)
        for rep in range(a.repeats):
            for c in conds:
                d = root / f"{c.replace(' ', '-')}-{rep}"
                d.mkdir()
                if c == "kcache cold":
                    r = run_once(d, d / "r.json", d / "store", d / "triton")
                elif c == "kcache warm":
                    r = run_once(d, d / "r.json", warm_store, d / "triton")
                elif c == "triton cold":
                    r = run_once(d, d / "r.json", None, d / "triton")
                else:
                    r = run_once(d, d / "r.json", None, warm_triton)
                runs[c].append(r)
                print(
                    f"  round {rep + 1} {c:<12} process {r['process_s']:.3f}s  kernels {r['kernels_s']:.4f}s"
                    f"  triton_key {r['key_s']:.4f}s  compiled {r['compiled']}/{n}",
                    flush=True,
                )
            ab.append(ab_round(root, rep, warm_store, warm_triton, a.ab_passes))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med: dict[str, dict[str, float]] = {}
    for c, rs in runs.items():
        med[c] = {
            k: statistics.median(r[k] for r in rs)
            for k in ("process_s", "kernels_s", "key_s", "import_s", "hit_path_s")
        }
        med[c]["compiled"] = max(r["compiled"] for r in rs)
        med[c]["errors"] = sum(r["errors"] for r in rs)
    print(f"\n{n} kernels, fresh processes, median of {a.repeats}:")
    print(
        f"{'condition':<14}{'kernels s':>11}{'hit path s':>12}{'process s':>11}{'triton_key s':>14}{'compiled':>10}"
    )
    for c in conds:
        m = med[c]
        print(
            f"{c:<14}{m['kernels_s']:>11.4f}{m['hit_path_s']:>12.4f}{m['process_s']:>11.3f}"
            f"{m['key_s']:>14.4f}{int(m['compiled']):>7}/{n}"
        )
    kw, tw = med["kcache warm"], med["triton warm"]
    kc, tc = med["kcache cold"], med["triton cold"]
    ratios = {
        "kcache_warm_vs_triton_warm_kernels": kw["kernels_s"] / tw["kernels_s"],
        "kcache_warm_vs_cold_kernels": kw["kernels_s"] / kc["kernels_s"],
        "triton_warm_vs_cold_kernels": tw["kernels_s"] / tc["kernels_s"],
        "kcache_vs_triton_hit_path": kw["hit_path_s"] / tw["hit_path_s"],
        "kcache_warm_vs_triton_warm_process": kw["process_s"] / tw["process_s"],
        "kcache_warm_vs_cold_process": kw["process_s"] / kc["process_s"],
        "triton_key_saving_s": tw["key_s"] - kw["key_s"],
        "kcache_vs_triton_per_kernel": statistics.median(x["kcache"] / x["triton"] for x in ab),
    }
    targets = {
        "a warm kernel through kcache at most 1.0x Triton's own (per kernel, one process)": ratios[
            "kcache_vs_triton_per_kernel"
        ]
        <= 1.0,
        "kcache warm within 1.05x of Triton warm (kernels)": ratios["kcache_warm_vs_triton_warm_kernels"]
        <= 1.05,
        "kcache warm at most 5% of cold (kernels)": ratios["kcache_warm_vs_cold_kernels"] <= 0.05,
        "warm processes compile nothing": kw["compiled"] == 0 and tw["compiled"] == 0,
    }
    print()
    print(
        f"kcache warm / Triton warm, kernels: {ratios['kcache_warm_vs_triton_warm_kernels']:.3f}x (target <= 1.05)"
    )
    print(
        f"kcache warm / kcache cold, kernels: {ratios['kcache_warm_vs_cold_kernels'] * 100:.1f}% (target <= 5%)"
    )
    print(f"kcache / Triton, steady hit path (10 more passes): {ratios['kcache_vs_triton_hit_path']:.3f}x")
    print(
        f"kcache / Triton, a warm kernel, alternating in one process: "
        f"{ratios['kcache_vs_triton_per_kernel']:.3f}x (median of {len(ab)} rounds; target <= 1.0)"
    )
    print(f"kcache warm / Triton warm, whole process: {ratios['kcache_warm_vs_triton_warm_process']:.3f}x")
    print(
        f"triton_key(): Triton's own {tw['key_s'] * 1000:.0f} ms, kcache's memo {kw['key_s'] * 1000:.1f} ms "
        f"(saves {ratios['triton_key_saving_s'] * 1000:.0f} ms per process)"
    )
    for t, ok in targets.items():
        print(f"  {'met' if ok else 'MISSED'}: {t}")
    write_json(
        a.json,
        a.repeats,
        kernels=n,
        median=med,
        runs=runs,
        ratios=ratios,
        per_kernel_ab_us=ab,
        targets=targets,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
