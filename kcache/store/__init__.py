"""The store: records and bytes, shared by every integration."""

from .local import Hit, Store, StoreError
from .records import Record

__all__ = ["Hit", "Record", "Store", "StoreError"]
