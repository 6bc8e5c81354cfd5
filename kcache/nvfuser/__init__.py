"""kcache's nvFuser integration.

Importing this package imports neither torch nor nvFuser: the fusion cache recognises tensors by
duck typing, and modules that need nvFuser import it when they are used.
"""

from __future__ import annotations

from kcache.nvfuser.fusion_cache import FusionCache

__all__ = ["FusionCache"]
