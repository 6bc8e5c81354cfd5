"""kcache's nvFuser integration.

Importing this package imports neither torch nor nvFuser: the fusion cache recognises tensors by
duck typing, and modules that need nvFuser import it when they are used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .. import kinds as _kinds
from ..patch import Integration

if TYPE_CHECKING:
    from kcache.nvfuser.fusion_cache import FusionCache

__all__ = ["INTEGRATION", "FusionCache", "flush"]


def __getattr__(name: str) -> Any:
    if name == "FusionCache":  # imported on first use: KCACHE=1 start-up stays cheap
        from kcache.nvfuser.fusion_cache import FusionCache

        return FusionCache
    raise AttributeError(name)


_hooked = False  # on_import ran since the last attach: detach unwraps nvFuser


def _attach(get_cache: Callable[[], Any]) -> Callable[[], None]:
    """Keep the getter of the active cache (see :mod:`.attached`); the detach stores what is new
    and unwraps nvFuser, if :func:`_on_import` ran."""
    from .attached import cache

    unbind = cache.bind(get_cache)

    def detach() -> None:
        global _hooked
        unbind()
        kdb = sys.modules.get("kcache.nvfuser.kerneldb")
        if _hooked and kdb is not None:
            _hooked = False
            kdb.detach_all()

    return detach


def _on_import(mod: ModuleType) -> None:
    """Keep nvFuser's compiled kernels in the store (see :mod:`kcache.nvfuser.kerneldb`): it
    loads with nvFuser, not in every Python process that has KCACHE=1."""
    global _hooked
    from kcache.nvfuser import kerneldb

    _hooked = True
    kerneldb.on_import(mod)


def flush() -> int:
    """Store the nvFuser kernels compiled since the last flush now (also done at exit)."""
    from kcache.nvfuser.kerneldb import flush as _flush

    return _flush()


INTEGRATION = Integration(
    "nvfuser",
    triggers=("nvfuser_direct", "nvfuser"),
    kinds=(_kinds.NVFUSER, _kinds.NVFUSER_MANIFEST, _kinds.NVFUSER_LEGACY, _kinds.NVFUSER_FUSION),
    attach=_attach,
    on_import=_on_import,
)
