"""With torch's Inductor loaded, kernels served by kcache also appear in Triton's own layout
(``<TRITON_CACHE_DIR>/<key>/``), which Inductor's static launcher and TritonBundler read directly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch._inductor")

from kernels.harness import clean_env  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, sys
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
    print(json.dumps({"hits": hits, "name": k.name, "hash": k.hash}))
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
    pytest.importorskip("kernels.elementwise")
    store = tmp_path / "store"
    env = clean_env(tmp_path, kcache_dir=store)
    cold = _run({**env, "TRITON_CACHE_DIR": str(tmp_path / "t1")}, "inductor")
    assert cold["hits"] == [False]
    assert len(_layout(tmp_path / "t1")) == 1  # written when the kernel was stored

    warm = _run({**env, "TRITON_CACHE_DIR": str(tmp_path / "t2")}, "inductor")
    assert warm["hits"] == [True]
    grps = _layout(tmp_path / "t2")
    assert len(grps) == 1  # and when it was served
    children = json.loads(grps[0].read_text())["child_paths"]
    assert any(c.endswith(".cubin") for c in children)
    for child, path in children.items():
        assert Path(path).parent == grps[0].parent and Path(path).name == child and Path(path).is_file()

    # Triton's own cache manager (no kcache) reads that folder as its own: a hit, no compile.
    plain = clean_env(tmp_path)
    plain["TRITON_CACHE_DIR"] = str(tmp_path / "t2")
    assert _run(plain, "plain")["hits"] == [True]


def test_no_mirror_without_inductor(tmp_path: Path) -> None:
    pytest.importorskip("kernels.elementwise")
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    _run({**env, "TRITON_CACHE_DIR": str(tmp_path / "t1")}, "plain")
    assert _layout(tmp_path / "t1") == []
