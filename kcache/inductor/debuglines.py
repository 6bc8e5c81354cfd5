"""The AOTAutograd key's debug lines, computed only when something will read them.

At every AOTAutograd lookup, torch 2.8-2.11's ``autograd_cache_key`` hashes the graph's details
once for the key and then again, attribute by attribute, into printable "debug lines"
(``FxGraphCachePickler.debug_lines``) that only a DEBUG log line and a structured-trace record
read. That second pass re-pickles the whole graph: 0.17 s of a served BERT-base first call on
the H100 (torch 2.11, cProfile; the key itself 0.17 s), in a process that has nothing else left
to do but trace. torch 2.12 computes them only when DEBUG logging is on (inline; 2.13 in
``_get_debug_lines_for_cache_key``); this is the same rule for the older torch, and it also keeps
them where a structured trace (``TORCH_TRACE``, which records them as the key's "components")
is being written.

The key is untouched: only what a log would print is skipped, so the entries and keys of a
process with kcache are those of one without it. Nothing is installed on a torch that already
skips them in ``_get_debug_lines_for_cache_key`` (2.13), or whose pickler or logger is not where
kcache looks; on 2.12 the wrapper is installed and changes nothing (torch calls it only at DEBUG,
where it passes the call on).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from ..log import logger

MODULE = "torch._functorch._aot_autograd.autograd_cache"


def _read(log: logging.Logger) -> bool:
    """Will anything read the debug lines: a DEBUG log of the module, or torch's structured
    trace (its logger has a handler only while a trace is being written)."""
    if log.isEnabledFor(logging.DEBUG):
        return True
    internal = sys.modules.get("torch._logging._internal")
    trace = getattr(internal, "trace_log", None)
    return bool(getattr(trace, "handlers", None))


def on_import(mod: Any) -> None:
    """Called when ``torch._functorch._aot_autograd.autograd_cache`` has been imported."""
    if hasattr(mod, "_get_debug_lines_for_cache_key"):
        return  # torch 2.13 and later skip them itself
    pickler = getattr(mod, "AOTAutogradCachePickler", None)
    log = getattr(mod, "log", None)
    if not callable(getattr(pickler, "debug_lines", None)) or not isinstance(log, logging.Logger):
        logger.debug("torch.compile: this torch's AOTAutograd pickler is not one kcache knows")
        return
    from .attached import patches

    def make(original: Any) -> Any:
        def debug_lines(self: Any, inp: Any) -> list[str]:
            return original(self, inp) if _read(log) else []

        debug_lines.__wrapped__ = original  # type: ignore[attr-defined]
        return debug_lines

    patches.wrap(pickler, "debug_lines", make, raw=True)
