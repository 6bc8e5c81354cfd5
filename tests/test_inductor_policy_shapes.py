"""kcache's switches of torch's caches on the shapes older torch gives them (torch 2.8-2.10),
which CI's torch (2.13) does not have. Found by reading each version's source (session 25):

- ``TritonKernel.inductor_meta_common`` is a staticmethod in torch 2.8-2.10 and a classmethod
  from 2.11. kcache's wrapper (kcache/inductor/policy.py, ``wrap_autotune_meta``) took only the
  classmethod, so on 2.8-2.10 every Triton kernel's meta told the compile workers that the
  autotune remote cache was on, also where the program had turned Inductor's local autotune cache
  off or opened a fresh scope (docs/torch-compile.md: "the same as without kcache").
- torch 2.8's ``jit_compile_runtime_wrappers`` takes ``should_use_remote_autograd_cache`` by
  name and decides there whether to save an AOTAutograd entry. kcache did not rebind it there, so
  a program that called ``kcache.enable()`` after torch's AOTAutograd modules were loaded had its
  lookups asked of the store and its entries never written to it.

Each test runs a child with ``KCACHE=1`` on a real store and CI's real torch config; only the
class or module that torch 2.8 would have is made here, in the shape that torch gives it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent


def run_child(code: str, tmp: Path, env: dict[str, str], *, kcache_on: bool) -> dict[str, object]:
    env = {k: v for k, v in env.items() if k != "KCACHE"}
    env.update(KCACHE_DIR=str(tmp / "store"), TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"))
    env["TRITON_CACHE_DIR"] = str(tmp / "triton")
    if kcache_on:  # at start-up, as users turn it on; otherwise the child enables it itself
        env["KCACHE"] = "1"
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


META = """
import json, sys, types
import torch._inductor.config as ic
import torch._inductor.runtime.autotune_cache  # kcache attaches to Inductor's config here
from torch._inductor.utils import fresh_cache
from kcache.inductor import policy

def meta():  # what torch's inductor_meta_common reads of the config (2.8: triton.py:3498)
    return {"autotune_local_cache": ic.autotune_local_cache,
            "autotune_remote_cache": ic.autotune_remote_cache}

class TritonKernel:  # torch 2.8-2.10
    @staticmethod
    def inductor_meta_common():
        return meta()

class TritonKernel211:  # torch 2.11 and later
    @classmethod
    def inductor_meta_common(cls):
        return meta()

got = {}
for name, cls in (("static", TritonKernel), ("class", TritonKernel211)):
    mod = types.ModuleType("torch._inductor.codegen.triton")  # the name kcache knows; not imported
    mod.TritonKernel = cls
    policy.wrap_autotune_meta(mod)
    remote = lambda: cls.inductor_meta_common()["autotune_remote_cache"]
    seen = {"default": remote(), "instance": cls().inductor_meta_common()["autotune_remote_cache"]}
    with ic.patch(autotune_local_cache=False):
        seen["local_off"] = remote()
    with fresh_cache():
        seen["fresh"] = remote()
    got[name] = seen
print(json.dumps(got))
"""


def test_the_kernels_meta_turns_the_remote_autotune_cache_off_on_each_torchs_shape(
    tmp_path: Path, clean_env: dict[str, str]
) -> None:
    got = run_child(META, tmp_path, clean_env, kcache_on=True)
    want = {"default": True, "instance": True, "local_off": None, "fresh": None}
    # staticmethod (torch 2.8-2.10): before the fix, {"local_off": True, "fresh": True}
    assert got == {"static": want, "class": want}, got


LATE = """
import json, sys, types
import torch._functorch._aot_autograd.autograd_cache as ac
import torch._functorch.aot_autograd  # torch's AOTAutograd, loaded before kcache is enabled

own = ac.should_use_remote_autograd_cache
# torch 2.8's jit_compile_runtime_wrappers: the decision taken by name (its line 46)
name = "torch._functorch._aot_autograd.jit_compile_runtime_wrappers"
jit = sys.modules.get(name) or types.ModuleType(name)
jit.should_use_remote_autograd_cache = own
sys.modules[name] = jit

import kcache
assert kcache.enable()
print(json.dumps({
    "defining_module_ours": ac.should_use_remote_autograd_cache is not own,
    "by_name_ours": jit.should_use_remote_autograd_cache is ac.should_use_remote_autograd_cache,
}))
"""


def test_a_late_enable_reaches_torch_28s_save_decision(tmp_path: Path, clean_env: dict[str, str]) -> None:
    got = run_child(LATE, tmp_path, clean_env, kcache_on=False)
    assert got == {"defining_module_ours": True, "by_name_ours": True}, got
