"""kcache's nvFuser integration.

Importing this package imports neither torch nor nvFuser: the fusion cache recognises tensors by
duck typing, and modules that need nvFuser import it when they are used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcache.nvfuser.fusion_cache import FusionCache

__all__ = ["FusionCache", "attach", "flush"]


def __getattr__(name: str) -> Any:
    if name == "FusionCache":  # imported on first use: KCACHE=1 start-up stays cheap
        from kcache.nvfuser.fusion_cache import FusionCache

        return FusionCache
    raise AttributeError(name)


def _on_import(mod: ModuleType) -> None:
    from kcache.nvfuser import kerneldb

    kerneldb.on_import(mod)


def attach() -> Callable[[], None]:
    """Keep nvFuser's compiled kernels in the store (see :mod:`kcache.nvfuser.kerneldb`).

    Until nvFuser is imported this only registers an import hook: kerneldb (and what it imports)
    loads with nvFuser, not in every Python process that has KCACHE=1."""
    from kcache._imports import forget, when_imported

    when_imported("nvfuser_direct", _on_import)
    when_imported("nvfuser", _on_import)

    def detach() -> None:
        forget("nvfuser_direct", _on_import)
        forget("nvfuser", _on_import)
        kdb = sys.modules.get("kcache.nvfuser.kerneldb")
        if kdb is not None:
            kdb.detach_all()

    return detach


def flush() -> int:
    """Store the nvFuser kernels compiled since the last flush now (also done at exit)."""
    from kcache.nvfuser.kerneldb import flush as _flush

    return _flush()
