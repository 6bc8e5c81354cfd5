"""The integrations' broad catches, narrowed (issue 35): what each place expects stays its own,
anything else is a bug for the fail-open boundary (:mod:`kcache.boundary`).

A bug is planted (a plain ``RuntimeError``, as a bug would raise) where a broad ``except`` used to
swallow it (a debug line, a silent ``pass``, or a warning with no ``errors`` count): it now raises
under ``KCACHE_STRICT=1`` (the suite runs strict) and is otherwise one warning, an ``errors``
count and the place's fallback. Next to each, what the place does expect still stays quiet.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

import pytest

import kcache
from kcache import counters


def _bug(*_args: object, **_kwargs: object) -> Any:
    raise RuntimeError("planted bug")


@pytest.fixture
def lenient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production's rule: no KCACHE_STRICT."""
    monkeypatch.delenv("KCACHE_STRICT", raising=False)


def _errors() -> float:
    return counters.process_totals().get("kcache", {}).get("errors", 0.0)


@pytest.fixture
def enabled(tmp_path: Path):
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False, torch=False)
    yield kcache.active_store()
    kcache.disable()


# -- prewarm: the build check at Triton's import, the recorder's undo and its file ------------------
def test_a_bug_in_the_prewarm_build_check_is_one_warning(
    lenient: None, monkeypatch: pytest.MonkeyPatch, kcache_warnings: list[str]
) -> None:
    from kcache.prewarm import integration, meta

    monkeypatch.delenv("KCACHE_RECORD", raising=False)
    monkeypatch.setattr(meta, "check_store_build", _bug)
    before = _errors()
    integration._on_triton(types.ModuleType("triton"))  # Triton's import goes on
    assert _errors() == before + 1  # (it was a debug line, uncounted)
    assert any(
        "check of the store's prewarm build failed (RuntimeError: planted bug)" in m for m in kcache_warnings
    )


def test_a_bug_in_the_prewarm_build_check_raises_under_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.prewarm import integration, meta

    monkeypatch.delenv("KCACHE_RECORD", raising=False)
    monkeypatch.setattr(meta, "check_store_build", _bug)
    with pytest.raises(RuntimeError, match="planted bug"):
        integration._on_triton(types.ModuleType("triton"))


@pytest.mark.parametrize("stored", [b"[1, 2]", b'"text"', b"not json", b"[" * 100_000])
def test_a_stored_build_that_is_no_object_says_nothing(enabled: Any, stored: bytes) -> None:
    """A build record whose bytes are JSON of another shape (or no JSON at all) is advice that says
    nothing: no raise, even strict (a JSON list used to raise AttributeError at Triton's import)."""
    from kcache.prewarm import meta

    assert enabled.put(meta.KIND, meta.ANY_KEY, {"build.json": stored}) is not None
    assert meta.check_store_build(enabled) is None


def test_a_bug_undoing_the_recorder_is_reported_and_the_rest_undone(
    lenient: None, kcache_warnings: list[str]
) -> None:
    from kcache.prewarm import integration

    undone: list[str] = []
    detach = integration._attach(lambda: None)
    integration._undo[:] = [lambda: undone.append("first"), _bug]
    before = _errors()
    detach()  # newest first: the bug, then the rest all the same
    assert undone == ["first"]
    assert _errors() == before + 1  # (it was a debug line, uncounted)
    assert any("undoing KCACHE_RECORD's recorder failed" in m for m in kcache_warnings)


def test_a_bug_undoing_the_recorder_raises_under_strict() -> None:
    from kcache.prewarm import integration

    detach = integration._attach(lambda: None)
    integration._undo[:] = [_bug]
    try:
        with pytest.raises(RuntimeError, match="planted bug"):
            detach()
    finally:
        integration._undo.clear()


def _pending(tmp_path: Path) -> Any:
    from kcache.prewarm.record import Recorder

    rec = Recorder(str(tmp_path / "recorded.toml"))
    entry = {"kernel": "mod:kernel", "args": {"n": 4}}
    rec._pending[(id(None), "k")] = ("rid", entry, None)
    return rec


def test_a_bug_writing_the_record_goes_to_the_hooks_edge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorder's commit no longer catches everything itself: a bug goes up to the hook that
    Triton calls (the one edge: raised when strict, else one warning and the kernel not recorded)."""
    rec = _pending(tmp_path)
    monkeypatch.setattr(rec, "_append", _bug)
    with pytest.raises(RuntimeError, match="planted bug"):
        rec.commit({"fn": None, "key": "k"})


def test_a_record_file_that_cannot_be_written_is_one_warning(
    tmp_path: Path, kcache_warnings: list[str]
) -> None:
    rec = _pending(tmp_path)
    os.symlink(tmp_path / "elsewhere", rec.path)  # refused, never followed: an OSError, expected
    rec.commit({"fn": None, "key": "k"})  # strict, and no raise
    assert any("KCACHE_RECORD: cannot append to" in m for m in kcache_warnings)
    assert not (tmp_path / "elsewhere").exists()


# -- nvFuser: storing its kernels at exit, at flush and at detach ---------------------------------------
class _BrokenSession:
    def flush(self) -> int:
        raise RuntimeError("planted bug")

    close = flush


@pytest.fixture
def broken_session(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.nvfuser.kerneldb import hooks

    monkeypatch.setattr(hooks, "_sessions", {"nvfuser_direct": _BrokenSession()})


def test_a_bug_storing_nvfusers_kernels_raises_under_strict(broken_session: None) -> None:
    from kcache.nvfuser.kerneldb import hooks

    with pytest.raises(RuntimeError, match="planted bug"):  # (it was a warning, swallowed)
        hooks.flush()
    with pytest.raises(RuntimeError, match="planted bug"):
        hooks._at_exit()


def test_without_strict_a_bug_storing_nvfusers_kernels_is_counted(
    lenient: None, broken_session: None, kcache_warnings: list[str]
) -> None:
    from kcache.nvfuser.kerneldb import hooks

    before = _errors()
    assert hooks.flush() == 0
    hooks._at_exit()
    assert _errors() == before + 2  # (each was a warning with no errors count)
    assert any(
        "storing nvFuser's new kernels failed (RuntimeError: planted bug)" in m for m in kcache_warnings
    )


def test_a_bug_pushing_fusion_cache_counts_is_no_longer_silent(
    lenient: None, monkeypatch: pytest.MonkeyPatch, kcache_warnings: list[str]
) -> None:
    from kcache.nvfuser import fusion_cache

    cache = fusion_cache.FusionCache(lambda key: "definition", execute=lambda d, args: d)
    monkeypatch.setattr(cache, "flush", _bug)
    before = _errors()
    fusion_cache.flush_all()  # the other caches' counts are pushed all the same
    assert _errors() == before + 1  # (it was a silent pass)
    assert any("pushing a FusionCache's counts failed" in m for m in kcache_warnings)


# -- Triton: the libcuda memo's edge -------------------------------------------------------------------
def _fake_driver(calls: list[str], dirs: list[str]) -> types.SimpleNamespace:
    def libcuda_dirs() -> list[str]:
        calls.append("ldconfig")
        return dirs

    return types.SimpleNamespace(
        libcuda_dirs=libcuda_dirs,
        knobs=types.SimpleNamespace(nvidia=types.SimpleNamespace(libcuda_path=None)),
    )


def test_a_bug_in_the_libcuda_memo_leaves_triton_to_answer(
    enabled: Any, lenient: None, monkeypatch: pytest.MonkeyPatch, kcache_warnings: list[str]
) -> None:
    from kcache.triton import warmup

    monkeypatch.setattr(warmup, "_key", _bug)
    calls: list[str] = []
    driver = _fake_driver(calls, ["/somewhere"])
    warmup.install_libcuda_memo(driver)
    before = _errors()
    assert driver.libcuda_dirs() == ["/somewhere"]  # Triton's own answer (it raised into Triton)
    assert calls == ["ldconfig"] and _errors() == before + 1
    assert any("memo of libcuda's folders failed (RuntimeError: planted bug)" in m for m in kcache_warnings)


def test_a_bug_in_the_libcuda_memo_raises_under_strict(enabled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kcache.triton import warmup

    monkeypatch.setattr(warmup, "_key", _bug)
    driver = _fake_driver([], ["/somewhere"])
    warmup.install_libcuda_memo(driver)
    with pytest.raises(RuntimeError, match="planted bug"):
        driver.libcuda_dirs()


def test_a_remembered_answer_that_is_no_json_asks_triton(enabled: Any) -> None:
    from kcache import kinds
    from kcache.triton import warmup

    calls: list[str] = []
    driver = _fake_driver(calls, ["/somewhere"])
    key = warmup._key(driver)
    if key is None:
        pytest.skip("no boot id: the memo is off by design")
    enabled.put(kinds.TRITON_META, key, {"dirs.json": b"\xff not json"})
    warmup.install_libcuda_memo(driver)
    assert driver.libcuda_dirs() == ["/somewhere"] and calls == ["ldconfig"]  # strict: no raise


# -- torch.compile: the autotune result check ------------------------------------------------------------
def test_an_autotune_result_with_a_huge_time_is_refused_with_its_reason() -> None:
    """A hostile integer the float check cannot convert (it raised OverflowError, which only a
    catch-all turned into a reason): refused for what it is."""
    from kcache.inductor import tunecheck

    blob = b'{"configs_hash": "a", "num_warps": 4, "num_stages": 2, "time_taken_ms": 1' + b"0" * 400 + b"}"
    why = tunecheck.problem(blob)
    assert why is not None and why.startswith("time_taken_ms = "), why
