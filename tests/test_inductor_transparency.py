"""torch.compile with kcache behaves as without it, under the switches and scopes torch offers.

Each process runs ``tests/torch_compile/steps.py``: small functions compiled on the CPU, one
condition each (a cache turned off, ``force_disable_caches``, ``fresh_cache()``, a cleared cache,
strict AOTAutograd caching, ``standalone_compile(...).save()``), with Inductor's and kcache's
counters per step. One process fills a store; the others start from copies of it, with a new
Inductor folder and their own ``TMPDIR``, as a new node or CI job does.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcache.inductor.declare import INDUCTOR_AOT, INDUCTOR_CPP, INDUCTOR_FX

PYTHON = sys.executable
HERE = Path(__file__).parent / "torch_compile"
STEPS = HERE / "steps.py"


#: The session's folder of Inductor's precompiled headers (tests/conftest.py: inductor_headers).
HEADERS: list[Any] = []


@pytest.fixture(scope="module", autouse=True)
def shared_precompiled_headers(inductor_headers: Any) -> Any:
    HEADERS.append(inductor_headers)
    yield
    HEADERS.clear()


def env_for(base: Path, store: Path | None, tag: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_"))}
    env.pop("PYTHONPATH", None)
    tmp = base / f"tmp-{tag}"  # a TMPDIR of this process alone (as under a scheduler)
    tmp.mkdir(parents=True, exist_ok=True)
    if HEADERS:
        # Inductor builds its precompiled header (7-8 s of g++) under $TMPDIR, keyed by the
        # header and the compile flags: one machine's processes share it, as they share one
        # TMPDIR. Each process here keeps a TMPDIR of its own (its path is in every C++
        # command: the subject of these tests) and reaches the session's header folder
        # through a link there, as a shared /tmp would give it.
        HEADERS[0].link(tmp)
    env.update(
        HOME=str(base / "home"),
        XDG_CACHE_HOME=str(base / "xdg"),
        TMPDIR=str(tmp),
        TORCHINDUCTOR_CACHE_DIR=str(base / f"ind-{tag}"),
        OMP_NUM_THREADS="1",  # the FX key holds the thread count: the same in every child
        # Inductor's CPU vector-ISA probe (a g++ build of 3 s of CPU, then a new Python, in each
        # process with an empty store) is not what these tests are about: torch told the answer
        # its probe gives here. (The probe and kcache's memo of it: tests/test_inductor.py and
        # test_inductor_served.py.) It is part of the FX key: the same in every child.
        TORCHINDUCTOR_VEC_ISA_OK="1",
    )
    if store is not None:
        env.update(KCACHE="1", KCACHE_DIR=str(store))
    env.update(extra)
    return env


def run(script: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    r = subprocess.run([PYTHON, str(script), *args], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def steps(env: dict[str, str], *args: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = run(STEPS, env, *args)
    return {(s["step"], s["fn"]): s for s in out["steps"]}


def kc(env: dict[str, str], *args: str) -> Any:
    r = subprocess.run(
        [PYTHON, "-m", "kcache", *args, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def kind(step: dict[str, Any], name: str) -> dict[str, float]:
    return step.get("kcache", {}).get(name, {})


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch", reason="torch.compile tests need torch (CI installs it)")
    base = tmp_path_factory.mktemp("transparency")
    store = base / "store"
    # f7 and f8 under the strict settings they are looked up with later (AOTAutograd's key holds them)
    got = steps(
        env_for(base, store, "a"),
        "default:f1,f2,f3,f4,f5,f6",
        "standalone:f3",
        "strict_fxremote_off:f7",
        "strict:f8",
    )
    assert all(s["ok"] for s in got.values()), got
    return {"base": base, "store": store, "steps": got}


def copy_of(stored: dict[str, Any], name: str) -> Path:
    dst = stored["base"] / name
    shutil.copytree(stored["store"], dst, symlinks=True)
    return dst


@pytest.fixture(scope="module")
def served(stored: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """A new node: a copy of the store, a new Inductor folder, a TMPDIR of its own."""
    # two compile workers, so that Inductor has a pool to start (a 2-core box gets none)
    env = env_for(stored["base"], copy_of(stored, "store-served"), "b", TORCHINDUCTOR_COMPILE_THREADS="2")
    return steps(
        env, "wakeup:-", "default:f6", "pool:served", "tune_meta:-", "fx_off:f1", "aot_off:f2", "force:f3", "fresh:f4",
        "cleared:f5", "pool:compiled",
    )  # fmt: skip


@pytest.fixture(scope="module")
def orphaned(stored: dict[str, Any]) -> dict[str, Any]:
    """A store whose FX graph entries are gone (``kcache clear --kind inductor-fx``, or an
    eviction), its AOTAutograd entries left."""
    store = copy_of(stored, "store-orphaned")
    env = env_for(stored["base"], store, "c")
    assert kc(env, "clear", "--kind", INDUCTOR_FX)["count"] >= 6
    got = steps(env, "strict_fxremote_off:f7", "strict:f8", "standalone:f3", "default:f4")
    return {"steps": got, "env": env}


# ------------------------------------------------------------------------------ a new node
def test_a_process_with_its_own_tmpdir_is_served_every_stored_kernel(served: Any) -> None:
    s = served[("default", "f6")]
    assert s["ok"] and s["inductor"].get("fxgraph_cache_hit") == 1 and s["aot"].get("autograd_cache_hit") == 1
    cpp_counts = kind(s, INDUCTOR_CPP)
    # torch keeps its precompiled headers under $TMPDIR whatever TORCHINDUCTOR_CACHE_DIR says:
    # the C++ kernels' keys must not hold that path
    assert cpp_counts.get("hits", 0) >= 1, s
    assert not cpp_counts.get("misses") and not cpp_counts.get("puts"), "g++ ran: a kernel was not served"


def test_a_served_graph_credits_its_compile_time_once(served: Any) -> None:
    s = served[("default", "f6")]
    aot, fx = kind(s, INDUCTOR_AOT), kind(s, INDUCTOR_FX)
    assert aot.get("hits") == 1 and aot.get("saved_s", 0) > 0
    # the AOTAutograd entry's compile time includes its FX graph's: the graph is not credited again
    assert fx.get("hits") == 1 and not fx.get("saved_s"), s["kcache"]


def test_the_compile_pool_starts_when_a_graph_is_to_be_compiled(served: Any) -> None:
    """Inductor wakes its compile workers at a process's first compile (GPU inputs): a process
    whose graphs are all served never uses them, and paid for them at exit (13-14 s on the H200)."""
    assert served[("pool", "served")]["pool_started"] is False
    assert served[("pool", "compiled")]["pool_started"] is True, "a graph missed: the workers were wanted"


# ------------------------------------------------------------------------------ off switches
def test_the_fx_graph_cache_switched_off_is_not_served(served: Any) -> None:
    s = served[("fx_off", "f1")]
    assert s["ok"] and not s.get("inductor", {}).get("fxgraph_cache_hit")
    assert not kind(s, INDUCTOR_FX) and not kind(s, INDUCTOR_AOT), s["kcache"]


def test_the_autograd_cache_switched_off_is_neither_served_nor_written(served: Any) -> None:
    s = served[("aot_off", "f2")]
    assert s["ok"] and not s.get("aot"), "torch counted AOTAutograd cache work: a remote cache was on"
    assert not kind(s, INDUCTOR_AOT), s["kcache"]


def test_the_autotune_cache_switched_off_is_off_in_the_compile_workers(served: Any) -> None:
    """The workers decide from each kernel's inductor_meta: kcache's remote autotune cache is
    written there only where Inductor's own autotune cache is on, outside fresh scopes."""
    got = served[("tune_meta", "-")]["autotune_remote_cache"]
    assert got == {"default": True, "local_off": None, "fresh": None}, got


def test_force_disable_caches_gets_nothing_from_the_store(served: Any) -> None:
    s = served[("force", "f3")]
    assert s["ok"] and not s.get("kcache"), "kcache served or kept something (C++ kernels?)"
    assert not s.get("inductor") and not s.get("aot")


# ------------------------------------------------------------------------------ scopes
def test_a_fresh_cache_scope_gets_nothing_from_the_store(served: Any) -> None:
    s = served[("fresh", "f4")]
    # compiled twice inside the scope: a miss, then a hit from the scope's own folder (as without kcache)
    assert s["ok"] and s["inductor"] == {"fxgraph_cache_miss": 1, "fxgraph_cache_hit": 1}, s
    assert not s.get("kcache"), s.get("kcache")


def test_a_cleared_cache_is_empty_for_this_process(served: Any) -> None:
    s = served[("cleared", "f5")]
    assert (
        s["ok"] and s["inductor"].get("fxgraph_cache_miss") == 1 and s["aot"].get("autograd_cache_miss") == 1
    )
    assert not kind(s, INDUCTOR_FX).get("hits") and not kind(s, INDUCTOR_AOT).get("hits")


# ------------------------------------------------------------------------------ AOT without FX
@pytest.mark.parametrize(
    "step", [("strict_fxremote_off", "f7"), ("strict", "f8")], ids=["fx-remote-off", "fx-cleared"]
)
def test_strict_autograd_caching_never_meets_a_missing_fx_graph(orphaned: Any, step: tuple[str, str]) -> None:
    s = orphaned["steps"][step]
    assert s["ok"], s.get("traceback") or s["error"]  # was: BackendCompilerFailed FXGraphCacheMiss


def test_standalone_compile_artifacts_save(orphaned: Any) -> None:
    s = orphaned["steps"][("standalone", "f3")]
    assert s["ok"] and s["saved"] == [True, True], s.get("traceback") or s["error"]


def test_an_aot_entry_whose_graphs_are_gone_is_a_plain_miss(orphaned: Any) -> None:
    s = orphaned["steps"][("default", "f4")]
    assert s["ok"] and s["aot"].get("autograd_cache_miss") == 1 and not s["aot"].get("autograd_cache_hit")
    assert s["inductor"].get("fxgraph_cache_miss") == 1, "one miss, not an AOT hit and an FX miss"
    aot = kind(s, INDUCTOR_AOT)
    assert not aot.get("hits") and aot.get("misses") == 1 and aot.get("puts") == 1, s["kcache"]


def test_an_aot_entry_is_kept_only_with_its_fx_graphs(stored: Any, orphaned: Any) -> None:
    """fx_graph_remote_cache=False keeps FX graphs out of the store: their AOT entries stay out."""
    for s in (
        stored["steps"][("strict_fxremote_off", "f7")],
        orphaned["steps"][("strict_fxremote_off", "f7")],
    ):
        assert not kind(s, INDUCTOR_AOT) and not kind(s, INDUCTOR_FX), s["kcache"]


# ------------------------------------------------------------------------------ caching precompile
# A frame traced after a stored caching-precompile package was installed: in tests/test_inductor.py
# (test_a_frame_traced_after_a_stored_package_was_installed), with the processes of the
# caching-precompile tests there.


# ------------------------------------------------------------------------------ -march=native
def fake_compiler(folder: Path, target: str) -> Path:
    """A compiler that answers ``-Q --help=target`` as GCC does, for a CPU named ``target``."""
    folder.mkdir(parents=True, exist_ok=True)
    cc = folder / "g++"
    cc.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--help=target*) '
        f"printf 'The following options are target specific:\\n  -march=  \\t\\t{target}\\n'; exit 0;; esac\n"
        "exit 1\n"
    )
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    return cc


def test_a_host_dependent_flag_enters_the_key_as_this_cpu_resolves_it(tmp_path: Path) -> None:
    from kcache.inductor import cpp, hostflags

    cmd = "{cc} k.cpp -O3 -march=native -shared -fPIC -o {out}/k.so"
    keys = {}
    for cpu in ("skylake-avx512", "haswell", "skylake-avx512"):
        hostflags.forget_answers()
        cc = fake_compiler(tmp_path / cpu, cpu)  # the same path for the same CPU name
        out = tmp_path / "out"
        _, key, comps = cpp.key_for(cmd.format(cc=cc, out=out), str(out / "k.so"))
        keys.setdefault(cpu, set()).add(key)
        assert comps["host_target"].startswith("gcc:")
    assert len(keys["skylake-avx512"]) == 1, "the same CPU gives the same key"
    assert keys["skylake-avx512"] != keys["haswell"], "another CPU, another key"


def test_a_host_dependent_flag_the_compiler_cannot_resolve_is_not_cached(tmp_path: Path) -> None:
    from kcache.inductor import cpp, hostflags

    hostflags.forget_answers()
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\nexit 1\n")
    cc.chmod(0o700)
    assert cpp.key_for(f"{cc} k.cpp -march=native -o {tmp_path}/k.so", str(tmp_path / "k.so")) is None
    plain = cpp.key_for(f"{cc} k.cpp -mavx2 -o {tmp_path}/k.so", str(tmp_path / "k.so"))
    assert plain is not None and "host_target" not in plain[2], "no native flag: nothing to resolve"


def test_folders_are_made_neutral_only_as_whole_path_components() -> None:
    from kcache.inductor import cpp

    cmd = "g++ /tmp/job1/k.cpp -I/tmp/job10/x -o /tmp/job1/k.so"
    assert cpp.neutral_command(cmd, "/tmp/job1") == "g++ <OUT>/k.cpp -I/tmp/job10/x -o <OUT>/k.so"
