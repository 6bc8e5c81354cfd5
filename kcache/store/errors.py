"""The store's exceptions (shared by its modules; :class:`StoreError` is public)."""

from __future__ import annotations

import errno
import os


class StoreError(Exception):
    """The store cannot be used (the message says why); caching stays off."""


class CorruptEntry(Exception):
    """An entry that fails its checks. Quarantined only if ``ident`` (the record file's identity
    as read: inode, device, mtime, ctime, size) is still what sits at its path: an entry removed
    or replaced while it was read is a plain miss."""

    def __init__(self, msg: str, ident: tuple[int, ...] | None = None) -> None:
        super().__init__(msg)
        self.ident = ident


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
    import sqlite3  # loaded with the store already

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
