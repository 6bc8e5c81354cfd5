"""The local disk tier: one store folder, checked, pinned, bounded, catalogued.

Layout under the store root::

    KCACHE_STORE            marker (a kcache store; its schema)
    kcache.conf             the settings kept with the store (its size bound; see conf.py)
    entries/<id[:2]>/<id>/  one committed entry: its member files and ``__kcache__.rec``
    index/kcache.sqlite     the catalogue (see index.py); node-local on network filesystems
    tmp/                    entries being written, per-process scratch and served files
    trash/                  entries being deleted (renamed here first, then removed)
    locks/                  single-flight locks, one per entry id; evict.lock; usage; the clock

:class:`DiskTier` puts together the parts that each do one job and each get the pinned folders
(:class:`~.opening.Folders`), never the tier itself:

- :mod:`.opening`: the checks when opened, and the pinned descriptors every call goes through;
- :mod:`.entries`: the entry folder format (read and verify, write and commit, remove);
- :mod:`.served` and :mod:`.hit`: files handed to libraries, and hits remembered per process;
- :mod:`.catalogue`: the index and what waits to be written to it (a daemon thread);
- :mod:`.eviction`: the size bound, shared by every process of the store;
- :mod:`.housekeeping`: walking the folders, clean-up;
- :mod:`.clock`: the filesystem's time; :mod:`.forks`: what a ``fork()`` does to all of it.

Its own upkeep, off the callers' path (what every removal does, the flush thread's turn, trash/,
eviction, dead processes' folders), is :class:`~.upkeep.Upkeep`, which it inherits.

Guarantees (each method's docstring says what it adds):

- Pinned: nothing is resolved by name twice (see :mod:`.opening`). Anything that fails a check
  is refused with one warning, never served, never deleted by a lookup.
- Complete or absent, and verified (see :mod:`.entries`): torn, truncated, flipped or missing
  members are a miss (the entry is quarantined, one warning). Nothing read is unpickled.
- Stable paths (see :mod:`.served`): eviction, ``kcache clear`` or a swapped folder cannot
  remove or change a file between the check and the library's open or dlopen.
- Its own clock (see :mod:`.clock`).
- Bounded (see :mod:`.eviction`): ``max_size`` holds while many processes write and after they end.
- The hit and put paths never touch the index (see :mod:`.catalogue`).
- Fork-safe (see :mod:`.forks`).
- A failure the tier expects (full disk, read-only or locked store, corrupt index or entry) is
  a miss or a skipped write with one warning: :meth:`get` and :meth:`put` do not raise for it.

Hits, misses and what goes to other tiers are counted by the composed cache (:mod:`.cache`),
not here: this tier counts only its own events (errors, bytes written, evictions).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .. import counters as _counters
from ..config import DEFAULT_MAX_SIZE
from ..kinds import valid_id
from ..log import logger, warn_once
from . import forks, fs, housekeeping
from . import tunables as T
from .catalogue import Catalogue
from .clock import Clock
from .conf import read_at as read_conf
from .entries import Entries
from .errors import EXPECTED, CorruptEntry, RefusedEntry, StoreError, tolerated, warn_failed
from .eviction import Evictor
from .hit import Hit, HitMemo, ServeFailed
from .index import Index
from .leases import Ticket
from .locks import Lock
from .opening import Folders, open_folders
from .records import Record, entry_id
from .safety import UnsafeStore
from .served import Served
from .trash import Trash
from .upkeep import Upkeep


class DiskTier(Upkeep):
    """A kcache store folder. Construct with :meth:`open`, which checks and pins it.

    Read-only tiers (``KCACHE_READONLY=1``, a store on a read-only filesystem, or one opened by a
    reading command) never write anything."""

    def __init__(
        self,
        folders: Folders,
        *,
        max_size: int,
        key_tag: str,
        drain_global: bool,
        index_timeout: float,
        counts: _counters.Counters | None = None,
    ) -> None:
        self.folders = folders
        self.max_size = max_size
        #: Where the bound came from: "argument" (the caller), "store" (kcache.conf), "default".
        self.max_size_source = "argument"
        self.key_tag = key_tag
        self.index_timeout = index_timeout
        self.counts = counts if counts is not None else _counters.Counters()
        #: Seconds a put protects its entry from eviction (until its first hit); see :meth:`protect`.
        self.protect_s = 0.0
        #: False while prewarming: this process's own hits are not uses (protection stays).
        self.hits_are_use = True
        self.clock = Clock(folders)
        self.served = Served(folders)
        self.entries = Entries(folders, self.clock, self.served, on_removed=self._removed)
        self.memo = HitMemo(folders, self.clock, self.served)
        self.catalogue = Catalogue(
            self.entries, self.counts, index_timeout=index_timeout, drain_global=drain_global
        )
        self.evictor = Evictor(
            self.entries,
            self.catalogue,
            bound=lambda: self.max_size,
            remove=self._remove_for_eviction,
            remove_soon=self._remove_for_put,
        )
        self.catalogue.on_turn = self._flush_turn
        self.evictor.let_go = self._let_go
        self.served.wake = self.catalogue.wake  # the holds' table of descriptors grown there
        self.catalogue.after_reconcile = self.evictor.recount
        self.entries.mark = self.evictor.usage.mark  # see Usage.add: a removal's bytes and a recount
        self.trash_state = Trash(folders)  # what removals left in trash/ (see trash.Trash)
        self._usage_started = False  # a new store's count made (see _first_put)
        self._dead_cleaned = False  # dead processes' private folders removed (see clean_dead_folders)
        forks.register(self)

    # ------------------------------------------------------------------ what opening found
    @property
    def root(self) -> Path:
        return self.folders.root

    @property
    def readonly(self) -> bool:
        return self.folders.readonly

    @property
    def closed(self) -> bool:
        return self.folders.closed

    @property
    def trust_host_code(self) -> bool:
        """False when the store failed a check and was opened anyway (KCACHE_ALLOW_INSECURE=1):
        host code and pickles are then never taken from it."""
        return self.folders.trusted

    @property
    def network_fs(self) -> bool:
        return self.folders.network_fs

    @property
    def index_dir(self) -> Path:
        return self.folders.index_dir

    @property
    def drain_global(self) -> bool:
        return self.catalogue.drain_global

    @property
    def tmp(self) -> Path:
        return self.folders.tmp

    @property
    def trash(self) -> Path:
        return self.folders.trash

    @property
    def locks(self) -> Path:
        return self.folders.locks

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        root: Path | str,
        *,
        max_size: int | None = None,
        readonly: bool = False,
        key_tag: str = "",
        allow_insecure: bool = False,
        create: bool = True,
        drain_global: bool = False,
        network_fs: bool | None = None,
        index_timeout: float = 0.25,
        counts: _counters.Counters | None = None,
    ) -> DiskTier:
        """Check, pin and (unless read-only, or ``create`` is False) create the store.

        Refused, with :class:`StoreError` saying why: a path that is not a folder; a folder that
        is not empty and holds no store; a store of another schema; a root, internal folder or
        parent folder that another user could change (unless ``allow_insecure``: then used, but
        :attr:`trust_host_code` is False). A missing folder is created 0700 unless ``readonly``
        or not ``create``; an empty one becomes a store only with ``create``. ``max_size`` None:
        the store's own setting (``kcache.conf``, see :mod:`.conf`), else the default."""
        path = os.path.abspath(os.fspath(root))
        try:
            folders = open_folders(
                path, readonly=readonly, allow_insecure=allow_insecure, create=create, network_fs=network_fs
            )
        except (UnsafeStore, fs.UnsafePath) as e:
            raise StoreError(str(e)) from None
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:
                raise StoreError(f"cannot use {path}: the path is too long") from None
            raise StoreError(f"cannot use {path}: {e.strerror or e}") from None
        except UnicodeError as e:
            raise StoreError(f"cannot use {path!r}: {e}") from None
        # The store's own settings file (kcache.conf) gives the bound unless the caller did.
        kept = read_conf(folders.fd("root"), folders.owners)[0] if max_size is None else {}
        tier = cls(
            folders,
            max_size=max_size or kept.get("max_size") or DEFAULT_MAX_SIZE,
            key_tag=key_tag,
            drain_global=drain_global,
            index_timeout=index_timeout,
            counts=counts,
        )
        tier.max_size_source = "argument" if max_size else "store" if "max_size" in kept else "default"
        # Opening writes nothing and lists nothing: what used to be done here is done off a
        # process's first hit, when first needed. The clock is set by the filesystem's at the
        # first put, the flush thread's first turn or the first ask for the store's time (see
        # .clock); a new store's size count is made at its first put; dead processes' private
        # folders go at the flush thread's first turn, or at close (clean_dead_folders).
        if not folders.readonly and not folders.network_fs:
            tier.trash_state.left = True  # what removals left there: the flush thread's first turn
        atexit.register(tier.close)  # read-only too: its private folders go at exit
        return tier

    def close(self) -> None:
        """Flush what is batched, close the index and every descriptor. Idempotent."""
        if self.closed:
            return
        # What this process holds goes first (and what it kept in trash/, unless others hold
        # it): the exit eviction then measures what stays on disk once it has gone.
        self.memo.clear()
        steps: list[tuple[str, Callable[[], object]]] = [
            ("served", self.served.close),  # lets go of the entry folders this process held
            ("dead-folders", self.clean_dead_folders),  # if the flush thread never had a turn
        ]
        if not self.readonly:
            steps += [
                ("trash", self.trash_state.retry_held),
                ("trash", lambda: self.sweep_trash(0.5, closing=True)),
                # the bound holds after the last writer ends, not only at the next one's put
                ("evict-at-exit", self.evictor.at_exit),
                ("trash", lambda: self.sweep_trash(0.5, closing=True)),  # the empty folders eviction left
            ]
        for topic, step in steps:  # each sorts what it expects; a bug in one: reported, the next runs
            with tolerated(f"close-{topic}", f"kcache's {topic} step at close", then="closing goes on"):
                step()
        self.flush(force=True)
        cat = self.catalogue
        with cat._index_lock, cat._lock:
            self.folders.closed = True
            if cat._index is not None and cat._index_pid == os.getpid():
                with contextlib.suppress(sqlite3.Error):  # closed whatever it is
                    cat._index.close()
            cat._index = None
        self.evictor.usage.close()
        self.clock.close()
        self.folders.close()

    # ------------------------------------------------------------------ forks
    def fork_locks(self) -> list[Any]:
        return self.catalogue.fork_locks()

    def after_fork_child(self, keep: list[Any]) -> None:
        self.trash_state.after_fork()  # first: cannot fail, and close waits on its lock
        self.catalogue.after_fork_child(keep)
        self.memo.after_fork()
        with tolerated("fork", "kcache's reset of its size count in a forked child"):
            self.evictor.after_fork()
        with tolerated("fork", "kcache's reset of its served files in a forked child"):
            self.served.after_fork()

    # ------------------------------------------------------------------ ids and time
    def entry_id(self, kind: str, key: str) -> str:
        """The id of (kind, key) in this store (a hash of kind, ``KCACHE_KEY_TAG`` and key)."""
        return entry_id(kind, key, self.key_tag)

    def entry_dir(self, ident: str) -> str:
        """The entry's folder, by name: for messages and reports only (never opened by name)."""
        return self.folders.entry_dir(ident)

    valid_id = staticmethod(valid_id)

    def now(self) -> float:
        """The store's time: this process's clock corrected to the filesystem's."""
        return self.clock.synced()

    # ------------------------------------------------------------------ reading
    def get(self, kind: str, key: str, *, touch: bool = False, files: bool = False) -> Hit | None:
        """The verified entry for (kind, key), or None. An entry that fails its checks is a miss:
        a corrupt one is removed (one warning), one that is not this user's is left alone and
        refused. ``touch``: a use (its last use refreshed when due). ``files``: the caller will
        use :attr:`Hit.paths`; they are made now, from the very files just verified (cheaper
        than later, and a hit whose files cannot be made is a miss)."""
        if files and len(self.memo):
            hit = self.memo.get(kind, key)
            if hit is not None:
                return hit
        ident = self.entry_id(kind, key)
        try:
            if files:
                hit = self.entries.read_served(ident, kind, key, touch=touch)
            else:
                hit = self.entries.read(ident, kind, key, touch=touch)
        except CorruptEntry as e:
            try:
                self._on_corrupt(ident, kind, str(e), e.ident)
            except EXPECTED as e2:  # quarantine is best effort, the lookup is a miss either way
                logger.debug("quarantine of %s: %s", ident, e2)
            return None
        except ServeFailed as e:
            warn_once("serve", f"cannot make the files of a cached kernel ({e}); compiling instead")
            self.counts.add(kind, errors=1)
            return None
        except RefusedEntry as e:
            warn_once(
                f"refused:{ident}",
                f"refused {kind} entry {ident[:12]} in {self.root}: {e}; compiling instead",
            )
            self.counts.add(kind, errors=1)
            return None
        except OSError as e:  # permission denied, I/O error, a closed store: a miss, once loudly
            warn_once(
                f"read:{type(e).__name__}", f"cannot read the store at {self.root}: {e}; compiling instead"
            )
            self.counts.add(kind, errors=1)
            return None
        if hit is not None and files:
            self.memo.put(kind, key, hit)
        return hit

    def read_any(self, ident: str, full: bool = False) -> tuple[Hit | None, str | None]:
        """(entry, None) or (None, problem) for an entry id, without counting, touching or
        quarantining anything. ``full`` also checks every member's sha256."""
        try:
            h = self.entries.read(ident, None, None, full=full)
            return h, None if h is not None else "missing"
        except (CorruptEntry, RefusedEntry, OSError) as e:
            return None, str(e) or type(e).__name__

    def read_record(self, ident: str) -> tuple[Record | None, str | None]:
        """The entry's own record (its members are not read), or (None, why)."""
        return self.entries.read_record(ident)

    def record_mtime(self, ident: str) -> float | None:
        """The record file's mtime (last use, by the filesystem's clock), or None."""
        return self.entries.record_mtime(ident)

    def _on_corrupt(self, ident: str, kind: str, why: str, rid: tuple[int, ...] | None) -> None:
        # Only quarantine (and report) what we read: an entry removed (clear, eviction) or
        # replaced by another process while we read it loses its members under us, which is a
        # plain miss, not corruption.
        if not self.entries.still_the_one(ident, rid):
            return
        warn_once(
            f"corrupt:{ident}", f"corrupt {kind} entry {ident[:12]} ({why}); removed, compiling instead"
        )
        self.counts.add(kind, errors=1)
        if self.readonly:
            return
        self.entries.remove(ident)
        self.catalogue.call(lambda idx: idx.remove([ident]))

    def scratch_dir(self) -> str:
        """A private folder of this process for files on their way into the store (Triton writes
        a kernel's members there before they are committed as one entry). Returns a path that
        resolves through the folder's descriptor. Held while the process lives; removed at exit
        (see :mod:`.served`)."""
        return self.served.scratch()

    def scratch_stage(self) -> tuple[str, Ticket]:
        """A new folder of this process for one compile's files, and the ticket that keeps it:
        removed once no path that holds the ticket lives (see :meth:`.served.Served.stage`)."""
        return self.served.stage()

    # ------------------------------------------------------------------ writing
    def put(
        self,
        kind: str,
        key: str,
        files: Mapping[str, bytes | str | os.PathLike[str]],
        *,
        components: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        compile_s: float = 0.0,
        protect_s: float = 0.0,
        created: float | None = None,
    ) -> tuple[Hit | None, bool]:
        """Store ``files`` (name -> bytes, or the path of a file to link or copy) as one entry:
        (the committed entry, True), (an identical one that another writer committed first,
        False: entries are immutable, first writer wins), or (None, False) when it could not be
        written (read-only, full, broken: one warning). ``protect_s`` (default:
        :attr:`protect_s`) keeps the entry from eviction until its first hit or that many seconds
        (its record says until when; its last use stays its creation).

        Past the store's bound, the flush thread evicts at once; far past it (the eviction is
        behind), the put itself frees about its own size first (see :mod:`.eviction`)."""
        if self.readonly or self.closed:
            return None, False
        protect_s = min(float(protect_s or self.protect_s or 0.0), T.MAX_PROTECT_S)
        ident = self.entry_id(kind, key)
        if not self._usage_started:
            self._first_put()
        try:
            fields = dict(
                kind=kind,
                key=key,
                created=self.clock.synced() if created is None else created,
                compile_s=float(compile_s),
                components=dict(components or {}),
                summary=dict(summary or {}),
                protect_until=self.clock.refresh() + protect_s if protect_s else 0.0,
            )
            hit, committed = self.entries.write(fields, ident, files, touch_existing=self.hits_are_use)
        except RefusedEntry as e:  # said once, under the topic a lookup of it uses
            warn_once(
                f"refused:{ident}", f"refused {kind} entry {ident[:12]} in {self.root}: {e}; not cached"
            )
            self.counts.add(kind, errors=1)
            return None, False
        except (OSError, ValueError) as e:
            why = f"cannot write to the store at {self.root} ({e}); kernels are compiled but not cached"
            warn_failed(self.root, e, None, f"write:{type(e).__name__}", why)  # a full disk: one for all
            self.counts.add(kind, errors=1)
            return None, False
        if not committed:
            if hit is not None and self.hits_are_use:
                self.catalogue.note_use(hit.record)  # returned like a hit: kept from eviction like one
            return hit, False
        assert hit is not None
        rec = hit.record
        self.counts.add(kind, bytes_written=rec.size)
        self.catalogue.note_put(rec, self.clock.now())
        try:
            self.evictor.after_put(hit.disk, ident)
        except EXPECTED as e:  # the put stands; the bound is kept by the next put or the flush thread
            logger.debug("eviction after put: %s", e)
        self.catalogue.maybe_flush()
        return hit, True

    def _first_put(self) -> None:
        """This process's first put: a new store's size count starts at 0 (exact from its first
        entry), and the store's clock is set by the filesystem's (a record's times are the
        filesystem's)."""
        self._usage_started = True
        try:
            self.evictor.usage.start_if_new()
        except OSError as e:  # the flush thread counts the store instead
            logger.debug("size count: %s", e)
        self.clock.synced()

    def replace_folder(self, kind: str, key: str) -> None:
        """Remove the entry's folder before a replacement (its row: the put's replaces it; the
        index is not opened on the compiling thread; if the put fails, the row of a missing
        entry goes at eviction)."""
        self.remove([self.entry_id(kind, key)], index=False)

    # ------------------------------------------------------------------ removing
    def remove(self, ids: list[str], *, index: bool = True) -> int:
        """Delete entries: their folders first (that frees the space, and works on a full disk),
        then their index rows (``index``; a failure there is ignored: rows of missing entries are
        dropped by eviction and ``verify --fix``). Returns how many folders were removed."""
        if self.readonly:
            raise StoreError("the store is read-only")
        n = sum(self.entries.remove(ident) is not None for ident in ids)
        if index:
            self.catalogue.call(lambda idx: idx.remove(ids))
        return n

    # ------------------------------------------------------------------ the catalogue
    def index(self) -> Index:
        return self.catalogue.index()

    def index_readonly(self) -> Index:
        return self.catalogue.index_readonly()

    def rebuild_index(self) -> Index:
        return self.catalogue.rebuild_index()

    def flush(self, force: bool = False) -> None:
        self.catalogue.flush(force)

    def reconcile(self, force: bool = False) -> int:
        return self.catalogue.reconcile(force)

    def note_use(self, rec: Record) -> None:
        self.catalogue.note_use(rec)

    def note_miss(self, kind: str, key: str, components: dict[str, Any]) -> None:
        self.catalogue.note_miss(kind, key, components)

    # ------------------------------------------------------------------ housekeeping
    def scan(self) -> Iterator[tuple[str, str, str | None]]:
        return housekeeping.scan(self.folders)

    def iter_entry_ids(self) -> Iterator[str]:
        return housekeeping.iter_entry_ids(self.folders)

    def entry_extras(self, ident: str, rec: Record) -> list[str]:
        return housekeeping.entry_extras(self.entries, ident, rec)

    def remove_stray(self, shard: str, name: str = "", member: str = "") -> bool:
        return housekeeping.remove_stray(self.entries, shard, name, member)

    def clean_tmp(self, min_age: float = T.STALE_TMP_S) -> int:
        return housekeeping.clean_tmp(self.folders, self.clock, min_age)

    # ------------------------------------------------------------------ locks
    def lock_for(self, kind: str, key: str) -> Lock | None:
        """An unacquired cross-process lock for (kind, key) (see :mod:`.locks`); None when the store
        is read-only or its ``locks/`` folder is missing."""
        lfd = self.folders.fd("locks")
        if self.readonly or lfd is None:
            return None
        return Lock(lfd, self.entry_id(kind, key) + ".lock")

    # ------------------------------------------------------------------ protection
    def protect(self, seconds: float) -> Callable[[], None]:
        """From now on, every put protects its entry from eviction for ``seconds`` (until its
        first hit), and this process's own hits are not uses (they leave protection and last
        use alone). For prewarm. Returns a function that undoes it."""
        before = (self.protect_s, self.hits_are_use)
        self.protect_s, self.hits_are_use = min(float(seconds), T.MAX_PROTECT_S), False

        def undo() -> None:
            self.protect_s, self.hits_are_use = before

        return undo
