"""Triton's one-time work moved off the first kernel's path (issue 19, item 8): gluon imported
in the background once the program defines a kernel of its own, ``libcuda_dirs()`` remembered
across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import kcache
from kcache.triton import warmup

PYTHON = sys.executable


PROGRAM = """
import json, sys, time, types
import triton
{define}
for _ in range({polls}):
    if {entry!r} in sys.modules:
        break
    time.sleep(0.05)
warmup = sys.modules.get("kcache.triton.warmup")
print(json.dumps({{"gluon": {entry!r} in sys.modules, "started": bool(getattr(warmup, "_started", False))}}))
"""
KERNEL = """
@triton.jit
def k(x):  # the program's first kernel of its own
    pass
"""
# A kernel as Inductor runs it: the module it generated, run under the name Inductor gives it
INDUCTOR_KERNEL = """
src = "import triton\\n@triton.jit\\ndef triton_poi_fused_0(x):\\n    pass\\n"
path = sys.argv[1]
open(path, "w").write(src)
mod = types.ModuleType("torch._inductor.runtime.compile_tasks.cfakekey")
mod.__file__ = path
exec(compile(src, path, "exec"), mod.__dict__)
"""


def _program(tmp_path: Path, define: str, kcache: bool, polls: int) -> dict[str, bool]:
    script = tmp_path / "program.py"  # @triton.jit reads its source from a file
    script.write_text(PROGRAM.format(define=define, polls=polls, entry=warmup.ENTRY))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    if kcache:
        env.update(KCACHE="1", KCACHE_DIR=str(tmp_path / "s"))
    r = subprocess.run([PYTHON, "-W", "ignore", str(script), str(tmp_path / "generated.py")], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got: dict[str, bool] = json.loads(r.stdout.strip().splitlines()[-1])
    return got


def test_gluon_is_imported_in_the_background_once_the_program_defines_a_kernel(tmp_path: Path) -> None:
    pytest.importorskip("triton.experimental.gluon.language", reason="this Triton has no gluon")
    on = _program(tmp_path, KERNEL, kcache=True, polls=200)
    assert on == {"gluon": True, "started": True}, on
    off = _program(tmp_path, KERNEL, kcache=False, polls=20)
    assert off["gluon"] is False, "the control: Triton alone does not import it at a kernel's definition"


@pytest.mark.parametrize("define", ["", INDUCTOR_KERNEL], ids=["import-only", "inductor-kernel"])
def test_no_gluon_import_where_no_kernel_of_the_program_s_is_defined(tmp_path: Path, define: str) -> None:
    """torch imports Triton in every process that compiles, or merely asks whether Triton is
    there, and Inductor launches its kernels through compiled launchers: none of its own
    processes imports gluon (H100, session 22). kcache's pre-import waits for a kernel that the
    JIT may specialise (was: started at ``import triton``, in every such process)."""
    pytest.importorskip("triton.experimental.gluon.language", reason="this Triton has no gluon")
    got = _program(tmp_path, define, kcache=True, polls=10)
    assert got == {"gluon": False, "started": False}, got


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


RACE = """
import builtins, sys, threading, time
class Slow:  # holds the warm-up thread inside gluon's __init__ (its locks held) for a while
    def find_spec(self, name, path=None, target=None):
        if threading.current_thread().name == "kcache-triton-warmup" and name == {slow!r}:
            time.sleep({delay})
        return None
sys.meta_path.insert(0, Slow())
import triton
time.sleep(0.1)
{body}
import triton.experimental.gluon.language as gl
assert gl.constexpr is not None
print("OK", type(builtins.__import__).__name__)
"""
JIT = """
import torch, triton.language as tl
from kcache.prewarm.triton_aot import install_stand_in
install_stand_in(90, host_code=False)
@triton.jit
def k(x_ptr, B: tl.constexpr):
    o = tl.arange(0, B)
    tl.store(x_ptr + o, tl.load(x_ptr + o) + 1)
k.warmup(torch.empty(1024, device="meta"), B=128, grid=(1,))
"""


@pytest.mark.parametrize(
    "slow, delay, body",
    [
        # The three that raised _DeadlockError in the program's thread before the guard (Triton
        # 3.9; CI saw the JIT's first kernel do it): the program enters gluon by another
        # submodule while the warm-up thread holds gluon's package lock.
        ("triton.experimental.gluon._runtime", 0.4, "import triton.experimental.gluon.nvidia.hopper"),
        ("triton.experimental.gluon._runtime", 0.8, "import triton.experimental.gluon.nvidia.hopper"),
        ("triton.experimental.gluon._runtime", 0.2, "from triton.experimental.gluon.nvidia import hopper"),
        ("triton.experimental.gluon.language._core", 0.4, "from triton.experimental import gluon"),
        (
            "triton.experimental.gluon.language._layouts",
            0.4,
            "import importlib; importlib.import_module('triton.experimental.gluon.nvidia.hopper')",
        ),
        ("triton.experimental.gluon._runtime", 0.4, JIT),
        ("triton.experimental.gluon.nvidia", 0.6, JIT),
    ],
)
def test_the_program_importing_gluon_meanwhile_never_deadlocks(
    tmp_path: Path, slow: str, delay: float, body: str
) -> None:
    pytest.importorskip("triton.experimental.gluon.language", reason="this Triton has no gluon")
    if "torch" in body:
        pytest.importorskip("torch")
    code = RACE.format(slow=slow, delay=delay, body=body)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env.update(
        KCACHE="1", KCACHE_DIR=str(tmp_path / "s"), HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "x")
    )
    script = tmp_path / "program.py"  # @triton.jit needs a source file
    script.write_text(code)
    r = subprocess.run(
        [PYTHON, "-W", "ignore", str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert "_DeadlockError" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 0, r.stderr[-2000:]
    # The guard on builtins.__import__ is gone once the pre-import is over.
    assert r.stdout.split()[-2:] == ["OK", "builtin_function_or_method"], r.stdout


def test_two_threads_defining_their_first_kernels_at_once_start_one_pre_import(tmp_path: Path) -> None:
    """The pre-import now starts at a kernel's definition, which any thread may reach: two at once
    must start one warm-up, or the second guard on ``builtins.__import__`` takes the first for the
    original and calls itself at every import. The window is widened on purpose: the check of
    ``TRITON_ALWAYS_COMPILE`` sleeps while the other thread arrives."""
    (tmp_path / "slow_gluon_stand_in.py").write_text("import time\ntime.sleep(0.3)\nVALUE = 42\n")
    code = textwrap.dedent(
        f"""
        import builtins, json, sys, threading, time
        sys.path.insert(0, {str(tmp_path)!r})
        from kcache.triton import warmup
        warmup.ENTRY = warmup.FALLBACK = "slow_gluon_stand_in"
        warmup._compiles_anyway = lambda: time.sleep(0.2) or False
        real = builtins.__import__
        started = []
        own_thread = threading.Thread
        class Counted(own_thread):
            def start(self):
                started.append(self.name)
                return own_thread.start(self)
        warmup.threading.Thread = Counted
        callers = [own_thread(target=warmup.start_gluon_import) for _ in range(4)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        warmup._thread.join(30)
        import slow_gluon_stand_in  # any import, once the warm-up is over
        print(json.dumps({{"started": started, "restored": builtins.__import__ is real}}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "KCACHE_NO_TRITON_WARMUP"}
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"started": ["kcache-triton-warmup"], "restored": True}, got
