"""No C compiler runs in a process whose every artifact was served, Triton's driver modules included.

Triton's NVIDIA driver builds host code with the machine's C compiler through its cache manager
(``compile_module_from_src``): the ``cuda_utils`` module at the driver's start, and in Triton 3.6 a
launcher per kernel signature (3.7+ have one generic launcher inside ``cuda_utils``). kcache stores
them as ``triton-aux`` entries. Without a GPU they are built here against kcache's stand-in libcuda
(:mod:`kcache.prewarm.stub_libcuda`, named by ``TRITON_LIBCUDA_PATH`` as on a GPU machine the
real one is found).

A shim folder first on ``PATH`` (with ``CC`` pointing into it) holds ``gcc``, ``cc``, ``clang``,
``g++`` and ``c++``: each logs its run and then runs the real compiler. A first process builds the
host code; processes with the warm store and a NEW Triton folder must run the compiler 0 times,
whatever Triton folder the environment names: none, a folder of its own, or
``<TORCHINDUCTOR_CACHE_DIR>/triton``, the shape of torch's ``fresh_cache()`` scopes, which the
GPU benchmark (``tools/gpu_compile_check.py``) gives each process at launch: kcache took it for
torch's scope, stepped aside, and every served process built ``cuda_utils`` with gcc (issue 33).
Counted, not timed. CI runs this file on Triton 3.6 and 3.9.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

from kernels.harness import PYTHON, clean_env  # noqa: E402

COMPILERS = ("gcc", "cc", "clang", "g++", "c++")
REAL_CC = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")
if not REAL_CC:
    pytest.skip("no C compiler: Triton builds no host code here", allow_module_level=True)

CHILD = textwrap.dedent(
    """
    import ctypes, json, os, sys
    # The stand-in libcuda, loaded as on a GPU machine the real one is (by soname).
    ctypes.CDLL(os.path.join(os.environ["TRITON_LIBCUDA_PATH"], "libcuda.so.1"), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    import triton
    import triton.backends.nvidia.driver as nvd
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kernels.elementwise import add_kernel
    nvd.CudaUtils()  # the driver's utility module (what the driver's __init__ builds)
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK": "constexpr"}
    k = triton.compile(ASTSource(add_kernel, sig, {"BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7):
        nvd.CudaLauncher(k.src, k.metadata)  # a launcher per signature (3.7+: inside cuda_utils)
    import kcache
    proc = kcache.stats()["process"]
    print(json.dumps({k: {n: v for n, v in d.items() if n in ("hits", "misses", "puts")}
                      for k, d in proc.items() if k.startswith("triton")}))
    """
)


def _shim(folder: Path, log: Path) -> Path:
    """Compiler stand-ins that log each run and exec the real compiler."""
    folder.mkdir(parents=True)
    real = {name: shutil.which(name) for name in COMPILERS}
    for name in COMPILERS:
        target = real[name] or REAL_CC
        script = folder / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexec "{target}" "$@"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def _stub(tmp: Path) -> str:
    """Build kcache's stand-in libcuda in a process of its own (never loaded into pytest's)."""
    code = "from kcache.prewarm.stub_libcuda import stub_libcuda, stub_error\nd = stub_libcuda()\nprint(d or 'ERROR ' + str(stub_error()))"
    p = subprocess.run([PYTHON, "-c", code], env=clean_env(tmp), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.strip().splitlines()[-1]
    assert not out.startswith("ERROR"), out
    return out


def _run(env: dict[str, str]) -> dict[str, Any]:
    p = subprocess.run([PYTHON, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _runs(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_served_process_runs_no_compiler_for_triton_s_host_code(tmp_path: Path) -> None:
    stub = _stub(tmp_path / "stub")
    store = tmp_path / "store"
    log = tmp_path / "compiler-runs.log"
    shim = _shim(tmp_path / "shim", log)

    def env_for(name: str, **extra: str) -> dict[str, str]:
        env = clean_env(tmp_path / name, kcache_dir=store, TRITON_LIBCUDA_PATH=stub, CC=str(shim / "cc"))
        env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)
        env.update(extra)
        for k, v in extra.items():
            if v == "":
                env.pop(k)  # unset
        return env

    first = _run(env_for("first"))
    built = _runs(log)
    assert built, "the first process built Triton's host code (the shim saw the compiler)"
    assert first["triton-aux"]["puts"] >= 1, first
    inductor = tmp_path / "inductor"
    served = {
        "own-folder": env_for("own-folder"),  # clean_env: TRITON_CACHE_DIR=<new folder>
        "default-folder": env_for("default-folder", TRITON_CACHE_DIR=""),  # Triton's default, in a new HOME
        "inductor-shaped": env_for(
            "inductor-shaped",
            TORCHINDUCTOR_CACHE_DIR=str(inductor),
            TRITON_CACHE_DIR=str(inductor / "triton"),
        ),
    }
    for name, env in served.items():
        before = len(_runs(log))
        got = _run(env)
        ran = _runs(log)[before:]
        assert ran == [], f"{name}: the compiler ran in a served process: {ran}"
        assert got["triton-aux"]["hits"] == first["triton-aux"]["puts"], (name, got)
        assert got["triton"]["hits"] == 1 and not got["triton"].get("misses"), (name, got)
