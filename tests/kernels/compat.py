"""Where things live in each Triton release the tests run on (3.4 to 3.9)."""

from __future__ import annotations

import importlib
from types import ModuleType


def triton_key_module() -> ModuleType:
    """The module that defines ``triton_key``: ``triton.runtime.cache`` (3.5+) or
    ``triton.compiler.compiler`` (3.4)."""
    mod = importlib.import_module("triton.runtime.cache")
    if not hasattr(mod, "triton_key"):
        mod = importlib.import_module("triton.compiler.compiler")
    return mod
