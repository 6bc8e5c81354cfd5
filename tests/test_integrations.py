"""The integration registry: integrations named by string, attached by the facade, handed the
active cache (a getter) instead of reaching up for it.

Each test that enables kcache runs in a child process: attaching patches the libraries of the
process that does it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kcache import integrations, registry
from kcache.patch import CacheSlot, Integration


def _child(code: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    full.update(
        KCACHE_STRICT="1",
        TRITON_CACHE_DIR=str(tmp_path / "triton-cache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"),
        **env,
    )
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_each_registered_integration_is_where_its_declaration_says(name: str) -> None:
    """The start-up hook registers triggers from the declarations without importing any
    integration; the ``Integration`` a declaration names is the registered one, and it names its
    switch, its triggers and (but for prewarm, whose memos are the shared machine-local kind) its
    kinds."""
    declared = registry.declared(name)
    integ = integrations.load(name)
    assert isinstance(integ, Integration)
    assert integ.name == name
    assert declared.switch in registry.switches() and declared.triggers
    assert declared.kinds or name == "prewarm", "an integration names the kinds it keeps"
    assert set(declared.uses) <= set(registry.REGISTRY) - {name}


def test_the_switches_are_the_declared_ones() -> None:
    assert registry.switches() == ["triton", "nvfuser", "torch"]


def test_a_declaration_is_read_without_importing_its_package(tmp_path: Path) -> None:
    """What the KCACHE=1 hook loads: the registry reads each declare.py from its file; no
    integration package (and none of what its __init__ imports) is loaded."""
    res = _child(
        """
        import json, sys
        from kcache import registry
        ds = registry.declarations()
        print(json.dumps({"pkgs": sorted(m for m in sys.modules if m.startswith("kcache.")),
                          "triggers": {d.name: list(d.triggers) for d in ds}}))
        """,
        tmp_path,
    )
    assert not [m for m in res["pkgs"] if m.startswith(tuple(registry.REGISTRY.values()))], res["pkgs"]
    assert set(res["pkgs"]) <= {"kcache._imports", "kcache.registry"}
    assert res["triggers"]["triton"] == ["triton"]


def test_enable_refuses_a_switch_no_integration_declares(tmp_path: Path) -> None:
    res = _child(
        f"""
        import json, kcache
        try:
            kcache.enable(dir={str(tmp_path / "s")!r}, jax=False)
            out = "enabled"
        except TypeError as e:
            out = str(e)
        print(json.dumps({{"out": out, "on": kcache.is_enabled()}}))
        """,
        tmp_path,
    )
    assert "jax" in res["out"] and res["on"] is False


def test_a_cache_slot_follows_its_getter_and_lets_go_only_of_its_own() -> None:
    slot = CacheSlot()
    assert slot() is None and not slot.bound
    current = ["a"]
    unbind_first = slot.bind(lambda: current[0])
    assert slot() == "a"
    current[0] = "b"  # the store switched: the slot sees it without being bound again
    assert slot() == "b"
    unbind_second = slot.bind(lambda: "c")
    unbind_first()  # an older attachment letting go leaves the newer one bound
    assert slot() == "c"
    unbind_second()
    assert slot() is None


def test_integrations_see_the_active_cache_through_enable_disable_and_a_switch_of_store(
    tmp_path: Path,
) -> None:
    """Every integration's parts read the cache the facade handed them: the store of the last
    enable(), None after disable(), whatever the switches (their objects may be used directly), for
    modules imported before enable() and after it."""
    res = _child(
        f"""
        import json, os
        import kcache
        from kcache.triton import attached as tri
        out = {{"before": tri.cache() is None}}
        a, b = os.path.realpath({str(tmp_path / "a")!r}), os.path.realpath({str(tmp_path / "b")!r})
        assert kcache.enable(dir=a, triton=False, nvfuser=False, torch=False)
        from kcache.inductor import attached as ind   # imported after enable()
        from kcache.nvfuser import attached as nvf
        out["a"] = [str(s().root) == a for s in (tri.cache, ind.cache, nvf.cache)]
        kcache.disable()
        out["off"] = [s.cache() is None for s in (tri, ind, nvf)]
        assert kcache.enable(dir=b, triton=False, nvfuser=False, torch=False)
        out["b"] = [str(s.cache().root) == b for s in (tri, ind, nvf)]
        kcache.disable()
        print(json.dumps(out))
        """,
        tmp_path,
    )
    assert res == {"before": True, "a": [True] * 3, "off": [True] * 3, "b": [True] * 3}


def test_a_triton_cache_manager_named_by_the_user_turns_kcache_on(tmp_path: Path) -> None:
    """TRITON_CACHE_MANAGER names kcache's manager and nothing enabled kcache: the manager asks
    the facade (through kcache._imports, below both) to turn kcache on, and uses its store."""
    res = _child(
        """
        import json, kcache
        from kcache.triton.manager import KcacheCacheManager
        before = kcache.is_enabled()
        m = KcacheCacheManager("0" * 64)
        print(json.dumps({"before": before, "after": kcache.is_enabled(),
                          "store": str(m._store.root) if m._store is not None else None}))
        """,
        tmp_path,
        KCACHE_DIR=str(tmp_path / "store"),
        TRITON_CACHE_MANAGER="kcache.triton.manager:KcacheCacheManager",
    )
    assert res["before"] is False and res["after"] is True
    assert res["store"] == os.path.realpath(tmp_path / "store")


def test_prewarm_is_the_callable_subpackage_after_a_plain_import(tmp_path: Path) -> None:
    """``kcache.prewarm(spec)`` works after ``import kcache`` alone, and is prewarm's own callable
    module (the facade holds none of prewarm's code)."""
    res = _child(
        """
        import json, sys, kcache
        loaded = "kcache.prewarm" in sys.modules
        p = kcache.prewarm
        try:
            p({"triton": []}, dry_run=True)
            answer = None
        except Exception as e:  # the spec's own one-line error: prewarm ran
            answer = type(e).__name__
        print(json.dumps({"loaded_at_import": loaded, "module": p is sys.modules["kcache.prewarm"],
                          "callable": callable(p), "answer": answer}))
        """,
        tmp_path,
        KCACHE_DIR=str(tmp_path / "store"),
    )
    assert res == {"loaded_at_import": False, "module": True, "callable": True, "answer": "SpecError"}


def test_triton_patches_carry_one_marker_and_undo_leaves_a_later_wrapper(tmp_path: Path) -> None:
    """Every attribute of Triton's that kcache replaces carries :data:`kcache.patch.MARKER`;
    disable puts the originals back, except where someone wrapped kcache's wrapper since; an
    enable after a disable wraps once again, not twice."""
    out = _child(
        f"""
        import json
        import triton, triton.compiler.compiler as cc
        from triton.runtime.autotuner import Autotuner
        import kcache
        from kcache.patch import is_ours, original
        from kcache.triton.keymemo import memo_triton_key  # noqa: F401  (loads the module)
        own = {{"key": cc.get_cache_key, "init": Autotuner.__dict__["__init__"], "compile": cc.compile}}
        names = {{"key": lambda: cc.get_cache_key, "init": lambda: Autotuner.__dict__["__init__"],
                 "compile": lambda: triton.compile}}
        r = {{}}
        for round in (1, 2):
            assert kcache.enable(dir={str(tmp_path / "store")!r}, nvfuser=False, torch=False)
            r[f"marked{{round}}"] = {{n: is_ours(get()) and original(get()) is own[n] for n, get in names.items()}}
            r[f"once{{round}}"] = {{n: not is_ours(getattr(get(), "__kcache_original__")) for n, get in names.items()}}
            ours = cc.compile
            later = lambda *a, **k: ours(*a, **k)  # a wrapper of someone else, after kcache's
            if round == 1:
                cc.compile = later
            kcache.disable()
            r[f"restored{{round}}"] = {{n: get() is own[n] for n, get in names.items()}}
            r[f"later{{round}}"] = cc.compile is later
            cc.compile = own["compile"]
        print(json.dumps(r))
        """,
        tmp_path,
    )
    for rnd in (1, 2):
        assert all(out[f"marked{rnd}"].values()) and all(out[f"once{rnd}"].values()), out
        assert all(out[f"restored{rnd}"].values()), out
    assert out["later1"] and not out["later2"], out


def test_torch_patches_carry_one_marker_and_disable_puts_back_every_object(tmp_path: Path) -> None:
    """Every attribute of torch's that kcache replaces (in the integration's trigger modules, their
    classes and the DynamoCache object) carries :data:`kcache.patch.MARKER`, and disable puts
    back the very objects torch had there (a staticmethod as the staticmethod), twice over."""
    pytest.importorskip("torch")
    out = _child(
        f"""
        import importlib, json, sys
        import kcache
        from kcache.inductor import TRIGGERS
        from kcache.patch import MARKER
        mods = [importlib.import_module(m) for m in TRIGGERS]
        import torch._inductor.config as ic

        def owners():
            for m in mods:
                yield m.__name__, m
                for k, v in list(vars(m).items()):
                    if isinstance(v, type) and v.__module__ == m.__name__ or k == "DynamoCache":
                        yield f"{{m.__name__}}.{{k}}", v

        def snap():
            return {{(n, a): v for n, o in owners() for a, v in list(vars(o).items())}}

        def ours(v):  # marked in its own __dict__ (torch's ``ops`` answers any attribute)
            return any(MARKER in getattr(o, "__dict__", {{}}) for o in (v, getattr(v, "__func__", None)))

        before = snap()
        r = {{}}
        for round in (1, 2):
            assert kcache.enable(dir={str(tmp_path / "store")!r}, nvfuser=False, triton=False)
            r[f"ours{{round}}"] = sorted(f"{{n}}:{{a}}" for (n, a), v in snap().items() if ours(v))
            r[f"fx{{round}}"] = ic.fx_graph_remote_cache
            kcache.disable()
            after = snap()
            r[f"changed{{round}}"] = sorted(f"{{n}}:{{a}}" for k, v in before.items() if after.get(k) is not v for n, a in [k])
            r[f"left{{round}}"] = sorted(f"{{n}}:{{a}}" for (n, a), v in after.items() if ours(v))
            r[f"fx_after{{round}}"] = ic.fx_graph_remote_cache
        print(json.dumps(r))
        """,
        tmp_path,
    )
    expected = {
        "torch._dynamo.package.DynamoCache:load",
        "torch._dynamo.package.CompilePackage:install",
        "torch._inductor.cpp_builder.CppBuilder:build",
        "torch._inductor.codecache.FxGraphCache:clear",
        "torch._inductor.remote_cache.RemoteFxGraphCache:backend_override_cls",
        "torch._inductor.runtime.triton_heuristics.CachingAutotuner:recheck_autotune_cache",
        "torch._inductor.async_compile:maybe_warm_pool",
        "torch._inductor.async_compile.AsyncCompile:wakeup",
        "torch._inductor.utils:should_use_remote_fx_graph_cache",
        "torch._inductor.compile_fx:should_use_remote_fx_graph_cache",
    }
    for rnd in (1, 2):
        assert expected <= set(out[f"ours{rnd}"]), sorted(expected - set(out[f"ours{rnd}"]))
        assert out[f"changed{rnd}"] == [] and out[f"left{rnd}"] == [], out
        assert out[f"fx{rnd}"] is True and out[f"fx_after{rnd}"] is None, out
