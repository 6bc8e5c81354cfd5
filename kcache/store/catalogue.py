"""The store's catalogue: opening, filling and writing its index, and eviction.

A mixin of :class:`~kcache.store.local.Store` (it uses the store's descriptors and locks). The
index is never on a lookup's path: hits and puts only note what to write, and a daemon thread
(one per process) writes it at most once a second and evicts when the store is over its bound.
Every index operation holds ``_index_lock``: one SQLite connection serves the process, and a
transaction must not be shared between threads.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Container, Iterator
from typing import Any

from .. import counters as _counters
from ..log import logger, warn_once
from . import fs
from . import tunables as T
from .errors import StoreError
from .eviction import sweep
from .index import DB_NAME, Index, IndexTooNew, is_corrupt_db
from .records import Record

_OLD_INDEX_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")  # the diskcache index of kcache 0.1


_DB_FILES = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm")


def _unlink_db(ifd: int, *, strict: bool = False) -> None:
    """Delete the index's database files in the folder ``ifd`` (never what a link points to).
    ``strict``: only a missing file is ignored (a rebuild must not claim a new index that it
    could not make); else every failure is (best effort, on the way to a miss)."""
    for name in _DB_FILES:
        with contextlib.suppress(FileNotFoundError if strict else OSError):
            os.unlink(name, dir_fd=ifd)


class CatalogueMixin:
    """Index and eviction methods of :class:`~kcache.store.local.Store`."""

    def index(self) -> Index:
        """The index, opened on first use (read-only on a read-only store). Raises if it cannot
        be opened (callers catch). A new index (first use, an older kcache's index, one that was
        corrupt) is filled from the entry folders."""
        with self._index_lock:  # the fill below uses the connection: no other thread meanwhile
            with self._lock:
                if self._index is not None and self._index_pid == os.getpid():
                    return self._index
                self._index = None  # a forked child never uses its parent's connection
                ifd = self._fd("index")
                if self.readonly:
                    self._index = self._open_index_readonly(ifd)
                else:
                    if ifd is None:
                        raise StoreError("the store has no index folder")
                    self._index = self._open_index(ifd)
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
        ifd = self._fd("index")
        if ifd is None:
            raise StoreError("the store has no index folder")
        with self._index_lock, self._lock:
            if self._index is not None and self._index_pid == os.getpid():
                with contextlib.suppress(Exception):
                    self._index.close()
            self._index = None
            _unlink_db(ifd, strict=True)
        return self.index()

    def index_readonly(self) -> Index:
        """A new connection to the index that never writes, creates or checkpoints anything (it
        works on a full disk and while another process holds the index); close it when done."""
        return self._open_index_readonly(self._fd("index"))

    def _open_index_readonly(self, ifd: int | None) -> Index:
        if ifd is None:
            return Index.open_readonly(None)
        try:
            st = os.stat(DB_NAME, dir_fd=ifd, follow_symlinks=False)
        except FileNotFoundError:
            return Index.open_readonly(None)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{self.index_dir}/{DB_NAME} is not a regular file")
        try:
            os.stat(DB_NAME + "-wal", dir_fd=ifd, follow_symlinks=False)
            immutable = False
        except FileNotFoundError:
            immutable = True
        return Index.open_readonly(
            fs.fd_path(ifd, DB_NAME, fallback=str(self.index_dir)), immutable=immutable
        )

    def _open_index(self, ifd: int) -> Index:
        """Open (create) the writable index in the folder ``ifd``: what sits where the database
        goes must be a regular file of ours (else removed: SQLite would follow a link); a corrupt
        database is replaced; one of a newer kcache is left alone (:class:`IndexTooNew`)."""
        for name in _OLD_INDEX_FILES:  # kcache 0.1's diskcache index: superseded, rebuilt from entries
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=ifd)
        for name in _DB_FILES:
            try:
                st = os.stat(name, dir_fd=ifd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or (self._owners is not None and st.st_uid not in self._owners):
                # A link or someone else's file where the database goes: SQLite would follow or
                # write it. Remove it (only our folder's entry, never what it points to).
                warn_once("index-unsafe", f"{self.index_dir}/{name} is not a file of ours; removed")
                fs.rmtree_at(ifd, name)
        path = fs.fd_path(ifd, DB_NAME, fallback=str(self.index_dir))
        try:
            return Index.open(path, timeout=self.index_timeout)
        except Exception as e:
            if isinstance(e, IndexTooNew) or not is_corrupt_db(e):
                raise
            # A broken index is replaced, not fatal: entries are intact and self-describing.
            warn_once("index-corrupt", f"the index at {self.index_dir} is corrupt ({e}); starting a new one")
            _unlink_db(ifd)
            return Index.open(path, timeout=self.index_timeout)

    def _records_on_disk(self, skip: Container[str] = ()) -> Iterator[tuple[Record, float | None]]:
        """(record, its mtime: the entry's last use) of every intact entry whose id is not in
        ``skip``, read from the entry folders."""
        for ident in self.iter_entry_ids():
            if ident in skip:
                continue
            rec, _why = self.read_record(ident)
            if rec is not None:
                yield rec, self.record_mtime(ident)

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
        except Exception as e:
            # Said under the topic the index's other failures use: a full disk (ENOSPC, or
            # EFBIG that SQLite reports as an I/O error) is one warning, not one per step.
            topic = "disk-full" if "full" in str(e).lower() else f"index:{type(e).__name__}"
            warn_once(
                topic,
                f"could not fill the new index from the entries ({e}); `kcache verify --fix` does",
            )

    def _index_call(self, fn: Callable[[Index], Any]) -> Any:
        """``fn(index)``, or None when the index cannot be used now (never raises). One
        connection serves the process: threads take turns (``_index_lock``), so that one
        thread's transaction never swallows or rolls back another's."""
        if self.readonly or self._closed or time.monotonic() < self._index_off_until:
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
        except Exception as e:
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
            full = "full" in msg  # SQLITE_FULL: the disk is full, said once for the store
            warn_once(
                "disk-full" if full else f"index:{type(e).__name__}",
                f"the store's index is unavailable ({type(e).__name__}: {e}); continuing without it",
            )
            if is_corrupt_db(e):
                with self._index_lock, self._lock:
                    if self._index is not None and self._index_pid == os.getpid():
                        with contextlib.suppress(Exception):
                            self._index.close()
                    self._index = None
                    ifd = self._fd("index")
                    if ifd is not None:
                        _unlink_db(ifd)
                self._index_off_until = 0.0
            return None

    def _maybe_flush(self) -> None:
        """Have the batched index writes done soon, off the caller's path.

        A hit or miss only notes what to write; a daemon thread (one per process, started on
        first need, again in a forked child) writes it at most once a second. Opening the index
        and a SQLite transaction cost milliseconds: they must not land inside a kernel launch."""
        if self.readonly or self._closed:
            return
        if self._flusher_pid != os.getpid():
            with self._lock:
                if self._flusher_pid != os.getpid():
                    self._flusher_pid = os.getpid()
                    try:
                        t = threading.Thread(target=self._flush_loop, name="kcache-flush", daemon=True)
                        t.start()
                    except Exception as e:  # no threads left (a pids limit), or at shutdown
                        # Tried again at the next put or lookup; until then rows wait in memory
                        # (and are written at close).
                        self._flusher_pid = None
                        logger.debug("flush thread not started: %s", e)

    def _flush_loop(self) -> None:
        """The daemon thread: eviction when the store is past its bound (woken by the put that
        took it there), and batched index writes. Both are off the compiling threads' path (a
        put only notes its row)."""
        pid = os.getpid()
        while not self._closed and os.getpid() == pid:
            self._wake.wait(T.FLUSH_EVERY_S)
            self._wake.clear()
            if self._closed or os.getpid() != pid:
                return
            try:
                if self._evictor.due():
                    self._evictor.run()
                self.flush()
                if self._trash_left:
                    self.sweep_trash()
                if time.monotonic() >= self._next_reconcile:
                    self._next_reconcile = time.monotonic() + T.RECONCILE_CHECK_S
                    self.reconcile()
            except Exception:  # flush never raises; a thread must not die loudly either
                pass

    def reconcile(self, force: bool = False) -> int:
        """Add a row for each entry on disk that has none, and return how many were added.

        A put's row is written by the flush thread: a process killed, or ended by ``os._exit``
        (multiprocessing's workers), before it ran leaves entries the index does not know
        (stats would not see them). Done at most once per
        :data:`~.tunables.RECONCILE_EVERY_S` for the whole store (the time is kept in the
        index; ``force`` ignores it), by whichever process finds it due, which also counts the
        store's bytes again (the size count drifts when a process is killed between a commit
        and its count). Never raises."""
        now = self.now()

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

        known = self._index_call(due)
        if known is None:
            return 0
        batch: list[tuple[Record, float | None]] = []
        try:
            batch.extend(self._records_on_disk(skip=known))
        except Exception as e:
            logger.debug("reconcile: %s", e)
        if batch and self._index_call(lambda idx: idx.insert_many(batch) or True) is None:
            return 0
        if batch:
            logger.info("added %d index rows for entries written by processes that ended early", len(batch))
        try:
            self._evictor.recount()
        except Exception as e:
            logger.debug("recount: %s", e)
        return len(batch)

    def flush(self, force: bool = False) -> None:
        """Write batched last-use times, counters and misses to the index. Never raises."""
        with self._flush_lock:
            self._flush_locked(force)

    def _flush_locked(self, force: bool) -> None:
        if self.readonly or self._closed:
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
        self._refresh_clock()

        def write(idx: Index) -> bool:
            with idx.transaction():
                if dropped:  # evicted here; a put of the same entry since then keeps its row
                    idx.remove([i for i in dropped if self.record_mtime(i) is None])
                for rec, access in pending.values():
                    if self.record_mtime(rec.id) is not None:  # not removed since its put
                        idx.insert(rec, last_used=access)
                if deltas:
                    idx.add_counters(deltas)
                if touches:
                    for ident in idx.touch(touches):
                        # on disk but not in the index (a crash, a new index): add it; but not an
                        # entry removed since its hit (here or by another process' clear)
                        if ident in recs and self.record_mtime(ident) is not None:
                            idx.insert(recs[ident], last_used=touches[ident][0], hits=touches[ident][1])
                if misses:
                    idx.add_misses(misses)
            return True

        if not self._index_call(write):
            self.counts.restore(deltas)  # keep the counts and rows for the next flush
            with self._lock:
                for ident, item in pending.items():
                    if len(self._pending) < T.MAX_PENDING:
                        self._pending.setdefault(ident, item)
                for ident in dropped:
                    if len(self._dropped) < T.MAX_PENDING:
                        self._dropped.add(ident)

    # ------------------------------------------------------------------ eviction
    def sweep_trash(self, budget_s: float | None = None, *, closing: bool = False) -> None:
        """What removals left in ``trash/``: empty folders (evictions leave them for later), and,
        at most every :data:`~.tunables.HELD_SWEEP_S`, folders that a process held and no longer
        does. Never raises."""
        trfd = self._fd("trash")
        if trfd is None or self.readonly or (self._closed and not closing):
            return
        now = time.monotonic()
        held = now - self._trash_swept >= T.HELD_SWEEP_S
        if held:
            self._trash_swept = now
        try:
            sweep(trfd, T.FLUSH_EVERY_S / 2 if budget_s is None else budget_s, held=held)
            self._trash_left = bool(os.listdir(trfd))
        except OSError:
            pass

    def evict(self, target: int | None = None) -> tuple[int, int]:
        """Remove least recently used entries until the store holds at most ``target`` bytes
        (default 90% of the bound), then write the index (see :mod:`.eviction`). One process
        evicts at a time; this returns at once when another one does. Returns (entries, bytes).

        The store also evicts on its own: its flush thread as soon as a put passes the bound,
        and a put itself when the store is far past it."""
        if self.readonly or self._closed:
            return 0, 0
        out = self._evictor.run(target)
        self.flush(force=True)
        return out
