"""The memo of Inductor's precompiled-header preprocessing (``kcache/inductor/pch.py``) against a
header that would now shadow the one the compiler found.

``-MD`` lists the headers the preprocessor found, not the places it looked first. Real g++,
real torch (``codecache._precompile_header``, as Inductor calls it), a compiler shim on ``PATH``
that logs each run (tests/test_inductor_served.py's): the header ``kc/probe.h`` is found in the
second of two folders of ``CPLUS_INCLUDE_PATH``; the first already has a ``kc/`` folder (with
another header), so adding ``kc/probe.h`` there changes neither folder of the search path's own
listing, only ``kc/``'s. After it is added, the name torch gives the precompiled header (a hash
of the preprocessed text) must be the one torch alone gives; before the fix the memo kept the
old answer and torch picked the old ``.gch``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_inductor_served import make_shim

PYTHON = sys.executable

# Inductor's call for a CPU kernel's header; prints the name torch gives the precompiled header.
PRECOMPILE = """
import json, os, sys
from torch._inductor import codecache as cc
from torch._inductor.cpu_vec_isa import invalid_vec_isa
flags = {**cc.CppCodeCache.cpp_compile_command_flags, "device_type": "cpu", "vec_isa": invalid_vec_isa,
         "use_relative_path": False}
path = cc._precompile_header("kc/probe.h", "kcache-test", **flags)
import kcache
print(json.dumps({"name": os.path.basename(path), "kcache": kcache.is_enabled()}))
"""


def precompile(base: Path, tag: str, *, with_kcache: bool = True) -> dict[str, Any]:
    """A fresh process's ``_precompile_header``: the name, and the preprocessor runs (``-E``)."""
    log = base / f"compiler-{tag}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_"))}
    for k in ("PYTHONPATH", "CC", "CXX", "CPATH", "C_INCLUDE_PATH"):
        env.pop(k, None)
    tmp = base / f"tmp-{tag}"
    tmp.mkdir()
    shim = base / "shim"
    env.update(
        PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}",
        CXX=str(shim / "g++"),
        COMPILER_LOG=str(log),
        CPLUS_INCLUDE_PATH=f"{base / 'first'}{os.pathsep}{base / 'second'}",
        HOME=str(base / "home"),
        XDG_CACHE_HOME=str(base / "xdg"),
        TMPDIR=str(tmp),
        TORCHINDUCTOR_CACHE_DIR=str(base / f"ind-{tag}"),
    )
    if with_kcache:
        env.update(KCACHE="1", KCACHE_DIR=str(base / "store"))
    r = subprocess.run([PYTHON, "-c", PRECOMPILE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["kcache"] == with_kcache, got
    runs = log.read_text().splitlines() if log.exists() else []
    got["preprocessed"] = sum(1 for ln in runs if " -E " in f" {ln} " and " -v " not in f" {ln} ")
    return got


def test_a_header_added_earlier_in_the_search_path_is_seen(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs torch")
    if shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler (g++)")
    make_shim(tmp_path / "shim")
    (tmp_path / "first" / "kc").mkdir(parents=True)
    (tmp_path / "first" / "kc" / "other.h").write_text("int kcache_other;\n")
    (tmp_path / "second" / "kc").mkdir(parents=True)
    (tmp_path / "second" / "kc" / "probe.h").write_text("int kcache_probe_second;\n")

    made = precompile(tmp_path, "made")
    assert made["preprocessed"] == 1, made
    again = precompile(tmp_path, "again")
    assert again == {**made, "preprocessed": 0}, again  # the memo answers: no preprocessor run

    # a header of the same name where the search finds it first (in a folder that existed)
    (tmp_path / "first" / "kc" / "probe.h").write_text("int kcache_probe_first;\n")
    shadowed = precompile(tmp_path, "shadowed")
    torch_alone = precompile(tmp_path, "torch-alone", with_kcache=False)
    assert torch_alone["name"] != made["name"], "the shadowing header changes torch's own name"
    assert shadowed["name"] == torch_alone["name"], (shadowed, torch_alone, made)
    assert shadowed["preprocessed"] == 1, shadowed
    assert precompile(tmp_path, "after") == {**shadowed, "preprocessed": 0}  # remembered again
