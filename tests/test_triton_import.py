"""``kcache import --triton-cache DIR``: a Triton cache built by plain Triton (no kcache), moved
away from where it was built, imported; then a ``KCACHE=1`` process gets every kernel from kcache
(while plain Triton, on the moved folder, compiles everything again)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

# Triton is a dependency of kcache on Linux (pyproject.toml) and CI installs it (.ci/run): these
# tests skip only where Triton does not exist (other platforms), never in CI.
pytest.importorskip("triton")

from kernels.harness import PYTHON, clean_env, entries_by_kind, run_kernels  # noqa: E402
from kernels.specs import SPECS  # noqa: E402

from kcache.store import Store  # noqa: E402
from kcache.triton import manager as mgr_mod  # noqa: E402
from kcache.triton.importer import import_triton_cache  # noqa: E402
from kcache.triton.manager import KcacheCacheManager  # noqa: E402

FAKE_KEY = "Q" * 52
LAUNCHER = "__triton_launcher.cpython-311-x86_64-linux-gnu.so"


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A Triton cache folder built by plain Triton, plus a launcher, an autotune file and some
    debris; then copied elsewhere and the original moved away (its group files name dead paths)."""
    tmp = tmp_path_factory.mktemp("triton-import")
    built = tmp / "built"
    env = clean_env(tmp, TRITON_CACHE_DIR=str(built))
    result = run_kernels(env, tmp / "plain.json", specs="all")
    assert not result["kcache_enabled"] and all(r["cache_hit"] is False for r in result["results"])
    key_dirs = sorted(p for p in built.iterdir() if p.is_dir())
    assert len(key_dirs) == len(SPECS)
    (key_dirs[0] / LAUNCHER).write_bytes(b"\x7fELF" + b"\0" * 60)
    os.chmod(key_dirs[0] / LAUNCHER, 0o700)
    (built / FAKE_KEY).mkdir()
    (built / FAKE_KEY / "matmul_kernel.autotune.json").write_text(
        json.dumps(
            {
                "key": [512, 512, "torch.float16"],
                "configs_timings": [[{"kwargs": {"BLOCK": 64}, "num_warps": 4}, [0.1, 0.1, 0.1]]],
            }
        )
    )
    (built / FAKE_KEY / "__grp__ghost.json").write_text(
        json.dumps(
            {"child_paths": {"ghost.json": "/nowhere/ghost.json", "ghost.cubin": "/nowhere/ghost.cubin"}}
        )
    )
    (built / FAKE_KEY / "ghost.json").write_text("{}")  # its cubin is missing: a torn group
    (built / "not-a-key").mkdir()
    moved = tmp / "moved"
    shutil.copytree(built, moved, symlinks=True)
    built.rename(tmp / "built-gone")
    cubins = {r["label"]: r["cubin_sha256"] for r in result["results"]}
    return {"tmp": tmp, "dir": moved, "cubins": cubins, "key_dirs": [moved / p.name for p in key_dirs]}


def kcache_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "kcache", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_import_then_a_kcache_process_hits_every_kernel(triton_cache: dict[str, Any], tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = clean_env(tmp_path)
    out = kcache_cli(
        "import", "--triton-cache", str(triton_cache["dir"]), "--dir", str(store), "--json", env=env
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["kernels"] == len(SPECS) and report["kernels_present"] == 0
    assert report["aux"] == 1 and report["autotune"] == 0 and report["other_triton"] == 0
    whys = {Path(s["path"]).name: s["why"] for s in report["skipped"]}
    assert "unknown GPU" in whys["matmul_kernel.autotune.json"]
    assert "incomplete" in whys["__grp__ghost.json"]
    assert "not a Triton cache key folder" in whys["not-a-key"]
    kinds = entries_by_kind(store)
    assert kinds["triton"] == len(SPECS) and kinds["triton-aux"] == 1 and "triton-autotune" not in kinds

    again = kcache_cli(
        "import", "--triton-cache", str(triton_cache["dir"]), "--dir", str(store), "--json", env=env
    )
    assert json.loads(again.stdout)["kernels_present"] == len(SPECS)
    assert entries_by_kind(store) == kinds

    res = run_kernels(clean_env(tmp_path, kcache_dir=store), tmp_path / "k.json", specs="all")
    for r in res["results"]:
        assert r["error"] is None and r["cache_hit"] is True, r
        assert r["kcache"]["hits"] == 1 and r["kcache"]["puts"] == 0, r
        assert r["cubin_sha256"] == triton_cache["cubins"][r["label"]]
    assert res["process"]["triton"].get("puts", 0) == 0


def test_plain_triton_misses_on_the_moved_folder(triton_cache: dict[str, Any], tmp_path: Path) -> None:
    """The contrast: Triton's own cache names absolute paths, so the moved copy compiles again."""
    copy = tmp_path / "copy"
    shutil.copytree(triton_cache["dir"], copy)
    res = run_kernels(
        clean_env(tmp_path, TRITON_CACHE_DIR=str(copy)), tmp_path / "t.json", specs="add,row_sum"
    )
    assert all(r["cache_hit"] is False for r in res["results"])


def test_host_code_from_a_folder_others_can_write_is_skipped(
    triton_cache: dict[str, Any], tmp_path: Path
) -> None:
    src = tmp_path / "cache"
    shutil.copytree(triton_cache["dir"], src)
    launcher = next(src.glob(f"*/{LAUNCHER}"))
    os.chmod(launcher, 0o775)
    store = Store.open(tmp_path / "store")
    try:
        report = import_triton_cache(store, src)
    finally:
        store.close()
    assert report["aux"] == 0 and report["kernels"] == len(SPECS)
    assert any("not trusted" in s["why"] for s in report["skipped"] if s["path"].endswith(LAUNCHER))


def test_autotune_results_are_imported_for_a_gpu_model_the_caller_names(
    triton_cache: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(tmp_path / "store")
    try:
        report = import_triton_cache(store, triton_cache["dir"], autotune_gpu="NVIDIA H200")
        assert report["autotune"] == 1
        monkeypatch.setattr(mgr_mod, "active_cache", lambda: store)
        monkeypatch.setattr(mgr_mod, "_gpu_model", lambda: "NVIDIA H200")
        path = KcacheCacheManager(FAKE_KEY).get_file("matmul_kernel.autotune.json")
        assert path and json.loads(Path(path).read_text())["key"][0] == 512
        monkeypatch.setattr(mgr_mod, "_gpu_model", lambda: "NVIDIA H100 80GB HBM3")
        assert KcacheCacheManager(FAKE_KEY).get_file("matmul_kernel.autotune.json") is None
    finally:
        store.close()


def test_import_of_a_missing_folder_is_a_clean_error(tmp_path: Path) -> None:
    out = kcache_cli(
        "import",
        "--triton-cache",
        str(tmp_path / "nope"),
        "--dir",
        str(tmp_path / "s"),
        env=clean_env(tmp_path),
    )
    assert out.returncode != 0 and "Traceback" not in out.stderr and "nope" in out.stderr
