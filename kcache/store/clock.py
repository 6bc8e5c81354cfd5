"""The store's clock: the filesystem's time, not the process's.

Last use, protection and eviction's order are judged by the time the filesystem gives a write
(the mtime of ``locks/clock``), so that a process whose clock runs ahead (or behind) orders
entries as every other process of the store does. :meth:`Clock.refresh` writes the clock file
and remembers how far this process's clock is off; :meth:`Clock.now` is this process's clock
corrected by that offset (no write).

Opening a store does not write the clock file (a metadata write, at every process's start): it
is written when a time the store keeps is first needed (:meth:`Clock.synced`: a put's record, a
maintenance command's "now", the flush thread's first turn, which comes within a second of a
process's first put, miss or unwritten hit), and then at every flush that writes the index.
Until then :meth:`now` is this process's own clock, which a lookup uses only to decide whether
an entry's last use is due a refresh (a minute or more old): with the filesystem's clock on the
same machine (a local disk) that is the same time; on a network filesystem whose server's clock
is off by more than a minute, a process's first lookups refresh (or leave) a last use that was
not (or was) due, which the index's last use (written with the filesystem's time, see
:mod:`.catalogue`) or the entry's next use puts right.
"""

from __future__ import annotations

import contextlib
import os
import time

from . import fs
from .opening import Folders


class Clock:
    """The clock of one store in one process."""

    def __init__(self, folders: Folders) -> None:
        self._folders = folders
        self._fd: int | None = None
        self.offset = 0.0
        #: Whether :meth:`refresh` was tried in this process (the offset is the filesystem's).
        self.synced_once = False

    def refresh(self) -> float:
        """The filesystem's time now: the mtime a write gives the clock file. Also refreshes the
        offset that :meth:`now` adds to this process's clock."""
        t = time.time()
        f = self._folders
        self.synced_once = True
        if f.readonly or f.closed:
            return t
        try:
            if self._fd is None:
                lfd = f.fd("locks")
                if lfd is None:
                    return t
                self._fd = os.open(
                    "clock", os.O_RDWR | os.O_CREAT | fs.O_NOFOLLOW | fs.O_CLOEXEC, 0o600, dir_fd=lfd
                )
            os.utime(self._fd)  # the kernel's (or the file server's) time, not this process's
            fst = os.fstat(self._fd).st_mtime
        except OSError:
            return t
        self.offset = fst - t
        return fst

    def now(self) -> float:
        """The store's time: this process's clock corrected to the filesystem's (by the offset
        the last :meth:`refresh` found; before any, this process's clock). No write."""
        return time.time() + self.offset

    def synced(self) -> float:
        """:meth:`now`, the offset found first if it never was in this process."""
        if not self.synced_once:
            return self.refresh()
        return self.now()

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
