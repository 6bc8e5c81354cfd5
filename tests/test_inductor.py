"""torch.compile through kcache (issue 14): Inductor's own caches in kcache's store.

Real torch.compile runs on the CPU (Inductor's C++ backend), each in a fresh process with its own
empty ``TORCHINDUCTOR_CACHE_DIR``: what a new container, node or replica has. The second process
must find the FX graph, AOTAutograd, C++ kernel and dynamic-shape (PGO) entries in kcache's store
(Inductor's own hit counters say so, and kcache's), bundles must carry them (signed only), and
the store's commands must know the new kinds. The integration's functions are also tested
directly, without torch.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kcache
from kcache import inductor
from kcache.inductor.declare import (
    INDUCTOR_AOT,
    INDUCTOR_AUTOTUNE,
    INDUCTOR_CPP,
    INDUCTOR_FX,
    INDUCTOR_PGO,
    INDUCTOR_PRECOMPILE,
)
from kcache.kinds import TRITON_META
from kcache.store import Store

PYTHON = sys.executable
CHILD = Path(__file__).parent / "torch_compile" / "child.py"
JOB = "kcache-test-job"  # PGO keeps profiles only under a job id (TORCH_COMPILE_JOB_ID)
SECRET = "bundle-secret"
# Inductor's CPU vector-ISA probe (a g++ build of 3 s of CPU, then a new Python, in a process with
# an empty store) is counted by the tests of the cold run (``warm``, ``plain``); in the prewarm and
# caching-precompile tests it is not the subject: torch is told the answer its probe gives here.
# It is in the FX key: the same in each process of a test.
NO_ISA_PROBE = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}


def env_for(tmp: Path, store: Path | None, inductor_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_"))}
    env.pop("PYTHONPATH", None)
    env.update(
        HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"), TORCHINDUCTOR_CACHE_DIR=str(inductor_dir)
    )
    env["TORCH_COMPILE_JOB_ID"] = JOB
    env["OMP_NUM_THREADS"] = "1"  # the FX key holds the thread count: the same in every child
    if store is not None:
        env.update(KCACHE="1", KCACHE_DIR=str(store))
    env.update(extra)
    return env


def run_child(env: dict[str, str], *batches: int) -> dict[str, Any]:
    r = subprocess.run(
        [PYTHON, str(CHILD), *map(str, batches)], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def kc(env: dict[str, str], *args: str) -> Any:
    r = subprocess.run(
        [PYTHON, "-m", "kcache", *args, "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def counts(out: dict[str, Any], kind: str, what: str) -> int:
    return int(out.get("process", {}).get(kind, {}).get(what, 0))


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One cold process (KCACHE=1, empty store, empty Inductor folder) at two batch sizes: a
    static graph, then a dynamic one (automatic dynamic), each kept in the store."""
    pytest.importorskip("torch", reason="torch.compile tests need torch (CI installs it)")
    base = tmp_path_factory.mktemp("inductor")
    store = base / "store"
    # it reports torch's cache switches too (kcache on, none set by the user: the switches test)
    out = run_child(env_for(base, store, base / "ind-cold", CHILD_SWITCHES="1"), 8, 16)
    return {"base": base, "store": store, "cold": out}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same child with KCACHE unset, an empty Inductor folder, one batch size; it reports
    torch's cache switches too (kcache off: the switches test)."""
    pytest.importorskip("torch", reason="torch.compile tests need torch (CI installs it)")
    base = tmp_path_factory.mktemp("inductor-plain")
    return run_child(env_for(base, None, base / "ind-plain", CHILD_SWITCHES="1"), 8)


# ------------------------------------------------------------------------------- end to end
def test_a_cold_run_stores_every_kind(warm: dict[str, Any]) -> None:
    cold = warm["cold"]
    assert cold["kcache"] and cold["ok"]
    assert cold["caching_precompile"] is False  # kcache never turns it on (it drops guards)
    assert cold["inductor"].get("fxgraph_cache_miss", 0) >= 2 and cold["unique_graphs"] == 2
    for kind in (INDUCTOR_FX, INDUCTOR_AOT, INDUCTOR_CPP, INDUCTOR_PGO):
        assert counts(cold, kind, "puts") >= 1, (kind, cold["process"])
    env = env_for(warm["base"], warm["store"], warm["base"] / "unused")
    stats = kc(env, "stats")
    for kind in (INDUCTOR_FX, INDUCTOR_AOT, INDUCTOR_CPP, INDUCTOR_PGO):
        assert stats["by_kind"][kind]["entries"] >= 1, stats["by_kind"]
    listed = kc(env, "inspect", "--kind", INDUCTOR_FX)
    assert len(listed) >= 2 and all(e["summary"].get("cache") == "fx-graph-v1" for e in listed)
    if platform.machine() in ("x86_64", "AMD64"):  # Inductor probes AVX2/AVX512 in a new Python each
        assert cold["isa_probes"] >= 1
        probes = [
            e for e in kc(env, "inspect", "--kind", TRITON_META) if e["key"].startswith("vec-isa-probe/")
        ]
        assert len(probes) == cold["isa_probes"], "each probe's answer is remembered"


def test_a_new_process_with_an_empty_inductor_folder_starts_warm(
    warm: dict[str, Any], tmp_path: Path
) -> None:
    fresh = tmp_path / "ind-fresh"
    out = run_child(env_for(warm["base"], warm["store"], fresh), 8, 16)
    assert out["ok"]
    assert out["inductor"].get("fxgraph_cache_hit", 0) >= 1 and "fxgraph_cache_miss" not in out["inductor"]
    assert out["aot"].get("autograd_cache_hit", 0) >= 1 and "autograd_cache_miss" not in out["aot"]
    # The stored profile says the batch is dynamic: one graph at once, not a static one first.
    assert out["unique_graphs"] == 1
    assert counts(out, INDUCTOR_FX, "hits") >= 1 and counts(out, INDUCTOR_PGO, "hits") >= 1
    assert counts(out, INDUCTOR_CPP, "hits") >= 1 and counts(out, INDUCTOR_CPP, "puts") == 0, "no g++ ran"
    assert out["isa_probes"] == 0, "the CPU ISA probes' answers come from the store (2 s on this box)"
    assert not (fresh / "fxgraph").exists(), "served from kcache, not from a local copy"


def test_graph_entries_name_the_compiled_function(warm: dict[str, Any]) -> None:
    """inspect's rows of FX graph and AOTAutograd entries say what they hold: the function Dynamo
    compiled (the frame's qualified name, and its file's base name), also to select and group by."""
    env = env_for(warm["base"], warm["store"], warm["base"] / "unused")
    for kind in (INDUCTOR_FX, INDUCTOR_AOT):
        listed = kc(env, "inspect", "--kind", kind)
        assert listed and all(e["summary"].get("name") == "MLP.forward" for e in listed), listed
        assert all(e["summary"]["file"].startswith("child.py:") for e in listed)
    by_name = kc(env, "inspect", "MLP.forward")
    assert {e["kind"] for e in by_name} >= {INDUCTOR_FX, INDUCTOR_AOT}
    groups = {g["name"]: g for g in kc(env, "inspect", "--group")}
    assert groups["MLP.forward"]["kinds"].get(INDUCTOR_FX, 0) >= 2


def test_without_kcache_an_empty_folder_is_cold(warm: dict[str, Any], plain: dict[str, Any]) -> None:
    """The control for the test above: the same child with KCACHE unset compiles everything."""
    out = plain
    assert not out["kcache"] and out["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert out["isa_probes"] == warm["cold"]["isa_probes"], "torch probes in every process"


def test_a_signed_bundle_carries_them_to_another_path(warm: dict[str, Any], tmp_path: Path) -> None:
    env = env_for(warm["base"], warm["store"], tmp_path / "x", KCACHE_SECRET=SECRET)
    bundle = tmp_path / "compile.kcb.tgz"
    exported = kc(env, "export", str(bundle))
    assert exported["signed"] and exported["by_kind"].get(INDUCTOR_FX, 0) >= 2
    assert TRITON_META not in exported["by_kind"], "machine-local: never exported"
    other = tmp_path / "elsewhere" / "store"
    imported = kc({**env, "KCACHE_DIR": str(other)}, "import", str(bundle))
    assert imported["signed"] and not imported["skipped"], imported
    hidden = warm["store"].with_name("store.hidden")  # the original is gone while the copy is used
    os.rename(warm["store"], hidden)
    try:
        out = run_child(env_for(warm["base"], other, tmp_path / "ind-bundle"), 8, 16)
    finally:
        os.rename(hidden, warm["store"])
    assert out["inductor"].get("fxgraph_cache_hit", 0) >= 1 and "fxgraph_cache_miss" not in out["inductor"]
    assert out["unique_graphs"] == 1 and counts(out, INDUCTOR_CPP, "puts") == 0


def test_an_unsigned_bundle_never_brings_pickles_or_host_code(warm: dict[str, Any], tmp_path: Path) -> None:
    env = env_for(warm["base"], warm["store"], tmp_path / "x")
    bundle = tmp_path / "unsigned.kcb"
    kc(env, "export", str(bundle))
    other = tmp_path / "other" / "store"
    # Imported by a process that has a secret: the bundle has no signature, so what torch would
    # unpickle (FX, AOT, PGO entries) and what it would dlopen (C++ kernels) stays out.
    r = subprocess.run(
        [PYTHON, "-m", "kcache", "import", str(bundle), "--json"],
        capture_output=True, text=True, timeout=120,
        env={**env, "KCACHE_DIR": str(other), "KCACHE_SECRET": SECRET},
    )  # fmt: skip
    # every entry exported needs a signature: nothing imported, which the exit status says
    assert r.returncode == 1 and "nothing imported" in r.stderr, r.stderr
    imported = json.loads(r.stdout)
    refused = {s["kind"] for s in imported["skipped"]}
    assert {INDUCTOR_FX, INDUCTOR_AOT, INDUCTOR_PGO, INDUCTOR_CPP} <= refused, imported
    # nothing of it in the store: the failed import left no store at all
    assert not other.exists()


def test_clear_kind_and_eviction_on_the_new_kinds(warm: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(warm["store"], copy, symlinks=True)
    env = env_for(warm["base"], copy, tmp_path / "x")
    before = kc(env, "stats")["by_kind"]
    res = kc(env, "clear", "--kind", INDUCTOR_FX)
    assert res["count"] == before[INDUCTOR_FX]["entries"] >= 2
    after = kc(env, "stats")["by_kind"]
    assert after.get(INDUCTOR_FX, {}).get("entries", 0) == 0
    assert after[INDUCTOR_AOT]["entries"] == before[INDUCTOR_AOT]["entries"], "only that kind"
    from kcache.store import tunables as local

    monkeypatch.setattr(local, "GRACE_S", 0.0)
    s = Store.open(copy, max_size=1)
    removed, _ = s.evict(target=0)
    s.close()
    assert removed >= after[INDUCTOR_AOT]["entries"] + after[INDUCTOR_CPP]["entries"]
    assert sum(v["entries"] for v in kc(env, "stats")["by_kind"].values()) == 0


SWITCHES = """
import json
from child import switches
print(json.dumps(switches()))
"""


@pytest.mark.parametrize("user", ["unset", "fx_off", "kcache_off"])
def test_switches_the_user_set_are_left_alone(
    request: pytest.FixtureRequest, tmp_path: Path, user: str
) -> None:
    """Read in a process with kcache on and nothing set (the cold run of ``warm``), one with
    ``TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=0`` (a process of its own, no compile) and one with
    kcache off (``plain``): tests/torch_compile/child.py's ``switches()`` in each."""
    pytest.importorskip("torch", reason="needs torch")
    if user == "unset":
        got = request.getfixturevalue("warm")["cold"]["switches"]
    elif user == "kcache_off":
        got = request.getfixturevalue("plain")["switches"]
    else:
        extra = {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0"}
        env = env_for(tmp_path, tmp_path / "store", tmp_path / "ind", **extra)
        r = subprocess.run(
            [PYTHON, "-c", SWITCHES], capture_output=True, text=True, env=env, timeout=300, cwd=CHILD.parent
        )
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["bundled"] is None, "never turned on: it changes the FX key and fails without Triton"
    if user == "kcache_off":
        assert (got["fx"], got["autotune"], got["aot"], got["pgo"]) == (None, None, None, None)
        assert not any(got["override"].values()) and not got["recheck_wrapped"]
        assert got["aot_decided"] is False
        return
    # kcache applies cached coordinate-descent winners torch 2.11 drops (tests/test_gpu.py)
    assert got["recheck_wrapped"]
    assert got["autotune"] and got["pgo"]
    assert got["override"]["RemoteAutotuneCache"] and got["override"]["RemoteDynamoPGOCache"]
    # AOTAutograd's switch stays unset (torch hashes it into the AOTAutograd key: a process with
    # kcache would not share Inductor's folder with one without); kcache answers torch's decision
    assert got["aot"] is None and got["override"]["RemoteAOTAutogradCache"]
    if user == "fx_off":
        assert got["fx"] is False and not got["override"]["RemoteFxGraphCache"]
        assert got["aot_decided"] is False  # an AOTAutograd entry is useless without its FX graphs
    else:
        assert got["fx"] is True and got["override"]["RemoteFxGraphCache"]
        assert got["aot_decided"] is True


# ------------------------------------------------------------------------------- the backend, directly
@pytest.fixture
def enabled(tmp_path: Path):
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False, torch=False)
    yield kcache.active_store()
    kcache.disable()


def test_get_put_replace_round_trip(enabled: Store) -> None:
    key = "pt2:fx-graph-v1::abc:c1"
    assert inductor.get(INDUCTOR_FX, key) is None
    inductor.put(INDUCTOR_FX, key, b'{"data": "AAAA", "time_taken_ms": 1234}')
    assert inductor.get(INDUCTOR_FX, key) == b'{"data": "AAAA", "time_taken_ms": 1234}'
    # Inductor's remote caches overwrite: the last put wins (a grown PGO profile, a new variant).
    inductor.put(INDUCTOR_FX, key, b'{"data": "BBBB", "time_taken_ms": 7}')
    assert inductor.get(INDUCTOR_FX, key) == b'{"data": "BBBB", "time_taken_ms": 7}'
    skey, _ = inductor.store_key(INDUCTOR_FX, key)
    hit = enabled.get(INDUCTOR_FX, skey, count=False)
    assert hit.record.compile_s == pytest.approx(0.007) and hit.record.summary["cache"] == "fx-graph-v1"
    assert hit.names == [inductor.entries.GRAPH] and hit.read(inductor.entries.GRAPH) == b"\x04\x10A"
    assert len([i for i in enabled.iter_entry_ids()]) == 1


def test_keys_name_what_torch_leaves_out() -> None:
    pgo, comps = inductor.store_key(INDUCTOR_PGO, "pt2:dynamo-pgo::job:None::c1")
    assert pgo.endswith(f"|torch={comps['torch_version']}")
    tune, comps = inductor.store_key(INDUCTOR_AUTOTUNE, "pt2:xyz::k:c1")
    assert tune.endswith(f"|gpu={comps['gpu_name']}") and comps["cache"] == "xyz"
    fx, _ = inductor.store_key(INDUCTOR_FX, "pt2:fx-graph-v1::k:c1")
    assert fx == "pt2:fx-graph-v1::k:c1|form=pickle"  # the graph's pickle, out of torch's envelope


def test_what_is_not_bytes_is_not_stored(enabled: Store, kcache_warnings: list[str]) -> None:
    inductor.put(INDUCTOR_AOT, "pt2:a::k:c1", {"not": "bytes"})
    assert list(enabled.iter_entry_ids()) == []
    assert any("not bytes" in m for m in kcache_warnings)


def test_an_insecure_store_gets_no_pickles(tmp_path: Path, kcache_warnings: list[str]) -> None:
    root = tmp_path / "store"
    Store.open(root).close()
    os.chmod(root, 0o770)  # group-writable: used only with KCACHE_ALLOW_INSECURE=1
    try:
        os.environ["KCACHE_ALLOW_INSECURE"] = "1"
        assert kcache.enable(dir=root, triton=False, nvfuser=False, torch=False)
        inductor.put(INDUCTOR_FX, "pt2:fx::k:c1", b"pickle bytes")
        assert inductor.get(INDUCTOR_FX, "pt2:fx::k:c1") is None
        assert list(kcache.active_store().iter_entry_ids()) == []
        assert any("ownership checks" in m for m in kcache_warnings)
    finally:
        os.environ.pop("KCACHE_ALLOW_INSECURE", None)
        kcache.disable()


def test_compile_time_from_the_envelope() -> None:
    assert inductor._compile_s(b'{"data": "x", "time_taken_ms": 2500}') == 2.5
    assert inductor._compile_s(b"no time here") == 0.0


# ------------------------------------------------------------------------------- prewarm


# `kcache prewarm` of the example's [[torch]] entry on the CPU, then its serving process with an
# empty Inductor folder (every listed shape an FX graph cache hit): tests/test_examples.py runs
# docs/examples/torch_compile/README.md as written and checks exactly that (it was run twice, here
# too: a minute of CI). What the README cannot show: a prewarm on a machine whose Inductor folder
# is warm, below, with a spec, model and serving process of its own (tests/torch_compile/prewarm:
# the example's program around a two-layer MLP, a quarter less CPU in each of its four processes).
PREWARM = CHILD.with_name("prewarm")


def _serve(env: dict[str, str]) -> dict[str, Any]:
    """The serving process of the prewarm spec's model: its FX graph cache counters."""
    r = subprocess.run(
        [PYTHON, "serve.py"], capture_output=True, text=True, env=env, timeout=600, cwd=PREWARM
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _prewarm(env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run(
        [PYTHON, "-m", "kcache", "prewarm", "spec.toml", "--json"],
        capture_output=True, text=True, env=env, timeout=900, cwd=PREWARM,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_prewarm_stores_what_it_prepares_whatever_inductor_s_folder_holds(tmp_path: Path) -> None:
    """Inductor looks a graph up in its own folder before it asks kcache: a prewarm run where that
    folder was warm (the machine prewarmed before: the example's README run twice) stored nothing
    ("0 prepared, 2 already cached") and a serving process with a new folder was cold. The prewarm
    now compiles in a folder of its own: the second store gets every graph and kernel, its summary
    says so, and a process with a new folder is served from it without a compile."""
    pytest.importorskip("torch", reason="needs torch")
    folder = tmp_path / "ind-machine"  # the machine's Inductor folder, warmed by a serving process
    first = env_for(tmp_path, tmp_path / "store-1", folder, **NO_ISA_PROBE)
    first.pop("TORCH_COMPILE_JOB_ID")
    _serve(first)
    assert (folder / "fxgraph").is_dir() and (folder / "aotautograd").is_dir(), "Inductor's folder is warm"
    first.pop("KCACHE")  # the prewarm turns kcache on itself, into the store it is given
    second = dict(first, KCACHE_DIR=str(tmp_path / "store-2"))
    summary = _prewarm(second)
    stored = summary["totals"]["stored"]
    assert stored.get(INDUCTOR_FX) == 2 and stored.get(INDUCTOR_AOT) == 2, summary["totals"]
    assert stored.get(INDUCTOR_CPP, 0) >= 1, summary["totals"]
    assert [i["status"] for i in summary["items"]] == ["prepared", "prepared"]
    again = _prewarm(second)  # the store holds it all now: nothing new, and said so
    assert [i["status"] for i in again["items"]] == ["cached", "cached"] and not again["totals"][
        "stored"
    ].get(INDUCTOR_FX), again["totals"]
    serve_env = env_for(tmp_path, tmp_path / "store-2", tmp_path / "ind-new", **NO_ISA_PROBE)
    serve_env.pop("TORCH_COMPILE_JOB_ID")
    report = _serve(serve_env)
    assert report["fxgraph_cache"] == {"fxgraph_cache_hit": 2}, report
    stats = kc(serve_env, "stats")
    assert stats["by_kind"][INDUCTOR_CPP]["entries"] == stored[INDUCTOR_CPP], "no kernel was compiled anew"


@pytest.mark.parametrize(
    "entry, message",
    [
        ('model = "m:f"', "inputs"),
        ('model = "m:f"\ninputs = "m:g"\ndevice = "tpu"', "cuda or cpu"),
        ('model = "m:f"\ninputs = "m:g"\ncompile = { modee = "max-autotune" }', "unknown argument"),
        ('model = "m:f"\ninputs = "m:g"\ncompile = { dynamic = "yes" }', "must be a bool"),
        ('model = "m:f"\ninputs = "m:g"\nbackward = 1', "true or false"),
        ('model = "not a path"\ninputs = "m:g"', "import path"),
    ],
)
def test_torch_entries_are_checked(entry: str, message: str) -> None:
    from kcache.prewarm.spec import SpecError, load

    with pytest.raises(SpecError, match=message):
        load(f"[[torch]]\n{entry}\n")


def test_a_torch_entry_expands_per_sizes_binding() -> None:
    from kcache.prewarm.spec import load

    sp = load(
        '[[torch]]\nmodel = "m:f"\ninputs = "m:g"\nsizes = [{ B = 1 }, { B = 8 }]\ncompile = { mode = "max-autotune" }\n'
    )
    items = sp.items()
    assert [i.symbols for i in items] == [{"B": 1}, {"B": 8}]
    assert items[0].entry.compile == {"mode": "max-autotune"} and items[0].entry.device == "cuda"


PRECOMPILE = {"TORCH_CACHING_PRECOMPILE": "1"}
NAMES = CHILD.with_name("precompile_names.py")  # functions compiled by name, in order


def run_names(env: dict[str, str], names: str) -> dict[str, Any]:
    r = subprocess.run([PYTHON, str(NAMES), names], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved_package(tmp_path_factory: pytest.TempPathFactory, inductor_headers: Any) -> dict[str, Any]:
    """A program that turned on Dynamo's caching precompile, compiled ``f`` and saved its
    artifacts, once per module: its store (copied by a test that changes it), what it reported,
    and the session's precompiled headers (each process of it keeps a TMPDIR of its own, as on
    another node, and reaches them there)."""
    pytest.importorskip("torch")
    import torch._dynamo.config as dynamo_config

    if not hasattr(dynamo_config, "caching_precompile"):
        pytest.skip("this torch has no caching precompile")
    tmp = tmp_path_factory.mktemp("precompile")
    store = tmp / "store"
    tmpdir = str(inductor_headers.link(tmp / "tmp-a"))
    env = env_for(
        tmp, store, tmp / "ind-a", CHILD_SAVE_ARTIFACTS="1", TMPDIR=tmpdir, **PRECOMPILE, **NO_ISA_PROBE
    )
    return {"tmp": tmp, "store": store, "first": run_names(env, "f"), "headers": inductor_headers}


@pytest.fixture(scope="module")
def package_served(saved_package: dict[str, Any]) -> dict[str, Any]:
    """The next process of that program, with an empty Inductor folder: it compiles ``f`` (its
    package in kcache's store), then ``g``, a frame of the same module traced after that
    package was installed."""
    tmp, store = saved_package["tmp"], saved_package["store"]
    tmpdir = str(saved_package["headers"].link(tmp / "tmp-b"))
    env = env_for(tmp, store, tmp / "ind-b", TMPDIR=tmpdir, **PRECOMPILE, **NO_ISA_PROBE)
    return {"env": env, "out": run_names(env, "f,g")}


def test_caching_precompile_is_kept_when_the_program_turns_it_on(
    saved_package: dict[str, Any], package_served: dict[str, Any]
) -> None:
    """A program that turns on Dynamo's caching precompile and saves its artifacts: the packages
    torch writes into its folder are kept in kcache's store, and a process with an empty folder
    gets them from there (torch's own counter says it loaded one)."""
    first = saved_package["first"]
    assert first["caching_precompile"] and first["ok"]
    assert first["dynamo_cache"].get("dynamo_cache_miss") == 1
    assert counts(first, INDUCTOR_PRECOMPILE, "puts") == 1
    second = package_served["out"]
    assert second["ok"]
    assert second["dynamo_cache"].get("dynamo_cache_hit") == 1, second["dynamo_cache"]
    assert counts(second, INDUCTOR_PRECOMPILE, "hits") == 1
    listed = kc(package_served["env"], "inspect", "--kind", INDUCTOR_PRECOMPILE)
    assert [e["kind"] for e in listed] == [INDUCTOR_PRECOMPILE]


def test_a_frame_traced_after_a_stored_package_was_installed(package_served: dict[str, Any]) -> None:
    """``f``'s package, installed from the store, put its ``__builtins_dict___0`` in the module;
    ``g``, traced after it, must get a name of its own (torch.compile with kcache behaves as
    without it)."""
    got = package_served["out"]
    assert got["dynamo_cache"].get("dynamo_cache_hit") == 1, got  # f's package came from the store
    assert got["f"] == "ok" and got["g"] == "ok", got  # was: Name '__builtins_dict___0' already exists


def test_a_kept_package_torch_cannot_install_is_compiled_afresh_and_removed(
    tmp_path: Path, saved_package: dict[str, Any]
) -> None:
    """torch 2.11 could not install its own caching-precompile package of a BERT model (a
    TypeError from its guards' unpickling, seen on the H200). A package kcache wrote into an empty
    folder must then cost a compile, not the program: the process compiles and answers right,
    and the package is gone from the folder and the store, so the next process does not try it."""
    import torch._dynamo.package as package

    if not hasattr(package, "load_guards_state"):
        pytest.skip("this torch's caching precompile has no load_guards_state to break")
    store = tmp_path / "store"
    shutil.copytree(saved_package["store"], store, symlinks=True)  # this test removes its entry
    env = env_for(tmp_path, store, tmp_path / "ind-b", CHILD_BREAK_INSTALL="1", **PRECOMPILE, **NO_ISA_PROBE)
    second = run_names(env, "f")  # the old code: torch's TypeError ended the program here
    assert second["ok"]
    assert second["dynamo_cache"].get("dynamo_cache_hit") == 1, second["dynamo_cache"]
    assert counts(second, INDUCTOR_PRECOMPILE, "hits") == 1
    assert second["unique_graphs"] >= 1  # compiled, as on a miss
    assert not list((tmp_path / "ind-b" / "dynamo").glob("*/entry"))
    assert kc(env, "inspect", "--kind", INDUCTOR_PRECOMPILE) == []
    third = run_names(env, "f")
    assert third["ok"] and third["dynamo_cache"].get("dynamo_cache_miss") == 1, third["dynamo_cache"]
