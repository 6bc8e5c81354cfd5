"""The getter of the active cache that the nvFuser integration was given at attach
(:data:`kcache.nvfuser.INTEGRATION`): its parts read the cache here (none of them imports the
package, which attaches them), and :data:`patches`, what it replaced in nvFuser (undone on
detach)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..patch import CacheSlot, Patches

if TYPE_CHECKING:
    from ..store.api import Cache

cache: CacheSlot[Cache] = CacheSlot()
patches = Patches("nvfuser")
