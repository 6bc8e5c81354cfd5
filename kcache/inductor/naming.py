"""What an Inductor cache entry holds, in words a person recognises: the function or module that
Dynamo compiled into the graph.

Inductor's FX graph and AOTAutograd entries are keyed by hashes and their contents are pickles
(never opened by kcache). But torch saves them while the graph is being compiled, inside
Dynamo's ``TracingContext``, whose ``traced_code`` starts with the code object of the frame
Dynamo is compiling (``torch/_dynamo/output_graph.py``: ``tracing_context.traced_code.append
(f_code)`` when the graph's output is set up), followed by the functions it inlined. Its
qualified name (``TinyEncoder.forward``) and the file's base name (``model.py``, never a
folder: paths are machine-specific) go into the entry's summary, which ``kcache inspect`` shows
and matches names against.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def graph_summary() -> dict[str, Any]:
    """``{"name": qualified name, "file": "model.py:27"}`` of the frame being compiled, or {}
    outside a Dynamo compile (never raises; never imports torch)."""
    guards = sys.modules.get("torch._guards")
    if guards is None:
        return {}
    from .torchcall import TorchRaised
    from .torchcall import own as torchs

    try:
        codes = torchs(guards.TracingContext.get_traced_code)
        if not codes:
            return {}
        code = codes[0]
        name = getattr(code, "co_qualname", None) or code.co_name
        out: dict[str, Any] = {"name": str(name)}
        if code.co_filename:
            out["file"] = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
        if len(codes) > 1:
            out["inlined"] = len(codes) - 1
        return out
    except (TorchRaised, AttributeError, TypeError, IndexError):  # a summary for inspect, read
        return {}  # from torch's frames: none outside a compile, or not of the shape it knows
