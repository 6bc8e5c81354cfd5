"""The store's exceptions (shared by its modules; :class:`StoreError` is public), its one warning
for a full filesystem (:func:`warn_failed`), what it expects of the world (:data:`EXPECTED`), and
how a step that must not stop what runs it sorts what it meets (:func:`expected`,
:func:`tolerated`)."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Iterator

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


#: The warning topic of a store whose filesystem is full (no block or no inode left): one cause,
#: said once, whichever part of the store meets it first (an entry's write, a lock file, the
#: index, ``kcache.stats()``).
DISK_FULL = "disk-full"
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def disk_full(e: BaseException, where: int | str | None = None) -> bool:
    """Whether ``e`` comes of a full filesystem: ENOSPC, EDQUOT or EFBIG, SQLite's "database or
    disk is full", or another failure to create or write a file (SQLite's "unable to open
    database file" and "disk I/O error" carry no errno) met while the filesystem of ``where``
    (a folder's descriptor or path) has no free block or no free inode left."""
    if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
        return True
    if isinstance(e, sqlite3.Error) and "disk is full" in str(e).lower():  # SQLITE_FULL
        return True
    if where is None or not isinstance(e, (OSError, sqlite3.Error)):
        return False
    return filesystem_full(where)


def filesystem_full(where: int | str) -> bool:
    """Whether the filesystem of ``where`` (a folder's descriptor or path) has no free block or
    no free inode left (as this user sees it)."""
    try:
        st = os.fstatvfs(where) if isinstance(where, int) else os.statvfs(where)
    except (OSError, ValueError):
        return False
    return st.f_bavail == 0 or (st.f_files > 0 and st.f_favail == 0)


def warn_full(root: object, e: BaseException) -> None:
    """The one warning of a store whose filesystem is full (topic :data:`DISK_FULL`)."""
    from ..log import warn_once

    warn_once(
        DISK_FULL,
        f"the store at {root} is on a full filesystem ({type(e).__name__}: {e}); kernels are compiled "
        "but not cached until space (or inodes) is freed",
    )


def warn_failed(root: object, e: BaseException, where: int | str | None, topic: str, message: str) -> None:
    """One warning for a failure of one part of the store: the store's full-disk warning when the
    filesystem is full (:func:`disk_full`), else ``message`` once under ``topic``."""
    from ..log import warn_once

    if disk_full(e, where):
        warn_full(root, e)
    else:
        warn_once(topic, message)


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


@contextlib.contextmanager
def tolerated(topic: str, what: str, then: str = "the store goes on without it") -> Iterator[None]:
    """A step that must not stop what runs it (a store's close, at exit too; a forked child's
    reset of one object): what the store expects (:data:`EXPECTED`) is a debug line, anything
    else a bug, raised under ``KCACHE_STRICT=1``, else one warning per topic (:func:`expected`).
    Either way the block ends there and the caller goes on with its next step."""
    try:
        yield
    except Exception as e:  # broad: a step of a close or a fork's reset: the next must run (bugs reported)
        if expected(e, topic, what, then):
            from ..log import logger

            logger.debug("%s: %s", what, e)
