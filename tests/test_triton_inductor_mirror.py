"""With torch's Inductor loaded, kernels served by kcache also appear in Triton's own layout
(``<TRITON_CACHE_DIR>/<key>/``), which Inductor's static launcher and TritonBundler read directly."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Triton is a dependency of kcache on Linux (pyproject.toml), torch is not (kcache works without
# it); CI (.ci/run) installs both in each of its environments, so there these tests always run.
pytest.importorskip("triton")
if importlib.util.find_spec("torch") is None:  # (not imported here, 4 s of CPU: the children use it)
    pytest.skip("torch is not installed", allow_module_level=True)

import kernels.elementwise  # noqa: E402, F401  (ours: an import error must fail, not skip)
from kernels.harness import clean_env  # noqa: E402

CHILD = textwrap.dedent(
    """
    import hashlib, json, sys
    if sys.argv[1] == "inductor":
        import torch._inductor  # noqa: F401
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels.elementwise import add_kernel
    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK": "constexpr"}
    k = triton.compile(ASTSource(add_kernel, sig, {"BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
    print(json.dumps({"hits": hits, "name": k.name, "hash": k.hash, "cubin": hashlib.sha256(k.asm["cubin"]).hexdigest()}))
    """
)


def _run(env: dict[str, str], mode: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _layout(triton_dir: Path) -> list[Path]:
    return sorted(triton_dir.glob("*/__grp__*.json"))


def test_kcache_hits_fill_tritons_layout_for_inductor(tmp_path: Path) -> None:
    plain = clean_env(tmp_path)  # Triton alone: the binary every run below must have
    reference = _run({**plain, "TRITON_CACHE_DIR": str(tmp_path / "t0")}, "plain")
    assert reference["hits"] == [False]
    store = tmp_path / "store"
    env = clean_env(tmp_path, kcache_dir=store)
    cold = _run({**env, "TRITON_CACHE_DIR": str(tmp_path / "t1")}, "inductor")
    assert cold["hits"] == [False] and cold["cubin"] == reference["cubin"]
    assert len(_layout(tmp_path / "t1")) == 1  # written when the kernel was stored

    warm = _run({**env, "TRITON_CACHE_DIR": str(tmp_path / "t2")}, "inductor")
    assert warm["hits"] == [True] and warm["cubin"] == reference["cubin"]
    grps = _layout(tmp_path / "t2")
    assert len(grps) == 1  # and when it was served
    children = json.loads(grps[0].read_text())["child_paths"]
    cubins = [c for c in children if c.endswith(".cubin")]
    assert len(cubins) == 1
    for child, path in children.items():
        assert Path(path).parent == grps[0].parent and Path(path).name == child and Path(path).is_file()
    # what Inductor's static launcher loads from there: Triton's own binary
    assert hashlib.sha256(Path(children[cubins[0]]).read_bytes()).hexdigest() == reference["cubin"]

    # Triton's own cache manager (no kcache) reads that folder as its own: a hit, no compile.
    again = _run({**plain, "TRITON_CACHE_DIR": str(tmp_path / "t2")}, "plain")
    assert again["hits"] == [True] and again["cubin"] == reference["cubin"]


def test_no_mirror_without_inductor(tmp_path: Path) -> None:
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    _run({**env, "TRITON_CACHE_DIR": str(tmp_path / "t1")}, "plain")
    assert _layout(tmp_path / "t1") == []
