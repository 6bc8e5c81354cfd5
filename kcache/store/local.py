"""The local store: one for every integration. It knows records and bytes, not libraries.

Layout under the store root::

    KCACHE_STORE            marker (a kcache store; its schema)
    entries/<id[:2]>/<id>/  one committed entry: its member files and ``__kcache__.rec``
    index/kcache.sqlite     the catalogue (see index.py); node-local on network filesystems
    tmp/                    entries being written, per-process scratch and served files
    trash/                  entries being deleted (renamed here first, then removed)
    locks/                  single-flight locks, one per entry id; evict.lock; the clock file

Guarantees (each method's docstring says what it adds):

- Pinned. The root is opened once (``O_DIRECTORY | O_NOFOLLOW``) and checked through its
  descriptor; so are ``entries/``, ``tmp/``, ``trash/``, ``locks/`` and ``index/``, each of which
  must be a real folder owned by this user and writable by nobody else. Every later open,
  create, rename and remove is relative to those descriptors, never to a path name that could
  have been swapped since; entry folders, records and members are checked the same way (owner,
  mode, regular file) when read. Anything that fails a check is refused with one warning.
- Complete or absent. An entry is written under ``tmp/`` and renamed into place in one step,
  and never modified afterwards (a replacement first moves the old one to ``trash/``).
- Verified. A hit reads the record and every member and checks sizes and checksums (xxh3, else
  crc32) before returning: torn, truncated, flipped or missing members are a miss (the entry is
  quarantined, one warning). Nothing read from disk is unpickled.
- Stable paths. A hit's bytes stay in memory; the paths handed to a library that wants files
  (:attr:`Hit.paths`) are hard links of the very member files that were read and verified (or
  copies of their bytes) in a private, held, per-process folder, reached through
  ``/proc/self/fd``: eviction, ``kcache clear`` or a swapped folder cannot remove or change a
  file between the check and the library's open or dlopen (see :mod:`.served`).
- Its own clock. Last use and protection are judged by the filesystem's clock (the mtime a
  write gives a file), not by the process's: a process whose clock runs ahead orders entries as
  every other does.
- Bounded. ``max_size`` holds while many processes write and after they end: one shared count
  of the store's bytes, eviction by the flush thread as soon as a put passes the bound, by a put
  itself far past it, and at exit (see :mod:`.eviction`).
- The hit and put paths (and :meth:`replace`) never touch the index. Last-use times and new
  rows go to the index in batches, from a daemon thread, which also evicts and adds rows that
  processes ended early never wrote (see :mod:`.catalogue`); the record's mtime is refreshed at
  most once a minute. (A corrupt entry found by a hit has its row dropped there and then: rare,
  and already the slow path.)
- Fork-safe. A forked child starts with its locks free, its own index connection, flush
  thread and private folders; its parent's are never used or removed by it.
- Fails open. Every failure (full disk, read-only or locked store, corrupt index) degrades to a
  miss or a skipped write with one warning: :meth:`get` and :meth:`put` never raise.

The store is split by concern: :mod:`.opening` (checks when opened), :mod:`.catalogue` (index
and the flush thread), :mod:`.eviction` (the size bound), :mod:`.housekeeping` (walking folders,
clean-up), :mod:`.served` (files handed to libraries), :mod:`.tunables` (timings and bounds).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import counters as _counters
from ..config import DEFAULT_MAX_SIZE
from ..kinds import valid_id
from ..log import logger, warn_once
from . import fs
from . import tunables as T
from .catalogue import CatalogueMixin
from .conf import read_at as read_conf
from .errors import CorruptEntry, RefusedEntry, StoreError
from .eviction import Evictor, drop_trash, entry_bytes, folder_bytes
from .housekeeping import HousekeepingMixin
from .index import Index
from .locks import Lock
from .opening import INSECURE_HINT, MARKER, SUBDIRS, check_marker, node_local_index, open_sub, unwritable
from .records import RECORD_NAME, CorruptRecord, Record, entry_id, file_info, valid_name
from .safety import UnsafeStore, check_root, insecure_parent, insecure_path, is_network_fs, make_private_dir
from .served import Served, clean_dead

__all__ = ["MARKER", "Hit", "Store", "StoreError"]


class _ServeFailed(Exception):
    """A verified hit whose files could not be made (a full disk everywhere, a closed store)."""


class Hit:
    """A verified entry. :meth:`read` gives a member's verified bytes; :attr:`paths` gives real
    files holding them, with the members' own names (Triton reads a file's type from its suffix),
    that stay as they are for the life of this process."""

    __slots__ = ("record", "_blobs", "_store", "_paths", "_paths_pid", "mtime", "_inos", "_pin")

    def __init__(
        self,
        record: Record,
        blobs: dict[str, bytes],
        store: Store | None,
        mtime: float = 0.0,
        inos: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.record, self._blobs, self._store = record, blobs, store
        #: The members' (device, inode) as verified: files made later are links of these very
        #: inodes, checked after linking, else copies of the bytes (see :mod:`.served`).
        self._inos: dict[str, tuple[int, int]] = inos or {}
        self._paths: dict[str, str] | None = None
        self._paths_pid = os.getpid()
        self.mtime = mtime
        #: The held entry folder its paths name (see :mod:`.served`), or None.
        self._pin: int | None = None

    def __repr__(self) -> str:
        return f"Hit({self.record!r})"

    def read(self, name: str) -> bytes:
        """The member's bytes, as checked against the record."""
        return self._blobs[name]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.record.files]

    @property
    def paths(self) -> dict[str, str]:
        """Member name -> path of a private file holding the verified bytes (made on first use;
        :class:`OSError` when they cannot be made, e.g. after ``Store.close()``: a miss)."""
        if self._paths is None or self._paths_pid != os.getpid():
            # (A forked child's own: its parent's name the parent's descriptors.)
            if self._store is None:
                raise OSError("no store to serve files from")
            self._paths, self._pin = self._store._served_files.serve_held(self)
            self._paths_pid = os.getpid()
        return self._paths


class Store(CatalogueMixin, HousekeepingMixin):
    """A kcache store rooted at ``root``. Construct with :meth:`open`, which checks and pins it.

    Integrations use :meth:`get`, :meth:`put`, :meth:`replace`, :meth:`lock` and
    :meth:`scratch_dir`; maintenance adds :meth:`index`, :meth:`read_any`, :meth:`read_record`,
    :meth:`remove`, :meth:`scan` and :meth:`clean_tmp`. Read-only stores (``KCACHE_READONLY=1``,
    a store on a read-only filesystem, or one opened by a reading command) never write anything.
    """

    def __init__(
        self,
        root: Path,
        fds: dict[str, int | None],
        *,
        max_size: int,
        readonly: bool,
        key_tag: str,
        trust_host_code: bool,
        owners: frozenset[int] | None,
        index_dir: str | None,
        network_fs: bool,
        drain_global: bool,
        index_timeout: float,
    ) -> None:
        self.root = root
        self.max_size = max_size
        self.readonly = readonly
        self.key_tag = key_tag
        #: False when the store failed a check and was opened anyway (KCACHE_ALLOW_INSECURE=1):
        #: host code and pickles are then never taken from it.
        self.trust_host_code = trust_host_code
        self.network_fs = network_fs
        self.drain_global = drain_global
        self.index_timeout = index_timeout
        #: What a reading command reports: the index's folder (node-local on a network filesystem).
        self.index_dir = Path(index_dir) if index_dir else root / "index"
        self.tmp, self.trash, self.locks = root / "tmp", root / "trash", root / "locks"
        self.counts = _counters.Counters()
        #: Seconds a put protects its entry from eviction (until its first hit); see :meth:`protect`.
        self.protect_s = 0.0
        #: False while prewarming: this process's own hits are not uses (protection stays).
        self.hits_are_use = True
        self._fds = fds
        self._owners = owners
        self._lock = threading.RLock()
        self._index_lock = threading.RLock()  # one SQLite connection: one thread at a time
        self._index: Index | None = None
        self._index_pid = 0
        self._index_off_until = 0.0
        self._busy_count = 0
        self._touches: dict[str, tuple[float, int]] = {}
        self._touch_since = 0.0  # monotonic: when the oldest last use not yet written was noted
        # (kind, key) -> a verified hit whose entry folder this process holds (see _memo_get)
        self._memo: dict[tuple[str, str], _Held] = {}
        self._touched_records: dict[str, Record] = {}
        self._misses: list[tuple[float, str, str, dict[str, Any]]] = []
        self._pending: dict[str, tuple[Record, float | None]] = {}
        self._flush_lock = threading.Lock()
        self._flusher_pid: int | None = None
        self._wake = threading.Event()  # set: the flush thread's turn now (the store is past its bound)
        self._dropped: set[str] = set()  # rows of entries removed here, for the next flush to drop
        self._trash_left = False  # removals left folders in trash/ (see eviction.sweep)
        self._trash_swept = -1e9  # monotonic: when held folders in trash/ were last tried
        self._next_reconcile = 0.0  # monotonic; the flush thread's first turn asks the index
        self._closed = False
        self._clock_fd: int | None = None
        self._clock_offset = 0.0
        self._real_shards: set[str] = set()
        self._served_files = Served(self)
        self._evictor = Evictor(self)
        # --- shared tier (issue 15): set by attach_remote; the tier is made on first need.
        self._remote_cfg: Any = None
        self._remote: Any = None
        _STORES.add(self)

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
    ) -> Store:
        """Check, pin and (unless read-only, or ``create`` is False) create the store.

        Refused, with :class:`StoreError` saying why: a path that is not a folder; a folder that
        is not empty and holds no store; a store of another schema; a root, internal folder or
        parent folder that another user could change (unless ``allow_insecure``: then used, but
        :attr:`trust_host_code` is False). A missing folder is created 0700 unless ``readonly``
        or not ``create``; an empty one becomes a store only with ``create``. ``max_size`` None:
        the store's own setting (``kcache.conf``, see :mod:`.conf`), else the default."""
        path = os.path.abspath(os.fspath(root))
        try:
            return cls._open(
                path,
                max_size=max_size,
                readonly=readonly,
                key_tag=key_tag,
                allow_insecure=allow_insecure,
                create=create,
                drain_global=drain_global,
                network_fs=network_fs,
                index_timeout=index_timeout,
            )
        except (UnsafeStore, fs.UnsafePath) as e:
            raise StoreError(str(e)) from None
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:
                raise StoreError(f"cannot use {path}: the path is too long") from None
            raise StoreError(f"cannot use {path}: {e.strerror or e}") from None
        except UnicodeError as e:
            raise StoreError(f"cannot use {path!r}: {e}") from None

    @classmethod
    def _open(
        cls,
        path: str,
        *,
        max_size: int | None,
        readonly: bool,
        key_tag: str,
        allow_insecure: bool,
        create: bool,
        drain_global: bool,
        network_fs: bool | None,
        index_timeout: float,
    ) -> Store:
        trust = True
        # The path as named: a link on the way is fine if this user (or root) made it, in a
        # folder nobody else can write; one another user planted decides where the store is.
        why_named = insecure_path(path) if os.path.realpath(path) != os.path.abspath(path) else None
        if why_named:
            if not allow_insecure:
                raise UnsafeStore(
                    f"{path}: another user decides where this path leads ({why_named}); {INSECURE_HINT}"
                )
            trust = False
        real = os.path.realpath(path)  # a link the user made to their store is fine; from here on, no links
        if not os.path.lexists(real):
            if readonly or not create:
                raise StoreError(
                    f"{path} does not exist" + (" (read-only: nothing to read)" if readonly else "")
                )
            make_private_dir(Path(real))
        why_parent = insecure_parent(real)
        if why_parent:
            if not allow_insecure:
                raise UnsafeStore(
                    f"{path}: another user can replace the store ({why_parent}); move the store to a "
                    f"folder only you (or root) can write, or {INSECURE_HINT}"
                )
            trust = False
        owners = fs.trusted_owners(readonly)
        try:
            root_fd = fs.open_dir(real, str(path), None)
        except fs.UnsafePath:
            raise StoreError(f"{path} exists and is not a directory") from None
        fds: dict[str, int | None] = {"root": root_fd}
        try:
            st = os.fstat(root_fd)
            try:
                check_root(st, path, readonly=readonly)
            except UnsafeStore:
                if not allow_insecure:
                    raise
                trust = False
                owners = None  # type: ignore[assignment]
            if not readonly:
                why = unwritable(root_fd)
                if why:
                    # Used as KCACHE_READONLY=1 would: hits served, nothing written, one warning.
                    warn_once(
                        "store-unwritable", f"{path} {why}: using it read-only (new kernels are not cached)"
                    )
                    readonly = True
                    if owners is not None:
                        owners = fs.trusted_owners(True)
            check_marker(root_fd, path, readonly=readonly, create=create)
            nfs = is_network_fs(Path(real)) if network_fs is None else network_fs
            for sub in SUBDIRS:
                if sub == "index" and nfs:
                    fds[sub] = None  # no SQLite file on a network filesystem (below)
                    continue
                fds[sub] = open_sub(root_fd, sub, path, owners, create=not readonly)
            index_dir = None
            if nfs:
                # SQLite's locks are not safe on NFS/Lustre: entries stay shared (written by
                # rename, checked on read), the catalogue is kept on this node.
                import hashlib

                base = os.path.join(
                    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                    "kcache-index",
                )
                index_dir = os.path.join(base, hashlib.sha256(os.fsencode(real)).hexdigest()[:16])
                warn_once(
                    "nfs",
                    f"{path} is on a network filesystem; its index is kept node-local in {index_dir} "
                    "(entries are shared, stats and eviction are per node)",
                )
                fds["index"] = node_local_index(base, os.path.basename(index_dir), readonly)
        except BaseException:
            for fd in fds.values():
                if fd is not None:
                    os.close(fd)
            raise
        # The store's own settings file (kcache.conf) gives the bound unless the caller did.
        kept = read_conf(fds["root"], owners)[0] if max_size is None else {}
        store = cls(
            Path(path),
            fds,
            max_size=max_size or kept.get("max_size") or DEFAULT_MAX_SIZE,
            readonly=readonly,
            key_tag=key_tag,
            trust_host_code=trust,
            owners=owners,
            index_dir=index_dir,
            network_fs=nfs,
            drain_global=drain_global,
            index_timeout=index_timeout,
        )
        #: Where the bound came from: "argument" (the caller), "store" (kcache.conf), "default".
        store.max_size_source = "argument" if max_size else "store" if "max_size" in kept else "default"
        if not readonly:
            store._refresh_clock()
            store._evictor.usage.start_if_new()
            # Private folders that dead processes left (killed, or ended by os._exit): nobody
            # holds them any more (see .served).
            tfd = store._fd("tmp")
            if tfd is not None and not nfs:  # a network filesystem's locks may be per node
                for prefix in ("served.", "scratch."):
                    clean_dead(tfd, prefix)
                store._trash_left = True  # what removals left there: the flush thread's first turn
        atexit.register(store.close)  # read-only too: its private folders go at exit
        return store

    @classmethod
    def from_settings(
        cls,
        settings: Any,
        *,
        write: bool = True,
        create: bool = True,
        remote: bool | None = None,
        **kwargs: Any,
    ) -> Store:
        """The store named by :class:`kcache.config.Settings` (read-only unless ``write``).

        ``remote``: attach the shared tier of the settings (``KCACHE_REMOTE``); by default only
        to a program's own store (the one :func:`kcache.active_store` opens, with
        ``drain_global``), never to a maintenance command's."""
        store = cls.open(
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
        # --- shared tier (issue 15)
        if (kwargs.get("drain_global", False) if remote is None else remote) and (
            getattr(settings, "remote", None) or getattr(settings, "remote_problems", None)
        ):
            store.attach_remote(settings)  # a bad shared-tier setting: one warning, tier off
        return store

    # --- shared tier (issue 15): the wiring. The tier itself is kcache/store/tiers/redis.py; it is
    # imported (and redis with it) at the first local miss or put, never on the hit path.
    def attach_remote(self, settings: Any) -> bool:
        """Use the shared tier named by ``settings`` (:class:`kcache.config.Settings`) from now
        on. A bad shared-tier setting warns once and leaves the tier off (local caching goes
        on). Returns True when attached."""
        problems = list(getattr(settings, "remote_problems", None) or [])
        if problems:
            warn_once("remote-settings", "the shared tier is off: " + "; ".join(problems))
            return False
        from .tiers.redis import RemoteConfig

        cfg = RemoteConfig.from_settings(settings)
        if cfg is not None:
            cfg.key_tag = self.key_tag
        self._remote_cfg, self._remote = cfg, None
        if cfg is not None and not self.readonly and self._holds_nothing():
            # A store that holds nothing misses on whatever it is asked, and every miss asks the
            # shared tier: import redis now, as part of the start, not at the first miss (0.1 s
            # of CPU; 8 fresh processes on 2 cores: seconds of the first compile's time).
            self.remote_tier().warm_up()
        return cfg is not None

    def _holds_nothing(self) -> bool:
        fd = self._fd("entries")
        try:
            return fd is not None and not os.listdir(fd)
        except OSError:
            return False

    def remote_tier(self) -> Any:
        """The shared tier (:class:`kcache.store.tiers.redis.RemoteTier`), made on first use; None
        when none is attached."""
        if self._remote is None and self._remote_cfg is not None and not self._closed:
            with self._lock:
                if self._remote is None:
                    from .tiers.redis import RemoteTier

                    self._remote = RemoteTier(self._remote_cfg, self.counts)
        return self._remote

    def remote_flight(self, kind: str, key: str) -> Hit | None:
        """Single flight across machines (see :meth:`RemoteTier.flight`): call after taking the
        local lock for (kind, key) and missing in both tiers. A Hit: another machine compiled it
        meanwhile; None: compile here (then :meth:`put` or :meth:`remote_unlock`). Never raises."""
        if self._remote_cfg is None or self.readonly:
            return None
        try:
            return self.remote_tier().flight(self, kind, key, self.entry_id(kind, key))
        except Exception as e:
            warn_once("remote-flight", f"shared tier lock failed ({e}); compiling")
            return None

    def remote_unlock(self, kind: str, key: str) -> None:
        """Let go of the shared tier's lock for (kind, key) if this process holds it (a compile
        that failed or was not stored). Never raises."""
        if self._remote is None:
            return
        try:
            self._remote.unlock(self.entry_id(kind, key))
        except Exception as e:
            logger.debug("remote unlock: %s", e)

    def close(self) -> None:
        """Flush what is batched, close the index and every descriptor. Idempotent."""
        if self._closed:
            return
        if self._remote is not None:  # --- shared tier (issue 15): its queue, within its bound
            try:
                self._remote.close()
            except Exception as e:
                logger.debug("remote close: %s", e)
        if not self.readonly:
            try:  # the bound holds after the last writer ends, not only at the next one's put
                self._evictor.at_exit()
            except Exception as e:
                logger.debug("eviction at exit: %s", e)
        self.flush(force=True)
        self._closed = True
        with self._index_lock, self._lock:
            if self._index is not None and self._index_pid == os.getpid():
                with contextlib.suppress(Exception):
                    self._index.close()
            self._index = None
        self._memo.clear()
        with contextlib.suppress(Exception):
            self._served_files.close()  # lets go of the entry folders this process held
        if not self.readonly:  # what those holds kept in trash/ goes now, if nobody else holds it
            self._trash_swept = -1e9
            with contextlib.suppress(Exception):
                self.sweep_trash(0.5, closing=True)
        self._evictor.usage.close()
        for fd in [self._clock_fd, *self._fds.values()]:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fds = {k: None for k in self._fds}
        self._clock_fd = None

    @property
    def closed(self) -> bool:
        return self._closed

    def _fd(self, sub: str) -> int | None:
        return self._fds.get(sub)

    # ------------------------------------------------------------------ ids and time
    def entry_id(self, kind: str, key: str) -> str:
        """The id of (kind, key) in this store (a hash of kind, ``KCACHE_KEY_TAG`` and key)."""
        return entry_id(kind, key, self.key_tag)

    def entry_dir(self, ident: str) -> str:
        """The entry's folder, by name: for messages and reports only (never opened by name)."""
        return os.path.join(str(self.root), "entries", ident[:2], ident)

    valid_id = staticmethod(valid_id)

    def _refresh_clock(self) -> float:
        """The filesystem's time now: the mtime a write gives the clock file. Also refreshes the
        offset that :meth:`now` adds to this process's clock."""
        t = time.time()
        if self.readonly or self._closed:
            return t
        try:
            if self._clock_fd is None:
                lfd = self._fd("locks")
                if lfd is None:
                    return t
                self._clock_fd = os.open(
                    "clock", os.O_RDWR | os.O_CREAT | fs.O_NOFOLLOW | fs.O_CLOEXEC, 0o600, dir_fd=lfd
                )
            os.utime(self._clock_fd)  # the kernel's (or the file server's) time, not this process's
            fst = os.fstat(self._clock_fd).st_mtime
        except OSError:
            return t
        self._clock_offset = fst - t
        return fst

    def now(self) -> float:
        """The store's time: this process's clock corrected to the filesystem's (see module doc)."""
        return time.time() + self._clock_offset

    # ------------------------------------------------------------------ reading
    def _entry_fd(self, ident: str) -> int | None:
        """The entry's folder, opened and checked; None if absent."""
        efd = self._fd("entries")
        if efd is None:
            return None
        shard = ident[:2]
        if shard not in self._real_shards:
            # The entry folder is opened with O_NOFOLLOW, which covers its last component only:
            # the shard must be a real folder of ours too (checked once per process).
            try:
                st = os.stat(shard, dir_fd=efd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            self._check_shard(shard, st)
        try:
            dfd = os.open(f"{shard}/{ident}", fs.O_DIR, dir_fd=efd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise CorruptEntry("entry is not a folder (or is a link)") from None
            raise
        if self._owners is not None:
            try:
                fs.check_stat(os.fstat(dfd), f"entry {ident[:12]}", self._owners, want_dir=True)
            except fs.UnsafePath as e:
                os.close(dfd)
                raise RefusedEntry(str(e)) from None
        return dfd

    def _check_shard(self, shard: str, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode):
            raise RefusedEntry(f"entries/{shard} is a link or not a folder")
        if self._owners is not None:
            try:
                fs.check_stat(st, f"entries/{shard}", self._owners, want_dir=True)
            except fs.UnsafePath as e:
                raise RefusedEntry(str(e)) from None
        self._real_shards.add(shard)

    def _read(
        self,
        ident: str,
        kind: str | None,
        key: str | None,
        *,
        full: bool = False,
        touch: bool = False,
        serve: bool = False,
    ) -> Hit | None:
        if not valid_id(ident):
            raise CorruptEntry(f"invalid entry id {ident!r}")
        dfd = self._entry_fd(ident)
        if dfd is None:
            return None
        try:
            return self._read_at(dfd, ident, kind, key, full, touch, serve)
        finally:
            os.close(dfd)

    def _read_at(
        self, dfd: int, ident: str, kind: str | None, key: str | None, full: bool, touch: bool, serve: bool
    ) -> Hit | None:
        """Read and verify the entry in the folder ``dfd``. With ``serve``, its files are made
        (see :attr:`Hit.paths`) from the member descriptors that were read, while still open:
        linked as the very inodes verified, whatever sits at their names by then."""
        try:
            rfd = os.open(RECORD_NAME, fs.O_READ, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise CorruptEntry("record is a link") from None
            raise
        mfds: dict[str, int] = {}
        try:
            st = os.fstat(rfd)
            # What is quarantined if this entry fails a check: this very record file (an inode
            # number alone can be reused by a new entry written meanwhile).
            rid = (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if not stat.S_ISREG(st.st_mode):
                raise CorruptEntry("record is not a regular file", rid)
            self._check_owner(st, f"record of {ident[:12]}")
            if st.st_size > T.MAX_RECORD:
                raise CorruptEntry("record too large", rid)
            data = fs.read_exact(rfd, st.st_size)
            try:
                rec = Record.decode(data)
            except CorruptRecord as e:
                raise CorruptEntry(str(e), rid) from None
            if (
                rec.id != ident
                or (kind is not None and rec.kind != kind)
                or (key is not None and rec.key != key)
            ):
                raise CorruptEntry("record does not belong to this entry", rid)
            blobs: dict[str, bytes] = {}
            inos: dict[str, tuple[int, int]] = {}
            for f in rec.files:
                try:
                    mfd = os.open(f.name, fs.O_READ, dir_fd=dfd)
                except OSError as e:
                    raise CorruptEntry(f"member {f.name}: {e.strerror}", rid) from None
                mfds[f.name] = mfd
                mst = os.fstat(mfd)
                if not stat.S_ISREG(mst.st_mode):
                    raise CorruptEntry(f"member {f.name} is not a regular file", rid)
                self._check_owner(mst, f"member {f.name} of {ident[:12]}")
                if mst.st_size != f.size:  # truncated or grown: no need to read it
                    raise CorruptEntry(f"member {f.name}: size {mst.st_size} != {f.size}", rid)
                blob = fs.read_exact(mfd, f.size)
                if not serve:
                    del mfds[f.name]
                    os.close(mfd)
                if len(blob) != f.size:
                    raise CorruptEntry(f"member {f.name}: size {len(blob)} != {f.size}", rid)
                if not f.check(blob):
                    raise CorruptEntry(f"member {f.name}: checksum mismatch", rid)
                if full and _sha256(blob).hexdigest() != f.sha256:
                    raise CorruptEntry(f"member {f.name}: sha256 mismatch", rid)
                blobs[f.name] = blob
                inos[f.name] = (mst.st_dev, mst.st_ino)
            mtime = st.st_mtime
            if (
                touch
                and not self.readonly
                and (
                    abs(self.now() - mtime) > T.TOUCH_EVERY_S
                    or (rec.protect_until and mtime <= rec.created + T.FIRST_USE_S)
                )
            ):
                # The record's mtime is the entry's last use for eviction, by the filesystem's
                # clock: refreshed here at most once a minute (no database write per hit). A
                # protected entry's first use ends its protection (its mtime moves on from its
                # creation). (A record of an older kcache with an mtime in the future, its way
                # of protecting, is brought back to now.)
                with contextlib.suppress(OSError):
                    os.utime(rfd)
                    mtime = os.fstat(rfd).st_mtime
            hit = Hit(rec, blobs, self, mtime, inos)
            if serve:
                try:
                    hit._paths, hit._pin = self._served_files.serve_held(hit, mfds, dfd)
                except OSError as e:
                    raise _ServeFailed(str(e) or type(e).__name__) from None
                if hit._pin is not None and kind is not None and key is not None:
                    self._memo_put(kind, key, hit, _sig(os.fstat(rfd)))
            return hit
        finally:
            os.close(rfd)
            for mfd in mfds.values():
                with contextlib.suppress(OSError):
                    os.close(mfd)

    def _check_owner(self, st: os.stat_result, what: str) -> None:
        if self._owners is not None and (
            st.st_uid not in self._owners or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            raise RefusedEntry(f"{what} is owned by uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):o})")

    def get(
        self,
        kind: str,
        key: str,
        components: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        *,
        count: bool = True,
        remote: bool = True,
        files: bool = False,
    ) -> Hit | None:
        """The verified entry for (kind, key), or None. Never raises.

        A hit is counted (with ``count``) and its last use noted in memory for the next batched
        index write. A miss is counted and, with ``components`` (or a callable that gives them),
        remembered for ``kcache explain``. An entry that fails its checks is a miss: a corrupt
        one is removed (one warning), one that is not this user's is left alone and refused.

        With a shared tier attached (and ``remote``), a local miss asks it; an entry found there
        is checked, committed here and returned like a local hit (counted as a hit).

        ``files``: the caller will use :attr:`Hit.paths`; they are made now, from the very files
        just verified (cheaper than later, and a hit whose files cannot be made is a miss)."""
        hit = self._memo_get(kind, key) if files and self._memo else None
        if hit is not None:
            if count:
                self.counts.add(kind, hits=1, saved_s=hit.record.compile_s)
                if self.hits_are_use:
                    self._note_use(hit.record)
            return hit
        ident = self.entry_id(kind, key)
        try:
            hit = self._read(ident, kind, key, touch=count and self.hits_are_use, serve=files)
        except CorruptEntry as e:
            try:
                self._on_corrupt(ident, kind, str(e), e.ident)
            except Exception as e2:  # quarantine is best effort: the lookup is a miss either way
                logger.debug("quarantine of %s: %s", ident, e2)
        except _ServeFailed as e:
            warn_once("serve", f"cannot make the files of a cached kernel ({e}); compiling instead")
            self.counts.add(kind, errors=1)
        except RefusedEntry as e:
            warn_once(
                f"refused:{ident}",
                f"refused {kind} entry {ident[:12]} in {self.root}: {e}; compiling instead",
            )
            self.counts.add(kind, errors=1)
        except Exception as e:  # permission denied, I/O error, a closed store: a miss, once loudly
            warn_once(
                f"read:{type(e).__name__}", f"cannot read the store at {self.root}: {e}; compiling instead"
            )
            self.counts.add(kind, errors=1)
        if hit is None and remote and self._remote_cfg is not None:  # --- shared tier (issue 15)
            hit = self._remote_fetch(kind, key, ident)
            if hit is not None and files:
                try:
                    _ = hit.paths
                except OSError as e:
                    warn_once("serve", f"cannot make the files of a cached kernel ({e}); compiling instead")
                    hit = None
        if hit is not None:
            if count:
                self.counts.add(kind, hits=1, saved_s=_counters.credit(kind, hit.record.compile_s))
                if self.hits_are_use:
                    self._note_use(hit.record)
            return hit
        if count:
            self.counts.add(kind, misses=1)
            if components is not None and not self.readonly:
                try:
                    comps = dict(components() if callable(components) else components)
                except Exception:
                    comps = {}
                with self._lock:
                    self._misses.append((self.now(), kind, key, comps))
            self._maybe_flush()
        return None

    # ------------------------------------------------------------------ the memo of held hits
    def _memo_put(self, kind: str, key: str, hit: Hit, rsig: tuple[int, ...]) -> None:
        """Remember a verified hit whose entry folder this process holds, so that its next
        lookup in this process reads no file again (see :meth:`_memo_get`)."""
        held = _Held(hit, rsig)
        with self._lock:
            memo = self._memo
            memo.pop((kind, key), None)
            if len(memo) >= _MEMO_MAX:
                memo.pop(next(iter(memo)), None)
            memo[(kind, key)] = held

    def _memo_get(self, kind: str, key: str) -> Hit | None:
        """The hit of (kind, key) verified earlier in this process, if its entry is still the
        one verified: its record file the same (by inode, size and times: not removed, replaced,
        nor due a refresh of its last use). Nothing is read again: the files it names are the
        ones verified, in the entry folder this process holds (an entry's files are never
        written once it is committed: kcache writes only new files, and a removal or a
        replacement renames the folder away). None otherwise: a full lookup."""
        m = self._memo.get((kind, key))
        efd = self._fd("entries")
        if m is None or efd is None:
            return None
        try:
            st = os.stat(m.record_path, dir_fd=efd, follow_symlinks=False)
        except OSError:
            st = None
        if (
            st is None
            or (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != m.rsig
            or abs(self.now() - st.st_mtime) > T.TOUCH_EVERY_S
        ):
            self._memo.pop((kind, key), None)
            return None
        hit = Hit(m.record, _HeldBlobs(m.pin, m.files), self, st.st_mtime, m.inos)
        hit._paths, hit._pin = dict(m.paths), m.pin
        return hit

    def _remote_fetch(self, kind: str, key: str, ident: str) -> Hit | None:
        """--- shared tier (issue 15): a local miss asks the tier. Never raises."""
        try:
            return self.remote_tier().fetch(self, kind, key, ident)
        except Exception as e:
            warn_once("remote-get", f"shared tier lookup failed ({e}); compiling instead")
            return None

    def read_any(self, ident: str, full: bool = False) -> tuple[Hit | None, str | None]:
        """(entry, None) or (None, problem) for an entry id, without counting, touching or
        quarantining anything. ``full`` also checks every member's sha256."""
        try:
            h = self._read(ident, None, None, full=full)
            return h, None if h is not None else "missing"
        except (CorruptEntry, RefusedEntry, OSError) as e:
            return None, str(e) or type(e).__name__

    def read_record(self, ident: str) -> tuple[Record | None, str | None]:
        """The entry's own record (its members are not read), or (None, why)."""
        if not valid_id(ident):
            return None, "not an entry id"
        try:
            dfd = self._entry_fd(ident)
        except (CorruptEntry, RefusedEntry, OSError) as e:
            return None, str(e)
        if dfd is None:
            return None, "missing"
        try:
            data, st = fs.read_at(dfd, RECORD_NAME, T.MAX_RECORD)
            self._check_owner(st, "record")
            rec = Record.decode(data)
        except FileNotFoundError:
            return None, "no record file"
        except (OSError, fs.UnsafePath, CorruptRecord, RefusedEntry) as e:
            return None, str(e)
        finally:
            os.close(dfd)
        if rec.id != ident:
            return None, "record does not belong to this entry"
        return rec, None

    def record_mtime(self, ident: str) -> float | None:
        """The record file's mtime (last use or protection, by the filesystem's clock), or None."""
        efd = self._fd("entries")
        if efd is None or not valid_id(ident):
            return None
        try:
            return os.stat(f"{ident[:2]}/{ident}/{RECORD_NAME}", dir_fd=efd, follow_symlinks=False).st_mtime
        except OSError:
            return None

    def _note_use(self, rec: Record) -> None:
        if self.readonly:
            return
        with self._lock:
            _, n = self._touches.get(rec.id, (0.0, 0))
            self._touches[rec.id] = (self.now(), n + 1)
            self._touched_records[rec.id] = rec
            if not self._touch_since:
                self._touch_since = time.monotonic()
        # The flush thread writes last uses at most once a second (and the store at exit): a hit
        # does not start it, a hit a second after the first unwritten one does. (A process's
        # first hits pay no thread start; a put or a miss starts it at once.)
        if self._flusher_pid != os.getpid() and time.monotonic() - self._touch_since >= T.FLUSH_EVERY_S:
            self._maybe_flush()

    def _on_corrupt(self, ident: str, kind: str, why: str, rid: tuple[int, ...] | None) -> None:
        if rid is not None:
            # Only quarantine (and report) what we read: an entry removed (clear, eviction) or
            # replaced by another process while we read it loses its members under us, which is
            # a plain miss, not corruption. The record is compared by inode, device, times and
            # size: a new entry's record may reuse the old one's inode number.
            efd = self._fd("entries")
            try:
                if efd is None:
                    return
                st = os.stat(f"{ident[:2]}/{ident}/{RECORD_NAME}", dir_fd=efd, follow_symlinks=False)
                if (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns, st.st_size) != rid:
                    return
            except FileNotFoundError:
                return
            except OSError:
                pass
        warn_once(
            f"corrupt:{ident}", f"corrupt {kind} entry {ident[:12]} ({why}); removed, compiling instead"
        )
        self.counts.add(kind, errors=1)
        if self.readonly:
            return
        self._remove_dirs([ident])
        self._index_call(lambda idx: idx.remove([ident]))

    def scratch_dir(self) -> str:
        """A private folder of this process for files on their way into the store (Triton writes
        a kernel's members there before they are committed as one entry). Returns a path that
        resolves through the folder's descriptor. Held while the process lives; removed at exit
        (see :mod:`.served`)."""
        return self._served_files.scratch()

    # ------------------------------------------------------------------ writing
    def put(
        self,
        kind: str,
        key: str,
        files: Mapping[str, bytes | str | os.PathLike],
        *,
        components: Mapping[str, Any] | None = None,
        summary: Mapping[str, Any] | None = None,
        compile_s: float = 0.0,
        protect_s: float = 0.0,
        _origin: str = "",
    ) -> Hit | None:
        """Store ``files`` (name -> bytes, or the path of a file to link or copy) as one entry.

        Returns the committed entry (this writer's, or an identical one that another writer
        committed first: entries are immutable, first writer wins), or None if it could not be
        written (read-only, full, broken: one warning). Never raises. ``protect_s`` (default:
        :attr:`protect_s`) keeps the entry from eviction until its first hit or that many seconds
        (its record says until when; its last use stays its creation).

        Past the store's bound, the flush thread evicts at once; far past it (the eviction is
        behind), the put itself frees about its own size first (see :mod:`.eviction`).

        With a shared tier attached, the committed entry is also queued for it (the caller does
        not wait). ``_origin="remote"``: the entry came from the shared tier (counted as
        ``remote_fills``, not as a put, and not sent back)."""
        if self.readonly or self._closed:
            return None
        protect_s = min(float(protect_s or self.protect_s or 0.0), T.MAX_PROTECT_S)
        ident = self.entry_id(kind, key)
        tfd, efd = self._fd("tmp"), self._fd("entries")
        tmp = None
        dfd = None
        try:
            if tfd is None or efd is None:
                raise OSError(errno.ENOENT, "the store's folders are missing")
            for name in files:
                if not valid_name(name):
                    raise ValueError(f"invalid member name {name!r}")
            for _ in range(3):
                tmp = fs.unique_name(ident)
                os.mkdir(tmp, 0o700, dir_fd=tfd)
                dfd = os.open(tmp, fs.O_DIR, dir_fd=tfd)
                # Held until committed: a clean-up of tmp/ in another process (clear, verify
                # --fix, a store being opened) removes only folders nobody holds.
                if fs.hold(dfd, tfd, tmp):
                    break
                os.close(dfd)
                dfd = None
            if dfd is None:
                raise OSError(errno.EAGAIN, "tmp/ is being cleaned as entries are written")
            infos, blobs, inos = [], {}, {}
            for name, data in files.items():
                blob, mst = self._write_member(dfd, name, data)
                infos.append(file_info(name, blob))
                blobs[name], inos[name] = blob, (mst.st_dev, mst.st_ino)
            rec = Record(
                kind=kind,
                key=key,
                id=ident,
                files=infos,
                created=self.now(),
                compile_s=float(compile_s),
                components=dict(components or {}),
                summary=dict(summary or {}),
                protect_until=self._refresh_clock() + protect_s if protect_s else 0.0,
            )
            encoded = rec.encode()
            fs.write_new_at(dfd, RECORD_NAME, encoded)
            shard = ident[:2]
            if shard not in self._real_shards:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(shard, 0o700, dir_fd=efd)
                self._check_shard(shard, os.stat(shard, dir_fd=efd, follow_symlinks=False))
            if not self._commit(tmp, ident, kind, key):
                try:
                    existing = self._read(ident, kind, key, touch=self.hits_are_use)
                except CorruptEntry:
                    return None  # replaced or removed again meanwhile: this put is just not kept
                if existing is not None and self.hits_are_use:
                    self._note_use(existing.record)  # returned like a hit: kept from eviction like one
                return existing
            tmp = None
        except RefusedEntry as e:  # said once, under the topic a lookup of it uses
            warn_once(
                f"refused:{ident}", f"refused {kind} entry {ident[:12]} in {self.root}: {e}; not cached"
            )
            self.counts.add(kind, errors=1)
            return None
        except Exception as e:
            full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            warn_once(
                "disk-full" if full else f"write:{type(e).__name__}",
                f"cannot write to the store at {self.root} ({e}); kernels are compiled but not cached",
            )
            self.counts.add(kind, errors=1)
            return None
        finally:
            if tmp is not None and tfd is not None:
                fs.rmtree_at(tfd, tmp)
            if dfd is not None:
                os.close(dfd)  # lets go of the hold (committed, or removed above)
        if _origin == "remote":  # --- shared tier (issue 15)
            self.counts.add(kind, remote_fills=1, bytes_written=rec.size)
        else:
            self.counts.add(kind, puts=1, bytes_written=rec.size)
            if self._remote_cfg is not None:
                try:
                    self.remote_tier().publish(rec, blobs)
                except Exception as e:
                    logger.debug("remote publish: %s", e)
        access = self.now()
        # The index row is written by the flush thread (a SQLite transaction, and the index's
        # first opening, cost milliseconds a compiling thread need not wait for); until then
        # the entry is on disk, served, and found by `verify`.
        with self._lock:
            if len(self._pending) < T.MAX_PENDING:
                self._pending[rec.id] = (rec, access)
        hit = Hit(rec, blobs, self, time.time(), inos)
        try:
            self._evictor.after_put(entry_bytes(rec), ident)
        except Exception as e:  # the bound is kept by the next put or the flush thread
            logger.debug("eviction after put: %s", e)
        self._maybe_flush()
        return hit

    def _write_member(
        self, dfd: int, name: str, data: bytes | str | os.PathLike
    ) -> tuple[bytes, os.stat_result]:
        """Write one member into the entry being built; returns (bytes, the member's fstat)."""
        if isinstance(data, (bytes, bytearray, memoryview)):
            blob = bytes(data)
            return blob, fs.write_new_at(dfd, name, blob)
        src = os.fspath(data)
        blob, sst = fs.read_at(None, src, 1 << 40)
        if sst.st_uid == os.geteuid() and not sst.st_mode & 0o022:
            # A private file of ours (Triton's scratch): link it, and keep the link only if it is
            # the very file just read (no copy of a large binary).
            try:
                os.link(src, name, dst_dir_fd=dfd)
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == (sst.st_dev, sst.st_ino) and st.st_size == len(blob):
                    return blob, st
                os.unlink(name, dir_fd=dfd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dfd)
        return blob, fs.write_new_at(dfd, name, blob)

    def _commit(self, tmp: str, ident: str, kind: str, key: str) -> bool:
        """Rename the finished entry into place. True when committed; False when an intact entry
        is already there (``tmp`` is left to the caller to remove)."""
        tfd, efd = self._fd("tmp"), self._fd("entries")
        dst = f"{ident[:2]}/{ident}"
        for _ in range(3):
            try:
                os.rename(tmp, dst, src_dir_fd=tfd, dst_dir_fd=efd)
                return True
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            try:
                if self._read(ident, kind, key) is not None:
                    return False  # another writer committed it first: keep theirs, immutable
            except CorruptEntry:
                pass
            self._remove_dirs([ident])  # a broken one is in the way: move it to trash
        raise OSError(errno.EEXIST, "entry is being replaced concurrently")

    def replace(
        self, kind: str, key: str, files: Mapping[str, bytes | str | os.PathLike], **kwargs: Any
    ) -> Hit | None:
        """Like :meth:`put`, but an existing entry for (kind, key) is removed first (a manifest
        that grows). Readers see the old entry, then none, then the new one; never a mix."""
        if self.readonly:
            return None
        # The folder only: the put's row replaces the old one (the index is not opened on the
        # compiling thread); if the put fails, the row of a missing entry goes at eviction.
        self.remove([self.entry_id(kind, key)], index=False)
        return self.put(kind, key, files, **kwargs)

    def _remove_dirs(self, ids: list[str]) -> int:
        """Remove entry folders (see :meth:`_remove_entry`). Returns how many were removed."""
        return sum(self._remove_entry(ident) is not None for ident in ids)

    def _remove_entry(self, ident: str, *, later: bool = False) -> int | None:
        """Move an entry's folder to trash (atomically: of several removers, one wins), delete
        its files and count their bytes off the store's size, then the folder, following no
        link. A folder a process holds (its files handed out, see :mod:`.served`) stays whole in
        ``trash/`` until nobody does (its bytes are off the store's count at once: they are
        that process's until it lets go). ``later`` (eviction): the empty folder
        goes at the flush thread's next turn (:func:`.eviction.sweep`: removing a folder can cost
        milliseconds). The bytes freed, or None when it was not there (or not a folder of
        ours)."""
        efd, trfd = self._fd("entries"), self._fd("trash")
        if efd is None or trfd is None or not valid_id(ident):
            return None  # not a path of ours (a crafted index row): only its row goes
        try:
            st = os.stat(ident[:2], dir_fd=efd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                return None  # never move (and delete) what a linked shard points to
        except OSError:
            return None
        t = fs.unique_name(ident)
        try:
            os.rename(f"{ident[:2]}/{ident}", t, src_dir_fd=efd, dst_dir_fd=trfd)
        except OSError:
            return None
        # Off the store's size now, held or not: what live processes were handed is theirs
        # (gone when they are), not the store's.
        freed = folder_bytes(trfd, t)
        self._evictor.usage.add(-freed)
        if drop_trash(trfd, t, keep_empty=later) is None or later:
            self._trash_left = True  # held (its files were handed out): it goes when let go
        with self._lock:
            self._pending.pop(ident, None)  # its row, not yet written, is not written
            self._touches.pop(ident, None)  # nor its last use: that would write the row again
            self._touched_records.pop(ident, None)
        return freed

    def _drop_row(self, ident: str) -> None:
        """Have the next flush drop the index row of an entry removed here (eviction)."""
        with self._lock:
            if len(self._dropped) < T.MAX_PENDING:
                self._dropped.add(ident)

    def _wake_flush(self) -> None:
        """The flush thread's turn now (the store is past its bound), not in a second."""
        self._maybe_flush()
        self._wake.set()

    def remove(self, ids: list[str], *, index: bool = True) -> int:
        """Delete entries: their folders first (that frees the space, and works on a full disk),
        then their index rows (``index``; a failure there is ignored: rows of missing entries are
        dropped by eviction and ``verify --fix``). Returns how many folders were removed."""
        if self.readonly:
            raise StoreError("the store is read-only")
        n = self._remove_dirs(ids)
        if index:
            self._index_call(lambda idx: idx.remove(ids))
        return n

    # ------------------------------------------------------------------ single flight
    def lock_for(self, kind: str, key: str) -> Lock | None:
        """An unacquired cross-process lock for (kind, key) (see :mod:`.locks`); None when the store
        is read-only or its ``locks/`` folder is missing."""
        lfd = self._fd("locks")
        if self.readonly or lfd is None:
            return None
        return Lock(lfd, self.entry_id(kind, key) + ".lock")

    def lock(self, kind: str, key: str, timeout: float) -> Lock | None:
        """The cross-process lock for (kind, key), held; None after ``timeout`` seconds, on a
        read-only store or when the lock cannot be taken (one warning). Release it with
        ``release()``. The kernel drops it when the holder dies."""
        lk = self.lock_for(kind, key)
        if lk is None:
            return None
        try:
            if lk.acquire(timeout):
                return lk
            warn_once(
                "lock-timeout",
                f"waited {timeout:.0f}s for another process compiling the same kernel; compiling here",
            )
        except Exception as e:
            warn_once("lock-error", f"cannot lock in {self.locks}: {e}")
        return None

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


# ---------------------------------------------------------------------- fork safety
# A fork copies the locks as they were: one held by another thread at that moment would never
# be released in the child, whose first lookup would then hang. Every open store's locks are
# taken just before a fork and let go just after it, in the parent; the child gets new ones,
# and its own private folders (its parent's stay its parent's).
_STORES: weakref.WeakSet[Store] = weakref.WeakSet()
# Per thread: two threads may fork at once, and each must let go of its own locks only.
_FORK_HELD = threading.local()
_FORK_LOCK_WAIT_S = 2.0  # a state lock held longer than this (a stuck thread) is not waited for


def _store_locks(store: Store) -> list[Any]:
    # Only the locks that guard in-memory state, held for microseconds: the buffers (``_lock``)
    # and the counters. The index and flush locks are held across SQLite work and eviction
    # (seconds): the child gets new ones and never uses its parent's connection, so a fork
    # need not wait for them.
    return [store._lock, store.counts._lock]


# Two threads forking at once run these handlers at once: one at a time, or each would wait
# out the other's locks (and time out).
_FORK_SERIAL = threading.Lock()


def _before_fork() -> None:
    held: list[Any] = []
    if _FORK_SERIAL.acquire(timeout=_FORK_LOCK_WAIT_S):
        held.append(_FORK_SERIAL)
    for store in list(_STORES):
        for lk in _store_locks(store):
            if lk.acquire(timeout=_FORK_LOCK_WAIT_S):
                held.append(lk)
    _FORK_HELD.locks = held


def _after_fork_parent() -> None:
    held = getattr(_FORK_HELD, "locks", [])
    _FORK_HELD.locks = []
    for lk in reversed(held):
        with contextlib.suppress(RuntimeError):
            lk.release()


# A forked child must not close (nor use) its parent's SQLite connection: SQLite forbids
# carrying one across fork, and closing it could checkpoint or unlock the parent's files. The
# child keeps the objects, unused, for its life.
_PARENTS_CONNECTIONS: list[Any] = []


def _after_fork_child() -> None:
    global _FORK_SERIAL
    _FORK_SERIAL = threading.Lock()
    _FORK_HELD.locks = []
    for store in list(_STORES):
        if store._index is not None:
            _PARENTS_CONNECTIONS.append(store._index)
            store._index = None
        store._flush_lock = threading.Lock()
        store._lock = threading.RLock()
        store._index_lock = threading.RLock()
        # What the parent has yet to write is the parent's to write: counted once, not twice.
        store.counts.after_fork()
        store._touches, store._touched_records, store._misses, store._pending = {}, {}, [], {}
        store._dropped, store._wake = set(), threading.Event()
        with contextlib.suppress(Exception):
            store._evictor.after_fork()
        with contextlib.suppress(Exception):
            store._served_files.after_fork()
    _counters.GLOBAL.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
    )


_MEMO_MAX = 4096  # verified hits remembered per store and process


def _sig(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is replaced or written: its inode, size and times."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Held:
    """What the memo keeps of a verified hit whose entry folder this process holds."""

    __slots__ = ("record", "paths", "pin", "rsig", "inos", "files", "record_path")

    def __init__(self, hit: Hit, rsig: tuple[int, ...]) -> None:
        rec = hit.record
        self.record, self.paths, self.pin, self.rsig = rec, dict(hit._paths or {}), hit._pin, rsig
        self.inos, self.files = dict(hit._inos), {f.name: f for f in rec.files}
        self.record_path = f"{rec.id[:2]}/{rec.id}/{RECORD_NAME}"


class _HeldBlobs(dict):  # type: ignore[type-arg]
    """A remembered hit's bytes, read again from its held entry folder when asked (and checked
    against the record as they are read): the memo holds no file's bytes."""

    __slots__ = ("_pin", "_files")

    def __init__(self, pin: int, files: dict[str, Any]) -> None:
        super().__init__()
        self._pin, self._files = pin, files

    def __missing__(self, name: str) -> bytes:
        f = self._files[name]
        data, _st = fs.read_at(self._pin, name, f.size)
        if len(data) != f.size or not f.check(data):
            raise OSError(errno.EIO, f"member {name} changed since it was verified")
        return data


def _sha256(data: bytes) -> Any:
    import hashlib  # here, not at the top: kept off kcache's start-up

    return hashlib.sha256(data)
