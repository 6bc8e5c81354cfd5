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

from kcache import integrations
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


@pytest.mark.parametrize("name", sorted(integrations.REGISTRY))
def test_each_registered_integration_declares_what_the_start_up_table_copies(name: str) -> None:
    """The start-up hook registers triggers from STARTUP without importing any integration: the
    copy must be what each one declares."""
    integ = integrations.load(name)
    assert isinstance(integ, Integration)
    assert integ.name == name
    assert integrations.STARTUP[name] == (integ.switch, integ.triggers)
    assert integ.kinds, "an integration names the kinds it keeps"


def test_the_registry_and_the_start_up_table_name_the_same_integrations() -> None:
    assert list(integrations.REGISTRY) == list(integrations.STARTUP)
    assert {switch for switch, _ in integrations.STARTUP.values()} == {"triton", "nvfuser", "torch"}


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
