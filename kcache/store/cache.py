"""The composed cache: the local disk first, then the shared tiers; what integrations talk to.

:class:`TieredCache` (public as ``kcache.store.Store``) holds the tiers in order, as sccache's
``MultiLevelStorage`` does, and owns, in one place:

- **the lookup**: the disk tier (:mod:`.disk`); on a miss, each shared tier in turn
  (:mod:`.tiers`); an entry found there (checked by its tier: signature, record, every member's
  checksum) is committed to the disk tier (the backfill) and served like a local hit, so the
  next lookup on this machine is local. A tier never calls back into the cache.
- **the write**: the disk tier commits; each shared tier is handed the committed entry (queued:
  the caller never waits).
- **the counts**: hits, misses, puts, waits, backfills, per kind (``kcache stats``), and the
  miss log (``kcache explain``).
- **single flight** (:meth:`single_flight`): a process that misses takes the entry's lock in
  ``locks/`` (an flock: the kernel drops it when its holder dies) and, with a shared tier, the
  entry's lease there; processes and machines that miss on the same entry meanwhile wait for it
  instead of making it too (bounded: :data:`LOCK_TIMEOUT_S` here, the tier's own bounds there).
- **quarantine** (:meth:`quarantine`): an entry whose use raised is removed here and dropped from
  the shared tiers, counted, and never served to this process again.

It implements the :class:`~.api.Cache` face (integrations) and the :class:`~.api.Admin` face
(maintenance, bundles): the latter is the disk tier's, passed through (:mod:`.admin`).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..log import logger, warn_once
from . import counting, forks
from . import quarantine as _quarantine
from .admin import DiskAdmin
from .api import Components, Files, Tier
from .disk import DiskTier
from .errors import EXPECTED, tolerated, warn_failed
from .hit import Hit
from .leases import Ticket
from .locks import Lock
from .records import Record
from .tiers.backend import Unavailable

#: How long a process waits for another process of this machine making the same entry.
LOCK_TIMEOUT_S = 120.0


class Flight:
    """One process's turn at an entry in single flight (see :meth:`TieredCache.single_flight`).

    ``hit``: the entry, found at once or made by another process or machine while this one
    waited; None: this process makes it, holding the locks (``held``) until :meth:`release` (a
    put of the entry releases the shared tier's lease on its own, once the entry is there)."""

    __slots__ = ("cache", "kind", "key", "hit", "_lock", "_pid", "owner", "thread", "__weakref__")

    def __init__(self, cache: TieredCache, kind: str, key: str, hit: Hit | None, lock: Lock | None = None):
        self.cache, self.kind, self.key, self.hit = cache, kind, key, hit
        self._lock = lock
        self._pid = os.getpid()
        self.owner: int = 0
        self.thread: int = 0

    @property
    def held(self) -> bool:
        """This process holds the entry's local lock (it makes the entry; the others wait)."""
        return self._lock is not None

    def release(self) -> None:
        """Let go of the locks (idempotent; a forked child never releases its parent's)."""
        lk, self._lock = self._lock, None
        if lk is None or self._pid != os.getpid():
            return
        self.cache._flight_done(self)
        for tier in self.cache.tiers:  # the shared tier's lease, if held and not handed on
            try:
                tier.unlock(self.cache.entry_id(self.kind, self.key))
            except Unavailable as e:  # a tier's lease ends by its own expiry anyway
                logger.debug("shared tier unlock: %s", e)
        try:
            lk.release()
        except OSError as e:
            logger.debug("lock release: %s", e)

    def __enter__(self) -> Hit | None:
        return self.hit

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # a make that raised and dropped its flight: let the waiters go
        try:
            self.release()
        except Exception:  # broad: a finaliser must not raise (interpreter shutdown)
            pass


class TieredCache(DiskAdmin):
    """The disk tier, then the shared tiers (see the module doc). Construct with :meth:`open`
    or :meth:`from_settings`."""

    def __init__(self, disk: DiskTier) -> None:
        self.disk = disk
        self.counts = disk.counts
        self.tiers: list[Tier] = []  # in order (the shared tier: Redis, a cluster, S3, ...)
        self._tier_settings: Any = None  # what attach_remote was given; the tier is made on first need
        self.recache = False  # KCACHE_RECACHE=1: counted lookups miss, puts replace (see get, put)
        self._lock = threading.Lock()
        # Flights this process holds: (kind, key) -> Flight (see single_flight).
        self._flights: dict[tuple[str, str], Flight] = {}
        forks.register(self)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, root: Path | str, **kwargs: Any) -> TieredCache:
        """The store at ``root``, checked and pinned (see :meth:`DiskTier.open` for the
        arguments and what is refused, with :class:`StoreError`)."""
        cache = cls(DiskTier.open(root, **kwargs))
        atexit.register(cache.close)  # after the disk tier's: runs first (tiers flush, then the disk)
        return cache

    @classmethod
    def from_settings(
        cls,
        settings: Any,
        *,
        write: bool = True,
        create: bool = True,
        remote: bool | None = None,
        **kwargs: Any,
    ) -> TieredCache:
        """The store named by :class:`kcache.config.Settings` (read-only unless ``write``).

        ``remote``: attach the shared tier of the settings (``KCACHE_REMOTE``); by default only
        to a program's own store (the one :func:`kcache.active_store` opens, with
        ``drain_global``), never to a maintenance command's."""
        cache = cls.open(
            settings.dir,
            # a bound from the environment or an argument wins over the store's kcache.conf
            max_size=None
            if (getattr(settings, "sources", None) or {}).get("max_size") == "default"
            else settings.max_size,
            readonly=settings.readonly or not write,
            key_tag=settings.key_tag,
            allow_insecure=settings.allow_insecure,
            create=create,
            **kwargs,
        )
        # KCACHE_RECACHE: a program's store only (drain_global); commands and imports never recache
        cache.recache = bool(getattr(settings, "recache", False)) and bool(kwargs.get("drain_global", False))
        if (kwargs.get("drain_global", False) if remote is None else remote) and (
            getattr(settings, "remote", None) or getattr(settings, "remote_problems", None)
        ):
            cache.attach_remote(settings)  # a bad shared-tier setting: one warning, tier off
        return cache

    def attach_remote(self, settings: Any) -> bool:
        """Use the shared tier named by ``settings`` (:class:`kcache.config.Settings`) from now
        on. A bad shared-tier setting warns once and leaves the tier off (local caching goes
        on). Returns True when attached. The tier (and its client library) is made at the first
        local miss or put, never on the hit path; for a store that holds nothing, now."""
        problems = list(getattr(settings, "remote_problems", None) or [])
        if problems:
            warn_once("remote-settings", "the shared tier is off: " + "; ".join(problems))
            return False
        from .tiers import tier_for

        tier = tier_for(settings, self.disk.key_tag, self.counts)
        self.tiers = [] if tier is None else [tier]
        if tier is not None and not self.readonly and self._holds_nothing():
            # A store that holds nothing misses on whatever it is asked, and every miss asks the
            # shared tier: import its client now, as part of the start, not at the first miss
            # (0.1 s of CPU; 8 fresh processes on 2 cores: seconds of the first compile's time).
            tier.warm_up()
        return tier is not None

    def _holds_nothing(self) -> bool:
        fd = self.disk.folders.fd("entries")
        try:
            return fd is not None and not os.listdir(fd)
        except OSError:
            return False

    def close(self) -> None:
        """Let go of the single flights this process still holds (their waiters compile, as
        after a crash), flush what is queued for the tiers (within their bounds), then close the
        disk tier. Idempotent."""
        with self._lock:
            held = list(self._flights.values())
        for flight in held:  # (a release sorts what it expects: what is left is a bug, reported)
            with tolerated("close", "kcache's release of a single flight at close", then="closing goes on"):
                flight.release()
        for tier in self.tiers:
            try:
                tier.close()
            except Unavailable as e:  # closing goes on
                logger.debug("shared tier close: %s", e)
        self.disk.close()

    # ------------------------------------------------------------------ forks
    def fork_locks(self) -> list[Any]:
        return [self._lock, self.counts._lock]

    def after_fork_child(self, keep: list[Any]) -> None:
        # What the parent has yet to write is the parent's to write: counted once, not twice.
        self.counts.after_fork()
        self._lock = threading.Lock()
        # The child shares its parent's open lock files: releasing them would unlock the parent's.
        self._flights = {}

    # ------------------------------------------------------------------ the Cache face
    @property
    def readonly(self) -> bool:
        return self.disk.readonly

    @property
    def trust_host_code(self) -> bool:
        return self.disk.trust_host_code

    @property
    def root(self) -> Path:
        return self.disk.root

    def count(self, kind: str, **deltas: float) -> None:
        self.counts.add(kind, **deltas)

    def entry_id(self, kind: str, key: str) -> str:
        return self.disk.entry_id(kind, key)

    def get(
        self,
        kind: str,
        key: str,
        components: Components = None,
        *,
        count: bool = True,
        remote: bool = True,
        files: bool = False,
    ) -> Hit | None:
        """The verified entry for (kind, key), or None. Never raises for a failure of the store.

        A hit is counted (with ``count``) and its last use noted for the next batched index
        write. A miss is counted and, with ``components`` (or a callable that gives them),
        remembered for ``kcache explain``. With shared tiers (and ``remote``), a local miss asks
        them (see the module doc). ``files``: the caller will use :attr:`Hit.paths`; they are
        made now (a hit whose files cannot be made is a miss). With :attr:`recache`, a counted
        lookup misses whatever is stored (counted ``recached``): the caller's put overwrites."""
        if count and self.recache:
            self._count_miss(kind, key, components, recached=1)
            return None
        hit = self._lookup(kind, key, touch=count and self.disk.hits_are_use, remote=remote, files=files)
        if count:
            if hit is not None:
                self._count_hit(hit)
            else:
                self._count_miss(kind, key, components)
        return hit

    def has(self, kind: str, key: str) -> bool:
        """Whether this machine's store holds an entry for (kind, key): its record read and
        checked, not its members; no tier asked, nothing counted. Never raises for a failure of
        the store (an unreadable record: False)."""
        rec, _why = self.disk.read_record(self.entry_id(kind, key))
        return rec is not None

    def keys(self, kind: str, prefix: str = "") -> list[str]:
        """The keys of ``kind``'s entries that start with ``prefix``, newest first, as the
        catalogue lists them (see :meth:`Catalogue.keys`). Never raises for a failure of the store."""
        return self.disk.catalogue.keys(kind, prefix)

    def _lookup(self, kind: str, key: str, *, touch: bool, remote: bool, files: bool) -> Hit | None:
        hit = self.disk.get(kind, key, touch=touch, files=files)
        if hit is not None and _quarantine.is_bad(hit.record):
            hit = None  # taken out of service in this process (a read-only store keeps it)
        if hit is None and remote and self.tiers:
            hit = self._from_tiers(kind, key, files)
        return hit

    # A lookup's counts (hits, misses, saved time, prewarm's checks): kcache/store/counting.py
    _count_hit = counting.count_hit
    _count_miss = counting.count_miss

    def _from_tiers(self, kind: str, key: str, files: bool) -> Hit | None:
        """A local miss asks each shared tier in turn; an entry found is backfilled."""
        ident = self.entry_id(kind, key)
        for tier in self.tiers:
            try:
                got = tier.fetch_entry(kind, key, ident)
            except Unavailable as e:  # a tier's failure is a miss (it counts its own)
                warn_once("remote-get", f"shared tier lookup failed ({e}); compiling instead")
                continue
            if got is not None:
                return self._backfill(got, files)
        return None

    def _backfill(self, got: tuple[Record, dict[str, bytes]], files: bool) -> Hit | None:
        """Commit an entry a shared tier gave to the disk tier, and serve it from there (a
        read-only or full disk: from memory, its files private copies)."""
        rec, blobs = got
        hit, committed = self.disk.put(
            rec.kind, rec.key, blobs, components=rec.components, summary=rec.summary, compile_s=rec.compile_s
        )
        if committed:
            self.counts.add(rec.kind, remote_fills=1)
        if hit is None:
            hit = Hit(rec, blobs, self.disk.served, self.disk.now())
        if files:
            try:
                _ = hit.paths
            except OSError as e:
                warn_once("serve", f"cannot make the files of a cached kernel ({e}); compiling instead")
                return None
        return hit

    def put(
        self,
        kind: str,
        key: str,
        files: Files,
        *,
        components: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        compile_s: float = 0.0,
        protect_s: float = 0.0,
    ) -> Hit | None:
        """Store ``files`` (name -> bytes, or the path of a file to link or copy) as one entry.

        Returns the committed entry (this writer's, or an identical one that another writer
        committed first: entries are immutable, first writer wins), or None if it could not be
        written (read-only, full, broken: one warning). Never raises for a failure of the store.
        ``protect_s``: see :meth:`DiskTier.put`. Each shared tier is handed the committed entry
        (queued: the caller does not wait). With :attr:`recache`, it replaces the entry there."""
        if self.recache and not self.readonly:
            self.disk.replace_folder(kind, key)
        hit, committed = self.disk.put(
            kind, key, files, components=components, summary=summary, compile_s=compile_s, protect_s=protect_s
        )
        if committed and hit is not None:
            self.counts.add(kind, puts=1)
            for tier in self.tiers:
                try:
                    tier.publish(hit.record, hit.blobs)
                except Unavailable as e:  # publishing is best effort (the tier counts drops)
                    logger.debug("shared tier publish: %s", e)
        return hit

    def replace(self, kind: str, key: str, files: Files, **kwargs: Any) -> Hit | None:
        """Like :meth:`put`, but an existing entry for (kind, key) is removed first (a manifest
        that grows). Readers see the old entry, then none, then the new one; never a mix."""
        if self.readonly:
            return None
        self.disk.replace_folder(kind, key)
        return self.put(kind, key, files, **kwargs)

    def forget(self, kind: str, key: str) -> None:
        """Remove the entry for (kind, key) here (the library could not use it). Never raises."""
        if self.readonly:
            return
        try:
            self.disk.remove([self.entry_id(kind, key)])
        except EXPECTED as e:  # forgetting is best effort, the caller redoes the work
            logger.debug("could not remove %s %s: %s", kind, key, e)

    def quarantine(self, rec: Record, why: str) -> None:
        """Take the entry ``rec`` out of service: its use raised (see :mod:`.quarantine`)."""
        _quarantine.remember(rec, why)
        try:
            self.counts.add(rec.kind, quarantined=1)
            if not self.readonly:
                current, _why = self.disk.read_record(rec.id)
                if current is not None and current.files == rec.files:
                    self.disk.remove([rec.id])
            for tier in self.tiers:
                tier.mark_bad(rec.kind, rec.id)  # (queued: never raises)
        except EXPECTED as e:  # best effort: the caller compiles either way
            logger.debug("quarantine of %s: %s", rec.id, e)

    def scratch_dir(self) -> str:
        return self.disk.scratch_dir()

    def scratch_stage(self) -> tuple[str, Ticket]:
        return self.disk.scratch_stage()

    # ------------------------------------------------------------------ single flight
    def single_flight(
        self,
        kind: str,
        key: str,
        components: Components = None,
        *,
        files: bool = False,
        owner: object = None,
    ) -> Flight:
        """Look (kind, key) up; on a miss, make sure one process of this machine, and one
        machine of those sharing a tier, makes it while the others wait for it.

        Returns a :class:`Flight`: its ``hit`` when the entry was found, at once or after
        waiting (counted as a hit, and as ``waited``); else ``hit`` is None (counted as a miss)
        and, when ``held``, this process holds the entry's lock until :meth:`Flight.release` or
        the put: the others wait for it (at most :data:`LOCK_TIMEOUT_S`; a holder that dies
        releases the lock with its process).

        A process never waits for an entry it is making itself (another thread's flight: it makes
        it again, without the lock). ``owner`` (Triton's cache manager): a thread makes one entry
        at a time, so this thread's flights of another owner that were never released are failed
        makes, released now."""
        if self.recache:  # KCACHE_RECACHE: compile, whatever is stored (see get); no waiting
            self._count_miss(kind, key, components, recached=1)
            return Flight(self, kind, key, None)
        hit = self._lookup(kind, key, touch=self.disk.hits_are_use, remote=True, files=files)
        if hit is not None:
            self._count_hit(hit)
            return Flight(self, kind, key, hit)
        me = threading.get_ident()
        with self._lock:
            stale = [
                f
                for f in self._flights.values()
                if owner is not None and f.thread == me and f.owner != id(owner)
            ]
            busy = (kind, key) in self._flights and self._flights[(kind, key)] not in stale
        for f in stale:
            f.release()
        if busy:  # this process makes it already (or failed to): never wait on ourselves
            self._count_miss(kind, key, components)
            return Flight(self, kind, key, None)
        lk, hit = self._wait_for(kind, key, files)
        if lk is not None:
            with self._lock:
                raced = (
                    kind,
                    key,
                ) in self._flights  # another thread took it meanwhile (flock: per open file)
                flight = Flight(self, kind, key, None, None if raced else lk)
                if not raced:
                    flight.owner, flight.thread = id(owner) if owner is not None else 0, me
                    self._flights[(kind, key)] = flight
            if raced:
                lk.release()
            else:
                # Ours now: the entry may have been committed just before we got the lock, or be
                # made on another machine (its lease, in the shared tier).
                hit = self.disk.get(kind, key, files=files) or self._tiers_flight(kind, key, files)
                if hit is not None:
                    flight.release()
                    flight.hit = hit
        else:
            flight = Flight(self, kind, key, hit)
        if flight.hit is not None:
            self._count_hit(flight.hit, waited=1)
        else:
            self._count_miss(kind, key, components)
        return flight

    def _wait_for(self, kind: str, key: str, files: bool) -> tuple[Lock | None, Hit | None]:
        """(lock, None) once this process holds the entry's lock, (None, hit) as soon as another
        process has committed it, (None, None) on a read-only store, a lock error or after
        :data:`LOCK_TIMEOUT_S`. The wait polls both every few milliseconds: a waiter picks up a
        finished entry within ~10 ms."""
        lk = self.disk.lock_for(kind, key)
        if lk is None:
            return None, None
        found: list[Hit] = []

        def finished() -> bool:
            hit = self.disk.get(kind, key, files=files)  # the holder is on this machine
            if hit is not None:
                found.append(hit)
            return hit is not None

        try:
            if lk.acquire(LOCK_TIMEOUT_S, poll=finished):
                return lk, None
        except OSError as e:
            warn_failed(self.disk.root, e, None, "lock-error", f"cannot lock in {self.disk.locks}: {e}")
            return None, None
        if found:
            return None, found[0]
        warn_once(
            "lock-timeout",
            f"waited {LOCK_TIMEOUT_S:.0f}s for another process compiling the same kernel; compiling here",
        )
        return None, None

    def _tiers_flight(self, kind: str, key: str, files: bool) -> Hit | None:
        """Single flight across machines, with this machine's lock held and the entry in no tier:
        the entry another machine made while this one waited on its lease, or None (make it
        here, holding the lease when it could be taken)."""
        if self.readonly:
            return None
        ident = self.entry_id(kind, key)
        for tier in self.tiers:
            try:
                got = tier.flight(kind, key, ident)
            except Unavailable as e:  # a tier's failure means compiling here
                warn_once("remote-flight", f"shared tier lock failed ({e}); compiling")
                continue
            if got is not None:
                return self._backfill(got, files)
        return None

    def _flight_done(self, flight: Flight) -> None:
        with self._lock:
            if self._flights.get((flight.kind, flight.key)) is flight:
                del self._flights[(flight.kind, flight.key)]

    def lock(self, kind: str, key: str, timeout: float) -> Lock | None:
        """The cross-process lock for (kind, key), held (exclusive access for a read-modify-write,
        such as a manifest); None after ``timeout`` seconds, on a read-only store or when the lock
        cannot be taken (one warning). Release it with ``release()``. The kernel drops it when
        the holder dies."""
        lk = self.disk.lock_for(kind, key)
        if lk is None:
            return None
        try:
            if lk.acquire(timeout):
                return lk
            warn_once(
                "lock-timeout",
                f"waited {timeout:.0f}s for another process compiling the same kernel; compiling here",
            )
        except OSError as e:
            warn_failed(self.disk.root, e, None, "lock-error", f"cannot lock in {self.disk.locks}: {e}")
        return None
