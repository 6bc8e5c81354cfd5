"""Versions (issue 10, point 5): an entry made under another Triton, nvFuser, torch, CUDA/NVRTC,
arch (or, for autotune timings, another GPU model) is never served. Each component is changed on
its own, everything else kept, and the lookup must miss; changing it back must hit again.

- Triton kernels are keyed by Triton's own key: ``triton_key()`` (version + hash of its sources
  and of libtriton, so also the Python version of the wheel), the source, the backend (arch,
  ptxas) and the options. A different Triton is simulated by a different ``triton_key()``; a
  different arch by another ``GPUTarget``.
- Autotune timings are keyed also by the GPU model that measured them (H100 and H200 are both
  sm_90).
- nvFuser kernels (KernelDb) are kept per fingerprint: nvFuser version and build, NVRTC, arch,
  torch version, CUDA runtime and the NVFUSER_* options that change generated code.
- The driver is in no key: a cubin does not depend on it (it only loads it), so entries survive a
  driver update; options known not to change code (``kernel_db``, dumps) are not in the key
  either. Both are checked below as "still served".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kcache import fingerprint

from .conftest import compile_in_child, kenv, no_traceback, run_py, store_entries, warning_lines

OTHER_TRITON = """
import triton
import triton.runtime.cache as _c
_orig = _c.triton_key
# Another Triton: same sources here, another version string and build hash in the key.
_c.triton_key = lambda: _orig().replace(triton.__version__, "9.9.9", 1) + "-another-build"
"""


def test_other_triton_version_never_served(tmp_path: Path, chaos: Any) -> None:
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    specs = chaos.kernel_specs(2)
    a, _ = compile_in_child(specs, env)
    entries = set(store_entries(store))
    b, rb = compile_in_child(specs, env, before=OTHER_TRITON)
    assert b["counts"]["triton"].get("hits", 0) == 0 and b["counts"]["triton"]["misses"] == 2
    for name in a["kernels"]:
        assert b["kernels"][name]["hash"] != a["kernels"][name]["hash"]
    assert len(set(store_entries(store)) - entries) >= 2  # stored apart, under their own key
    c, _ = compile_in_child(specs, env)  # the real Triton again: its own entries, exact
    assert c["counts"]["triton"]["hits"] == 2 and c["kernels"] == a["kernels"]
    d, _ = compile_in_child(specs, env, before=OTHER_TRITON)  # and the other one finds its own
    assert d["counts"]["triton"]["hits"] == 2 and d["kernels"] == b["kernels"]
    assert warning_lines(rb.stderr) == []


def test_other_arch_never_served(tmp_path: Path, chaos: Any) -> None:
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    spec90 = chaos.kernel_specs(1)[0]
    spec80 = (*spec90[:3], 80)
    a, _ = compile_in_child([spec90], env)
    b, _ = compile_in_child([spec80], env)
    n90, n80 = "/".join(map(str, spec90)), "/".join(map(str, spec80))
    assert b["counts"]["triton"].get("hits", 0) == 0
    assert b["arch"][n80] == 80 and a["arch"][n90] == 90
    assert b["kernels"][n80]["cubin"] != a["kernels"][n90]["cubin"]
    c, _ = compile_in_child([spec90, spec80], env)
    assert c["counts"]["triton"]["hits"] == 2
    assert c["arch"] == {n90: 90, n80: 80}
    assert c["kernels"][n90] == a["kernels"][n90] and c["kernels"][n80] == b["kernels"][n80]


AUTOTUNE_CHILD = """
import json, triton
import kcache.triton.manager as mm
model = {model!r}
mm._gpu_model = lambda: model  # the model of the GPU the process runs on
key = "AUTOTUNEKEY" + "A" * 41
blob = {blob!r}.encode()
out = {{}}
if {put!r}:
    m = mm.KcacheCacheManager(key)
    m.put(blob, "fn.autotune.json")
p = mm.KcacheCacheManager(key).get_file("fn.autotune.json")
out["hit"] = p is not None and open(p, "rb").read() == blob
print(json.dumps(out))
"""


def test_autotune_timings_only_for_the_gpu_model_that_measured_them(tmp_path: Path) -> None:
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    blob = json.dumps(
        {"key": [1024], "configs_timings": [[{"kwargs": {"BLOCK": 128}, "num_warps": 4}, [0.011]]]}
    )

    def child(model: str | None, put: bool) -> bool:
        r = run_py(AUTOTUNE_CHILD.format(model=model, blob=blob, put=put), env)
        no_traceback(r)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])["hit"]

    assert child("NVIDIA H100 80GB HBM3", put=True)
    assert not child("NVIDIA H200", put=False)  # same arch (sm_90), another model
    assert not child(None, put=False)  # no GPU: never another machine's timings
    assert child("NVIDIA H100 80GB HBM3", put=False)


def test_key_tag_separates_entries(tmp_path: Path, chaos: Any) -> None:
    """KCACHE_KEY_TAG breaks caches on purpose: entries made under one tag are not served under
    another."""
    store = tmp_path / "store"
    specs = chaos.kernel_specs(1)
    compile_in_child(specs, kenv(tmp_path, store, KCACHE_KEY_TAG="one"))
    b, _ = compile_in_child(specs, kenv(tmp_path, store, KCACHE_KEY_TAG="two"))
    assert b["counts"]["triton"].get("hits", 0) == 0
    c, _ = compile_in_child(specs, kenv(tmp_path, store, KCACHE_KEY_TAG="one"))
    assert c["counts"]["triton"]["hits"] == 1


# ------------------------------------------------------------------------------------- nvFuser
@pytest.fixture
def kerneldb() -> Any:
    # kcache's own module (it needs no nvFuser to import): an import error is a failure, not a skip
    import kcache.nvfuser.kerneldb

    return kcache.nvfuser.kerneldb


BASE = {
    "nvfuser_version": "nvfuser==0.2.36",
    "nvrtc": "12.8",
    "arch": "sm_90a",
    "torch_version": "2.13.0",
    "cuda_runtime": "12.8",
    "driver": "570.86.15",
    "gpu_name": "NVIDIA H200",
}
BASE_ENV = {"NVFUSER_ENABLE": "kernel_db", "NVFUSER_DISABLE": ""}

# (what changes, component overrides, environment) -> must the stored kernel still be served?
CHANGES = [
    ("nothing", {}, {}, True),
    ("nvfuser version", {"nvfuser_version": "nvfuser==0.2.37"}, {}, False),
    ("nvrtc", {"nvrtc": "12.9"}, {}, False),
    ("arch", {"arch": "sm_100a"}, {}, False),
    ("arch suffix", {"arch": "sm_90"}, {}, False),
    ("torch version", {"torch_version": "2.14.0"}, {}, False),
    ("cuda runtime", {"cuda_runtime": "13.0"}, {}, False),
    ("NVFUSER_ENABLE codegen option", {}, {"NVFUSER_ENABLE": "kernel_db,fast_math"}, False),
    ("NVFUSER_DISABLE codegen option", {}, {"NVFUSER_DISABLE": "index_hoist"}, False),
    ("another NVFUSER_ variable", {}, {"NVFUSER_MAX_REG_COUNT": "128"}, False),
    ("driver (not in the key)", {"driver": "580.1"}, {}, True),
    ("GPU model of the same arch (not in the key)", {"gpu_name": "NVIDIA H100"}, {}, True),
    ("a dump option (not codegen)", {}, {"NVFUSER_DUMP": "cuda_kernel"}, True),
]

SIG = "_ZN3nvf29nvfuser_pointwise_f0_c1_r0_g0ENS_6TensorIfLi1ELi1EEES1_"


def fake_kerneldb(kerneldb: Any, folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "kernel_0.cu").write_bytes(b"__global__ void " + SIG.encode() + b"(float* a) {}\n")
    (folder / "kernel_0.cubin").write_bytes(b"\x7fELF" + b"\0" * 60 + SIG.encode() + b"\0" * 100)
    (folder / "db.csv").write_text(
        f"{kerneldb.HEADER}\n{SIG},--std=c++17 --gpu-architecture=sm_90a -default-device,kernel_0.cu,kernel_0.cubin\n"
    )


def fingerprint_with(kerneldb: Any, overrides: dict[str, str], env: dict[str, str]) -> Any:
    fingerprint.reset()
    for k, v in {**BASE, **overrides}.items():
        fingerprint.override(k, v)
    return kerneldb.current_fingerprint(None, {**BASE_ENV, **env})


@pytest.mark.parametrize("what,overrides,env,served", CHANGES, ids=[c[0] for c in CHANGES])
def test_nvfuser_kernels_only_for_their_fingerprint(
    what: str, overrides: dict, env: dict, served: bool, tmp_path: Path, chaos: Any, kerneldb: Any
) -> None:
    st = chaos.open_store(tmp_path / "store")
    try:
        fp_a = fingerprint_with(kerneldb, {}, {})
        fake_kerneldb(kerneldb, tmp_path / "made")
        res = kerneldb.harvest(st, tmp_path / "made", fp_a)
        assert len(res.added) == 1, res
        fp_b = fingerprint_with(kerneldb, overrides, env)
        seeded = kerneldb.seed(st, tmp_path / "seeded", fp_b)
        assert bool(seeded.seeded) is served, (what, fp_a.components, fp_b.components)
        again = kerneldb.seed(st, tmp_path / "seeded-again", fingerprint_with(kerneldb, {}, {}))
        assert len(again.seeded) == 1  # the entry is still there for its own fingerprint
    finally:
        st.close()
        fingerprint.reset()
