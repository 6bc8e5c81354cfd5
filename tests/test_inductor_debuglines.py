"""The AOTAutograd key's debug lines on a torch that computes them at every lookup (torch 2.8-2.11):
kcache/inductor/debuglines.py has them computed only when a log or a structured trace reads them.

CI's torch (2.13) skips them itself, so its module is not wrapped; these tests hand the wrapper a
module shaped as torch 2.11's (an AOTAutograd pickler inheriting torch's own ``debug_lines``, the
module's logger) and call it. tests/test_inductor_served.py counts them in a served process of
whatever torch is installed (on torch 2.11: 2 before this, 0 now)."""

from __future__ import annotations

import contextlib
import logging
import sys
import types
import uuid
from collections.abc import Iterator

import pytest

from kcache.inductor import debuglines


@contextlib.contextmanager
def trace_handlers(*handlers: logging.Handler) -> Iterator[None]:
    """torch's structured-trace logger with exactly ``handlers`` inside the block (none: as when
    a compile reaches the AOTAutograd key without ``TORCH_TRACE``, its lazy handler, there at
    import, having removed itself at Dynamo's first trace event; under pytest, torch 2.8 also
    passes it the capture handlers of the test's phase). Nothing where torch is not loaded."""
    internal = sys.modules.get("torch._logging._internal")
    trace = getattr(internal, "trace_log", None)
    if trace is None:
        yield
        return
    kept = list(trace.handlers)
    trace.handlers = list(handlers)
    try:
        yield
    finally:
        trace.handlers = kept


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
    with trace_handlers():
        assert mod.AOTAutogradCachePickler().debug_lines("details") == []
    assert calls == []
    # the FX graph key's pickler (its debug lines go into the compiled graph) is torch's own
    assert mod.FxGraphCachePickler().debug_lines("fx") == ["[hash] fx"]


def test_a_debug_log_reads_them() -> None:
    mod, calls = torch_211_like()
    debuglines.on_import(mod)
    mod.log.setLevel(logging.DEBUG)
    try:
        with trace_handlers():
            assert mod.AOTAutogradCachePickler().debug_lines("details") == ["[hash] details"]
    finally:
        mod.log.setLevel(logging.WARNING)
    assert calls == ["details"]


def test_a_structured_trace_reads_them() -> None:
    """With ``TORCH_TRACE`` torch records them as the key's "components": its trace logger has a
    handler while a trace is written."""
    pytest.importorskip("torch", reason="torch's structured trace logger")
    import torch._logging._internal  # noqa: F401  (loaded: its logger is what is read)

    mod, calls = torch_211_like()
    debuglines.on_import(mod)
    with trace_handlers(logging.NullHandler()):  # a trace is written
        assert mod.AOTAutogradCachePickler().debug_lines("details") == ["[hash] details"]
    with trace_handlers():  # the trace ended
        assert mod.AOTAutogradCachePickler().debug_lines("again") == []
    assert calls == ["details"]


def test_a_torch_that_skips_them_itself_is_left_alone() -> None:
    mod, calls = torch_211_like(with_guard=True)
    own = mod.AOTAutogradCachePickler.debug_lines
    debuglines.on_import(mod)
    assert mod.AOTAutogradCachePickler.debug_lines is own
    assert "debug_lines" not in vars(mod.AOTAutogradCachePickler)
