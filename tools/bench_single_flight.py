#!/usr/bin/env python3
"""Single flight across processes: N processes start cold on the same K kernels at once.

    python tools/bench_single_flight.py [--procs 8] [--repeats 3] [--json OUT.json]

Each process is ``python -m kernels.run`` (tests/kernels) with ``KCACHE=1`` on one fresh store:
it imports Triton, computes Triton's key, says it is ready and waits at a barrier (a file); the
barrier is released when all are ready, and each compiles the whole kernel set (10 kernels:
elementwise, reduction, three ``tl.dot`` matmul configurations, a helper call, constexpr
branches, divisibility) for ``cuda:90`` (no GPU needed).

Counted, not inferred: compiles are kcache's ``triton`` puts summed over the processes' own
counters, and Triton's own verdicts (the compilation listener's ``cache_hit=False``) summed the
same way; both must equal K. Timed: from the barrier's release to the last process's last kernel
(wall clock), against one process alone on a fresh store measured the same way. Conditions:

* ``alone``: one process;
* ``same-order``: N processes, each compiling the kernels in the same order (all wait on the
  first, then the next: the worst case for single flight);
* ``rotated``: N processes, each starting at another kernel (they compile different kernels in
  parallel and pick up each other's results);
* ``triton-only``: N processes without kcache on one shared TRITON_CACHE_DIR (Triton has no
  cross-process lock: every process compiles what it misses).

Figures: the median over ``--repeats`` fresh stores. Target: ``same-order`` within 1.5x of ``alone``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from kernels.harness import clean_env, release_barrier, start_kernels  # noqa: E402
from kernels.specs import SPECS  # noqa: E402


def one_round(tmp: Path, procs: int, rotate: bool, kcache: bool) -> dict[str, Any]:
    tmp.mkdir(parents=True)
    env = clean_env(tmp, kcache_dir=tmp / "store" if kcache else None)
    barrier = tmp / "go"
    names = ",".join(SPECS)
    ps = [
        start_kernels(env, tmp / f"p{i}.json", specs=names, barrier=barrier, rotate=i if rotate else 0)
        for i in range(procs)
    ]
    release_barrier(barrier, ps)
    t_release = time.time()
    for p in ps:
        p.wait(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"process failed: {p.stderr.read()[-3000:] if p.stderr else ''}")
    results = [json.loads((tmp / f"p{i}.json").read_text()) for i in range(procs)]
    end = max(r["t_go_wall"] + r["t_compile_all"] for r in results)
    puts = sum(r["process"].get("triton", {}).get("puts", 0) for r in results)
    compiled = sum(x["cache_hit"] is False for r in results for x in r["results"])
    errors = sum(x["error"] is not None for r in results for x in r["results"])
    cubins = {(x["label"], x["cubin_sha256"]) for r in results for x in r["results"]}
    return {
        "wall_s": end - t_release,
        "kcache_puts": int(puts),
        "triton_compiles": compiled,
        "errors": errors,
        "distinct_binaries": len(cubins),
        "waited": int(sum(r["process"].get("triton", {}).get("waited", 0) for r in results)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--no-triton-only", action="store_true", help="skip the Triton-only contrast")
    a = ap.parse_args()
    k = len(SPECS)
    conditions: list[tuple[str, int, bool, bool]] = [
        ("alone", 1, False, True),
        ("same-order", a.procs, False, True),
        ("rotated", a.procs, True, True),
    ]
    if not a.no_triton_only:
        conditions.append(("triton-only", a.procs, False, False))
    rounds: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in conditions}
    root = Path(tempfile.mkdtemp(prefix="kcache-sf-"))
    try:
        for rep in range(a.repeats):
            for name, n, rotate, kc in conditions:  # interleaved, so that machine noise hits all alike
                r = one_round(root / f"{name}-{rep}", n, rotate, kc)
                rounds[name].append(r)
                print(
                    f"  round {rep + 1} {name:<12} wall {r['wall_s']:6.2f}s  kcache puts {r['kcache_puts']:3d}"
                    f"  Triton compiles {r['triton_compiles']:3d}  errors {r['errors']}",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    summary: dict[str, Any] = {}
    for name, rs in rounds.items():
        summary[name] = {
            "wall_s_median": statistics.median(r["wall_s"] for r in rs),
            "wall_s_all": [round(r["wall_s"], 3) for r in rs],
            "kcache_puts": [r["kcache_puts"] for r in rs],
            "triton_compiles": [r["triton_compiles"] for r in rs],
            "errors": sum(r["errors"] for r in rs),
            "distinct_binaries": [r["distinct_binaries"] for r in rs],
        }
    alone = summary["alone"]["wall_s_median"]
    ok = True
    print(f"\n{a.procs} processes x {k} kernels, cold, median of {a.repeats}:")
    print(f"{'condition':<13}{'wall s':>8}{'vs alone':>10}{'compiles (kcache puts / Triton)':>34}")
    for name, s in summary.items():
        ratio = s["wall_s_median"] / alone
        s["ratio_vs_alone"] = ratio
        compiles = f"{s['kcache_puts']} / {s['triton_compiles']}"
        print(f"{name:<13}{s['wall_s_median']:>8.2f}{ratio:>9.2f}x{compiles:>34}")
        if name != "triton-only":
            exact = all(p == k for p in s["kcache_puts"]) and all(c == k for c in s["triton_compiles"])
            ok &= exact and s["errors"] == 0
    target = summary["same-order"]["ratio_vs_alone"] <= 1.5
    print(
        f"\nexactly {k} compiles in every kcache round: {'yes' if ok else 'NO'}; "
        f"same-order within 1.5x of alone: {'yes' if target else 'NO'} "
        f"({summary['same-order']['ratio_vs_alone']:.2f}x)"
    )
    if a.json:
        import triton

        Path(a.json).write_text(
            json.dumps(
                {
                    "date": datetime.date.today().isoformat(),
                    "python": platform.python_version(),
                    "triton": triton.__version__,
                    "procs": a.procs,
                    "kernels": k,
                    "repeats": a.repeats,
                    "summary": summary,
                    "exact": ok,
                    "within_target": target,
                },
                indent=1,
            )
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
