"""The strict switch through the store and the places that used to swallow bugs (issue 35).

A broad ``except`` inside kcache that is no edge (the store's housekeeping, a probe of the
machine, prewarm's checks and hooks) sorts what it met by the fail-open boundary's rule
(:func:`kcache.boundary.expected`): what the place expects (a full disk, a corrupt entry, a locked
index, a library that is not installed) stays a counted miss; anything else is a bug, raised under
``KCACHE_STRICT=1`` (the suite runs strict) and otherwise one warning and an ``errors`` count.

Each test plants a bug (a plain ``RuntimeError``, as a bug would raise) at one place and checks
that it raises under strict, that the place goes on without strict, and that a failure it expects
never raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcache import boundary, counters, fingerprint
from kcache.store import Store


def _bug(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("planted bug")


def _disk_full(*_args: object, **_kwargs: object) -> None:
    raise OSError(28, "No space left on device")


@pytest.fixture
def lenient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production's rule: no KCACHE_STRICT."""
    monkeypatch.delenv("KCACHE_STRICT", raising=False)


def _errors() -> float:
    return counters.process_totals().get("kcache", {}).get("errors", 0.0)


def test_the_rule_itself(lenient: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert boundary.expected(OSError("gone"), (OSError,), "t-rule", "a test")
    before = _errors()
    assert not boundary.expected(RuntimeError("bug"), (OSError,), "t-rule", "a test")
    assert _errors() == before + 1
    monkeypatch.setenv("KCACHE_STRICT", "1")
    with pytest.raises(RuntimeError) as got:
        boundary.expected(RuntimeError("bug"), (OSError,), "t-rule", "a test")
    assert boundary.raised_strict(got.value)


# -- fingerprint.py: a component's probe ---------------------------------------------------------
@pytest.fixture
def planted_component() -> str:
    name = "kcache-test-planted"
    yield name
    fingerprint._computers.pop(name, None)
    fingerprint._values.pop(name, None)


def test_a_bug_in_a_component_probe_raises_under_strict(planted_component: str) -> None:
    fingerprint.component(planted_component)(_bug)
    with pytest.raises(RuntimeError, match="planted bug"):
        fingerprint.current(planted_component)


def test_a_probe_that_fails_as_probes_do_is_an_unknown_part(planted_component: str) -> None:
    fingerprint.component(planted_component)(lambda: _disk_full())
    assert fingerprint.current(planted_component) is None  # strict, and no raise


def test_without_strict_a_bug_in_a_probe_is_an_unknown_part(lenient: None, planted_component: str) -> None:
    fingerprint.component(planted_component)(_bug)
    before = _errors()
    assert fingerprint.current(planted_component) is None
    assert _errors() == before + 1


# -- prewarm/meta.py: where libtriton is ---------------------------------------------------------
def test_a_bug_in_finding_libtriton_raises_under_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.prewarm import meta
    from kcache.triton import keymemo

    monkeypatch.setattr(keymemo, "_libtriton_path", _bug)
    with pytest.raises(RuntimeError, match="planted bug"):
        meta.libtriton_path()


def test_a_triton_that_cannot_load_is_no_libtriton(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.prewarm import meta
    from kcache.triton import keymemo

    def broken(_mod: object) -> None:
        raise ImportError("libtriton.so: cannot open shared object file")

    monkeypatch.setattr(keymemo, "_libtriton_path", broken)
    assert meta.libtriton_path() is None


# -- prewarm/record.py: the hook Triton calls -------------------------------------------------------
RECORD_HOOK = textwrap.dedent(
    """
    import json
    from kcache.prewarm.record import chain_hooks
    from triton import knobs

    class Recorder:
        def capture(self, kw):
            raise RuntimeError("planted bug")
        commit = capture

    seen = []
    knobs.runtime.jit_cache_hook = lambda **kw: seen.append(kw) or "theirs"
    chain_hooks(Recorder())
    try:
        out = knobs.runtime.jit_cache_hook(fn=None, key="k")
        got = {"returned": out, "program_hook_ran": len(seen)}
    except RuntimeError as e:
        got = {"raised": str(e)}
    print(json.dumps(got))
    """
)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_a_bug_in_the_recording_hook_raises_under_strict(tmp_path: Path, strict: bool) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE")}
    if strict:
        env["KCACHE_STRICT"] = "1"
    res = subprocess.run(
        [sys.executable, "-c", RECORD_HOOK],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    if strict:
        assert got == {"raised": "planted bug"}
    else:  # the program's own hook still runs, and the failure is said once
        assert got == {"returned": "theirs", "program_hook_ran": 1}
        assert "KCACHE_RECORD's recording of a kernel failed" in res.stderr


# -- store/eviction.py and the store's other catches ------------------------------------------------
@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "store", max_size=1 << 30)
    for i in range(4):
        assert s.put("triton", f"k{i}", {"a.bin": os.urandom(4096)}) is not None
    yield s
    s.close()


def test_a_bug_in_eviction_raises_under_strict(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.store.eviction import Evictor

    monkeypatch.setattr(Evictor, "_evict_one", _bug)
    with pytest.raises(RuntimeError, match="planted bug"):
        store.evict(target=0)


def test_a_disk_that_fails_eviction_stays_quiet_under_strict(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kcache.store.eviction import Evictor

    monkeypatch.setattr(Evictor, "_evict_one", _disk_full)
    assert store.evict(target=0) == (0, 0)


def test_without_strict_a_bug_in_eviction_is_reported_and_the_store_goes_on(
    lenient: None, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kcache.store.eviction import Evictor

    monkeypatch.setattr(Evictor, "_evict_one", _bug)
    before = _errors()
    assert store.evict(target=0) == (0, 0)
    assert _errors() == before + 1
    assert store.get("triton", "k0") is not None


def test_a_bug_in_eviction_after_a_put_raises_under_strict(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kcache.store.eviction import Evictor

    monkeypatch.setattr(Evictor, "after_put", _bug)
    with pytest.raises(RuntimeError, match="planted bug"):
        store.put("triton", "k-new", {"a.bin": b"x" * 100})


def test_a_bug_in_an_integrations_key_components_raises_under_strict(store: Store) -> None:
    """The components of a miss are an integration's code, called by the store for explain."""
    with pytest.raises(RuntimeError, match="planted bug"):
        store.get("triton", "absent", _bug)
    assert store.get("triton", "absent", lambda: {"kernel": "k"}) is None


def test_a_bug_in_the_index_raises_under_strict(store: Store) -> None:
    store.flush(force=True)
    with pytest.raises(RuntimeError, match="planted bug"):
        store.disk.catalogue.call(_bug)


def test_a_locked_index_is_no_bug(store: Store) -> None:
    import sqlite3

    def locked(_idx: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    assert store.disk.catalogue.call(locked) is None
