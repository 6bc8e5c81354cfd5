"""The store of a folder that does not exist (or is empty): every command reads it as empty.

:class:`EmptyStore` implements the whole :class:`~kcache.store.api.Admin` face, each method
answering as an empty store would (no entries, an empty in-memory index, nothing removed), so
that a command works on it unchanged; tests/test_maintenance_empty.py checks it against the face,
so that a method added to ``Admin`` must be added here too. It is read-only: nothing is ever
created through it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Settings
from ..store import tunables as T
from ..store.records import entry_id

if TYPE_CHECKING:
    from ..store import Hit
    from ..store.index import Index
    from ..store.records import Record


def _empty_index() -> Index:
    from ..store.index import Index

    return Index.open_readonly(None)


class EmptyStore:
    """An empty, read-only store at ``settings.dir`` (a folder that holds none)."""

    def __init__(self, settings: Settings) -> None:
        self.root = Path(settings.dir).absolute()
        self.index_dir = self.root / "index"
        self.max_size = int(settings.max_size)
        self.key_tag = settings.key_tag

    @property
    def readonly(self) -> bool:
        return True

    def entry_id(self, kind: str, key: str) -> str:
        return entry_id(kind, key, self.key_tag)

    def entry_dir(self, ident: str) -> str:
        return str(self.root / "entries" / ident[:2] / ident)

    def iter_entry_ids(self) -> Iterator[str]:
        return iter(())

    def scan(self) -> Iterator[tuple[str, str, str | None]]:
        return iter(())

    def read_any(self, ident: str, full: bool = False) -> tuple[Hit | None, str | None]:
        return None, "missing"

    def read_record(self, ident: str) -> tuple[Record | None, str | None]:
        return None, "missing"

    def record_mtime(self, ident: str) -> float | None:
        return None

    def entry_extras(self, ident: str, rec: Record) -> list[str]:
        return []

    def remove(self, ids: list[str], *, index: bool = True) -> int:
        return 0

    def remove_stray(self, shard: str, name: str = "", member: str = "") -> bool:
        return False

    def index(self) -> Index:
        return _empty_index()

    def index_readonly(self) -> Index:
        return _empty_index()

    def rebuild_index(self) -> Index:
        return _empty_index()

    def evict(self, target: int | None = None) -> tuple[int, int]:
        return 0, 0

    def clean_tmp(self, min_age: float = T.STALE_TMP_S) -> int:
        return 0

    def now(self) -> float:
        return time.time()

    def close(self) -> None:
        pass
