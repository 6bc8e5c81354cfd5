"""The shared tier's write-behind queue: a local put is sent to the backend by a thread, never by
the compile that made it.

Bounded (:data:`QUEUE_ITEMS` entries and :data:`QUEUE_BYTES`, or one entry of
``KCACHE_REMOTE_MAX_ENTRY``): what does not fit is dropped and counted (``remote_dropped``),
never waited for. Batches of at most :data:`BATCH_ITEMS` and :data:`BATCH_BYTES` go to the backend
grouped by node (one call per node: a failing node holds up only its own), each within
:data:`WRITE_TIMEOUT_MIN_S` plus the transfer time of its bytes. At exit (and close) the thread
gets :data:`EXIT_FLUSH_S` (or room for two writes by their deadline, when longer) to empty it.
The thread is a daemon of the process that made it: a forked child makes its own.

The same thread runs the backend's upkeep (:meth:`.backend.Backend.upkeep`: S3's credentials
refreshed ahead of their expiry), the work no call may do on its caller's thread: started at the
tier's open for a backend that wants it (:meth:`Writer.start_upkeep`), not for any other (one
thread, and none where nothing needs it). A write waits while an upkeep runs (a refresh that
hangs holds up the queue, bounded and dropped as always, never a compile).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import TYPE_CHECKING

from ...boundary import failed
from .backend import Answered, Full, Op, Unavailable
from .bounded import bounded
from .entry import pack_entry

if TYPE_CHECKING:
    from ..records import Record
    from .core import Core

QUEUE_ITEMS = 1024  # entries waiting for the writer, at most
QUEUE_BYTES = 64 << 20  # and their bytes, at most (or one entry of KCACHE_REMOTE_MAX_ENTRY)
BATCH_ITEMS, BATCH_BYTES = 64, 8 << 20  # one call
EXIT_FLUSH_S = 2.0  # at exit (and close), the writer gets this long to empty its queue, at least
WRITE_TIMEOUT_MIN_S = 1.0  # a write's deadline, at least (plus its bytes' transfer time)


class Item:
    """One thing to write: ``put`` an entry (then release ``release``), ``release`` a lease,
    or ``bad``: delete an entry (if still at ``version``)."""

    __slots__ = ("op", "kind", "ident", "release", "rec", "blobs", "version", "size")

    def __init__(
        self,
        op: str,
        kind: str,
        ident: str,
        *,
        release: bytes | None = None,
        rec: Record | None = None,
        blobs: dict[str, bytes] | None = None,
        version: str | None = None,
    ) -> None:
        self.op, self.kind, self.ident, self.release = op, kind, ident, release
        self.rec, self.blobs, self.version = rec, blobs, version
        self.size = rec.size if rec is not None else 0


class Writer:
    """The queue and thread of one tier in one process (a fork makes a new one)."""

    def __init__(self, tier: Core) -> None:
        self.tier = tier
        self._cond = threading.Condition(threading.Lock())
        self._queue: collections.deque[Item] = collections.deque()
        self._queued_bytes = 0
        self._busy = False
        self._thread: threading.Thread | None = None
        self._closing = False
        self._upkeep_at: float | None = None  # (time.monotonic) when the backend's upkeep is due

    # ------------------------------------------------------------------ queueing
    def enqueue_put(self, rec: Record, blobs: dict[str, bytes], release: bytes | None) -> None:
        self._enqueue(Item("put", rec.kind, rec.id, release=release, rec=rec, blobs=blobs))

    def enqueue_release(self, kind: str, ident: str, release: bytes) -> None:
        self._enqueue(Item("release", kind, ident, release=release))

    def enqueue_delete(self, kind: str, ident: str, version: str | None) -> None:
        self._enqueue(Item("bad", kind, ident, version=version))

    def _enqueue(self, item: Item) -> None:
        counts = self.tier.counts
        with self._cond:
            if self._closing:
                if item.op == "put":
                    counts.add(item.kind, remote_dropped=1)
                return
            bound = max(QUEUE_BYTES, self.tier.cfg.max_entry)
            if item.op == "put" and (
                len(self._queue) >= QUEUE_ITEMS or self._queued_bytes + item.size > bound
            ):
                counts.add(item.kind, remote_dropped=1)
                if not item.release:
                    return
                item = Item("release", item.kind, item.ident, release=item.release)  # still let go
            self._queue.append(item)
            self._queued_bytes += item.size
            self._start()
            self._cond.notify()

    def start_upkeep(self) -> None:
        """Run the backend's upkeep in this thread, at once and then when it asks (started now)."""
        with self._cond:
            if self._closing:
                return
            self._upkeep_at = time.monotonic()
            self._start()
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kcache-remote", daemon=True)
            self._thread.start()

    def _take_batch(self) -> list[Item] | None:
        """The next batch; [] when the upkeep is due first; None when closing."""
        with self._cond:
            while not self._queue and not self._closing:
                at = self._upkeep_at
                if at is None:
                    self._cond.wait()
                elif at <= time.monotonic():
                    return []
                else:
                    self._cond.wait(at - time.monotonic())
            if not self._queue:
                return None
            batch: list[Item] = []
            size = 0
            while self._queue and len(batch) < BATCH_ITEMS and (not batch or size < BATCH_BYTES):
                item = self._queue.popleft()
                self._queued_bytes -= item.size
                size += item.size
                batch.append(item)
            self._busy = True
            return batch

    def _run(self) -> None:
        pid = os.getpid()
        while os.getpid() == pid:
            self._upkeep()
            batch = self._take_batch()
            if batch is None:
                return
            if not batch:
                continue  # the upkeep is due
            try:
                self._write(batch)
            # broad: the thread's edge. A backend's own failures are the tier's misses (see
            # SharedTier._call); what is left is a bug: raised under KCACHE_STRICT=1, else one
            # warning, and the thread goes on with the next batch.
            except Exception as e:
                failed("remote-writer", "kcache's shared tier writer", e, then="the batch is dropped")
            finally:
                for it in batch:
                    if it.release:
                        self.tier.keeper.forget(it.ident)
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _upkeep(self) -> None:
        at = self._upkeep_at
        if at is None or at > time.monotonic():
            return
        then: float | None = None
        try:
            then = self.tier.backend.upkeep()
        # broad: the thread's edge, as for a batch (a backend's upkeep never raises what it
        # expects): a bug is raised under KCACHE_STRICT=1, else one warning, and no more upkeep
        except Exception as e:
            failed("remote-upkeep", "kcache's shared tier upkeep", e, then="no more upkeep")
        with self._cond:
            self._upkeep_at = None if then is None else time.monotonic() + then

    # ------------------------------------------------------------------ writing
    def _write(self, batch: list[Item]) -> None:
        tier = self.tier
        if not tier.ready():
            for it in batch:
                if it.op == "put":
                    tier.counts.add(it.kind, remote_dropped=1)
            return
        for group in tier.backend.split(batch, lambda it: it.ident, writer=True):
            self._write_group(group)

    def _write_group(self, batch: list[Item]) -> None:
        tier, counts, cfg = self.tier, self.tier.counts, self.tier.cfg
        puts = [it for it in batch if it.op == "put"]
        breaker = tier.admit(batch[0].ident, writer=True)
        if breaker is None:
            for it in puts:
                counts.add(it.kind, remote_dropped=1)
            return  # leases: they expire on their own
        ops: list[Op] = []
        plan: list[tuple[Item, int]] = []  # the item and bytes of each op
        nbytes = 0
        for it in batch:
            if it.op == "bad":
                ops.append(Op("delete", it.kind, it.ident, version=it.version))
                plan.append((it, 0))
            elif it.op == "put" and it.rec is not None and it.blobs is not None:
                value = pack_entry(it.rec.encode(), it.blobs, cfg.secret)
                if len(value) > cfg.value_limit:  # nobody would read it
                    counts.add(it.kind, remote_too_large=1)
                    if it.release:
                        ops.append(Op("release", it.kind, it.ident, release=it.release))
                        plan.append((it, 0))
                    continue
                nbytes += len(value)
                ops.append(Op("put", it.kind, it.ident, value=value, release=it.release))
                plan.append((it, len(value)))
            elif it.release:
                ops.append(Op("release", it.kind, it.ident, release=it.release))
                plan.append((it, 0))
        if not ops:
            return
        try:
            with bounded(tier.transfer_s(nbytes, WRITE_TIMEOUT_MIN_S), 64 << 10):
                outcomes = tier.backend.write(ops)
        except (Unavailable, Full, Answered, OSError) as e:
            if puts:
                for it in puts[1:]:  # an error per entry, one failure for the breaker
                    counts.add(it.kind, remote_errors=1)
                tier.failed(puts[0].kind, e, breaker=breaker)
            else:
                tier.failed("", e, n=0, breaker=breaker)  # only releases: their expiry ends them
            return
        failure: BaseException | None = None
        for (it, n), op, out in zip(plan, ops, outcomes):
            if isinstance(out, BaseException):
                if isinstance(out, Full):
                    tier.failed("", out, n=0, breaker=breaker)
                elif not isinstance(out, Answered):
                    failure = out
                if op.op == "put":
                    counts.add(it.kind, remote_errors=1)
                continue
            if op.op == "put" and out:
                counts.add(it.kind, remote_puts=1, remote_bytes_out=n)
            elif op.op == "delete" and out:
                counts.add(it.kind, remote_marked_bad=1)
        if failure is not None:
            tier.failed("", failure, n=0, breaker=breaker)  # counted per entry above
        else:
            breaker.ok()

    # ------------------------------------------------------------------ flushing
    def exit_flush_s(self) -> float:
        """How long close (at exit) waits: :data:`EXIT_FLUSH_S`, or room for two writes by their
        own deadline where ``KCACHE_REMOTE_TIMEOUT`` makes one longer than a second (a write
        begun just before exit, then the last one; else a slow link set with a longer deadline
        drops what was compiled last)."""
        return max(EXIT_FLUSH_S, 2 * self.tier.transfer_s(0, WRITE_TIMEOUT_MIN_S))

    def flush(self, timeout: float) -> bool:
        """Wait until the queue is written (at most ``timeout`` s); True when it is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return not (self._queue or self._busy)
                self._cond.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """Stop: what is left is dropped and counted."""
        with self._cond:
            self._closing = True
            for it in self._queue:
                if it.op == "put":
                    self.tier.counts.add(it.kind, remote_dropped=1)
            self._queue.clear()
            self._queued_bytes = 0
            self._cond.notify_all()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread
