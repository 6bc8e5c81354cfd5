"""A served graph's load against Inductor's own warm folder (issue 33): `AOTAutogradCache.inductor_load`.

    python tools/bench_inductor_load.py [--rounds 5] [--shapes 1x16,4x32] [--profile DIR] [--json OUT]

On the CPU (torch's FX graph and AOTAutograd caches work there, with C++ kernels), the small
encoder of docs/examples/torch_compile is compiled in fresh processes, two conditions alternating
(which goes first alternates too):

- ``inductor``: plain torch (no kcache), Inductor's own folder warm (filled by one plain run);
- ``kcache``: ``KCACHE=1`` with a warm store (filled by one run) and a new, empty Inductor folder
  and ``TMPDIR`` in every round (a new node).

Each child reports Dynamo's own timer for ``AOTAutogradCache.inductor_load`` (the served graph's
FX entries read, checked, unpickled and their kernels loaded: ``compile_times``, summed over the
child's graphs), the first call at each shape and the whole process. Medians of ``--rounds``
rounds and the ratio kcache / inductor. ``--profile DIR``: one more child of each condition
under cProfile (first calls only), its pstats written to DIR/<condition>.prof.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "torch_compile"

CHILD = r"""
import json, os, sys, time
t_start = time.perf_counter()
sys.path.insert(0, os.environ["BENCH_EXAMPLE"])
import torch
from model import make_inputs, make_model
prof = None
if os.environ.get("BENCH_PROFILE"):
    import cProfile
    prof = cProfile.Profile()
model = torch.compile(make_model(), dynamic=False)
firsts = {}
for shape in os.environ["BENCH_SHAPES"].split(","):
    B, S = (int(v) for v in shape.split("x"))
    (ids,) = make_inputs(B, S)
    if prof is not None:
        prof.enable()
    t = time.perf_counter()
    with torch.no_grad():
        model(ids)
    firsts[shape] = time.perf_counter() - t
    if prof is not None:
        prof.disable()
if prof is not None:
    prof.dump_stats(os.environ["BENCH_PROFILE"])
from torch._dynamo.utils import compilation_time_metrics, counters
load = compilation_time_metrics.get("AOTAutogradCache.inductor_load", [])
print(json.dumps({
    "inductor_load_s": sum(load), "loads": len(load), "first_s": firsts,
    "script_s": time.perf_counter() - t_start,
    "fx": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
    "aot": {k: v for k, v in counters["aot_autograd"].items() if "autograd_cache" in k},
}))
"""


def child_env(base: Path, tag: str, *, kcache: bool, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_"))}
    env.pop("PYTHONPATH", None)
    tmp = base / f"tmp-{tag}"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(base / "home"),
        XDG_CACHE_HOME=str(base / "xdg"),
        TMPDIR=str(tmp),
        TORCHINDUCTOR_CACHE_DIR=str(folder),
        OMP_NUM_THREADS="1",
        BENCH_EXAMPLE=str(EXAMPLE),
        PYTHONWARNINGS="ignore",
    )
    if kcache:
        env.update(KCACHE="1", KCACHE_DIR=str(base / "store"))
    return env


def run_child(env: dict[str, str], shapes: str, profile: str | None = None) -> dict:
    env = dict(env, BENCH_SHAPES=shapes)
    if profile:
        env["BENCH_PROFILE"] = profile
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"child failed ({r.returncode}):\n{r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_s"] = wall
    return out


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="1x16,4x32")
    ap.add_argument("--profile", metavar="DIR", help="also one cProfile'd child of each condition")
    ap.add_argument("--json", metavar="OUT", help="write every child's figures there")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="kcache-bench-load-"))
    try:
        plain_folder = base / "ind-plain"
        warm_plain = run_child(child_env(base, "plain", kcache=False, folder=plain_folder), a.shapes)
        warm_store = run_child(child_env(base, "kc-cold", kcache=True, folder=base / "ind-kc-cold"), a.shapes)
        runs: dict[str, list[dict]] = {"inductor": [], "kcache": []}
        for i in range(a.rounds):
            order = ("inductor", "kcache") if i % 2 == 0 else ("kcache", "inductor")
            for cond in order:
                if cond == "inductor":
                    env = child_env(base, "plain", kcache=False, folder=plain_folder)  # its TMPDIR warm too
                else:
                    env = child_env(base, f"kc-{i}", kcache=True, folder=base / f"ind-kc-{i}")
                got = run_child(env, a.shapes)
                if got["fx"].get("fxgraph_cache_miss") or not got["loads"]:
                    raise SystemExit(f"{cond} round {i} was not served: {got['fx']} {got['aot']}")
                runs[cond].append(got)
        if a.profile:
            os.makedirs(a.profile, exist_ok=True)
            run_child(child_env(base, "plain", kcache=False, folder=plain_folder), a.shapes,
                      os.path.join(a.profile, "inductor.prof"))  # fmt: skip
            run_child(child_env(base, "kc-p", kcache=True, folder=base / "ind-kc-p"), a.shapes,
                      os.path.join(a.profile, "kcache.prof"))  # fmt: skip
        res: dict = {
            "python": sys.version.split()[0],
            "rounds": a.rounds,
            "shapes": a.shapes,
            "cold_s": {"inductor": warm_plain["process_s"], "kcache": warm_store["process_s"]},
        }
        for key in ("inductor_load_s", "script_s", "process_s"):
            med = {c: median(rows, key) for c, rows in runs.items()}
            res[key] = {
                **{c: round(v, 4) for c, v in med.items()},
                "ratio": round(med["kcache"] / med["inductor"], 3),
            }
        first = {c: [sum(r["first_s"].values()) for r in rows] for c, rows in runs.items()}
        res["first_calls_s"] = {c: round(statistics.median(v), 4) for c, v in first.items()}
        res["first_calls_s"]["ratio"] = round(
            res["first_calls_s"]["kcache"] / res["first_calls_s"]["inductor"], 3
        )
        res["inductor_load_each"] = {
            c: [round(r["inductor_load_s"], 4) for r in rows] for c, rows in runs.items()
        }
        if a.json:
            Path(a.json).write_text(json.dumps({"summary": res, "runs": runs}, indent=1))
        print(json.dumps(res, indent=1))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
