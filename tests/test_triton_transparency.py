"""Triton with kcache behaves as without it where a program asks for something of its own.

- A program that points Triton at a cache folder while it runs (``triton.knobs.cache.dir``, or
  ``TRITON_CACHE_DIR`` set after Triton is imported; Triton's own tests do it for a fresh cache)
  gets that folder, through Triton's own cache manager: a warm store does not answer for it.
  The folder the process started with, and the one Inductor picks for itself, stay kcache's.
- An autotuner with hooks of its own is not cached by kcache's default (its hooks watch the
  benchmark), unless the program asked for caching itself.
- An autotune result whose every config failed is neither kept nor served.

Real compiles (``triton.compile`` for ``cuda:90`` needs no GPU), in fresh processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

import kcache  # noqa: E402
from kcache.triton import manager as mgr_mod  # noqa: E402
from kcache.triton.manager import KcacheCacheManager  # noqa: E402

PYTHON = sys.executable

PROGRAM = r"""
import json, os, sys
mode, folder = sys.argv[1], sys.argv[2]
if mode == "env-before":
    os.environ["TRITON_CACHE_DIR"] = folder   # the program's own setting, before Triton loads
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kcache

@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

def compile_and_count():
    sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    triton.compile(ASTSource(fn=add, signature=sig, constexprs={"BLOCK": 1024}),
                   target=GPUTarget("cuda", 90, 32))
    return kcache.active_store().counts.process_totals().get("triton", {}).get("hits", 0)

out = {}
if mode == "knob":
    from triton import knobs
    with knobs.cache.scope():
        knobs.cache.dir = folder          # what Triton's fresh_triton_cache fixture does
        out["hits_in_folder"] = compile_and_count()
    out["hits_after"] = compile_and_count()
elif mode == "env-after":
    os.environ["TRITON_CACHE_DIR"] = folder
    out["hits_in_folder"] = compile_and_count()
elif mode == "inductor":
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton", "0")   # Inductor's own pick
    out["hits_in_folder"] = compile_and_count()
elif mode == "fresh-scope":
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")   # torch's fresh_cache()
    out["hits_in_folder"] = compile_and_count()
else:
    out["hits_in_folder"] = compile_and_count()
print(json.dumps(out))
"""


def env_for(tmp: Path, store: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_", "TORCHINDUCTOR"))}
    env.pop("PYTHONPATH", None)
    env.update(
        HOME=str(tmp / "home"),
        XDG_CACHE_HOME=str(tmp / "xdg"),
        KCACHE="1",
        KCACHE_DIR=str(store),
        TRITON_CACHE_DIR=str(tmp / "triton-env"),
    )
    return env


def script(folder: Path, name: str, text: str) -> Path:
    """Triton reads a @jit function's source from its file: the programs run as files."""
    path = folder / name
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def run(env: dict[str, str], mode: str, folder: Path) -> dict[str, Any]:
    prog = script(Path(env["HOME"]).parent / "programs", "folders.py", PROGRAM)
    r = subprocess.run(
        [PYTHON, str(prog), mode, str(folder)], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def has_kernel(folder: Path) -> bool:
    return any(p.name.startswith("__grp__") for p in folder.rglob("*")) if folder.exists() else False


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("triton-folders")
    store = tmp / "store"
    assert run(env_for(tmp, store), "plain", tmp / "unused")["hits_in_folder"] == 0
    return {"tmp": tmp, "store": store}


def test_a_folder_set_while_running_gets_triton_s_own_cache(warm: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "fresh-knob"
    got = run(env_for(warm["tmp"], warm["store"]), "knob", folder)
    assert got["hits_in_folder"] == 0, "the warm store answered for the program's own folder"
    assert has_kernel(folder), "Triton compiled into the folder it was given"
    assert got["hits_after"] == 1, "back in the process's own folder, kcache serves again"


def test_a_triton_cache_dir_set_while_running_gets_triton_s_own_cache(
    warm: dict[str, Any], tmp_path: Path
) -> None:
    folder = tmp_path / "fresh-env"
    assert run(env_for(warm["tmp"], warm["store"]), "env-after", folder)["hits_in_folder"] == 0
    assert has_kernel(folder)


def test_torch_s_fresh_scope_folder_gets_triton_s_own_cache(warm: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "fresh-scope"
    assert run(env_for(warm["tmp"], warm["store"]), "fresh-scope", folder)["hits_in_folder"] == 0
    assert has_kernel(folder / "triton")


@pytest.mark.parametrize("mode", ["plain", "env-before", "inductor"])
def test_the_start_folder_and_inductor_s_own_stay_served(
    warm: dict[str, Any], tmp_path: Path, mode: str
) -> None:
    """The environment's folder, one the program set before importing Triton, and Inductor's
    ``<TORCHINDUCTOR_CACHE_DIR>/triton/<device>``: kcache's (a torch.compile warm start)."""
    assert run(env_for(warm["tmp"], warm["store"]), mode, tmp_path / mode)["hits_in_folder"] == 1


#: A job for Inductor's compile workers (imported there by name, from the parent's sys.path).
POOLWORK = r"""
import triton
import triton.language as tl

@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 2, mask=mask)

def hits_of_a_compile():
    import kcache
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def hits():
        store = kcache.active_store()
        return store.counts.process_totals().get("triton", {}).get("hits", 0) if store else -1

    before = hits()
    sig = {"x": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    triton.compile(ASTSource(fn=scale, signature=sig, constexprs={"BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
    return hits() - before
"""

#: A program with torch that starts processes inside torch's ``fresh_cache()`` and after it: each
#: child compiles the kernel of ``folders.py`` (its kcache hits) or asks torch's FX-graph remote
#: cache decision (kcache's policy in the child); and Inductor's compile workers, started before
#: and inside a scope, compile the kernel of ``poolwork.py`` twice each.
SCOPES = r"""
import json, os, subprocess, sys
import torch  # KCACHE=1: kcache attaches to torch as it loads
from torch._inductor.compile_worker.subproc_pool import SubprocPool
from torch._inductor.utils import fresh_cache
import poolwork
program, work = sys.argv[1], sys.argv[2]

def pool_hits():
    pool = SubprocPool(1)
    try:
        return [pool.submit(poolwork.hits_of_a_compile).result(timeout=600) for _ in range(2)]
    finally:
        pool.shutdown()
ASK_TORCH = "import torch._inductor.utils as u; print(bool(u.should_use_remote_fx_graph_cache()))"

def child(env=None, torch_asks=False):
    cmd = [sys.executable, "-c", ASK_TORCH] if torch_asks else [sys.executable, program, "plain", "-"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    last = r.stdout.strip().splitlines()[-1]
    return last == "True" if torch_asks else json.loads(last)["hits_in_folder"]

def own_folder(name):  # the shape a launcher gives (tools/gpu_compile_check.py), a folder of its own
    folder = os.path.join(work, name)
    return dict(os.environ, TORCHINDUCTOR_CACHE_DIR=folder, TRITON_CACHE_DIR=os.path.join(folder, "triton"))

out = {"pool": pool_hits()}
with fresh_cache():
    scope = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    out["in_scope"] = child()
    out["compiled_into_scope"] = any(
        n.startswith("__grp__") for _, _, names in os.walk(os.path.join(scope, "triton")) for n in names
    )
    out["torch_in_scope"] = child(torch_asks=True)
    with fresh_cache():
        out["nested"] = child()
    out["back_in_outer"] = child()
    out["own_folder_in_scope"] = child(own_folder("inside"))
out["after"] = child()
out["torch_after"] = child(torch_asks=True)
out["own_folder_after"] = child(own_folder("after"))
with fresh_cache():
    out["pool_in_scope"] = pool_hits()
print(json.dumps(out))
"""


def test_a_process_started_inside_torch_s_fresh_scope_compiles_cold(
    warm: dict[str, Any], tmp_path: Path
) -> None:
    """Review M7: a process started inside ``fresh_cache()`` inherits the scope's folders, the
    shape a launcher gives a process of its own (served: tests/test_triton_host_code.py). It was
    served from the store, and so were Inductor's compile workers first started inside a scope:
    the scope asks for a cold compile. kcache marks the scope in the environment
    (``KCACHE_FRESH_SCOPE``): such a child steps aside, a folder given at launch stays served.
    Counted (kcache's Triton hits in each child and compile worker), not timed."""
    if importlib.util.find_spec("torch") is None:  # (not imported here: the children use it)
        pytest.skip("torch is not installed: torch's fresh_cache()")
    prog = script(warm["tmp"] / "programs", "folders.py", PROGRAM)
    parent = script(warm["tmp"] / "programs", "scopes.py", SCOPES)
    script(warm["tmp"] / "programs", "poolwork.py", POOLWORK)
    env = env_for(warm["tmp"], warm["store"])
    env.update(TMPDIR=str(tmp_path), OMP_NUM_THREADS="1")  # fresh_cache() makes its folder under TMPDIR
    r = subprocess.run(
        [PYTHON, str(parent), str(prog), str(tmp_path)], capture_output=True, text=True, env=env, timeout=1800
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["in_scope"] == 0, f"a child of the scope was served from the store: {got}"
    assert got["compiled_into_scope"], "the child compiled into the scope's Triton folder, as without kcache"
    assert got["torch_in_scope"] is False, "kcache's policy in the child serves torch's caches in the scope"
    assert got["nested"] == 0 and got["back_in_outer"] == 0, got
    # Inductor's compile workers: served when started outside a scope (a miss, then a hit),
    # Triton's own cache when first started inside one
    assert got["pool"][1] == 1 and got["pool_in_scope"] == [0, 0], got
    # served: a folder given at launch (inside a scope or not), and everything after the scope
    assert got["own_folder_in_scope"] == 1 and got["own_folder_after"] == 1, got
    assert got["after"] == 1 and got["torch_after"] is True, got


AUTOTUNERS = r"""
import json
import triton
import triton.language as tl

@triton.jit
def k(x, n, B: tl.constexpr):
    pass

configs = [triton.Config({"B": 32}), triton.Config({"B": 64})]
hook = lambda *args, **kwargs: None
tuners = {
    "no_hooks": triton.autotune(configs=configs, key=["n"])(k),
    "post_hook": triton.autotune(configs=configs, key=["n"], post_hook=hook)(k),
    "pre_hook": triton.autotune(configs=configs, key=["n"], pre_hook=hook)(k),
    "hook_asked_to_cache": triton.autotune(configs=configs, key=["n"], post_hook=hook, cache_results=True)(k),
}
print(json.dumps({name: t.cache_results for name, t in tuners.items()}))
"""


def test_autotuners_with_their_own_hooks_are_not_cached_by_default(tmp_path: Path) -> None:
    env = env_for(tmp_path, tmp_path / "store")
    prog = script(tmp_path, "autotuners.py", AUTOTUNERS)
    r = subprocess.run([PYTHON, str(prog)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"no_hooks": True, "post_hook": False, "pre_hook": False, "hook_asked_to_cache": True}
    r = subprocess.run(
        [PYTHON, str(prog)], capture_output=True, text=True, timeout=300,
        env={**env, "TRITON_CACHE_AUTOTUNING": "0"},
    )  # fmt: skip
    assert json.loads(r.stdout.strip().splitlines()[-1])["no_hooks"] is False, "the opt-out"


# ------------------------------------------------------------------------------ failed winners
def tuned(*times: float) -> str:
    """An autotune result as Triton writes it (``Config.__dict__``, a timing each): a config
    that failed to run is timed as infinite."""
    import triton

    configs = [triton.Config({"BLOCK": 64 * (i + 1)}, num_warps=4) for i in range(len(times))]
    return json.dumps(
        {"key": [1024], "configs_timings": [[dict(c.__dict__), [t] * 3] for c, t in zip(configs, times)]}
    )


def test_which_results_are_usable() -> None:
    from kcache.triton import tuning

    inf = float("inf")
    assert not tuning.usable(tuned(inf, inf).encode())
    assert tuning.usable(tuned(inf, 0.01).encode()), "a failed config that did not win is Triton's to keep"
    assert tuning.usable(b'{"something": "else"}'), "a form kcache does not know is left to Triton"


@pytest.fixture
def kstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(mgr_mod, "_gpu_model", lambda: "Test GPU")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    for k in list(os.environ):
        if k.startswith("KCACHE") and k != "KCACHE_STRICT":
            monkeypatch.delenv(k)
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False)
    yield kcache.active_store()
    kcache.disable()


def test_a_result_whose_every_config_failed_is_never_the_cached_winner(kstore: Any) -> None:
    inf = float("inf")
    failed, one_failed = tuned(inf, inf), tuned(inf, 0.01)
    key = "C" * 52
    path = KcacheCacheManager(key).put(failed, "k.autotune.json", binary=False)
    assert Path(path).read_text() == failed, "Triton still gets its file"
    assert KcacheCacheManager(key).get_file("k.autotune.json") is None, (
        "not kept: the next process benchmarks"
    )
    # one planted by an older kcache (or imported) is not served either
    from kcache.triton.kinds import KIND_AUTOTUNE, store_key

    kstore.put(
        KIND_AUTOTUNE, store_key(key, "k.autotune.json", "Test GPU"), {"k.autotune.json": failed.encode()}
    )
    assert KcacheCacheManager(key).get_file("k.autotune.json") is None
    other = "D" * 52
    KcacheCacheManager(other).put(one_failed, "k.autotune.json", binary=False)
    assert KcacheCacheManager(other).get_file("k.autotune.json") is not None, "its winner ran: served"


WORKER = r"""
import json, sys
import triton  # Inductor's compile-worker sidecar imports Triton at its start


@triton.jit
def k(x):  # a kernel of the program's (a worker compiles such kernels, and never launches them)
    pass


from kcache.triton import warmup
print(json.dumps({"gluon_pre_import": warmup._started}))
"""


@pytest.mark.parametrize("where", ["program", "_inductor/compile_worker"])
def test_no_gluon_pre_import_in_inductor_s_compile_workers(tmp_path: Path, where: str) -> None:
    """The pre-import helps a process's first launch; a compile worker never launches, and there
    it delayed the pool Inductor races against (docs/torch-compile.md, reduce-overhead)."""
    prog = script(tmp_path / where, "__main__.py", WORKER)
    r = subprocess.run(
        [PYTHON, str(prog)],
        capture_output=True,
        text=True,
        env=env_for(tmp_path, tmp_path / "s"),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    started = json.loads(r.stdout.strip().splitlines()[-1])["gluon_pre_import"]
    assert started is (where == "program")
