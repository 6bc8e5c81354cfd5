#!/usr/bin/env python3
"""What the check of a Triton group's metadata (kcache/triton/groupcheck.py) adds to a hit.

In one process: the kernels of tests/kernels are compiled for ``cuda:90`` into a fresh store (no
GPU needed), then each is looked up again through kcache's cache manager (``get_group``, the
call ``triton.compile()`` makes, with the served files), as shipped (``check``) and with the check
replaced by one that accepts every group (``nocheck``); the same for a whole ``triton.compile()``
that hits (``compile``, ``compile_nocheck``: Triton's key, the lookup, its loader); and
``problem()`` alone on each group's bytes. The two are interleaved within every repeat, so that machine noise hits them alike;
figures are medians over ``--repeats`` of the mean CPU time (``process_time``: the box is
shared) per lookup over ``--loops`` passes.

    python tools/bench_groupcheck.py --repeats 7 --loops 200 [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--loops", type=int, default=200)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="kcache-bench-") as tmp:
        os.environ["TRITON_CACHE_DIR"] = os.path.join(tmp, "triton")
        import kcache

        kcache.enable(dir=os.path.join(tmp, "store"))
        import triton
        from kernels.specs import SPECS, compile_spec

        from kcache.triton import groupcheck
        from kcache.triton.manager import KcacheCacheManager

        for spec in SPECS.values():
            compile_spec(spec)
        store = kcache.active_store()
        groups = []
        for ident in store.iter_entry_ids():
            rec, _ = store.read_record(ident)
            if rec is not None and rec.kind == "triton":
                key, _, filename = rec.key.rpartition("/")
                hit = store.get("triton", rec.key, count=False)
                groups.append((key, filename, {n: hit.read(n) for n in hit.names}))
        shipped = groupcheck.servable

        def accept(store: Any, filename: str, hit: Any, target: Any) -> bool:
            groupcheck.note_served(store, hit.record)
            return True

        def lookups() -> float:
            t = time.process_time()
            for _ in range(a.loops):
                for key, filename, _m in groups:
                    assert KcacheCacheManager(key).get_group(filename) is not None
            return (time.process_time() - t) / (a.loops * len(groups)) * 1e6

        def checks() -> float:
            t = time.process_time()
            for _ in range(a.loops):
                for _key, filename, members in groups:
                    assert groupcheck.problem(filename, members, target="cuda:90") is None
            return (time.process_time() - t) / (a.loops * len(groups)) * 1e6

        specs = list(SPECS.values())

        def compiles() -> float:
            t = time.process_time()
            for _ in range(max(1, a.loops // 10)):
                for spec in specs:
                    compile_spec(spec)  # a whole triton.compile() that hits
            return (time.process_time() - t) / (max(1, a.loops // 10) * len(specs)) * 1e6

        runs: dict[str, list[float]] = {
            k: [] for k in ("check", "nocheck", "problem", "compile", "compile_nocheck")
        }
        lookups()  # warm: served files made, memos filled
        compiles()
        for _ in range(a.repeats):
            groupcheck.servable = shipped
            runs["check"].append(lookups())
            runs["compile"].append(compiles())
            groupcheck.servable = accept
            runs["nocheck"].append(lookups())
            runs["compile_nocheck"].append(compiles())
            groupcheck.servable = shipped
            runs["problem"].append(checks())
        med = {k: statistics.median(v) for k, v in runs.items()}
        out = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
            "python": platform.python_version(),
            "triton": triton.__version__,
            "groups": len(groups),
            "metadata_bytes": statistics.median(len(m[f]) for _k, f, m in groups),
            "us_per_hit": {k: round(v, 2) for k, v in med.items()},
            "ratio_check_to_nocheck": round(med["check"] / med["nocheck"], 3),
            "ratio_compile_check_to_nocheck": round(med["compile"] / med["compile_nocheck"], 3),
            "runs": {k: [round(x, 2) for x in v] for k, v in runs.items()},
        }
        kcache.disable()
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
