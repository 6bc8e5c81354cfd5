"""The store's exceptions (shared by its modules; :class:`StoreError` is public), and how its
broad catches sort what they meet (:func:`expected`)."""

from __future__ import annotations

import sqlite3

from ..boundary import expected as _sort
from .fs import UnsafePath
from .index import CorruptIndex, IndexTooNew
from .records import CorruptRecord
from .safety import UnsafeStore


class StoreError(Exception):
    """The store cannot be used (the message says why); caching stays off."""


class CorruptEntry(Exception):
    """An entry that fails its checks. Quarantined only if ``ident`` (the record file's identity
    as read: inode, device, mtime, ctime, size) is still what sits at its path: an entry removed
    or replaced while it was read is a plain miss."""

    def __init__(self, msg: str, ident: tuple[int, ...] | None = None) -> None:
        super().__init__(msg)
        self.ident = ident


class ServeFailed(Exception):
    """A verified hit whose files could not be made (a full disk everywhere, a closed store)."""


class RefusedEntry(Exception):
    """Something in the store that is not ours to trust (owner, mode, a link): a miss, never
    served and never deleted by a lookup."""


#: What the store expects of the world, each a counted miss or a skipped write, never a bug: a
#: full, read-only or vanished disk and a lock held too long (``OSError``), a corrupt, locked or
#: newer index (``sqlite3.Error``, ``CorruptIndex``, ``IndexTooNew``), an entry that fails its
#: checks or is not ours to trust (``CorruptEntry``, ``RefusedEntry``, ``CorruptRecord``,
#: ``UnsafePath``), a store it cannot use (``StoreError``, ``UnsafeStore``), files it cannot hand
#: out (``ServeFailed``).
EXPECTED: tuple[type[BaseException], ...] = (
    OSError,
    sqlite3.Error,
    StoreError,
    CorruptEntry,
    RefusedEntry,
    CorruptRecord,
    CorruptIndex,
    IndexTooNew,
    UnsafePath,
    UnsafeStore,
    ServeFailed,
)


def expected(e: BaseException, topic: str, what: str, then: str = "the store goes on without it") -> bool:
    """:func:`kcache.boundary.expected` with the store's :data:`EXPECTED`: True for one of them
    (the caller counts it as the miss it is); a bug is raised under ``KCACHE_STRICT=1``, else
    reported once (a warning per topic, an ``errors`` count) and False."""
    return _sort(e, EXPECTED, f"store-{topic}", what, then)
