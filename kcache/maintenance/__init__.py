"""Maintenance over a store: stats, inspect, clear, verify, explain and config, as plain data.

The command line (:mod:`kcache.cli`) only parses arguments and formats what these functions
return; tests and other tools can call them directly. One module per command; this one opens
and closes stores for them and holds what several share.

Reading never writes: :func:`open_store` without ``write`` opens the store read-only (its index
through a connection that cannot write, checkpoint or create files). A missing store folder
reads as an empty store and is never created; neither is an empty folder turned into a store
by a command that only changes or reads one.
"""

from __future__ import annotations

import atexit
import contextlib
from typing import Any

from ..config import Settings
from ..store import Record, Store, StoreError

#: How long a maintenance command waits for a busy index (a compile waits a quarter second).
WRITE_TIMEOUT_S = 10.0


class MaintenanceError(Exception):
    """A maintenance operation cannot be done (the message says why); the CLI exits 1."""


class EmptyStore:
    """Stands in for a store folder that does not exist: every command reads it as empty."""

    readonly = True

    def __init__(self, settings: Settings) -> None:
        from pathlib import Path

        self.root = Path(settings.dir).absolute()
        self.max_size = settings.max_size
        self.key_tag = settings.key_tag
        self.index_dir = self.root / "index"

    def index(self) -> Any:
        from ..store.index import Index

        return Index.open_readonly(None)

    # ``kcache verify`` reads the index through this (on a missing or empty folder it failed with
    # "'EmptyStore' object has no attribute 'index_readonly'", exit 1, instead of "ok").
    index_readonly = index

    def iter_entry_ids(self) -> Any:
        return iter(())

    def scan(self) -> Any:
        return iter(())

    def close(self) -> None:
        pass

    def now(self) -> float:
        import time

        return time.time()


def open_store(settings: Settings, *, write: bool = False) -> Store:
    """The store at ``settings.dir``: read-only unless ``write``.

    A missing folder is never created: it opens as an empty read-only store. An existing folder
    that holds no store (empty or not) is refused, for writing too: only a compile or an import
    makes a new store. Raises :class:`StoreError` when the folder cannot be used, and for
    ``write`` when the settings say read-only."""
    import os

    root = os.path.abspath(os.fspath(settings.dir))
    if write and settings.readonly:
        raise StoreError(f"{root} is read-only (KCACHE_READONLY=1): nothing may be changed")
    try:
        exists = os.path.lexists(root)
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot use {root!r}: {e}") from None
    if not exists:
        return EmptyStore(settings)  # type: ignore[return-value]
    if not write:
        with contextlib.suppress(OSError):
            if os.path.isdir(root) and not os.listdir(root):
                return EmptyStore(settings)  # type: ignore[return-value]
    return Store.from_settings(
        settings, write=write, create=False, index_timeout=WRITE_TIMEOUT_S if write else 1.0
    )


def close_store(store: Store) -> None:
    """Close ``store`` and drop its exit hook."""
    store.close()
    with contextlib.suppress(Exception):
        atexit.unregister(store.close)


def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a component or summary value (bytes as hex, tuples as lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def entry_dict(
    rec: Record, *, last_used: float | None = None, hits: int | None = None, size: int | None = None
) -> dict[str, Any]:
    """What ``inspect`` lists for one entry (``protected_until``: kept from eviction until then
    unless used first, for prewarmed entries; None otherwise)."""
    return {
        "id": rec.id,
        "kind": rec.kind,
        "key": rec.key,
        "size": rec.size if size is None else size,
        "created": rec.created,
        "last_used": last_used,
        "hits": hits,
        "compile_s": rec.compile_s,
        "summary": jsonable(rec.summary),
        "protected_until": rec.protect_until or None,
    }


from .clear import clear, stale_reasons, version_components  # noqa: E402
from .configreport import config_report  # noqa: E402
from .explain import explain  # noqa: E402
from .inspect import find_entries, list_entries  # noqa: E402
from .stats import stats, zero_counters  # noqa: E402
from .verify import verify  # noqa: E402

__all__ = [
    "MaintenanceError",
    "clear",
    "close_store",
    "config_report",
    "entry_dict",
    "explain",
    "find_entries",
    "jsonable",
    "list_entries",
    "open_store",
    "stale_reasons",
    "stats",
    "verify",
    "version_components",
    "zero_counters",
]
