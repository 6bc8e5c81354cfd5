"""On a GPU: JIT launches through KCACHE=1 in two fresh processes; the second is served from the
store and both results are right. Skips cleanly without a GPU. (The same child program as
tools/gpu_smoke.py, which ran on the H200; docs/gpu-results/gpu_smoke.json.)"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_second_process_launches_from_the_store(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "gpu_smoke", Path(__file__).parents[1] / "tools" / "gpu_smoke.py"
    )
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)  # type: ignore[union-attr]
    script = tmp_path / "child.py"
    script.write_text(smoke.CHILD)
    env = {
        **os.environ,
        "KCACHE": "1",
        "KCACHE_DIR": str(tmp_path / "store"),
        "TRITON_CACHE_DIR": str(tmp_path / "t"),
    }
    env.pop("TRITON_CACHE_MANAGER", None)
    if importlib.util.find_spec("kcache") is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert all(r["ok"] and r["enabled"] for r in runs)
    assert runs[0]["counts"]["triton"]["puts"] >= 2
    assert runs[1]["counts"]["triton"].get("puts", 0) == 0
    assert runs[1]["counts"]["triton"]["hits"] >= 2 and runs[1]["counts"]["triton-autotune"]["hits"] == 1


# A small program tuned by coordinate descent (what mode="max-autotune" turns on, without the GEMM
# templates that make max-autotune slow): pointwise kernels with one config, reductions with
# several. Prints Inductor's counters and whether the result matches eager.
_COORDESC_CHILD = r"""
import json, sys
import torch
from torch._dynamo.utils import counters

def f(x, y):
    return torch.softmax(x * 2 + y, dim=-1).sum(dim=0) + x.relu().mean()

torch.manual_seed(0)
x = torch.randn(512, 1000, device="cuda")
y = torch.randn(512, 1000, device="cuda")
out = torch.compile(f)(x, y)
torch.cuda.synchronize()
c = counters["inductor"]
kc = sys.modules.get("kcache")
print(json.dumps({
    "ok": bool(torch.allclose(out, f(x, y), atol=1e-4, rtol=1e-4)),
    "enabled": bool(kc is not None and kc.is_enabled()),
    "coordesc_benchmarks": c["coordesc_tuning_bench"],
    "fx_hits": c["fxgraph_cache_hit"],
    "static_autotuners": c["triton_bundler_load_static_autotuner"],
}))
"""


@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU")
def test_a_warm_coordinate_descent_start_does_not_tune_again(tmp_path: Path) -> None:
    """torch 2.11 re-tunes kernels whose FX graph comes from a cache (pytorch#172819); kcache
    applies the cached coordinate-descent winners, from its store and from Inductor's folder."""
    script = tmp_path / "child.py"
    script.write_text(_COORDESC_CHILD)
    base = {
        **os.environ,
        "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING": "1",
        "KCACHE_DIR": str(tmp_path / "store"),
    }
    base.pop("TRITON_CACHE_DIR", None)
    base["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), base.get("PYTHONPATH", "")])

    def run(folder: str, kcache: bool) -> dict:
        env = {**base, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / folder)}
        if kcache:
            env["KCACHE"] = "1"
        else:
            env.pop("KCACHE", None)
        p = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, p.stderr[-3000:]
        r = json.loads(p.stdout.strip().splitlines()[-1])
        assert r["ok"] and r["enabled"] == kcache
        return r

    cold = run("first", kcache=True)
    assert cold["coordesc_benchmarks"] > 0 and cold["fx_hits"] == 0
    for folder in ("new", "first"):  # kcache's store alone; both warm (Inductor's folder first)
        warm = run(folder, kcache=True)
        assert warm["fx_hits"] >= 1 and warm["static_autotuners"] >= 1, warm
        assert warm["coordesc_benchmarks"] == 0, warm
