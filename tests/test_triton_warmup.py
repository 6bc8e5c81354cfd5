"""Triton's one-time work moved off the first kernel's path (issue 19, item 8): gluon imported
in the background when Triton is imported, ``libcuda_dirs()`` remembered across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import kcache
from kcache.triton import warmup

PYTHON = sys.executable


def test_gluon_is_imported_in_the_background(tmp_path: Path) -> None:
    pytest.importorskip("triton.experimental.gluon.language", reason="this Triton has no gluon")
    g = repr(warmup.GLUON)
    code = f"import sys, time, triton\nfor _ in range(200):\n    time.sleep(0.05)\n    if {g} in sys.modules: break\nprint({g} in sys.modules)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE")}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    on = subprocess.run([PYTHON, "-c", code], env={**env, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "s")},
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    off = subprocess.run([PYTHON, "-c", code.replace("range(200)", "range(20)")], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert on.stdout.strip() == "True", on.stderr
    assert off.stdout.strip() == "False", "the control: Triton alone does not import it at import"


def _fake_driver(calls: list[str], dirs: list[str]) -> types.SimpleNamespace:
    def libcuda_dirs() -> list[str]:
        calls.append("ldconfig")
        return dirs

    return types.SimpleNamespace(
        libcuda_dirs=libcuda_dirs,
        knobs=types.SimpleNamespace(nvidia=types.SimpleNamespace(libcuda_path=None)),
    )


@pytest.fixture
def enabled(tmp_path: Path):
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False, torch=False)
    yield kcache.active_store()
    kcache.disable()


def test_libcuda_dirs_remembered_and_checked(enabled, tmp_path: Path) -> None:
    if not os.path.exists("/proc/sys/kernel/random/boot_id"):
        pytest.skip("no boot id: the memo is off by design")
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libcuda.so.1").write_bytes(b"\x7fELF")
    calls: list[str] = []
    first = _fake_driver(calls, [str(libdir)])
    warmup.install_libcuda_memo(first)
    assert first.libcuda_dirs() == [str(libdir)] and calls == ["ldconfig"]
    second = _fake_driver(calls, [str(libdir)])  # another process: its own module, its own lru
    warmup.install_libcuda_memo(second)
    assert second.libcuda_dirs() == [str(libdir)] and calls == ["ldconfig"], "answered from the store"
    (libdir / "libcuda.so.1").unlink()  # the remembered answer no longer holds: ask again
    third = _fake_driver(calls, ["/elsewhere"])
    warmup.install_libcuda_memo(third)
    assert third.libcuda_dirs() == ["/elsewhere"] and calls == ["ldconfig", "ldconfig"]
