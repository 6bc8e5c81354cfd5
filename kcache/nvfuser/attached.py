"""The getter of the active cache that the nvFuser integration was given at attach
(:data:`kcache.nvfuser.INTEGRATION`): its parts read the cache here (none of them imports the
package, which attaches them), and :data:`patches`, what it replaced in nvFuser (undone on
detach)."""

from __future__ import annotations

from ..patch import CacheSlot, Patches

cache = CacheSlot()
patches = Patches("nvfuser")
