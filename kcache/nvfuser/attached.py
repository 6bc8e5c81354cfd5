"""The getter of the active cache that the nvFuser integration was given at attach
(:data:`kcache.nvfuser.INTEGRATION`): its parts read the cache here (none of them imports the
package, which attaches them)."""

from __future__ import annotations

from ..patch import CacheSlot

cache = CacheSlot()
