"""kcache's nvFuser integration.

Importing this package imports neither torch nor nvFuser: the fusion cache recognises tensors by
duck typing, and modules that need nvFuser import it when they are used.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..patch import CacheSlot, Hooks, Integration

if TYPE_CHECKING:
    from kcache.nvfuser.fusion_cache import FusionCache

__all__ = ["INTEGRATION", "FusionCache", "flush"]


def __getattr__(name: str) -> Any:
    if name == "FusionCache":  # imported on first use: KCACHE=1 start-up stays cheap
        from kcache.nvfuser.fusion_cache import FusionCache

        return FusionCache
    raise AttributeError(name)


def _slot() -> CacheSlot:
    from .attached import cache

    return cache


def _install(mod: ModuleType) -> None:
    """Keep nvFuser's compiled kernels in the store (see :mod:`kcache.nvfuser.kerneldb`): it
    loads with nvFuser, not in every Python process that has KCACHE=1."""
    from kcache.nvfuser import kerneldb

    kerneldb.on_import(mod)


def _uninstall() -> None:
    """Store what is new and unwrap nvFuser."""
    kdb = sys.modules.get("kcache.nvfuser.kerneldb")
    if kdb is not None:
        kdb.detach_all()


_hooks = Hooks(_slot, _install, _uninstall)


def flush() -> int:
    """Store the nvFuser kernels compiled since the last flush now (also done at exit)."""
    from kcache.nvfuser.kerneldb import flush as _flush

    return _flush()


INTEGRATION = Integration(
    "nvfuser",
    attach=_hooks.attach,
    on_import=_hooks.on_import,
)
