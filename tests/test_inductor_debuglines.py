"""The AOTAutograd key's debug lines on a torch that computes them at every lookup (torch 2.8-2.12):
kcache/inductor/debuglines.py has them computed only when a log or a structured trace reads them.

CI's torch (2.13) skips them itself, so its module is not wrapped; these tests hand the wrapper a
module shaped as torch 2.11's (an AOTAutograd pickler inheriting torch's own ``debug_lines``, the
module's logger) and call it. tests/test_inductor_served.py counts them in a served process of
whatever torch is installed (on torch 2.11: 2 before this, 0 now)."""

from __future__ import annotations

import logging
import sys
import types
import uuid

import pytest

from kcache.inductor import debuglines


@pytest.fixture(autouse=True)
def no_trace_yet():
    """torch's structured-trace logger as it is when a compile reaches the AOTAutograd key
    without ``TORCH_TRACE``: without handlers (its lazy handler, there at import, removes itself
    at Dynamo's first trace event). Put back afterwards."""
    internal = sys.modules.get("torch._logging._internal")
    trace = getattr(internal, "trace_log", None)
    kept = list(trace.handlers) if trace is not None else []
    for h in kept:
        trace.removeHandler(h)
    yield
    for h in kept:
        trace.addHandler(h)


def torch_211_like(with_guard: bool = False) -> tuple[types.ModuleType, list[object]]:
    """A module as torch 2.11's ``autograd_cache``: ``AOTAutogradCachePickler`` inherits a
    ``debug_lines`` (which records its calls) and ``log`` is the module's logger; ``with_guard``:
    torch 2.13's ``_get_debug_lines_for_cache_key`` beside them."""
    calls: list[object] = []

    class FxGraphCachePickler:
        def debug_lines(self, inp: object) -> list[str]:
            calls.append(inp)
            return [f"[hash] {inp}"]

    class AOTAutogradCachePickler(FxGraphCachePickler):
        pass

    mod = types.ModuleType(f"autograd_cache_{uuid.uuid4().hex[:8]}")
    mod.AOTAutogradCachePickler = AOTAutogradCachePickler  # type: ignore[attr-defined]
    mod.FxGraphCachePickler = FxGraphCachePickler  # type: ignore[attr-defined]
    # at WARNING, as torch sets its loggers without TORCH_LOGS (not the root logger's level,
    # which another test of the same worker may have lowered)
    mod.log = logging.getLogger(mod.__name__)  # type: ignore[attr-defined]
    mod.log.setLevel(logging.WARNING)
    if with_guard:
        mod._get_debug_lines_for_cache_key = lambda *a: []  # type: ignore[attr-defined]
    return mod, calls


def test_no_reader_no_debug_lines_and_the_fx_pickler_untouched() -> None:
    mod, calls = torch_211_like()
    debuglines.on_import(mod)
    assert mod.AOTAutogradCachePickler().debug_lines("details") == []
    assert calls == []
    # the FX graph key's pickler (its debug lines go into the compiled graph) is torch's own
    assert mod.FxGraphCachePickler().debug_lines("fx") == ["[hash] fx"]


def test_a_debug_log_reads_them() -> None:
    mod, calls = torch_211_like()
    debuglines.on_import(mod)
    mod.log.setLevel(logging.DEBUG)
    try:
        assert mod.AOTAutogradCachePickler().debug_lines("details") == ["[hash] details"]
    finally:
        mod.log.setLevel(logging.WARNING)
    assert calls == ["details"]


def test_a_structured_trace_reads_them() -> None:
    """With ``TORCH_TRACE`` torch records them as the key's "components": its trace logger has a
    handler while a trace is written."""
    pytest.importorskip("torch", reason="torch's structured trace logger")
    import torch._logging._internal as internal

    lazy = list(internal.trace_log.handlers)  # (torch loaded after the fixture ran: as it does)
    for h in lazy:
        internal.trace_log.removeHandler(h)
    mod, calls = torch_211_like()
    debuglines.on_import(mod)
    handler = logging.NullHandler()
    internal.trace_log.addHandler(handler)
    try:
        assert mod.AOTAutogradCachePickler().debug_lines("details") == ["[hash] details"]
        internal.trace_log.removeHandler(handler)  # the trace ended
        assert mod.AOTAutogradCachePickler().debug_lines("again") == []
    finally:
        internal.trace_log.removeHandler(handler)
        for h in lazy:
            internal.trace_log.addHandler(h)
    assert calls == ["details"]


def test_a_torch_that_skips_them_itself_is_left_alone() -> None:
    mod, calls = torch_211_like(with_guard=True)
    own = mod.AOTAutogradCachePickler.debug_lines
    debuglines.on_import(mod)
    assert mod.AOTAutogradCachePickler.debug_lines is own
    assert "debug_lines" not in vars(mod.AOTAutogradCachePickler)
