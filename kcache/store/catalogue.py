"""The store's catalogue: its index (SQLite), and what hits, misses and puts note for it.

The index is never on a lookup's path: hits and puts only note what to write
(:meth:`Catalogue.note_use`, :meth:`~Catalogue.note_put`, :meth:`~Catalogue.note_miss`), and a
daemon thread (one per process) writes it at most once a second, and gives the disk tier its
turn then (eviction, clean-up of ``trash/``; see :mod:`.disk`). Every index operation holds
``_index_lock``: one SQLite connection serves the process, and a transaction must not be shared
between threads. Which files the index is, and opening them safely, is :mod:`.indexfiles`'s.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Container, Iterator
from typing import Any

from .. import counters as _counters
from ..log import logger, warn_once
from . import indexfiles
from . import tunables as T
from .clock import Clock
from .entries import Entries
from .errors import EXPECTED, StoreError, expected, warn_failed
from .housekeeping import iter_entry_ids
from .index import Index, IndexNotMade, IndexTooNew, is_corrupt_db
from .records import Record


class Catalogue:
    """The index of one store in one process, and what waits to be written to it."""

    def __init__(
        self,
        entries: Entries,
        counts: _counters.Counters,
        *,
        index_timeout: float,
        drain_global: bool,
    ) -> None:
        self.entries = entries
        self.folders = entries.folders
        self.clock: Clock = entries.clock
        self.counts = counts
        self.index_timeout = index_timeout
        #: Also write kcache's process-wide counters (those of integrations that are not the
        #: store, see :mod:`kcache.counters`): the program's own store does.
        self.drain_global = drain_global
        #: Called at each of the flush thread's turns, before the index is written (eviction,
        #: clean-up), and after a reconcile (recount): set by the disk tier.
        self.on_turn: Callable[[], None] = lambda: None
        self.after_reconcile: Callable[[], object] = lambda: None
        self._lock = threading.RLock()  # the buffers below
        self._index_lock = threading.RLock()  # one SQLite connection: one thread at a time
        self._index: Index | None = None
        self._index_pid = 0
        self._index_off_until = 0.0
        self._busy_count = 0
        self._touches: dict[str, tuple[float, int]] = {}
        self._touch_since = 0.0  # monotonic: when the oldest last use not yet written was noted
        self._touched_records: dict[str, Record] = {}
        self._misses: list[tuple[float, str, str, dict[str, Any]]] = []
        self._pending: dict[str, tuple[Record, float | None]] = {}
        self._dropped: set[str] = set()  # rows of entries removed here, for the next flush to drop
        self._flush_lock = threading.Lock()
        self._flusher_pid: int | None = None
        # Set: the flush thread's turn now (the store is past its bound). Made with the thread
        # (an Event costs a process's first lookup 12 us).
        self._wake: threading.Event | None = None
        self._next_reconcile = 0.0  # monotonic; the flush thread's first turn asks the index

    @property
    def readonly(self) -> bool:
        return self.folders.readonly

    @property
    def closed(self) -> bool:
        return self.folders.closed

    # ------------------------------------------------------------------ forks
    def fork_locks(self) -> list[Any]:
        # Only the lock of the buffers, held for microseconds. The index and flush locks are
        # held across SQLite work and eviction (seconds): the child gets new ones and never uses
        # its parent's connection, so a fork need not wait for them.
        return [self._lock]

    def after_fork_child(self, keep: list[Any]) -> None:
        """In a forked child: new locks, empty buffers (what the parent has yet to write is the
        parent's to write), and the parent's SQLite connection put in ``keep``, unused: SQLite
        forbids carrying one across a fork, and closing it could checkpoint or unlock the
        parent's files."""
        if self._index is not None:
            keep.append(self._index)
            self._index = None
        self._flush_lock = threading.Lock()
        self._lock = threading.RLock()
        self._index_lock = threading.RLock()
        self._touches, self._touched_records, self._misses, self._pending = {}, {}, [], {}
        self._dropped, self._wake = set(), None

    # ------------------------------------------------------------------ what waits to be written
    def note_use(self, rec: Record) -> None:
        """A hit of ``rec``: its last use and hit count, written by the next flush."""
        if self.readonly:
            return
        with self._lock:
            _, n = self._touches.get(rec.id, (0.0, 0))
            # By this process's clock: the store's offset is added when it is written (a
            # process's first hits come before the store's clock is set, see .clock).
            self._touches[rec.id] = (time.time(), n + 1)
            self._touched_records[rec.id] = rec
            if not self._touch_since:
                self._touch_since = time.monotonic()
        # The flush thread writes last uses at most once a second (and the store at exit): a hit
        # does not start it, a hit a second after the first unwritten one does. (A process's
        # first hits pay no thread start; a put or a miss starts it at once.)
        if self._flusher_pid != os.getpid() and time.monotonic() - self._touch_since >= T.FLUSH_EVERY_S:
            self.maybe_flush()

    def note_miss(self, kind: str, key: str, components: dict[str, Any]) -> None:
        """A miss, for ``kcache explain``."""
        if self.readonly:
            return
        with self._lock:
            self._misses.append((time.time(), kind, key, components))  # as note_use's
        self.maybe_flush()

    def note_put(self, rec: Record, access: float) -> None:
        """A committed entry's row: written by the flush thread (a SQLite transaction, and the
        index's first opening, cost milliseconds a compiling thread need not wait for); until
        then the entry is on disk, served, and found by ``verify``."""
        with self._lock:
            if len(self._pending) < T.MAX_PENDING:
                self._pending[rec.id] = (rec, access)

    def forget(self, ident: str) -> None:
        """An entry removed here: its row and last use, not yet written, are not written."""
        with self._lock:
            self._pending.pop(ident, None)
            self._touches.pop(ident, None)
            self._touched_records.pop(ident, None)

    def drop_row(self, ident: str) -> None:
        """Have the next flush drop the index row of an entry removed here (eviction)."""
        with self._lock:
            if len(self._dropped) < T.MAX_PENDING:
                self._dropped.add(ident)

    def own_touches(self) -> dict[str, tuple[float, int]]:
        """This process's hits not written to the index yet: id -> (last use, hits)."""
        off = self.clock.offset
        with self._lock:
            return {k: (t + off, n) for k, (t, n) in self._touches.items()}

    def wake(self) -> None:
        """The flush thread's turn now (the store is past its bound), not in a second."""
        self.maybe_flush()
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ the index
    def index(self) -> Index:
        """The index, opened on first use (read-only on a read-only store). Raises if it cannot
        be opened (callers catch). A new index (first use, an older kcache's index, one that was
        corrupt) is filled from the entry folders."""
        with self._index_lock:  # the fill below uses the connection: no other thread meanwhile
            with self._lock:
                if self._index is not None and self._index_pid == os.getpid():
                    return self._index
                self._index = None  # a forked child never uses its parent's connection
                ifd = self.folders.fd("index")
                if self.readonly:
                    self._index = indexfiles.open_for_reading(self.folders, ifd)
                else:
                    if ifd is None:
                        raise StoreError("the store has no index folder")
                    self._index = indexfiles.open_writable(self.folders, ifd, self.index_timeout)
                self._index_pid = os.getpid()
                idx = self._index
            if idx.created:
                idx.created = False
                self._fill_index(idx)  # on the flush thread or in a command: never in a lookup or put
            return idx

    def rebuild_index(self) -> Index:
        """Replace the index by a new one filled from the entry folders (a corrupt index, or
        ``kcache verify --fix``). Counters and the miss log start anew."""
        if self.readonly:
            raise StoreError("the store is read-only")
        ifd = self.folders.fd("index")
        if ifd is None:
            raise StoreError("the store has no index folder")
        with self._index_lock, self._lock:
            if self._index is not None and self._index_pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):  # replaced whatever it is
                    self._index.close()
            self._index = None
            indexfiles.remove_files(ifd, strict=True)
        return self.index()

    def index_readonly(self) -> Index:
        """A new connection to the index that never writes, creates or checkpoints anything (it
        works on a full disk and while another process holds the index); close it when done."""
        return indexfiles.open_readonly(self.folders, self.folders.fd("index"))

    def keys(self, kind: str, prefix: str = "") -> list[str]:
        """The keys of the entries of ``kind`` that start with ``prefix``, newest first, from a
        connection that never writes (it works on a full disk and while another process holds
        the index). Best effort: an entry is listed about a second after its put; an index that
        cannot be read lists nothing (one warning). Never raises for a failure of the store."""
        out: list[str] = []
        try:
            idx = self.index_readonly()
            try:
                for row in idx.rows(kind=kind, order="store_time DESC"):
                    if row.record is not None and row.record.key.startswith(prefix):
                        out.append(row.record.key)
            finally:
                idx.close()
        except IndexNotMade:
            pass  # another process is making it (at a new store's first puts): none listed yet
        except EXPECTED as e:  # locked, corrupt, newer, a folder where a file goes: none listed
            warn_once("index-list", f"cannot list entries from the store's index: {e}")
        return out

    def _records_on_disk(self, skip: Container[str] = ()) -> Iterator[tuple[Record, float | None]]:
        """(record, its mtime: the entry's last use) of every intact entry whose id is not in
        ``skip``, read from the entry folders."""
        for ident in iter_entry_ids(self.folders):
            if ident in skip:
                continue
            rec, _why = self.entries.read_record(ident)
            if rec is not None:
                yield rec, self.entries.record_mtime(ident)

    def _fill_index(self, idx: Index) -> None:
        """Add every intact entry's record to a new index (last use: the record's mtime)."""
        batch: list[tuple[Record, float | None]] = []
        try:
            for item in self._records_on_disk():
                batch.append(item)
                if len(batch) >= 500:
                    idx.insert_many(batch)
                    batch = []
            if batch:
                idx.insert_many(batch)
        except EXPECTED as e:  # a rebuild is best effort (sqlite3, the disk)
            # A full disk is one warning for the store, whichever part meets it first.
            why = f"could not fill the new index from the entries ({e}); `kcache verify --fix` does"
            warn_failed(self.folders.root_name, e, self.folders.fd("index"), f"index:{type(e).__name__}", why)

    def call(self, fn: Callable[[Index], Any]) -> Any:
        """``fn(index)``, or None when the index cannot be used now (never raises). One
        connection serves the process: threads take turns (``_index_lock``), so that one
        thread's transaction never swallows or rolls back another's."""
        if self.readonly or self.closed or time.monotonic() < self._index_off_until:
            return None
        try:
            with self._index_lock:
                out = fn(self.index())
            self._busy_count = 0
            return out
        except IndexTooNew as e:
            # A newer kcache shares this store: its index is not ours to rewrite or delete.
            warn_once("index-newer", f"{e}: stats and eviction are off in this process (entries are used)")
            self._index_off_until = float("inf")
            return None
        except Exception as e:  # broad: the index is optional (stats, eviction): sorted below, never fatal
            if not expected(e, "index", "kcache's use of its index", then="continuing without it"):
                return None  # a bug: reported (raised under KCACHE_STRICT=1)
            msg = str(e).lower()
            if isinstance(e, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg):
                # Other processes are writing (many ranks at once): expected, not worth a
                # warning, unless it lasts (a process holding the index for good). What was to
                # be written is kept for the next flush.
                now = time.monotonic()
                self._busy_count += 1
                # 0.5 s, 1 s, 2 s, 4 s, then 5 s: soon again after a moment's contention, rarely
                # when another process holds the index for good (each try waits the busy timeout).
                back = min(T.INDEX_BACKOFF_S, T.INDEX_BUSY_BACKOFF_S * 2 ** min(self._busy_count - 1, 8))
                self._index_off_until = now + back
                logger.debug("index busy: %s", e)
                if self._busy_count >= T.INDEX_BUSY_WARN_AFTER:
                    warn_once(
                        "index-locked",
                        f"the store's index is locked by another process ({e}); hits and new kernels "
                        "go on, stats and eviction catch up when it is free",
                    )
                return None
            self._index_off_until = time.monotonic() + T.INDEX_BACKOFF_S
            # A full disk (SQLITE_FULL; or no inode left for the log: "unable to open database
            # file") is said once for the store, with its entries' and locks' failures.
            why = f"the store's index is unavailable ({type(e).__name__}: {e}); continuing without it"
            warn_failed(self.folders.root_name, e, self.folders.fd("index"), f"index:{type(e).__name__}", why)
            if is_corrupt_db(e):
                with self._index_lock, self._lock:
                    if self._index is not None and self._index_pid == os.getpid():
                        with contextlib.suppress(sqlite3.Error):  # replaced whatever it is
                            self._index.close()
                    self._index = None
                    ifd = self.folders.fd("index")
                    if ifd is not None:
                        indexfiles.remove_files(ifd)
                self._index_off_until = 0.0
            return None

    def maybe_flush(self) -> None:
        """Have the batched index writes done soon, off the caller's path.

        A hit or miss only notes what to write; a daemon thread (one per process, started on
        first need, again in a forked child) writes it at most once a second. Opening the index
        and a SQLite transaction cost milliseconds: they must not land inside a kernel launch."""
        if self.readonly or self.closed:
            return
        if self._flusher_pid != os.getpid():
            with self._lock:
                if self._flusher_pid != os.getpid():
                    self._flusher_pid = os.getpid()
                    if self._wake is None:
                        self._wake = threading.Event()
                    try:
                        t = threading.Thread(target=self._flush_loop, name="kcache-flush", daemon=True)
                        t.start()
                    except RuntimeError as e:  # no threads left (a pids limit), or at shutdown
                        # Tried again at the next put or lookup; until then rows wait in memory
                        # (and are written at close).
                        self._flusher_pid = None
                        logger.debug("flush thread not started: %s", e)

    def _flush_loop(self) -> None:
        """The daemon thread: eviction when the store is past its bound (woken by the put that
        took it there), and batched index writes. Both are off the compiling threads' path (a
        put only notes its row)."""
        pid = os.getpid()
        wake = self._wake  # made before the thread was started
        if wake is None:
            return
        while not self.closed and os.getpid() == pid:
            wake.wait(T.FLUSH_EVERY_S)
            wake.clear()
            if self.closed or os.getpid() != pid:
                return
            try:
                self.on_turn()
                self.flush()
                if time.monotonic() >= self._next_reconcile:
                    self._next_reconcile = time.monotonic() + T.RECONCILE_CHECK_S
                    self.reconcile()
            except Exception as e:  # broad: the flush thread goes on (its parts sort their own failures)
                if not sys.is_finalizing():  # a bug: reported once (under KCACHE_STRICT=1 it ends the thread)
                    expected(e, "flush", "kcache's flush thread")

    def reconcile(self, force: bool = False) -> int:
        """Add a row for each entry on disk that has none, and return how many were added.

        A put's row is written by the flush thread: a process killed, or ended by ``os._exit``
        (multiprocessing's workers), before it ran leaves entries the index does not know
        (stats would not see them). Done at most once per
        :data:`~.tunables.RECONCILE_EVERY_S` for the whole store (the time is kept in the
        index; ``force`` ignores it), by whichever process finds it due, which also counts the
        store's bytes again (the size count drifts when a process is killed between a commit
        and its count). Never raises."""
        now = self.clock.synced()

        def due(idx: Index) -> set[str] | None:
            with idx.transaction():  # one process claims the turn
                last = idx.get_meta("reconciled_at")
                try:
                    if not force and last is not None and now - float(last) < T.RECONCILE_EVERY_S:
                        return None
                except ValueError:
                    pass
                idx.set_meta("reconciled_at", repr(now))
            return idx.ids()

        known = self.call(due)
        if known is None:
            return 0
        batch: list[tuple[Record, float | None]] = []
        try:
            batch.extend(self._records_on_disk(skip=known))
        except EXPECTED as e:  # as a rebuild (the disk)
            logger.debug("reconcile: %s", e)

        def insert(idx: Index) -> bool:
            idx.insert_many(batch)
            return True

        if batch and self.call(insert) is None:
            return 0
        if batch:
            logger.info("added %d index rows for entries written by processes that ended early", len(batch))
        try:
            self.after_reconcile()
        except EXPECTED as e:  # a recount is best effort: the next reconcile tries again
            logger.debug("recount: %s", e)
        return len(batch)

    def flush(self, force: bool = False) -> None:
        """Write batched last-use times, counters and misses to the index. Never raises."""
        with self._flush_lock:
            self._flush_locked(force)

    def _flush_locked(self, force: bool) -> None:
        if self.readonly or self.closed:
            return
        if force:
            self._index_off_until = 0.0  # at exit and on request: one more try, bounded by the timeout
        with self._lock:
            touches, self._touches = self._touches, {}
            self._touch_since = 0.0
            recs, self._touched_records = self._touched_records, {}
            misses, self._misses = self._misses, []
            pending, self._pending = self._pending, {}
            dropped, self._dropped = self._dropped, set()
        deltas = self.counts.drain()
        if self.drain_global:
            for k, v in _counters.drain().items():
                deltas[k] = deltas.get(k, 0.0) + v
        if not (touches or misses or deltas or pending or dropped):
            return
        # What was noted by this process's clock, in the store's time: by the offset puts used
        # meanwhile (the order of a put and a hit a moment later must not turn on the few
        # milliseconds a new reading moves it), or this one's when the clock was never set.
        clock = self.clock
        before = clock.offset if clock.synced_once else None
        clock.refresh()
        off = clock.offset if before is None else before
        touches = {k: (t + off, n) for k, (t, n) in touches.items()}
        misses = [(t + off, kind, key, comps) for t, kind, key, comps in misses]

        def write(idx: Index) -> bool:
            with idx.transaction():
                if dropped:  # evicted here; a put of the same entry since then keeps its row
                    idx.remove([i for i in dropped if self.entries.record_mtime(i) is None])
                for rec, access in pending.values():
                    if self.entries.record_mtime(rec.id) is not None:  # not removed since its put
                        idx.insert(rec, last_used=access)
                if deltas:
                    idx.add_counters(deltas, at=time.time() + off)
                if touches:
                    for ident in idx.touch(touches):
                        # on disk but not in the index (a crash, a new index): add it; but not an
                        # entry removed since its hit (here or by another process' clear)
                        if ident in recs and self.entries.record_mtime(ident) is not None:
                            idx.insert(recs[ident], last_used=touches[ident][0], hits=touches[ident][1])
                if misses:
                    idx.add_misses(misses)
            return True

        if not self.call(write):
            self.counts.restore(deltas)  # keep the counts and rows for the next flush
            with self._lock:
                for ident, item in pending.items():
                    if len(self._pending) < T.MAX_PENDING:
                        self._pending.setdefault(ident, item)
                for ident in dropped:
                    if len(self._dropped) < T.MAX_PENDING:
                        self._dropped.add(ident)
