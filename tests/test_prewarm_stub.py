"""The stand-in libcuda that prewarm builds Triton's host code against: one folder for every
process (Triton 3.9 hashes the folder into the key of its ``cuda_utils``), and never a folder
another user could have written, since the library is loaded into the process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")):
    pytest.skip("no C compiler: prewarm builds no host code here", allow_module_level=True)

PROBE = (
    "from kcache.prewarm.stub_libcuda import stub_libcuda, stub_error\n"
    "d = stub_libcuda()\n"
    "print(d if d else 'ERROR ' + str(stub_error()))\n"
)


def _stub(tmp: Path) -> str:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env["XDG_CACHE_HOME"] = str(tmp / "xdg")
    env["HOME"] = str(tmp / "home")
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.strip().splitlines()[-1]
    assert not out.startswith("ERROR"), out
    return out


def test_the_stub_folder_is_the_same_in_every_process(tmp_path: Path) -> None:
    first = _stub(tmp_path)
    assert Path(first).parent == tmp_path / "xdg" / "kcache-stub-libcuda"
    assert (Path(first) / "libcuda.so.1").is_file()  # kept after the process: the next one uses it
    st = os.stat(first)
    assert st.st_mode & 0o077 == 0 and st.st_uid == os.geteuid()
    assert _stub(tmp_path) == first
    assert [n for n in os.listdir(Path(first).parent) if n.startswith(".build-")] == []


def test_a_stub_folder_others_can_write_is_not_loaded(tmp_path: Path) -> None:
    first = _stub(tmp_path)
    os.chmod(first, 0o777)  # as if another user could have replaced the library
    other = _stub(tmp_path)
    assert other != first and not other.startswith(str(tmp_path / "xdg"))
    os.chmod(first, 0o700)
    base = Path(first).parent
    os.chmod(base, 0o777)  # a parent others may write (no sticky bit): they could swap the folder
    try:
        assert _stub(tmp_path) != first
    finally:
        os.chmod(base, 0o700)
    assert _stub(tmp_path) == first
