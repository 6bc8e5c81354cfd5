"""The store's size bound: one shared count of its bytes, and eviction by every process that writes.

What is counted: the bytes of committed entries' members (what ``kcache stats`` shows), in one
number that every process of the store keeps up to date (``locks/usage``: a put adds its entry,
a removal subtracts what it removed). Updating it takes an flock for two small reads and writes;
a put never waits for it (a busy count carries the bytes to the next update).

Who evicts, least recently used first:

- the flush thread of any process that writes, as soon as a put takes the store past its bound
  (not a second later), one process at a time (``locks/evict.lock``, never waited for), down to
  :data:`~.tunables.EVICT_TO` of the bound; it lists every entry (its record's mtime) and
  removes the oldest;
- a put that finds the store past :data:`~.tunables.HELP_OVER` of its bound (the evicting
  thread is behind the writers) frees about its own size before it returns: the oldest of a
  random sample of entries, without any lock (removal is a rename, which one process wins).
  It only renames them into ``trash/`` (their bytes leave the count then); deleting their files
  is left to the flush thread's next turn, which the put wakes (deleting files makes the
  filesystem's journal wait, and a put must not);
- a process that ends with the store past its bound brings it back under before it goes
  (for at most :data:`~.tunables.EXIT_EVICT_S`), so the bound holds after the last writer.

Last use is the later of the record file's mtime (refreshed by hits at most once a minute, by
the filesystem's clock) and, when the index can be read, its last use (written within a second
of a hit); eviction needs neither the index nor any lock a compile holds.

Nothing is kept for its age: what a hit handed out is a private link (see :mod:`.served`), so
removing its entry cannot change or remove what a live process reads. An entry put with
``protect_s`` (prewarm) carries ``protect_until`` in its record and is not evicted before then
unless it has been used: its record's mtime moved on from its creation, or the index counts a
hit. Last use stays true (no date in the future).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..kinds import valid_id
from ..log import logger, warn_once
from . import fs
from . import tunables as T
from .errors import expected
from .locks import Lock
from .records import RECORD_NAME, Record
from .trash import folder_bytes

if TYPE_CHECKING:
    from .catalogue import Catalogue
    from .clock import Clock
    from .entries import Entries
    from .opening import Folders

USAGE_NAME = "usage"
# bytes; 1 once counted (0: puts added since the file was made); bytes ever added (only grows:
# a recount adds what was put while it walked, see Usage.settle). A 16-byte file (an older
# kcache's) reads as adding nothing.
_USAGE = struct.Struct("<qqq")
_USAGE_OLD = struct.Struct("<qq")
_HEX = frozenset("0123456789abcdef")


def entry_bytes(rec: Record) -> int:
    """What a committed entry counts for against the bound: its members' bytes (what ``kcache
    stats`` and ``inspect`` show; its record, a few hundred bytes, is not counted)."""
    return rec.size


def is_protected(rec: Record | None, mtime: float, hits: int, now: float) -> bool:
    """Kept from eviction: put with protection that has not run out, and not used since (its
    record's mtime still its creation's, no hit in the index)."""
    return rec is not None and rec.protect_until > now and hits == 0 and mtime <= rec.created + T.FIRST_USE_S


class Usage:
    """The store's committed bytes, shared by its processes through ``locks/usage``."""

    def __init__(self, folders: Folders) -> None:
        self._folders = folders
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0
        self._carry = 0  # bytes not written yet (the count was busy): added next time
        self._carry_added = 0  # the positive part of them
        self._broken = False

    def after_fork(self) -> None:
        # The child shares its parent's open file (and so its flock): never unlock it there.
        self._lock = threading.Lock()
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._carry = self._carry_added = 0

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
            self._broken = True
            warn_once("usage", f"cannot keep count of the store's size ({e}); its size bound is not kept")
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
            fs.write_new_at(lfd, tmp, _USAGE.pack(0, 1, 0))
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
    def _get(fd: int) -> tuple[int, bool, int]:
        """(bytes, counted, bytes ever added)."""
        raw = os.pread(fd, _USAGE.size, 0)
        if len(raw) < _USAGE_OLD.size:
            return 0, False, 0
        if len(raw) < _USAGE.size:
            total, counted = _USAGE_OLD.unpack(raw[: _USAGE_OLD.size])
            return total, counted == 1, 0
        total, counted, added = _USAGE.unpack(raw)
        return total, counted == 1, added

    def add(self, delta: int) -> int | None:
        """Add ``delta`` bytes; the store's total after it, or None when it is not known (not
        counted yet, or the count is busy or unusable: then the bytes are added next time)."""
        with self._lock:
            plus = self._carry_added + max(delta, 0)
            delta += self._carry
            self._carry = self._carry_added = 0
            try:
                fd = self._file()
                if fd is None:
                    return None
                if not self._lock_file(fd, fcntl.LOCK_EX):
                    self._carry, self._carry_added = delta, plus
                    return None
                try:
                    total, counted, added = self._get(fd)
                    total += delta
                    os.pwrite(fd, _USAGE.pack(total, int(counted), added + plus), 0)
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError as e:
                self._carry, self._carry_added = delta, plus
                logger.debug("usage: %s", e)
                return None
            return total if counted else None

    def flush(self, wait_s: float = 1.0) -> None:
        """Add what busy counts carried (at exit, and at the flush thread's turns): waits for
        the count at most ``wait_s`` seconds."""
        end = time.monotonic() + wait_s
        while self._carry:
            self.add(0)
            if not self._carry or time.monotonic() > end:
                return
            time.sleep(0.001)

    def read(self) -> tuple[int, bool] | None:
        """(bytes, counted), or None when it cannot be read now."""
        got = self._read_all()
        return None if got is None else got[:2]

    def added(self) -> int | None:
        """The bytes ever added to the count (a mark for :meth:`settle`), or None."""
        got = self._read_all()
        return None if got is None else got[2]

    def _read_all(self) -> tuple[int, bool, int] | None:
        """(bytes, counted, bytes ever added), read under a shared lock, or None."""
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

    def settle(self, counted: int, before: int | None) -> int | None:
        """After a recount that found ``counted`` bytes on disk, which began when
        :meth:`added` said ``before``: the number becomes ``counted`` plus every byte added
        meanwhile (an entry put during the count may be in both: counted twice rather than not
        at all). Removals meanwhile are not subtracted, for the same reason (the walk may have
        counted the entry or not). The net change would not do: a put and a removal during the
        walk cancel out in it, while the walk can miss the put (its shard walked already) and
        the removed entry both, which left the count one entry short for good (seen: 10,000
        bytes counted for 11 entries of 1,000 under a 10,000 bound, never evicted)."""
        with self._lock:
            try:
                fd = self._file()
                if fd is None:
                    return None
                fcntl.flock(fd, fcntl.LOCK_EX)  # the recount is rare: a short wait is fine here
                try:
                    _now, _, added = self._get(fd)
                    during = max(0, added - before) if before is not None else 0
                    total = counted + during + self._carry_added
                    self._carry = self._carry_added = 0
                    os.pwrite(fd, _USAGE.pack(total, 1, added), 0)
                    return total
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                return None


class Evictor:
    """Keeps one store under its bound (see the module doc). The disk tier calls
    :meth:`after_put` after every commit, :meth:`due` and :meth:`run` from its flush thread,
    :meth:`at_exit` when it closes. ``bound()`` is the store's bound now; ``remove(id)`` removes
    an entry for eviction (the bytes freed, or None when it was not there); ``remove_soon(id)``
    the same for a put that evicts, leaving the files for a later turn to delete (default
    ``remove``)."""

    def __init__(
        self,
        entries: Entries,
        catalogue: Catalogue,
        *,
        bound: Callable[[], int],
        remove: Callable[[str], int | None],
        remove_soon: Callable[[str], int | None] | None = None,
    ) -> None:
        self.folders: Folders = entries.folders
        self.clock: Clock = entries.clock
        self.entries, self.catalogue = entries, catalogue
        self.bound, self.remove = bound, remove
        self.remove_soon = remove_soon or remove
        self.usage = Usage(self.folders)
        # id -> (protect_until, record mtime when seen): not read again until one of them changes
        self._protected: dict[str, tuple[float, float]] = {}
        self._shards: list[str] = []
        self._full: set[str] = set()  # shards that held entries when last listed
        self._shards_at = -1e9
        self._recount_at = -1e9

    def after_fork(self) -> None:
        self.usage.after_fork()
        self._protected = {}

    # ------------------------------------------------------------------ the put path
    def after_put(self, size: int, ident: str) -> None:
        """A put committed ``size`` bytes: count them; past the bound, have the flush thread
        evict now; far past it, free about as much here."""
        total = self.usage.add(size)
        if total is None:  # not counted yet (a new store): the flush thread counts it
            self.catalogue.wake()
            return
        bound = self.bound()
        if total <= bound:
            return
        self.catalogue.wake()
        if total > bound * T.HELP_OVER and self.help(min(total - bound, 2 * size), exclude=ident, soon=True):
            self.catalogue.wake()  # their files: deleted at the flush thread's turn

    def help(self, need: int, exclude: str = "", *, soon: bool = False) -> int:
        """Free about ``need`` bytes now, without a lock: the oldest unprotected entry of a
        random sample, a few times at most (``soon``: removed with ``remove_soon``). Returns the
        bytes freed."""
        freed = 0
        now = self.clock.now()
        for _ in range(4):
            if freed >= need:
                break
            got = None
            for mtime, ident in sorted(self._sample(16, exclude)):
                if mtime > now - T.GRACE_S:
                    break
                got = self._evict_one(ident, mtime, 0, now, soon=soon)
                if got is not None:
                    break
            if got is None:
                break
            freed += got
        return freed

    def _sample(self, n: int, exclude: str) -> list[tuple[float, str]]:
        """(record mtime, id) of up to ``n`` entries of random shards (those that held entries
        at the last listing first: a small store leaves most of its 256 shards empty)."""
        import random  # only when a put has to help

        efd = self.folders.fd("entries")
        if efd is None:
            return []
        if time.monotonic() - self._shards_at > 10.0 or not self._shards:
            with contextlib.suppress(OSError):
                self._shards = [s for s in os.listdir(efd) if len(s) == 2 and set(s) <= _HEX]
                self._shards_at = time.monotonic()
        shards = list(self._shards)
        random.shuffle(shards)
        shards.sort(key=lambda x: x not in self._full)
        out: list[tuple[float, str]] = []
        per = max(2, n // 8)
        for shard in shards[:64]:
            try:
                sfd = os.open(shard, fs.O_DIR, dir_fd=efd)
            except OSError:
                continue
            try:
                names = [x for x in os.listdir(sfd) if x != exclude and valid_id(x) and x[:2] == shard]
                for name in random.sample(names, min(len(names), per)):
                    with contextlib.suppress(OSError):
                        st = os.stat(f"{name}/{RECORD_NAME}", dir_fd=sfd, follow_symlinks=False)
                        out.append((st.st_mtime, name))
            except OSError:
                pass
            finally:
                os.close(sfd)
            if len(out) >= n:
                break
        return out

    # ------------------------------------------------------------------ the flush thread
    def due(self) -> bool:
        """Whether :meth:`run` has work: the store past its bound, or not counted yet."""
        self.usage.flush(0.0)
        r = self.usage.read()
        return r is not None and (not r[1] or r[0] > self.bound())

    def run(
        self, target: int | None = None, *, lock_wait: float = 0.0, deadline: float | None = None
    ) -> tuple[int, int]:
        """Evict least recently used entries until the store holds at most ``target`` bytes
        (default :data:`~.tunables.EVICT_TO` of the bound). One process at a time; another
        one's turn is waited for at most ``lock_wait`` seconds. Returns (entries, bytes)."""
        st = self.folders
        if st.readonly or st.closed:
            return 0, 0
        target = int(self.bound() * T.EVICT_TO) if target is None else target
        lfd = st.fd("locks")
        if lfd is None:
            return 0, 0
        lk = Lock(lfd, "evict.lock")
        try:
            if not lk.acquire(lock_wait):
                return 0, 0
        except OSError:
            return 0, 0
        removed = freed = 0
        try:
            total = self.usage.total()
            if total is None:
                total = self.recount(locked=True)
            if total is None or total <= target:
                return 0, 0
            now = self.clock.refresh()
            exhausted = True
            for last, mtime, ident, hits in self._candidates():
                if total <= target or (deadline is not None and time.monotonic() > deadline):
                    exhausted = False
                    break
                if last > now - T.GRACE_S:
                    break  # oldest first: every later one was used more recently still
                got = self._evict_one(ident, mtime, hits, now)
                if got is None:
                    continue
                removed += 1
                freed += got
                now_total = self.usage.total()
                total = now_total if now_total is not None else total - got
            if exhausted and total > target and time.monotonic() - self._recount_at > T.RECOUNT_EVERY_S:
                # Nothing left to remove and still past the target: the count may have drifted
                # (a process killed between a removal and its count); count again.
                self._recount_at = time.monotonic()
                self.recount(locked=True)
        except Exception as e:  # broad: eviction runs on the flush thread and at exit, which go on
            if expected(e, "evict", "kcache's eviction", then="the bound is kept at the next turn"):
                warn_once("evict", f"eviction failed: {e}")  # the disk, the index: the put stands
        finally:
            lk.release()
        return removed, freed

    def at_exit(self) -> None:
        """A process ending with the store past its bound brings it under (bounded time)."""
        self.usage.flush(min(1.0, T.EXIT_EVICT_S / 2))  # bytes a busy count carried, not lost
        total = self.usage.total()
        if total is None or total <= self.bound():
            return
        deadline = time.monotonic() + T.EXIT_EVICT_S
        self.run(lock_wait=min(1.0, T.EXIT_EVICT_S / 2), deadline=deadline)
        while time.monotonic() < deadline:
            total = self.usage.total()
            bound = self.bound()
            if total is None or total <= bound or not self.help(total - bound):
                break

    def _candidates(self) -> list[tuple[float, float, str, int]]:
        """(last use, record mtime, id, index hits) of every entry, least recently used first."""
        index: dict[str, tuple[float, int]] = self.catalogue.call(lambda idx: idx.last_uses()) or {}
        own = self.catalogue.own_touches()  # this process's hits, not written to the index yet
        out = []
        for ident, mtime in self.scan():
            at, hits = index.get(ident, (0.0, 0))
            mine_at, mine = own.get(ident, (0.0, 0))
            out.append((max(mtime, at, mine_at), mtime, ident, hits + mine))
        out.sort()
        return out

    def _evict_one(
        self, ident: str, mtime: float, hits: int, now: float, *, soon: bool = False
    ) -> int | None:
        """Remove one candidate unless it was used since it was listed or is protected. The bytes
        freed, or None when it stays (or was gone)."""
        mt = self.entries.record_mtime(ident)
        if mt is None or abs(mt - mtime) > 1e-6:
            return None  # gone, or a hit refreshed it since it was listed
        known = self._protected.get(ident)
        if known is not None and known[1] == mt and known[0] > now:
            return None
        rec, _why = self.entries.read_record(ident)
        if is_protected(rec, mt, hits, now):
            assert rec is not None
            self._protected[ident] = (rec.protect_until, mt)
            return None
        self._protected.pop(ident, None)
        got = (self.remove_soon if soon else self.remove)(ident)
        if got is not None:
            self.catalogue.counts.add("store", evictions=1)
            self.catalogue.drop_row(ident)
        return got

    # ------------------------------------------------------------------ listing and counting
    def _folders(self) -> Iterator[tuple[int, str]]:
        """(shard folder's descriptor, entry id) of every entry folder; the descriptor is valid
        until the next item."""
        efd = self.folders.fd("entries")
        if efd is None:
            return
        try:
            shards = [s for s in os.listdir(efd) if len(s) == 2 and set(s) <= _HEX]
        except OSError:
            return
        self._shards, self._shards_at = shards, time.monotonic()
        full = set()
        for shard in shards:
            try:
                sfd = os.open(shard, fs.O_DIR, dir_fd=efd)
            except OSError:
                continue
            try:
                with os.scandir(sfd) as it:
                    names = [e.name for e in it if valid_id(e.name) and e.name[:2] == shard]
                if names:
                    full.add(shard)
                for name in names:
                    yield sfd, name
            except OSError:
                continue
            finally:
                os.close(sfd)
        self._full = full

    def scan(self) -> Iterator[tuple[str, float]]:
        """(id, record mtime) of every entry folder; an entry folder without a record (damaged)
        comes with its folder's mtime."""
        for sfd, name in self._folders():
            try:
                yield name, os.stat(f"{name}/{RECORD_NAME}", dir_fd=sfd, follow_symlinks=False).st_mtime
            except FileNotFoundError:
                with contextlib.suppress(OSError):
                    yield name, os.stat(name, dir_fd=sfd, follow_symlinks=False).st_mtime
            except OSError:
                continue

    def recount(self, *, locked: bool = False) -> int | None:
        """Count the bytes of every entry on disk and make that the shared number (a new store,
        a store older than the count, a count that drifted). Under ``locks/evict.lock`` (taken
        here unless ``locked``). Returns the new total."""
        st = self.folders
        if st.readonly or st.closed:
            return None
        lk = None
        if not locked:
            lfd = st.fd("locks")
            if lfd is None:
                return None
            lk = Lock(lfd, "evict.lock")
            try:
                if not lk.try_acquire():
                    return None
            except OSError:
                return None
        try:
            before = self.usage.added()
            counted = sum(folder_bytes(sfd, name) for sfd, name in self._folders())
            total = self.usage.settle(counted, before)
            logger.debug("store size counted: %d bytes on disk, now %s", counted, total)
            return total
        finally:
            if lk is not None:
                lk.release()
