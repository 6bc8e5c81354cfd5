"""The store's faces: what each kind of caller may use, declared.

Three callers, three faces (as JAX's ``CacheInterface`` and sccache's ``Storage`` are each one
small declared interface; here ``typing.Protocol``, checked by the type checker and, where a test
wants it, at run time):

- :class:`Cache`: what integrations use (Triton, nvFuser, torch.compile, the machine-local memos,
  prewarm): look up, keep, replace, forget and quarantine entries, single flight, a lock for a
  read-modify-write, a listing of keys, a scratch folder, counters.
- :class:`Admin`: what maintenance commands and bundles use: walk, read and remove entries by id,
  the catalogue (the index), the bound, clean-up.
- :class:`Tier`: what a tier behind the local store offers the composed cache (the shared
  tier over Redis, a Redis Cluster, S3, a user's backend): get a checked entry, put one, drop a
  bad one, single flight. A tier never calls back into the store: the composed cache commits
  what it returns (the backfill).

``kcache.store.Store`` (the composed cache: the local disk first, then the tiers) implements
:class:`Cache` and :class:`Admin`; code outside the store is typed against the face it uses, so
that a change inside the store stops at its edge.

Failure contract, one rule at every level. What the store expects of the world (a full,
read-only or vanished disk, a corrupt or foreign entry, a locked or corrupt index: the
exceptions of :data:`kcache.store.errors.EXPECTED`; a shared tier that does not answer) is never
raised to a caller: :class:`Cache` and :class:`Admin` methods miss or skip, count it and warn
once. Anything else is a bug: it propagates to the library-facing edge
(:mod:`kcache.boundary`), which fails open, or raises under ``KCACHE_STRICT=1``; where the store
must go on instead (its flush thread, a close, eviction after a put), the catch sorts what it met
by the boundary's rule (:func:`kcache.store.errors.expected`): an expected failure is the miss it
is, a bug is raised under ``KCACHE_STRICT=1`` and otherwise warned once and counted as an error.
A :class:`Tier` returns None for a miss and counts its own failures; for a failure it may raise
only the tier machinery's typed "unavailable" error
(:class:`kcache.store.tiers.backend.Unavailable`), which the
composed cache counts as a miss. Anything else a tier raises is a bug, by the same rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

if TYPE_CHECKING:
    from .hit import Hit
    from .index import Index
    from .leases import Ticket
    from .records import Record

#: Key components for ``kcache explain``: a mapping, or a function that gives one (called only
#: on a miss, so a hit never pays for them).
Components = Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None
#: Member name -> its bytes, or the path of a file holding them.
Files = Mapping[str, Union[bytes, str, "os.PathLike[str]"]]
#: A checked entry from a tier: its record and every member's bytes.
Entry = tuple["Record", dict[str, bytes]]


class Tier:
    """A tier behind the local store (:mod:`kcache.store.tiers`: the shared tier's machinery over
    a backend). The defaults make a tier without leases, without a client to warm up and
    without remote deletes: only :meth:`fetch_entry`, :meth:`publish` and :meth:`close` must be
    given. A tier counts its own failures (``remote_*``, one warning) and returns a miss; it may
    instead raise :class:`~kcache.store.tiers.backend.Unavailable`, which the composed cache
    counts as a miss. Anything else it raises is a bug."""

    def fetch_entry(self, kind: str, key: str, ident: str) -> Entry | None:
        """The entry for ``ident``, checked (signature, record, every member's checksum), or
        None when the tier lacks it, refuses it or fails."""
        raise NotImplementedError

    def publish(self, rec: Record, blobs: dict[str, bytes]) -> None:
        """Keep an entry committed locally (queued; never waits). Releases this process's lease
        on it once it is there."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush what is queued (bounded) and let go of connections and threads."""
        raise NotImplementedError

    def flight(self, kind: str, key: str, ident: str) -> Entry | None:
        """Single flight across machines (this machine's lock held, the entry in no tier): the
        entry another machine made while this one waited on its lease, or None: make it here,
        holding the lease when it could be taken. Default: no leases, make it here."""
        return None

    def unlock(self, ident: str) -> None:
        """Let go of this process's lease on ``ident`` (a make that failed)."""

    def mark_bad(self, kind: str, ident: str) -> bool:
        """Drop an entry whose use raised, if it is still the one this process was served."""
        return False

    def warm_up(self) -> None:
        """Get ready for lookups now (import the client library): a store that holds nothing."""


class Flight(Protocol):
    """One process's turn at an entry in single flight (:meth:`Cache.single_flight`)."""

    @property
    def hit(self) -> Hit | None:
        """The entry (found at once, or made by another process or machine while this one
        waited); None: this process makes it, holding the locks until :meth:`release` or the
        put."""

    def release(self) -> None:
        """Let go of the locks (a make that failed; idempotent)."""

    def __enter__(self) -> Hit | None: ...

    def __exit__(self, *exc: object) -> None: ...


class Held(Protocol):
    """A lock this process holds (:meth:`Cache.lock`)."""

    def release(self) -> None: ...


class Cache(Protocol):
    """What integrations use (each keeps the cache it is given in a ``CacheSlot[Cache]``)."""

    @property
    def root(self) -> Path:
        """The store's folder (for messages: never opened by name)."""

    @property
    def readonly(self) -> bool: ...

    @property
    def trust_host_code(self) -> bool:
        """False for a store used only because ``KCACHE_ALLOW_INSECURE=1``: no host code or pickle
        is taken from it or put into it."""

    @property
    def closed(self) -> bool:
        """The store was closed (``kcache.disable()``, exit): an integration that kept it since
        its attach writes nothing more into it."""

    def get(
        self,
        kind: str,
        key: str,
        components: Components = None,
        *,
        count: bool = True,
        files: bool = False,
    ) -> Hit | None:
        """The verified entry for (kind, key), or None (counted; a corrupt entry is removed)."""

    def has(self, kind: str, key: str) -> bool:
        """Whether this machine's store holds an entry for (kind, key) (its record read and
        checked, not its members; no tier asked, nothing counted): Inductor keeps an AOTAutograd
        entry only with the FX graphs it names."""

    def put(
        self,
        kind: str,
        key: str,
        files: Files,
        *,
        components: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        compile_s: float = 0.0,
    ) -> Hit | None:
        """Keep ``files`` as one entry (first writer wins); the committed entry, or None."""

    def replace(self, kind: str, key: str, files: Files, **kwargs: Any) -> Hit | None:
        """Like :meth:`put`, the old entry removed first (last writer wins)."""

    def forget(self, kind: str, key: str) -> None:
        """Remove the entry for (kind, key) (the library could not use it)."""

    def quarantine(self, rec: Record, why: str) -> None:
        """Take the entry ``rec`` (a hit) out of service: the library could not use it (removed
        here and from the shared tiers, never served to this process again)."""

    def single_flight(
        self,
        kind: str,
        key: str,
        components: Components = None,
        *,
        files: bool = False,
        owner: object = None,
    ) -> Flight:
        """Look (kind, key) up; on a miss, one process of this machine (and one machine of those
        sharing a tier) makes it while the others wait for it. ``with cache.single_flight(kind,
        key) as hit:`` (or the flight's ``hit`` and ``release()``): the entry, found or made by
        another while this one waited; else None, and this process makes it, holding the locks
        until the put or the release. ``owner``: the maker (Triton's cache manager): a thread
        makes one entry at a time, so its flights of another owner are failed makes, released."""

    def lock(self, kind: str, key: str, timeout: float) -> Held | None:
        """The cross-process lock for (kind, key), held: a read-modify-write of one entry (a
        manifest that grows). None after ``timeout`` seconds or on a read-only store."""

    def keys(self, kind: str, prefix: str = "") -> list[str]:
        """The keys of the entries of ``kind`` that start with ``prefix``, newest first, as the
        store's catalogue lists them: a fallback listing (best effort: an entry is listed about
        a second after its put; a catalogue that cannot be read lists nothing)."""

    def scratch_dir(self) -> str:
        """A private folder of this process for files on their way into the store (``OSError``
        when it cannot be made)."""

    def scratch_stage(self) -> tuple[str, Ticket]:
        """A new private folder of this process for one compile's files on their way into the
        store, and the ticket that keeps it (:mod:`kcache.store.leases`): the paths handed out
        from it must hold the ticket (``hold_paths``); once none lives, the folder is removed,
        never in the collector's callback (``OSError`` when it cannot be made)."""

    def count(self, kind: str, **deltas: float) -> None:
        """Add to the counters of ``kind`` (``kcache stats``)."""


class Admin(Protocol):
    """What maintenance commands and bundles use."""

    @property
    def root(self) -> Path: ...

    @property
    def index_dir(self) -> Path: ...

    max_size: int

    @property
    def key_tag(self) -> str: ...

    @property
    def readonly(self) -> bool: ...

    def entry_id(self, kind: str, key: str) -> str: ...

    def entry_dir(self, ident: str) -> str:
        """The entry's folder, by name: for reports only (never opened by name)."""

    def iter_entry_ids(self) -> Iterator[str]: ...

    def scan(self) -> Iterator[tuple[str, str, str | None]]:
        """Every entry folder and stray: (shard, name, problem or None)."""

    def read_any(self, ident: str, full: bool = False) -> tuple[Hit | None, str | None]: ...

    def read_record(self, ident: str) -> tuple[Record | None, str | None]: ...

    def record_mtime(self, ident: str) -> float | None: ...

    def entry_extras(self, ident: str, rec: Record) -> list[str]: ...

    def remove(self, ids: list[str], *, index: bool = True) -> int: ...

    def remove_stray(self, shard: str, name: str = "", member: str = "") -> bool: ...

    def index(self) -> Index: ...

    def index_readonly(self) -> Index: ...

    def rebuild_index(self) -> Index: ...

    def evict(self, target: int | None = None) -> tuple[int, int]: ...

    def clean_tmp(self, min_age: float = ...) -> int: ...

    def now(self) -> float: ...

    def close(self) -> None: ...
