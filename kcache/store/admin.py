"""The :class:`~.api.Admin` face of the composed cache: the disk tier's, passed through.

Maintenance commands and bundles (:mod:`kcache.maintenance`, :mod:`kcache.bundle`) work on this
machine's store folder: its index, its entry folders, its bound. The shared tiers hold nothing
they act on, so each verb is the disk tier's (:class:`~.disk.DiskTier`), unchanged;
:class:`~.cache.TieredCache` takes them from here, beside its own :class:`~.api.Cache` face.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from . import tunables as T
from .disk import DiskTier
from .hit import Hit
from .index import Index
from .records import Record


class DiskAdmin:
    """The Admin verbs of a cache whose local tier is :attr:`disk`."""

    disk: DiskTier

    @property
    def closed(self) -> bool:
        return self.disk.closed

    @property
    def max_size(self) -> int:
        return self.disk.max_size

    @max_size.setter
    def max_size(self, value: int) -> None:
        self.disk.max_size = value

    @property
    def max_size_source(self) -> str:
        return self.disk.max_size_source

    @property
    def key_tag(self) -> str:
        return self.disk.key_tag

    @property
    def index_timeout(self) -> float:
        return self.disk.index_timeout

    @property
    def index_dir(self) -> Path:
        return self.disk.index_dir

    @property
    def network_fs(self) -> bool:
        return self.disk.network_fs

    @property
    def locks(self) -> Path:
        return self.disk.locks

    @property
    def tmp(self) -> Path:
        return self.disk.tmp

    @property
    def trash(self) -> Path:
        return self.disk.trash

    def entry_dir(self, ident: str) -> str:
        return self.disk.entry_dir(ident)

    valid_id = staticmethod(DiskTier.valid_id)

    def now(self) -> float:
        return self.disk.now()

    def scan(self) -> Iterator[tuple[str, str, str | None]]:
        return self.disk.scan()

    def iter_entry_ids(self) -> Iterator[str]:
        return self.disk.iter_entry_ids()

    def read_any(self, ident: str, full: bool = False) -> tuple[Hit | None, str | None]:
        return self.disk.read_any(ident, full)

    def read_record(self, ident: str) -> tuple[Record | None, str | None]:
        return self.disk.read_record(ident)

    def record_mtime(self, ident: str) -> float | None:
        return self.disk.record_mtime(ident)

    def entry_extras(self, ident: str, rec: Record) -> list[str]:
        return self.disk.entry_extras(ident, rec)

    def remove(self, ids: list[str], *, index: bool = True) -> int:
        return self.disk.remove(ids, index=index)

    def remove_stray(self, shard: str, name: str = "", member: str = "") -> bool:
        return self.disk.remove_stray(shard, name, member)

    def index(self) -> Index:
        return self.disk.index()

    def index_readonly(self) -> Index:
        return self.disk.index_readonly()

    def rebuild_index(self) -> Index:
        return self.disk.rebuild_index()

    def evict(self, target: int | None = None) -> tuple[int, int]:
        return self.disk.evict(target)

    def reconcile(self, force: bool = False) -> int:
        return self.disk.reconcile(force)

    def clean_tmp(self, min_age: float = T.STALE_TMP_S) -> int:
        return self.disk.clean_tmp(min_age)

    def flush(self, force: bool = False) -> None:
        self.disk.flush(force)

    def protect(self, seconds: float) -> Callable[[], None]:
        return self.disk.protect(seconds)
