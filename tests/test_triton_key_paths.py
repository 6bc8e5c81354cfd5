"""``triton_key()`` in a served process reads libtriton zero times, whoever asks for it first.

Triton's key hashes the whole libtriton shared object (0.3-0.75 s); kcache's memo keeps its digest
in the store. Callers reach Triton's function by many roads: ``triton.runtime.cache.triton_key``,
the name Triton's autotuner bound at import, ``triton.compile`` (``get_cache_key``), torch 2.13's
``codecache.get_system()`` (through its ``prefetchable_cache`` wrapper, which may run it in a
thread), torch 2.11's ``get_system()`` and ``pre_fork_setup()`` (``from
torch._inductor.runtime.triton_compat import triton_key`` inside the function; torch 2.11 is not
installable here, its pattern is reproduced from its source), and names a program bound before it
turned kcache on (an alias, a closure). Triton's function caches its result for the process, so
the first caller's road is the one that decides: each road gets a process of its own, and an audit
hook counts every ``open()`` of libtriton (the memo's own hashing included). The count, not a time.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

from kernels.harness import PYTHON, clean_env  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    reads = []
    def audit(event, args):
        if event == "open" and isinstance(args[0], str) and os.path.basename(args[0]).startswith("libtriton."):
            reads.append(threading.current_thread().name)
    sys.addaudithook(audit)
    road = sys.argv[1]
    out = {"road": road}
    if road == "alias-before-enable":  # bound before the program turned kcache on (KCACHE unset)
        from triton.runtime.cache import triton_key as key_fn
        held = {"fn": key_fn}
        import kcache
        assert kcache.enable(dir=os.environ["PROBE_STORE"])
        out["key"] = held["fn"]()
    elif road == "closure-before-enable":
        import triton.runtime.cache as c
        def make(fn):
            return lambda: fn()
        ask = make(c.triton_key)
        import kcache
        assert kcache.enable(dir=os.environ["PROBE_STORE"])
        out["key"] = ask()
    elif road == "triton":
        from kernels.compat import triton_key_module
        out["key"] = triton_key_module().triton_key()
    elif road == "autotuner":  # Triton 3.5+ bind the name at import (3.4 has no such name)
        import triton.runtime.autotuner as at
        out["key"] = at.triton_key() if hasattr(at, "triton_key") else None
    elif road == "jit":  # the compile path: get_cache_key asks for it
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from kernels.elementwise import add_kernel
        sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK": "constexpr"}
        triton.compile(ASTSource(add_kernel, sig, {"BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
        from kernels.compat import triton_key_module
        out["key"] = triton_key_module().triton_key()
    elif road == "torch-get-system":  # and torch_key, which a served graph's lookup asks for too
        from torch._inductor import codecache
        codecache.CacheBase.get_system()
        codecache.torch_key()
        from torch._inductor.runtime.triton_compat import triton_key
        out["key"] = triton_key()
    elif road == "torch-prefetch-thread":  # torch 2.13: its wrapper computes the key in a thread
        from torch._inductor import codecache
        fn = codecache.triton_key
        if hasattr(fn, "prefetch"):
            fn.prefetch()
        out["key"] = fn()
    elif road == "torch-211":  # torch 2.11's get_system / pre_fork_setup, as its source has them
        import torch
        def get_system():
            from torch._inductor.runtime.triton_compat import HAS_TRITON, triton_key
            return triton_key() if HAS_TRITON else None
        out["key"] = get_system()
    out["reads"] = reads
    k = sys.modules.get("kcache")
    out["kcache_on"] = bool(k is not None and k.is_enabled())
    print(json.dumps(out))
    """
)

TORCH_ROADS = ("torch-get-system", "torch-prefetch-thread", "torch-211")
ROADS = ("triton", "autotuner", "jit", "alias-before-enable", "closure-before-enable", *TORCH_ROADS)


def _start(env: dict[str, str], road: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PYTHON, "-c", CHILD, road], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(p: subprocess.Popen) -> dict[str, Any]:
    stdout, stderr = p.communicate(timeout=600)
    assert p.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def test_a_served_process_never_reads_libtriton_whoever_asks_first(tmp_path: Path) -> None:
    store = tmp_path / "store"
    plain = _result(_start(clean_env(tmp_path / "plain"), "triton"))
    assert plain["reads"] == ["MainThread"] and not plain["kcache_on"]  # the probe sees Triton's read
    # The first process with kcache hashes the library once (and compiles the kernel), the memo
    # keeps the digest.
    first = _result(_start(clean_env(tmp_path / "first", kcache_dir=store), "jit"))
    assert first["kcache_on"] and first["key"] == plain["key"], first
    assert len(first["reads"]) == 1, first
    roads = list(ROADS)
    # torch is no dependency of kcache; CI installs it (.ci/run). Not imported here (Inductor is
    # 4 s of CPU): its roads' children import it
    if importlib.util.find_spec("torch") is None:
        roads = [r for r in roads if r not in TORCH_ROADS]
    procs = {}
    for road in roads:
        late = road.endswith("-before-enable")
        env = clean_env(tmp_path / road, kcache_dir=None if late else store, PROBE_STORE=str(store))
        procs[road] = _start(env, road)
    results = {road: _result(p) for road, p in procs.items()}
    for road, r in results.items():
        assert r["kcache_on"], r
        if r["key"] is not None:
            assert r["key"] == plain["key"], road  # Triton's own key, with the memo
        assert r["reads"] == [], r  # libtriton read 0 times in the served process
