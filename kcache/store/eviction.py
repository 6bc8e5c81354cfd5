"""The store's size bound: the whole folder on disk, as ``du`` and a disk quota count it.

What is counted (see :mod:`.footprint`): blocks, not file sizes (a 300-byte record takes 4 KiB
on ext4), of everything under the store's folder, in two parts:

- the committed entries (each one's folder, record and members), in one number that every
  process of the store keeps up to date (:mod:`.usage`: a put adds its entry, a removal
  subtracts what it removed; a put never waits for it);
- everything else (the index and its WAL, the root's files and folders, the shard folders,
  ``locks/``, and what is held in ``tmp/`` and ``trash/``: entries being written, removed
  entries a live process still holds, processes' private folders), walked by each writing
  process's flush thread at its turns (:meth:`Evictor.measure`), and by a put when the last
  walk is older than :data:`~.tunables.REMEASURE_S` (a loaded box starves the flush threads,
  while what is held grows). Held bytes are counted against the bound like any others:
  eviction removes other entries around them.

Who evicts, least recently used first:

- the flush thread of any process that writes, as soon as a put takes the store past its bound
  (not a second later), one process at a time (``locks/evict.lock``, never waited for), down to
  :data:`~.tunables.EVICT_TO` of the bound; it lists every entry (its record's mtime) and
  removes the oldest, then the shard folders it left empty;
- a put that finds the store past :data:`~.tunables.HELP_OVER` of its bound (the evicting
  thread is behind the writers) first lets go of what costs disk and nobody needs (the removed
  entries its process holds idle; ``trash/`` swept for a moment: at most every
  :data:`~.tunables.REMEASURE_S`), then frees about its own size before it returns: the oldest
  of a random sample of entries, without any lock (removal is a rename, which one process
  wins). It only renames them into ``trash/`` (their bytes leave the count then); deleting
  their files is left to the flush thread's next turn, which the put wakes (deleting files
  makes the filesystem's journal wait), unless the store is past
  :data:`~.tunables.BRAKE_OVER` of its bound: then the flush threads are far behind (a
  loaded box), and the put deletes them itself;
- a process that ends with the store past its bound brings it back under before it goes
  (for at most :data:`~.tunables.EXIT_EVICT_S`), so the bound holds after the last writer.

Last use is the later of the record file's mtime (refreshed by hits at most once a minute, by
the filesystem's clock) and, when the index can be read, its last use (written within a second
of a hit); eviction needs neither the index nor any lock a compile holds.

Nothing is kept for its age: what a hit handed out is held apart (see :mod:`.served`), so
removing its entry cannot change or remove what a live process reads. An entry put with
``protect_s`` (prewarm) carries ``protect_until`` in its record and is not evicted before then
unless it has been used: its record's mtime moved on from its creation, or the index counts a
hit. Last use stays true (no date in the future).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..kinds import valid_id
from ..log import logger, warn_once
from . import fs
from . import tunables as T
from .errors import expected
from .footprint import Footprint, measure
from .locks import Lock
from .records import RECORD_NAME, Record
from .trash import folder_bytes
from .usage import Usage

if TYPE_CHECKING:
    from .catalogue import Catalogue
    from .clock import Clock
    from .entries import Entries
    from .opening import Folders

_HEX = frozenset("0123456789abcdef")


def _spaced(cpu: float) -> float:
    """How soon a put may do again what it began when its thread's CPU time was ``cpu`` (a walk,
    letting go): :data:`~.tunables.REMEASURE_S`, or longer so that it takes at most
    :data:`~.tunables.REMEASURE_SHARE` of the time. CPU, not wall: a loaded box that deschedules
    the work must not make it rarer, when the bound needs it most."""
    return max(T.REMEASURE_S, (time.thread_time() - cpu) / T.REMEASURE_SHARE)


def is_protected(rec: Record | None, mtime: float, hits: int, now: float) -> bool:
    """Kept from eviction: put with protection that has not run out, and not used since (its
    record's mtime still its creation's, no hit in the index)."""
    return rec is not None and rec.protect_until > now and hits == 0 and mtime <= rec.created + T.FIRST_USE_S


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
        #: The store's bytes on disk outside its committed entries, as last measured, and when.
        self.outside = Footprint(0, 0, 0, 0)
        self._measured_at = self._let_go_at = -1e9
        self._walk_every = T.REMEASURE_S  # a put's walks: at most this often (see measure)
        self._let_go_every = T.REMEASURE_S  # ... and its letting go (see after_put)
        #: Called by a put that finds the store far past its bound (see :meth:`after_put`): lets
        #: go of what costs disk and nobody needs; whether it did.
        self.let_go: Callable[[], bool] = lambda: False
        self._emptied: set[str] = set()  # shards whose entries eviction removed (tried at its end)

    def after_fork(self) -> None:
        self.usage.after_fork()
        self._protected = {}

    @property
    def overhead(self) -> int:
        """Bytes on disk outside the committed entries, as last measured (see :meth:`measure`),
        but the entries being written (counted as they land)."""
        return self.outside.beside_entries

    def measure(self, shards: bool = True) -> Footprint:
        """Walk what is outside the committed entries (:func:`.footprint.measure`): at every flush
        turn of a writing process, at exit and before eviction (a few dozen stats, and up to 256
        for the shard folders: about a millisecond); at a put when the last walk is older than
        :data:`~.tunables.REMEASURE_S` (without the shard folders, which change slowly: their
        last figure is kept)."""
        cpu = time.thread_time()
        try:
            got = measure(self.folders, shards=shards)
            self.outside = got if shards else got._replace(shards=self.outside.shards)
            self._measured_at = time.monotonic()
            self._walk_every = _spaced(cpu)
        except OSError:
            pass
        return self.outside

    # ------------------------------------------------------------------ the put path
    def after_put(self, size: int, ident: str) -> None:
        """A put committed ``size`` bytes: count them; past the bound, have the flush thread
        evict now; far past it, free about as much here (and further past, delete it here)."""
        total = self.usage.add(size)
        if total is None:  # not counted yet (a new store): the flush thread counts it
            self.catalogue.wake()
            return
        # With what is beside the entries as of now, not as of the flush thread's last turn (a
        # second ago, or many on a loaded box, while removed entries other processes hold, files
        # puts left to delete and entries in flight grow): walked again when the last walk is
        # older than REMEASURE_S (a few dozen stats, 0.5 ms; at most that often per process, and
        # no oftener than keeps the walks to REMEASURE_SHARE of the time). The entries being
        # written are counted too: the folder's peak is what this guards (eviction's own target
        # leaves them out, see Footprint.beside_entries).
        now = time.monotonic()
        if now - self._measured_at > self._walk_every:
            self.measure(shards=False)
        bound = self.bound()
        seen = total + self.outside.total
        if seen <= bound:
            return
        self.catalogue.wake()
        if seen <= bound * T.HELP_OVER:
            return
        # Far past it: the flush threads are behind the writers (a loaded box starves them: the
        # folder reached 1.6x its bound once in CI). First what costs disk and nobody needs (the
        # removed entries this process holds idle, what trash/ holds: see Upkeep._let_go), at
        # most every REMEASURE_S (and REMEASURE_SHARE of the time), before live entries are
        # evicted around it.
        if now - self._let_go_at > self._let_go_every:
            self._let_go_at = now
            cpu = time.thread_time()
            went = self.let_go()
            self._let_go_every = _spaced(cpu)
            if went:
                self.measure(shards=False)
                seen = total + self.outside.total
                if seen <= bound * T.HELP_OVER:
                    return
        # Further past it, this put deletes what it evicts itself rather than leave the files
        # to a turn that may not come for seconds.
        soon = seen <= bound * T.BRAKE_OVER
        if self.help(min(seen - bound, 2 * size), exclude=ident, soon=soon):
            self.catalogue.wake()  # their files (or folders): deleted at the flush thread's turn

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
        out: list[tuple[float, str]] = []
        seen: set[str] = set()
        per = max(2, n // 8)
        for again in (False, True):
            age = time.monotonic() - self._shards_at
            if again or age > 10.0 or not self._shards:
                # (again: the list came up short, one listdir of up to 256 names; shards come and
                # go as writers fill a new store and eviction or a clear empties them, and a put
                # every few milliseconds found only the emptied ones for as long as a list was
                # kept: a store that grew to 1.6x its bound, test_store_quota.py)
                with contextlib.suppress(OSError):
                    self._shards = [s for s in os.listdir(efd) if len(s) == 2 and set(s) <= _HEX]
                    self._shards_at = time.monotonic()
            shards = list(self._shards)
            random.shuffle(shards)
            shards.sort(key=lambda x: x not in self._full)
            for shard in shards[:64]:
                try:
                    sfd = os.open(shard, fs.O_DIR, dir_fd=efd)
                except OSError:
                    continue
                try:
                    names = [
                        x
                        for x in os.listdir(sfd)
                        if x != exclude and x not in seen and valid_id(x) and x[:2] == shard
                    ]
                    for name in random.sample(names, min(len(names), per)):
                        with contextlib.suppress(OSError):
                            st = os.stat(f"{name}/{RECORD_NAME}", dir_fd=sfd, follow_symlinks=False)
                            out.append((st.st_mtime, name))
                            seen.add(name)
                except OSError:
                    pass
                finally:
                    os.close(sfd)
                if len(out) >= n:
                    return out
        return out

    # ------------------------------------------------------------------ the flush thread
    def due(self) -> bool:
        """Whether :meth:`run` has work: the store past its bound, or not counted yet."""
        self.usage.flush(0.0)
        r = self.usage.read()
        if r is None:
            return False
        if not r[1]:
            return True
        return r[0] + self.measure().beside_entries > self.bound()

    def run(
        self, target: int | None = None, *, lock_wait: float = 0.0, deadline: float | None = None
    ) -> tuple[int, int]:
        """Evict least recently used entries until the store's folder takes at most
        :data:`~.tunables.EVICT_TO` of the bound on disk, or (given ``target``) until its
        committed entries take at most ``target`` bytes on disk. One process at a time; another
        one's turn is waited for at most ``lock_wait`` seconds. Returns (entries, bytes)."""
        st = self.folders
        if st.readonly or st.closed:
            return 0, 0
        if target is None:  # what the bound leaves for the committed entries
            target = max(0, int(self.bound() * T.EVICT_TO) - self.measure().beside_entries)
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
        # broad: eviction runs on the flush thread, at exit and for `kcache evict`, which all go on:
        # the disk or the index failing is one warning; a bug is reported (raised when strict)
        except Exception as e:
            if expected(e, "evict", "kcache's eviction", then="the bound is kept at the next turn"):
                warn_once("evict", f"eviction failed: {e}")
        finally:
            self._remove_empty_shards()
            lk.release()
        return removed, freed

    def _remove_empty_shards(self) -> None:
        """Remove the shard folders this eviction left empty (a folder takes a block: 256 of
        them are 1 MiB). Only this thread's own turn does it (a removed folder can cost
        milliseconds); a writer that meets the shard gone makes it again (see Entries._commit)."""
        emptied, self._emptied = self._emptied, set()
        efd = self.folders.fd("entries")
        if efd is None:
            return
        # (a copy: a put past BRAKE_OVER evicts on its own thread, and may add to the set just
        # taken; a shard it adds late stays until a later eviction empties it again)
        for shard in list(emptied):
            with contextlib.suppress(OSError):  # not empty (the usual case), or gone already
                os.rmdir(shard, dir_fd=efd)

    def at_exit(self) -> None:
        """A process ending with the store past its bound brings it under (bounded time)."""
        self.usage.flush(min(1.0, T.EXIT_EVICT_S / 2))  # bytes a busy count carried, not lost
        total = self.usage.total()
        room = self.bound() - self.measure().beside_entries  # what the bound leaves the entries
        if total is None or total <= room:
            return
        deadline = time.monotonic() + T.EXIT_EVICT_S
        # Down to the bound, not below: what other live processes hold and write now is in the
        # measure, and goes with them (each exit that took its own 10% made the store's last
        # writers leave it at half its bound).
        self.run(max(0, room), lock_wait=min(1.0, T.EXIT_EVICT_S / 2), deadline=deadline)
        while time.monotonic() < deadline:
            total = self.usage.total()
            bound = self.bound() - self.overhead
            if total is None or total <= bound or not self.help(total - bound):
                break
        self._remove_empty_shards()

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
            if not soon:
                self._emptied.add(ident[:2])
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
        """Count every entry's bytes on disk and make that the shared number (a new store, a
        store older than the count, a count that drifted). Under ``locks/evict.lock`` (taken
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
            # Where the walk begins. Another process updating the count holds it for a moment:
            # waited for, as settle waits. Without it, settle could add nothing put while the walk
            # went on, and an entry put behind the walk was counted nowhere (the count short for
            # good, the store past its bound). Not readable within a second: no recount now (the
            # next turn, or the next reconcile, tries again).
            before = self.usage.added(wait_s=1.0)
            if before is None:
                return None
            counted = sum(folder_bytes(sfd, name) for sfd, name in self._folders())
            total = self.usage.settle(counted, before)
            logger.debug("store size counted: %d bytes on disk, now %s", counted, total)
            return total
        finally:
            if lk is not None:
                lk.release()
