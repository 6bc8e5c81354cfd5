"""The store: records and bytes, shared by every integration.

``Store`` is the composed cache (:class:`~kcache.store.cache.TieredCache`: the local disk tier,
then the shared tiers); integrations see it through the :class:`~kcache.store.api.Cache` face,
maintenance and bundles through :class:`~kcache.store.api.Admin`.

Its names are imported on first use (PEP 562): reading the settings checks ``KCACHE_REMOTE`` with
its backend's module (:mod:`kcache.remotes`), which lives here, and must not import the whole
store (the disk tier, the index: 50-150 ms) to do it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cache import TieredCache as Store
    from .errors import StoreError
    from .hit import Hit
    from .records import Record

__all__ = ["Hit", "Record", "Store", "StoreError"]

_NAMES = {"Store": (".cache", "TieredCache"), "StoreError": (".errors", "StoreError"), "Hit": (".hit", "Hit")}
_NAMES["Record"] = (".records", "Record")


def __getattr__(name: str) -> Any:
    where = _NAMES.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(where[0], __name__), where[1])
    globals()[name] = value
    return value
