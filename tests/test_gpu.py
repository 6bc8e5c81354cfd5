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
