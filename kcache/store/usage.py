"""The store's committed entries' bytes on disk, one number shared by its processes.

``locks/usage.du`` holds it (see :mod:`.eviction` for what uses it, :mod:`.footprint` for what an
entry counts for): a put adds its entry after the rename that commits it, a removal subtracts
what it deleted. Updating it takes an flock for two small reads and writes, tried without
waiting: a busy count carries the bytes to the next update, so that a put never waits for
another. A new store starts counted at 0; an older one, or a count that drifted, is counted
again from the folders (:meth:`Usage.settle`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import threading
import time
from typing import TYPE_CHECKING

from ..log import logger, warn_once
from . import fs
from .errors import disk_full, warn_failed

if TYPE_CHECKING:
    from .opening import Folders

#: The committed entries' bytes on disk. (``locks/usage``, an older kcache's, counted their
#: members' sizes: a store it used is counted again from its folders once.)
USAGE_NAME = "usage.du"
# bytes; 1 once counted (0: puts added since the file was made); bytes ever added (only grows:
# a recount adds what was put while it walked, see Usage.settle); recounts that set it (only
# grows: a removal's bytes come off only if none did since its rename, see Usage.add). A 16-byte
# file reads as adding nothing, a 24-byte one (an older kcache's) as never recounted.
_USAGE = struct.Struct("<qqqq")
_USAGE_24 = struct.Struct("<qqq")
_USAGE_OLD = struct.Struct("<qq")


class Usage:
    """The store's committed entries' bytes on disk, shared by its processes through
    ``locks/usage.du``."""

    def __init__(self, folders: Folders) -> None:
        self._folders = folders
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0
        # Bytes not written yet (the count was busy): written next time. Those added, and those
        # removed by the mark their removals took (see add).
        self._carry_in = 0
        self._carry_out: dict[int | None, int] = {}
        self._last: int | None = None  # the total as last read or written (counted stores only)
        self._broken = False

    def after_fork(self) -> None:
        # The child shares its parent's open file (and so its flock): never unlock it there.
        self._lock = threading.Lock()
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._carry_in, self._carry_out = 0, {}

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is not None and self._pid == os.getpid():
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _file(self) -> int | None:
        if self._fd is not None and self._pid == os.getpid():
            return self._fd
        lfd = self._folders.fd("locks")
        if lfd is None or self._broken or self._folders.readonly:
            return None
        try:
            fd = os.open(USAGE_NAME, os.O_RDWR | os.O_CREAT | fs.O_NOFOLLOW | fs.O_CLOEXEC, 0o600, dir_fd=lfd)
        except FileNotFoundError:
            return None  # the store's folder was removed under this process: nothing to count
        except OSError as e:
            # A full filesystem is the store's one warning (said once, whichever part meets it
            # first), and a pause: the count is tried again at the next turn (it is made anew,
            # and counted from the folders, once there is room). Anything else: for good.
            self._broken = not disk_full(e, lfd)
            why = f"cannot keep count of the store's size ({e}); its size bound is not kept"
            warn_failed(self._folders.root_name, e, lfd, "usage", why)
            return None
        st = os.fstat(fd)
        owners = self._folders.owners  # None: a store used despite its checks (KCACHE_ALLOW_INSECURE=1)
        if not stat.S_ISREG(st.st_mode) or (owners is not None and st.st_uid not in owners):
            os.close(fd)
            self._broken = True
            warn_once("usage", "the store's size count is not a file of ours; its size bound is not kept")
            return None
        if st.st_nlink != 1:  # linked elsewhere too (or being made: see start_if_new): not now
            os.close(fd)
            return None
        self._fd, self._pid = fd, os.getpid()
        return fd

    def start_if_new(self) -> None:
        """A new store (no entries, no count yet) starts counted at 0, so that its count is
        exact from its first put (an older store is counted by the flush thread instead)."""
        st = self._folders
        lfd, efd = st.fd("locks"), st.fd("entries")
        if lfd is None or efd is None or st.readonly:
            return
        try:
            os.stat(USAGE_NAME, dir_fd=lfd, follow_symlinks=False)
            return  # counted already, or being counted
        except FileNotFoundError:
            pass
        except OSError:
            return
        tmp = fs.unique_name(USAGE_NAME)
        try:
            if os.listdir(efd):
                return
            fs.write_new_at(lfd, tmp, _USAGE.pack(0, 1, 0, 0))
            # Whole or not at all: a process that opens it meanwhile never sees it empty.
            os.link(tmp, USAGE_NAME, src_dir_fd=lfd, dst_dir_fd=lfd, follow_symlinks=False)
        except OSError:
            pass  # another process made it first (or an entry came): counted as above
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=lfd)

    @staticmethod
    def _lock_file(fd: int, how: int) -> bool:
        for _ in range(3):  # a few microseconds' turns; never a wait
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                os.sched_yield()
        return False

    @staticmethod
    def _get(fd: int) -> tuple[int, bool, int, int]:
        """(bytes, counted, bytes ever added, recounts)."""
        raw = os.pread(fd, _USAGE.size, 0)
        if len(raw) < _USAGE_OLD.size:
            return 0, False, 0, 0
        if len(raw) < _USAGE_24.size:
            total, counted = _USAGE_OLD.unpack(raw[: _USAGE_OLD.size])
            return total, counted == 1, 0, 0
        if len(raw) < _USAGE.size:
            total, counted, added = _USAGE_24.unpack(raw[: _USAGE_24.size])
            return total, counted == 1, added, 0
        total, counted, added, recounts = _USAGE.unpack(raw)
        return total, counted == 1, added, recounts

    def mark(self) -> int | None:
        """The recounts that have set the count so far: what a removal takes before it renames
        its entry away, and hands to :meth:`add` with its bytes. Read without the file's lock (a
        removal can be a put's, which never waits): a read torn by a recount's write gives a
        wrong mark, which only leaves the removal's bytes on the count (too high, never low)."""
        with self._lock:
            try:
                fd = self._file()
                return None if fd is None else self._get(fd)[3]
            except OSError:
                return None

    def add(self, delta: int, mark: int | None = None) -> int | None:
        """Add ``delta`` bytes; the store's total after it, or None when it is not known (not
        counted yet, or unusable). A busy count carries the bytes to the next time, and the
        total is then the last one known plus what is carried (so that the put that added them
        still sees the bound passed).

        A removal's bytes (``delta`` < 0) come with ``mark``, what :meth:`mark` said before its
        rename; they are not taken off when a recount has set the count since (the file counts
        recounts). That recount's walk came after the rename, and did not count the entry, or
        before it, and did: taking it off would make the count an entry short in the first case
        (the store then grows past its bound, for good until the next recount), and leaving it
        makes it an entry long in the second, as for any removal while a recount walks (see
        :meth:`settle`). The short count is the one to avoid. (A removal without a mark, None,
        is taken off.)"""
        with self._lock:
            plus = self._carry_in + max(delta, 0)
            minus = dict(self._carry_out)
            if delta < 0:
                minus[mark] = minus.get(mark, 0) - delta
            self._carry_in, self._carry_out = 0, {}
            try:
                fd = self._file()
                if fd is None:
                    return None
                if not self._lock_file(fd, fcntl.LOCK_EX):
                    self._carry_in, self._carry_out = plus, minus
                    return None if self._last is None else self._last + plus - sum(minus.values())
                try:
                    total, counted, added, recounts = self._get(fd)
                    total += plus - sum(n for m, n in minus.items() if m is None or m == recounts)
                    os.pwrite(fd, _USAGE.pack(total, int(counted), added + plus, recounts), 0)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError as e:
                self._carry_in, self._carry_out = plus, minus
                logger.debug("usage: %s", e)
                return None
            self._last = total if counted else None
            return self._last

    def flush(self, wait_s: float = 1.0) -> None:
        """Add what busy counts carried (at exit, and at the flush thread's turns): waits for
        the count at most ``wait_s`` seconds."""
        end = time.monotonic() + wait_s
        while self._carry_in or self._carry_out:
            self.add(0)
            if not (self._carry_in or self._carry_out) or time.monotonic() > end:
                return
            time.sleep(0.001)

    def read(self) -> tuple[int, bool] | None:
        """(bytes, counted), or None when it cannot be read now."""
        got = self._read_all()
        return None if got is None else got[:2]

    def added(self, wait_s: float = 0.0) -> int | None:
        """The bytes ever added to the count (a mark for :meth:`settle`), or None when it cannot
        be read; a busy count is waited for at most ``wait_s`` seconds."""
        end = time.monotonic() + wait_s
        while True:
            got = self._read_all()
            if got is not None or self._fd is None or time.monotonic() >= end:
                return None if got is None else got[2]
            time.sleep(0.001)

    def _read_all(self) -> tuple[int, bool, int, int] | None:
        """(bytes, counted, bytes ever added, recounts), read under a shared lock, or None."""
        with self._lock:
            try:
                fd = self._file()
                if fd is None or not self._lock_file(fd, fcntl.LOCK_SH):
                    return None
                try:
                    return self._get(fd)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                return None

    def total(self) -> int | None:
        r = self.read()
        return r[0] if r is not None and r[1] else None

    def peek(self) -> int | None:
        """The count as the file says now, for a reading command (no lock, nothing made or
        written: a store opened read-only); None when there is none, or not counted yet."""
        lfd = self._folders.fd("locks")
        if lfd is None:
            return None
        try:
            fd = os.open(USAGE_NAME, os.O_RDONLY | fs.O_NOFOLLOW | fs.O_CLOEXEC, dir_fd=lfd)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            total, counted, _, _ = self._get(fd)
            return total if counted else None
        except OSError:
            return None
        finally:
            os.close(fd)

    def settle(self, counted: int, before: int | None) -> int | None:
        """After a recount that found ``counted`` bytes on disk, which began when
        :meth:`added` said ``before``: the number becomes ``counted`` plus every byte added
        meanwhile (an entry put during the count may be in both: counted twice rather than not
        at all). Removals meanwhile are not subtracted, for the same reason (the walk may have
        counted the entry or not). The net change would not do: a put and a removal during the
        walk cancel out in it, while the walk can miss the put (its shard walked already) and
        the removed entry both, which left the count one entry short for good (seen: 10,000
        bytes counted for 11 entries of 1,000 under a 10,000 bound, never evicted). Nor are
        removals still to come whose entry went before now: the recount is noted in the file,
        and their bytes stay (see :meth:`add`)."""
        with self._lock:
            try:
                fd = self._file()
                if fd is None:
                    return None
                fcntl.flock(fd, fcntl.LOCK_EX)  # the recount is rare: a short wait is fine here
                try:
                    _now, _, added, recounts = self._get(fd)
                    during = max(0, added - before) if before is not None else 0
                    total = counted + during + self._carry_in
                    self._carry_in, self._carry_out = 0, {}  # removals carried: as those meanwhile
                    os.pwrite(fd, _USAGE.pack(total, 1, added, recounts + 1), 0)
                    return total
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                return None
