#!/usr/bin/env python
"""Benchmark of the commands that read every entry: ``kcache verify`` and ``kcache export``.

Each reads and checks every member of every entry (sha256 too). At 100,000 Triton-shaped
entries (six files, 4 KB) both took ~29 s with nothing on the screen. Measured here, in one run
so that the machine's state is shared, each as a subprocess (interpreter start-up included):

- ``kcache verify --json`` with ``--jobs 1`` (one reader: the anchor, what the command did before)
  and with the default (several readers);
- ``kcache export FILE`` likewise;
- with ``--baseline CHECKOUT``, both commands as another checkout has them (the anchor: the code
  before, e.g. ``git worktree add /tmp/base <commit>``), run by the same interpreter.

The store is filled once through ``Store.put`` in parallel processes (tools/bench_store.py's
groups) and kept with ``--dir`` for later runs. Variants alternate in each run (rotating order);
the figure is the median over ``--runs`` runs, the ratio the median of the runs' own ratios.

    python tools/bench_maintenance.py --entries 100000 --dir /var/tmp/kc-bench --runs 3 --json
"""

from __future__ import annotations

import argparse
import concurrent.futures
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_store  # noqa: E402


def filled(root: Path, n: int) -> None:
    """A store of ``n`` entries at ``root`` (kept: a second run reuses it)."""
    mark = root.parent / f".{root.name}.bench-{n}"  # beside the store: nothing of ours inside it
    if mark.exists():
        return
    workers = max(1, os.cpu_count() or 1)
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        t = bench_store.fill(pool, bench_store._fill_kcache, str(root), 0, n, 4096)
    print(f"filled {n} entries in {t:.0f} s", file=sys.stderr)
    from kcache.store import Store

    s = Store.open(root, max_size=1 << 50)
    s.reconcile(force=True)
    s.close()
    mark.write_text("")


def timed(cmd: list[str], cwd: str | None = None) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr[-500:]}")
    return dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", help="the store to fill (and keep); default: a temporary folder")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="also run the commands of another kcache checkout (run from its folder), side by side: "
        "the anchor (e.g. a worktree of the commit before)",
    )
    args = ap.parse_args(argv)
    tmp = None
    if args.dir:
        root = Path(args.dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kcache-bench-")
        root = Path(tmp.name) / "store"
    filled(root, args.entries)
    out = Path(tempfile.mkdtemp(prefix="kcache-bench-out-"))
    kc = [sys.executable, "-m", "kcache"]
    variants = {
        "verify --jobs 1": kc + ["verify", "--json", "--jobs", "1", "--dir", str(root)],
        "verify": kc + ["verify", "--json", "--dir", str(root)],
        "export --jobs 1": kc + ["export", str(out / "a.kcb"), "--jobs", "1", "--dir", str(root)],
        "export": kc + ["export", str(out / "b.kcb"), "--dir", str(root)],
    }
    base = os.path.abspath(args.baseline) if args.baseline else None
    if base:  # this checkout's commands against the baseline's, as they run by default
        variants = {
            "verify": variants["verify"],
            "export": variants["export"],
            "verify (baseline)": kc + ["verify", "--json", "--dir", str(root)],
            "export (baseline)": kc + ["export", str(out / "c.kcb"), "--dir", str(root)],
        }
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.runs):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            # run from the baseline's folder: `python -m kcache` takes its package before the install
            times[n].append(timed(variants[n], base if n.endswith("(baseline)") else None))
    med = {n: statistics.median(v) for n, v in times.items()}
    anchor = " (baseline)" if args.baseline else " --jobs 1"
    ratios = {
        cmd: statistics.median(a / b for a, b in zip(times[cmd], times[f"{cmd}{anchor}"]))
        for cmd in ("verify", "export")
    }
    shutil.rmtree(out, ignore_errors=True)
    import kcache

    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "kcache": kcache.__version__,
        "entries": args.entries,
        "runs": times,
        "median_s": med,
        "anchor": "baseline checkout" if args.baseline else "--jobs 1",
        "ratio_to_anchor": ratios,
    }
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for n in names:
            print(f"{n:18s} {med[n]:7.2f} s  ({', '.join(f'{t:.2f}' for t in times[n])})")
        for cmd, x in ratios.items():
            print(f"{cmd}: {x:.2f}x the anchor's time ({anchor.strip()})")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
