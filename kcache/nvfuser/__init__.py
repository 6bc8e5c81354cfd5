"""kcache's nvFuser integration.

Importing this package imports neither torch nor nvFuser: the fusion cache recognises tensors by
duck typing, and modules that need nvFuser import it when they are used.
"""

from __future__ import annotations

from collections.abc import Callable

from kcache.nvfuser.fusion_cache import FusionCache

__all__ = ["FusionCache", "attach", "flush"]


def attach() -> Callable[[], None]:
    """Keep nvFuser's compiled kernels in the store (see :mod:`kcache.nvfuser.kerneldb`)."""
    from kcache.nvfuser.kerneldb import attach as _attach

    return _attach()


def flush() -> int:
    """Store the nvFuser kernels compiled since the last flush now (also done at exit)."""
    from kcache.nvfuser.kerneldb import flush as _flush

    return _flush()
