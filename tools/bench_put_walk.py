#!/usr/bin/env python3
"""What a put's walk of the store's folder costs a writing process (session 26).

A put walks what is beside the committed entries (``tmp/``, ``trash/``, the index: see
``kcache/store/eviction.py``) when its process's last walk is older than ``REMEASURE_S``, and
no oftener than keeps the walks to ``REMEASURE_SHARE`` of the time. What the walk costs grows
with what ``trash/`` holds: removed entries a live process still holds (a ``kcache clear`` while
programs run) stay there whole. This puts 2 KB groups in a loop for ``--seconds`` into a store
whose ``trash/`` holds ``--held`` such folders (eight files each, held by this process as a
live program holds them), with the share as it is and, side by side, with no share (a walk every
``REMEASURE_S``, as before), alternating, ``--repeats`` times each; in fresh processes.

    python tools/bench_put_walk.py --held 3000 --seconds 3 --repeats 3 [--json OUT.json]

Reported per condition (median over the runs): the share of the loop's time spent walking,
walks, puts per second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def run_one(held: int, seconds: float, share: float | None) -> dict[str, Any]:
    """One process: the store, its held trash, the put loop; what it measured."""
    import fcntl
    import time

    from kcache.store import Store
    from kcache.store import tunables as T

    if share is not None:
        T.REMEASURE_SHARE = share
    with tempfile.TemporaryDirectory(prefix="kcache-bench-walk-") as tmp:
        root = Path(tmp) / "store"
        s = Store.open(root, max_size=1 << 40)
        s.disk.catalogue.on_turn = lambda: None  # the flush thread's walks are not the subject
        holds = []
        for i in range(held):
            d = root / "trash" / f"{i:040x}.held"
            d.mkdir()
            for j in range(8):
                (d / f"m{j}").write_bytes(b"x" * 3000)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_SH)  # as a live process holds a removed entry's folder
            holds.append(fd)
        ev = s.disk.evictor
        walk = ev.measure
        spent = [0.0, 0]

        def timed(shards: bool = True) -> Any:
            t = time.perf_counter()
            try:
                return walk(shards)
            finally:
                spent[0] += time.perf_counter() - t
                spent[1] += 1

        ev.measure = timed  # type: ignore[method-assign]
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < seconds:
            s.put("triton", f"k{n}", {"a.bin": bytes([n % 251]) * 2000})
            n += 1
        el = time.perf_counter() - t0
        s.close()
        for fd in holds:
            os.close(fd)
    return {"walk_share": spent[0] / el, "walks": spent[1], "walk_s": spent[0], "puts_per_s": n / el}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--held", type=int, default=3000, help="held folders in trash/ (eight files each)")
    ap.add_argument("--seconds", type=float, default=3.0, help="how long each run puts")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--one", choices=["share", "every"], help=argparse.SUPPRESS)  # a child run
    a = ap.parse_args(argv)
    if a.one:
        # "every": no share (1e9 makes it REMEASURE_S), as before session 26
        print(json.dumps(run_one(a.held, a.seconds, None if a.one == "share" else 1e9)))
        return 0
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env = {k: v for k, v in env.items() if not k.startswith(("KCACHE", "TRITON_"))}
    runs: dict[str, list[dict[str, Any]]] = {"every": [], "share": []}
    for rep in range(a.repeats):
        for cond in ("every", "share"):
            cmd = [
                sys.executable,
                __file__,
                "--one",
                cond,
                "--held",
                str(a.held),
                "--seconds",
                str(a.seconds),
            ]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            runs[cond].append(r)
            print(
                f"run {rep + 1}, {cond:5}: {r['walk_share']:.1%} of the time walking, {r['walks']} walks, "
                f"{r['puts_per_s']:.0f} puts/s",
                flush=True,
            )
    med = {c: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for c, rs in runs.items()}
    for c, m in med.items():
        print(
            f"median, {c:5}: {m['walk_share']:.1%} walking, {m['walks']:.0f} walks, {m['puts_per_s']:.0f} puts/s"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"held": a.held, "seconds": a.seconds, "runs": runs, "median": med})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
