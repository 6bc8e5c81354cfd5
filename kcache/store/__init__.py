"""The store: records and bytes, shared by every integration.

``Store`` is the composed cache (:class:`~kcache.store.cache.TieredCache`: the local disk tier,
then the shared tiers); integrations see it through the :class:`~kcache.store.api.Cache` face,
maintenance and bundles through :class:`~kcache.store.api.Admin`.
"""

from .cache import TieredCache as Store
from .errors import StoreError
from .hit import Hit
from .records import Record

__all__ = ["Hit", "Record", "Store", "StoreError"]
