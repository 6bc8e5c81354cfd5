"""What the torch.compile integration was given and what it turned on, read by all its parts
(none of which imports the package, which attaches them):

- :data:`cache`: the getter of the active cache it was given at attach
  (:data:`kcache.inductor.INTEGRATION`);
- the remote caches whose switch kcache turned on, and the backends it set
  (:func:`backend_is_ours`);
- :data:`patches`: every attribute of torch's that kcache replaced (undone on detach).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..patch import CacheSlot, Patches

if TYPE_CHECKING:
    from ..store.api import Cache

cache: CacheSlot[Cache] = CacheSlot()
patches = Patches("torch")

switched_on: set[str] = set()  # cache classes whose switch kcache turned on in this process
#: Of those, the ones whose switch kcache left unset (None) and answers for in torch's decision
#: function instead: cache class -> (config module, switch). torch hashes that switch into its
#: keys (functorch's portable config is part of the AOTAutograd key), so setting it would give a
#: process with kcache other keys than one without, for the same graph in the same folder.
answered: dict[str, tuple[str, str]] = {}
our_backends: dict[str, Any] = {}  # cache class name -> the backend_override_cls kcache set


def backend_is_ours(cls_name: str) -> bool:
    """torch's remote cache class ``cls_name`` has kcache's store as its backend (or will have,
    when ``torch._inductor.remote_cache`` loads: kcache turned its switch on)."""
    rc = sys.modules.get("torch._inductor.remote_cache")
    if rc is None:
        return cls_name in switched_on
    cls = getattr(rc, cls_name, None)
    ours = our_backends.get(cls_name)
    return ours is not None and cls is not None and cls.__dict__.get("backend_override_cls") is ours
