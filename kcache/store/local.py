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
  (:attr:`Hit.paths`) are hard links (or copies) of the verified files in a private per-process
  folder, reached through ``/proc/self/fd``: eviction, ``kcache clear`` or a swapped folder
  cannot remove or change a file between the check and the library's open or dlopen.
- Its own clock. Last use, protection and eviction's grace period are judged by the
  filesystem's clock (the mtime a write gives a file), not by the process's: a process whose
  clock runs ahead cannot evict what others use.
- The hit path never touches the index. Last-use times go to the index in batches, from a
  daemon thread; the record's mtime is refreshed at most once a minute.
- Fails open. Every failure (full disk, read-only or locked store, corrupt index) degrades to a
  miss or a skipped write with one warning: :meth:`get` and :meth:`put` never raise.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack

from .. import counters as _counters
from ..kinds import valid_id
from ..log import logger, warn_once
from . import fs
from .index import DB_NAME, Index, is_corrupt_db
from .locks import Lock
from .records import RECORD_NAME, CorruptRecord, Record, entry_id, file_info, valid_name
from .safety import UnsafeStore, check_root, insecure_parent, insecure_path, is_network_fs, make_private_dir

MARKER = "KCACHE_STORE"
STORE_SCHEMA = 1
SUBDIRS = ("entries", "tmp", "trash", "locks", "index")
GRACE_S = 120.0  # eviction leaves entries used this recently alone
TOUCH_EVERY_S = 60.0  # a hit refreshes the record's mtime at most this often
FLUSH_EVERY_S = 1.0  # batched index writes (last use, counters, misses) at most this often
INDEX_BACKOFF_S = 5.0  # after an index failure, leave the index alone this long
INDEX_BUSY_BACKOFF_S = 0.5  # after finding it locked by other writers
INDEX_BUSY_WARN_AFTER = 1  # found locked this many times in a row (past the busy timeout): one warning
MAX_PENDING = 10_000  # index inserts kept for a later flush while the index is busy
STALE_TMP_S = 3600.0  # tmp/ leftovers older than this go, whoever made them
MAX_RECORD = 1 << 20
MAX_PROTECT_S = 365 * 86400.0
_OLD_INDEX_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")  # the diskcache index of kcache 0.1


class StoreError(Exception):
    """The store cannot be used (the message says why); caching stays off."""


class _Corrupt(Exception):
    """An entry that fails its checks: quarantined (if ``ino`` is still the record read)."""

    def __init__(self, msg: str, ino: int | None = None) -> None:
        super().__init__(msg)
        self.ino = ino


class _Refused(Exception):
    """Something in the store that is not ours to trust (owner, mode, a link): a miss, never
    served and never deleted by a lookup."""


class Hit:
    """A verified entry. :meth:`read` gives a member's verified bytes; :attr:`paths` gives real
    files holding them, with the members' own names (Triton reads a file's type from its suffix),
    that stay as they are for the life of this process."""

    __slots__ = ("record", "_blobs", "_inos", "_store", "_paths", "mtime")

    def __init__(
        self,
        record: Record,
        blobs: dict[str, bytes],
        inos: dict[str, tuple[int, int]],
        store: Store | None,
        mtime: float = 0.0,
    ) -> None:
        self.record, self._blobs, self._inos, self._store = record, blobs, inos, store
        self._paths: dict[str, str] | None = None
        self.mtime = mtime

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
        """Member name -> path of a private file holding the verified bytes (made on first use)."""
        if self._paths is None:
            if self._store is None:
                raise OSError("no store to serve files from")
            self._paths = self._store._serve(self)
        return self._paths


class Store:
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
        self._lock = threading.Lock()
        self._index: Index | None = None
        self._index_pid = 0
        self._index_off_until = 0.0
        self._busy_since: float | None = None
        self._busy_count = 0
        self._touches: dict[str, tuple[float, int]] = {}
        self._touched_records: dict[str, Record] = {}
        self._misses: list[tuple[float, str, str, dict[str, Any]]] = []
        self._pending: dict[str, tuple[Record, float | None]] = {}
        self._flush_lock = threading.Lock()
        self._flusher_pid: int | None = None
        self._size_estimate: int | None = None
        self._size_checked = 0.0
        self._closed = False
        self._clock_fd: int | None = None
        self._clock_offset = 0.0
        self._real_shards: set[str] = set()
        self._private: dict[str, _Private] = {}
        self._served: dict[str, tuple[dict[tuple[int, int], int], dict[str, str]]] = {}
        self._served_n = 0
        # --- shared tier (issue 15): set by attach_remote; the tier is made on first need.
        self._remote_cfg: Any = None
        self._remote: Any = None

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        root: Path | str,
        *,
        max_size: int = 10 * 1024**3,
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
        or not ``create``; an empty one becomes a store only with ``create``."""
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
        max_size: int,
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
                    f"{path}: another user decides where this path leads ({why_named}); {_INSECURE_HINT}"
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
                    f"folder only you (or root) can write, or {_INSECURE_HINT}"
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
                why = _unwritable(root_fd)
                if why:
                    # Used as KCACHE_READONLY=1 would: hits served, nothing written, one warning.
                    warn_once(
                        "store-unwritable", f"{path} {why}: using it read-only (new kernels are not cached)"
                    )
                    readonly = True
                    if owners is not None:
                        owners = fs.trusted_owners(True)
            _check_marker(root_fd, path, readonly=readonly, create=create)
            nfs = is_network_fs(Path(real)) if network_fs is None else network_fs
            for sub in SUBDIRS:
                if sub == "index" and nfs:
                    fds[sub] = None  # no SQLite file on a network filesystem (below)
                    continue
                fds[sub] = _open_sub(root_fd, sub, path, owners, create=not readonly)
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
                fds["index"] = _node_local_index(base, os.path.basename(index_dir), readonly)
        except BaseException:
            for fd in fds.values():
                if fd is not None:
                    os.close(fd)
            raise
        store = cls(
            Path(path),
            fds,
            max_size=max_size,
            readonly=readonly,
            key_tag=key_tag,
            trust_host_code=trust,
            owners=owners,
            index_dir=index_dir,
            network_fs=nfs,
            drain_global=drain_global,
            index_timeout=index_timeout,
        )
        if not readonly:
            store._refresh_clock()
            atexit.register(store.close)
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
            max_size=settings.max_size,
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

    # --- shared tier (issue 15): the wiring. The tier itself is kcache/store/remote.py; it is
    # imported (and redis with it) at the first local miss or put, never on the hit path.
    def attach_remote(self, settings: Any) -> bool:
        """Use the shared tier named by ``settings`` (:class:`kcache.config.Settings`) from now
        on. A bad shared-tier setting warns once and leaves the tier off (local caching goes
        on). Returns True when attached."""
        problems = list(getattr(settings, "remote_problems", None) or [])
        if problems:
            warn_once("remote-settings", "the shared tier is off: " + "; ".join(problems))
            return False
        from .remote import RemoteConfig

        cfg = RemoteConfig.from_settings(settings)
        if cfg is not None:
            cfg.key_tag = self.key_tag
        self._remote_cfg, self._remote = cfg, None
        return cfg is not None

    def remote_tier(self) -> Any:
        """The shared tier (:class:`kcache.store.remote.RemoteTier`), made on first use; None
        when none is attached."""
        if self._remote is None and self._remote_cfg is not None and not self._closed:
            with self._lock:
                if self._remote is None:
                    from .remote import RemoteTier

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
        self.flush(force=True)
        self._closed = True
        with self._lock:
            if self._index is not None and self._index_pid == os.getpid():
                with contextlib.suppress(Exception):
                    self._index.close()
            self._index = None
        for p in self._private.values():
            p.remove()
        self._private.clear()
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
                raise _Corrupt("entry is not a folder (or is a link)") from None
            raise
        if self._owners is not None:
            try:
                fs.check_stat(os.fstat(dfd), f"entry {ident[:12]}", self._owners, want_dir=True)
            except fs.UnsafePath as e:
                os.close(dfd)
                raise _Refused(str(e)) from None
        return dfd

    def _check_shard(self, shard: str, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode):
            raise _Refused(f"entries/{shard} is a link or not a folder")
        if self._owners is not None:
            try:
                fs.check_stat(st, f"entries/{shard}", self._owners, want_dir=True)
            except fs.UnsafePath as e:
                raise _Refused(str(e)) from None
        self._real_shards.add(shard)

    def _read(
        self, ident: str, kind: str | None, key: str | None, *, full: bool = False, touch: bool = False
    ) -> Hit | None:
        if not valid_id(ident):
            raise _Corrupt(f"invalid entry id {ident!r}")
        dfd = self._entry_fd(ident)
        if dfd is None:
            return None
        try:
            return self._read_at(dfd, ident, kind, key, full, touch)
        finally:
            os.close(dfd)

    def _read_at(
        self, dfd: int, ident: str, kind: str | None, key: str | None, full: bool, touch: bool
    ) -> Hit | None:
        try:
            rfd = os.open(RECORD_NAME, fs.O_READ, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _Corrupt("record is a link") from None
            raise
        try:
            st = os.fstat(rfd)
            if not stat.S_ISREG(st.st_mode):
                raise _Corrupt("record is not a regular file", st.st_ino)
            self._check_owner(st, f"record of {ident[:12]}")
            if st.st_size > MAX_RECORD:
                raise _Corrupt("record too large", st.st_ino)
            data = fs.read_exact(rfd, st.st_size)
            try:
                rec = Record.decode(data)
            except CorruptRecord as e:
                raise _Corrupt(str(e), st.st_ino) from None
            if (
                rec.id != ident
                or (kind is not None and rec.kind != kind)
                or (key is not None and rec.key != key)
            ):
                raise _Corrupt("record does not belong to this entry", st.st_ino)
            blobs: dict[str, bytes] = {}
            inos: dict[str, tuple[int, int]] = {}
            for f in rec.files:
                try:
                    mfd = os.open(f.name, fs.O_READ, dir_fd=dfd)
                except OSError as e:
                    raise _Corrupt(f"member {f.name}: {e.strerror}", st.st_ino) from None
                try:
                    mst = os.fstat(mfd)
                    if not stat.S_ISREG(mst.st_mode):
                        raise _Corrupt(f"member {f.name} is not a regular file", st.st_ino)
                    self._check_owner(mst, f"member {f.name} of {ident[:12]}")
                    if mst.st_size != f.size:  # truncated or grown: no need to read it
                        raise _Corrupt(f"member {f.name}: size {mst.st_size} != {f.size}", st.st_ino)
                    blob = fs.read_exact(mfd, f.size)
                finally:
                    os.close(mfd)
                if len(blob) != f.size:
                    raise _Corrupt(f"member {f.name}: size {len(blob)} != {f.size}", st.st_ino)
                if not f.check(blob):
                    raise _Corrupt(f"member {f.name}: checksum mismatch", st.st_ino)
                if full and _sha256(blob).hexdigest() != f.sha256:
                    raise _Corrupt(f"member {f.name}: sha256 mismatch", st.st_ino)
                blobs[f.name] = blob
                inos[f.name] = (mst.st_dev, mst.st_ino)
            mtime = st.st_mtime
            if touch and not self.readonly and abs(self.now() - mtime) > TOUCH_EVERY_S:
                # The record's mtime is what eviction checks before deleting: refreshed here (by
                # the filesystem's clock), a hit is safe from eviction for GRACE_S without a
                # database write per hit. A protected entry (mtime in the future) loses its
                # protection at its first real use.
                with contextlib.suppress(OSError):
                    os.utime(rfd)
                    mtime = os.fstat(rfd).st_mtime
        finally:
            os.close(rfd)
        return Hit(rec, blobs, inos, self, mtime)

    def _check_owner(self, st: os.stat_result, what: str) -> None:
        if self._owners is not None and (
            st.st_uid not in self._owners or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        ):
            raise _Refused(f"{what} is owned by uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):o})")

    def get(
        self,
        kind: str,
        key: str,
        components: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        *,
        count: bool = True,
        remote: bool = True,
    ) -> Hit | None:
        """The verified entry for (kind, key), or None. Never raises.

        A hit is counted (with ``count``) and its last use noted in memory for the next batched
        index write. A miss is counted and, with ``components`` (or a callable that gives them),
        remembered for ``kcache explain``. An entry that fails its checks is a miss: a corrupt
        one is removed (one warning), one that is not this user's is left alone and refused.

        With a shared tier attached (and ``remote``), a local miss asks it; an entry found there
        is checked, committed here and returned like a local hit (counted as a hit)."""
        ident = self.entry_id(kind, key)
        hit = None
        try:
            hit = self._read(ident, kind, key, touch=count and self.hits_are_use)
        except _Corrupt as e:
            self._on_corrupt(ident, kind, str(e), e.ino)
        except _Refused as e:
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
        if hit is not None:
            if count:
                self.counts.add(kind, hits=1, saved_s=hit.record.compile_s)
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
        except (_Corrupt, _Refused, OSError) as e:
            return None, str(e) or type(e).__name__

    def read_record(self, ident: str) -> tuple[Record | None, str | None]:
        """The entry's own record (its members are not read), or (None, why)."""
        if not valid_id(ident):
            return None, "not an entry id"
        try:
            dfd = self._entry_fd(ident)
        except (_Corrupt, _Refused, OSError) as e:
            return None, str(e)
        if dfd is None:
            return None, "missing"
        try:
            data, st = fs.read_at(dfd, RECORD_NAME, MAX_RECORD)
            self._check_owner(st, "record")
            rec = Record.decode(data)
        except FileNotFoundError:
            return None, "no record file"
        except (OSError, fs.UnsafePath, CorruptRecord, _Refused) as e:
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
        self._maybe_flush()

    def _on_corrupt(self, ident: str, kind: str, why: str, ino: int | None) -> None:
        if ino is not None:
            # Only quarantine (and report) what we read: an entry removed (clear, eviction) or
            # replaced by another process while we read it loses its members under us, which is
            # a plain miss, not corruption.
            efd = self._fd("entries")
            try:
                if (
                    efd is None
                    or os.stat(f"{ident[:2]}/{ident}/{RECORD_NAME}", dir_fd=efd, follow_symlinks=False).st_ino
                    != ino
                ):
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

    # ------------------------------------------------------------------ served files
    def _private_dir(self, role: str) -> tuple[int, str]:
        """This process's private folder for ``role`` ("served", "scratch"): inside ``tmp/`` of a
        writable store (same filesystem: members are hard-linked, not copied), else a new private
        folder under the system's temporary folder. Returns (descriptor, name). A folder removed
        under the process (``kcache clear``, another process's ``clean_tmp``) is made anew.
        Removed at close and exit."""
        pid = os.getpid()
        cur = self._private.get(role)
        if cur is not None and cur.pid == pid and cur.alive():
            return cur.fd, cur.name
        tfd = None if self.readonly else self._fd("tmp")
        if tfd is not None:
            name = fs.unique_name(role)
            try:
                fd = fs.open_dir_at(tfd, name, f"tmp/{name}", fs.trusted_owners(False), create=True)
                self._private[role] = _Private(fd, tfd, name, own_parent=False)
                return fd, name
            except (OSError, fs.UnsafePath):
                pass
        import tempfile

        path = tempfile.mkdtemp(prefix=f"kcache-{role}-")  # 0700, made with O_EXCL semantics
        parent = fs.open_dir(os.path.dirname(path), "the temporary folder", None)
        try:
            fd = fs.open_dir_at(parent, os.path.basename(path), path, fs.trusted_owners(False))
        except BaseException:
            os.close(parent)
            raise
        self._private[role] = _Private(fd, parent, os.path.basename(path), own_parent=True)
        return fd, os.path.basename(path)

    def _serve(self, hit: Hit) -> dict[str, str]:
        """Private files holding a hit's verified members (see :attr:`Hit.paths`)."""
        with self._lock:
            sfd, sname = self._private_dir("served")
            rec = hit.record
            key = {f.name: hit._inos.get(f.name) for f in rec.files}
            cached = self._served.get(rec.id)
            if cached is not None and cached[0] == key:
                return dict(cached[1])
            self._served_n += 1
            sub = f"{rec.id[:16]}.{self._served_n}"
            os.mkdir(sub, 0o700, dir_fd=sfd)
            subfd = os.open(sub, fs.O_DIR, dir_fd=sfd)
            efd = self._fd("entries")
            try:
                for f in rec.files:
                    linked = False
                    ino = hit._inos.get(f.name)
                    if efd is not None and ino is not None and not self._closed:
                        # A hard link of the file that was verified (checked after linking: the
                        # same inode), else a copy of the verified bytes.
                        try:
                            os.link(
                                f"{rec.id[:2]}/{rec.id}/{f.name}",
                                f.name,
                                src_dir_fd=efd,
                                dst_dir_fd=subfd,
                                follow_symlinks=False,
                            )
                            st = os.stat(f.name, dir_fd=subfd, follow_symlinks=False)
                            linked = (st.st_dev, st.st_ino) == ino
                            if not linked:
                                os.unlink(f.name, dir_fd=subfd)
                        except OSError:
                            linked = False
                    if not linked:
                        fs.write_new_at(subfd, f.name, hit._blobs[f.name])
            finally:
                os.close(subfd)
            paths = {f.name: fs.fd_path(sfd, sub, f.name, fallback=None) for f in rec.files}
            self._served[rec.id] = (key, paths)  # type: ignore[assignment]
            return dict(paths)

    def scratch_dir(self) -> str:
        """A private folder of this process for files on their way into the store (Triton writes
        a kernel's members there before they are committed as one entry). Returns a path that
        resolves through the folder's descriptor. Removed at exit."""
        with self._lock:
            fd, _name = self._private_dir("scratch")
            return fs.fd_path(fd, fallback=None)

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
        :attr:`protect_s`) keeps the entry from eviction until its first hit or that many seconds.

        With a shared tier attached, the committed entry is also queued for it (the caller does
        not wait). ``_origin="remote"``: the entry came from the shared tier (counted as
        ``remote_fills``, not as a put, and not sent back)."""
        if self.readonly or self._closed:
            return None
        protect_s = min(float(protect_s or self.protect_s or 0.0), MAX_PROTECT_S)
        ident = self.entry_id(kind, key)
        tfd, efd = self._fd("tmp"), self._fd("entries")
        tmp = None
        try:
            if tfd is None or efd is None:
                raise OSError(errno.ENOENT, "the store's folders are missing")
            for name in files:
                if not valid_name(name):
                    raise ValueError(f"invalid member name {name!r}")
            tmp = fs.unique_name(ident)
            os.mkdir(tmp, 0o700, dir_fd=tfd)
            dfd = os.open(tmp, fs.O_DIR, dir_fd=tfd)
            try:
                infos, blobs, inos = [], {}, {}
                for name, data in files.items():
                    blob, st = self._write_member(dfd, name, data)
                    infos.append(file_info(name, blob))
                    blobs[name], inos[name] = blob, (st.st_dev, st.st_ino)
                rec = Record(
                    kind=kind,
                    key=key,
                    id=ident,
                    files=infos,
                    created=self.now(),
                    compile_s=float(compile_s),
                    components=dict(components or {}),
                    summary=dict(summary or {}),
                )
                fs.write_new_at(dfd, RECORD_NAME, rec.encode())
                if protect_s:
                    t = self._refresh_clock() + protect_s
                    os.utime(RECORD_NAME, (t, t), dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
            shard = ident[:2]
            if shard not in self._real_shards:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(shard, 0o700, dir_fd=efd)
                self._check_shard(shard, os.stat(shard, dir_fd=efd, follow_symlinks=False))
            if not self._commit(tmp, ident, kind, key):
                existing = self._read(ident, kind, key, touch=self.hits_are_use)
                if existing is not None and self.hits_are_use:
                    self._note_use(existing.record)  # returned like a hit: kept from eviction like one
                return existing
            tmp = None
        except _Refused as e:  # said once, under the topic a lookup of it uses
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
        if _origin == "remote":  # --- shared tier (issue 15)
            self.counts.add(kind, remote_fills=1, bytes_written=rec.size)
        else:
            self.counts.add(kind, puts=1, bytes_written=rec.size)
            if self._remote_cfg is not None:
                try:
                    self.remote_tier().publish(rec, blobs)
                except Exception as e:
                    logger.debug("remote publish: %s", e)
        access = self.now() + protect_s if protect_s else self.now()

        def insert(idx: Index) -> bool:
            idx.insert(rec, last_used=access)
            return True

        if not self._index_call(insert):
            # The index was busy (many writers at once) or is backing off: keep the row for the
            # next flush, so the entry is counted for stats and eviction rather than lost to them.
            with self._lock:
                if len(self._pending) < MAX_PENDING:
                    self._pending[rec.id] = (rec, access)
        hit = Hit(rec, blobs, inos, self, time.time())
        self._after_put(rec.size)
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
            except _Corrupt:
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
        self.remove([self.entry_id(kind, key)])
        return self.put(kind, key, files, **kwargs)

    def _remove_dirs(self, ids: list[str]) -> int:
        """Move entry folders to trash (atomically), then delete them, following no link.
        Returns how many were removed."""
        efd, trfd = self._fd("entries"), self._fd("trash")
        if efd is None or trfd is None:
            return 0
        n = 0
        for ident in ids:
            if not valid_id(ident):
                continue  # not a path of ours (a crafted index row): only its row goes
            try:
                st = os.stat(ident[:2], dir_fd=efd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    continue  # never move (and delete) what a linked shard points to
            except OSError:
                continue
            t = fs.unique_name(ident)
            try:
                os.rename(f"{ident[:2]}/{ident}", t, src_dir_fd=efd, dst_dir_fd=trfd)
            except OSError:
                continue
            n += 1
            fs.rmtree_at(trfd, t)
        return n

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
        self.protect_s, self.hits_are_use = min(float(seconds), MAX_PROTECT_S), False

        def undo() -> None:
            self.protect_s, self.hits_are_use = before

        return undo

    # ------------------------------------------------------------------ index (best effort)
    def index(self) -> Index:
        """The index, opened on first use (read-only on a read-only store). Raises if it cannot
        be opened (callers catch). A new index (first use, an older kcache's index, one that was
        corrupt) is filled from the entry folders."""
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
            self._fill_index(idx)
        return idx

    def rebuild_index(self) -> Index:
        """Replace the index by a new one filled from the entry folders (a corrupt index, or
        ``kcache verify --fix``). Counters and the miss log start anew."""
        if self.readonly:
            raise StoreError("the store is read-only")
        ifd = self._fd("index")
        if ifd is None:
            raise StoreError("the store has no index folder")
        with self._lock:
            if self._index is not None and self._index_pid == os.getpid():
                with contextlib.suppress(Exception):
                    self._index.close()
            self._index = None
            for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=ifd)
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
        for name in _OLD_INDEX_FILES:  # kcache 0.1's diskcache index: superseded, rebuilt from entries
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=ifd)
        for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
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
            if not is_corrupt_db(e):
                raise
            # A broken index is replaced, not fatal: entries are intact and self-describing.
            warn_once("index-corrupt", f"the index at {self.index_dir} is corrupt ({e}); starting a new one")
            for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=ifd)
            return Index.open(path, timeout=self.index_timeout)

    def _fill_index(self, idx: Index) -> None:
        """Add every intact entry's record to a new index (last use: the record's mtime)."""
        batch: list[tuple[Record, float | None]] = []
        try:
            for ident in self.iter_entry_ids():
                rec, _why = self.read_record(ident)
                if rec is not None:
                    batch.append((rec, self.record_mtime(ident)))
                if len(batch) >= 500:
                    idx.insert_many(batch)
                    batch = []
            if batch:
                idx.insert_many(batch)
        except Exception as e:
            warn_once(
                "index-fill",
                f"could not fill the new index from the entries ({e}); `kcache verify --fix` does",
            )

    def _index_call(self, fn: Callable[[Index], Any]) -> Any:
        if self.readonly or self._closed or time.monotonic() < self._index_off_until:
            return None
        try:
            out = fn(self.index())
            self._busy_since, self._busy_count = None, 0
            return out
        except Exception as e:
            msg = str(e).lower()
            if isinstance(e, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg):
                # Other processes are writing (many ranks at once): expected, not worth a
                # warning, unless it lasts (a process holding the index for good). What was to
                # be written is kept for the next flush.
                now = time.monotonic()
                self._busy_since = self._busy_since or now
                self._busy_count += 1
                # 0.5 s, 1 s, 2 s, 4 s, then 5 s: soon again after a moment's contention, rarely
                # when another process holds the index for good (each try waits the busy timeout).
                back = min(INDEX_BACKOFF_S, INDEX_BUSY_BACKOFF_S * 2 ** min(self._busy_count - 1, 8))
                self._index_off_until = now + back
                logger.debug("index busy: %s", e)
                if self._busy_count >= INDEX_BUSY_WARN_AFTER:
                    warn_once(
                        "index-locked",
                        f"the store's index is locked by another process ({e}); hits and new kernels "
                        "go on, stats and eviction catch up when it is free",
                    )
                return None
            self._index_off_until = time.monotonic() + INDEX_BACKOFF_S
            full = "full" in msg  # SQLITE_FULL: the disk is full, said once for the store
            warn_once(
                "disk-full" if full else f"index:{type(e).__name__}",
                f"the store's index is unavailable ({type(e).__name__}: {e}); continuing without it",
            )
            if is_corrupt_db(e):
                with self._lock:
                    if self._index is not None and self._index_pid == os.getpid():
                        with contextlib.suppress(Exception):
                            self._index.close()
                    self._index = None
                    ifd = self._fd("index")
                    if ifd is not None:
                        for name in (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm"):
                            with contextlib.suppress(OSError):
                                os.unlink(name, dir_fd=ifd)
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
                    t = threading.Thread(target=self._flush_loop, name="kcache-flush", daemon=True)
                    t.start()

    def _flush_loop(self) -> None:
        pid = os.getpid()
        while not self._closed and os.getpid() == pid:
            time.sleep(FLUSH_EVERY_S)
            if self._closed:
                return
            try:
                self.flush()
            except Exception:  # flush never raises; a thread must not die loudly either
                pass

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
            recs, self._touched_records = self._touched_records, {}
            misses, self._misses = self._misses, []
            pending, self._pending = self._pending, {}
        deltas = self.counts.drain()
        if self.drain_global:
            for k, v in _counters.drain().items():
                deltas[k] = deltas.get(k, 0.0) + v
        if not (touches or misses or deltas or pending):
            return
        self._refresh_clock()

        def write(idx: Index) -> bool:
            with idx.transaction():
                for rec, access in pending.values():
                    idx.insert(rec, last_used=access)
                if deltas:
                    idx.add_counters(deltas)
                if touches:
                    for ident in idx.touch(touches):
                        if ident in recs:  # on disk but not in the index (a crash, a new index): add it
                            idx.insert(recs[ident], last_used=touches[ident][0], hits=touches[ident][1])
                if misses:
                    idx.add_misses(misses)
            return True

        if not self._index_call(write):
            self.counts.restore(deltas)  # keep the counts and rows for the next flush
            with self._lock:
                for ident, item in pending.items():
                    if len(self._pending) < MAX_PENDING:
                        self._pending.setdefault(ident, item)

    # ------------------------------------------------------------------ eviction
    def _after_put(self, size: int) -> None:
        now = time.monotonic()
        if self._size_estimate is None or now - self._size_checked > 30.0:
            total = self._index_call(lambda idx: idx.total_bytes())
            if total is None:
                return
            self._size_estimate, self._size_checked = total, now
        else:
            self._size_estimate += size
        if self._size_estimate > self.max_size:
            self.evict()

    def evict(self, target: int | None = None) -> tuple[int, int]:
        """Remove least recently used entries until the store is under ``target`` bytes (default
        90% of the bound). One process evicts at a time; others skip. Returns (entries, bytes).

        Entries used (or protected) within :data:`GRACE_S` by the filesystem's clock are never
        evicted, whatever this process's clock says: under many writers and a tiny bound the
        store can exceed its bound by what was written in the last two minutes."""
        if self.readonly or self._closed:
            return 0, 0
        target = int(self.max_size * 0.9) if target is None else target
        lfd = self._fd("locks")
        if lfd is None:
            return 0, 0
        lk = Lock(lfd, "evict.lock")
        try:
            if not lk.try_acquire():
                return 0, 0
        except OSError:
            return 0, 0
        removed = freed = 0
        try:
            self.flush(force=True)
            idx = self.index()
            total = idx.total_bytes()
            now = self._refresh_clock()
            while total > target:
                rows = idx.oldest(256, before=now - GRACE_S)
                if not rows:
                    break
                gone, refreshed = [], {}
                for ident, _at, size in rows:
                    mt = self.record_mtime(ident)
                    if mt is not None and mt > now - GRACE_S:
                        refreshed[ident] = (mt, 0)  # used or protected: not a candidate
                        continue
                    gone.append(ident)
                    total -= size
                    freed += size
                    if total <= target:
                        break
                if refreshed:
                    idx.touch(refreshed)
                if gone:
                    idx.remove(gone)
                    n = 0
                    now = self._refresh_clock()
                    for ident in gone:
                        # Checked again just before it goes: a hit since the check above has
                        # refreshed the record's mtime. (Its reader is safe either way: a hit's
                        # files are served from private links.)
                        mt = self.record_mtime(ident)
                        if mt is None or mt <= now - GRACE_S:
                            n += self._remove_dirs([ident])
                    removed += n
                    self.counts.add("store", evictions=n)
            self._size_estimate, self._size_checked = total, time.monotonic()
        except Exception as e:
            warn_once("evict", f"eviction failed: {e}")
        finally:
            lk.release()
        return removed, freed

    # ------------------------------------------------------------------ walking
    def iter_entry_ids(self) -> Iterator[str]:
        """The ids of the entry folders on disk (names that are not ids are skipped)."""
        for _shard, name, problem in self.scan():
            if problem is None:
                yield name

    def scan(self) -> Iterator[tuple[str, str, str | None]]:
        """(shard, name, problem) for everything under ``entries/``: problem None for an entry
        folder, else why the path does not belong there (a stray, for ``verify``)."""
        efd = self._fd("entries")
        if efd is None:
            return
        try:
            shards = sorted(os.listdir(efd))
        except OSError:
            return
        for shard in shards:
            try:
                st = os.stat(shard, dir_fd=efd, follow_symlinks=False)
            except OSError:
                continue
            if (
                len(shard) != 2
                or not all(c in "0123456789abcdef" for c in shard)
                or not stat.S_ISDIR(st.st_mode)
            ):
                yield shard, "", "not an entry shard"
                continue
            try:
                sfd = os.open(shard, fs.O_DIR, dir_fd=efd)
            except OSError as e:
                yield shard, "", f"unreadable: {e.strerror}"
                continue
            try:
                names = sorted(os.listdir(sfd))
                for name in names:
                    try:
                        est = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                    except OSError:
                        continue
                    if not valid_id(name) or name[:2] != shard or not stat.S_ISDIR(est.st_mode):
                        yield shard, name, "not an entry folder"
                    else:
                        yield shard, name, None
            finally:
                os.close(sfd)

    def entry_extras(self, ident: str, rec: Record) -> list[str]:
        """Files in the entry's folder that are not its members (strays, for ``verify``)."""
        try:
            dfd = self._entry_fd(ident)
        except (_Corrupt, _Refused, OSError):
            return []
        if dfd is None:
            return []
        try:
            return sorted(set(os.listdir(dfd)) - {f.name for f in rec.files} - {RECORD_NAME})
        except OSError:
            return []
        finally:
            os.close(dfd)

    def remove_stray(self, shard: str, name: str = "", member: str = "") -> bool:
        """Remove a path under ``entries/`` that is not an entry (or a stray file in an entry),
        following no link. True when it is gone."""
        efd = self._fd("entries")
        if self.readonly or efd is None or "/" in shard + name + member or ".." in (shard, name, member):
            return False
        if member:
            dfd = self._entry_fd(name)
            if dfd is None:
                return True
            try:
                return fs.rmtree_at(dfd, member)
            finally:
                os.close(dfd)
        trfd = self._fd("trash")
        src = f"{shard}/{name}" if name else shard
        t = fs.unique_name("stray")
        try:
            if trfd is not None:
                os.rename(src, t, src_dir_fd=efd, dst_dir_fd=trfd)
                return fs.rmtree_at(trfd, t)
        except OSError:
            pass
        if name:
            try:
                sfd = os.open(shard, fs.O_DIR, dir_fd=efd)
            except OSError:
                return False
            try:
                return fs.rmtree_at(sfd, name)
            finally:
                os.close(sfd)
        return fs.rmtree_at(efd, shard)

    def clean_tmp(self, min_age: float = STALE_TMP_S) -> int:
        """Remove what dead or long-gone writers left in ``tmp/`` and ``trash/`` (never this
        process's own folders). Follows no link: a link in there is removed, not followed.

        Run by ``kcache clear`` and ``verify --fix``, never on its own. "Dead" means no such pid
        in this process's pid namespace: containers that share one store each see only their
        own pids, so run those commands where no compile is in flight in another container."""
        if self.readonly:
            return 0
        n = 0
        now = self._refresh_clock()
        mine = {p.name for p in self._private.values() if p.pid == os.getpid()}
        for sub in ("tmp", "trash"):
            dfd = self._fd(sub)
            if dfd is None:
                continue
            try:
                names = os.listdir(dfd)
            except OSError:
                continue
            for name in names:
                if name in mine:
                    continue
                parts = name.split(".")
                pid = int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
                try:
                    age = now - os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime
                except OSError:
                    continue
                dead = pid is not None and pid != os.getpid() and not fs.pid_alive(pid)
                if sub == "trash" or dead or age > min_age:
                    fs.rmtree_at(dfd, name)
                    n += 1
        return n


class _Private:
    """A private folder of this process (see :meth:`Store._private_dir`)."""

    __slots__ = ("fd", "parent", "name", "own_parent", "pid")

    def __init__(self, fd: int, parent: int, name: str, *, own_parent: bool) -> None:
        self.fd, self.parent, self.name, self.own_parent, self.pid = fd, parent, name, own_parent, os.getpid()

    def alive(self) -> bool:
        """Still there under its name (not removed by another process's clean-up)."""
        try:
            return os.path.samestat(
                os.stat(self.name, dir_fd=self.parent, follow_symlinks=False), os.fstat(self.fd)
            )
        except OSError:
            return False

    def remove(self) -> None:
        """Close and delete it (only in the process that made it: a forked child leaves it)."""
        if self.pid != os.getpid():
            return
        with contextlib.suppress(OSError):
            os.close(self.fd)
        fs.rmtree_at(self.parent, self.name)
        if self.own_parent:
            with contextlib.suppress(OSError):
                os.close(self.parent)


_INSECURE_HINT = "set KCACHE_ALLOW_INSECURE=1 to use it anyway (launchers and pickled entries are then never taken from it)"


def _node_local_index(base: str, name: str, readonly: bool) -> int | None:
    """The node-local index folder ``<base>/<name>`` of a store on a network filesystem, opened
    folder by folder with the store's rules (``$XDG_CACHE_HOME/kcache-index`` may not be a link
    another user planted: SQLite would write wherever it leads). None when absent (read-only)."""
    owners = fs.trusted_owners(readonly)
    parent = os.path.dirname(base)
    if not readonly:
        make_private_dir(Path(parent))
    why = insecure_path(parent) or insecure_parent(os.path.join(parent, "x"))
    if why:
        raise UnsafeStore(f"the node-local index folder {base}: {why}")
    try:
        pfd = fs.open_dir(parent, parent, None)
    except FileNotFoundError:
        return None
    try:
        bfd = fs.open_dir_at(pfd, os.path.basename(base), base, owners, create=not readonly)
    except FileNotFoundError:
        return None
    finally:
        os.close(pfd)
    try:
        return fs.open_dir_at(bfd, name, os.path.join(base, name), owners, create=not readonly)
    except FileNotFoundError:
        return None
    finally:
        os.close(bfd)


def _open_sub(
    root_fd: int, sub: str, path: str, owners: frozenset[int] | None, *, create: bool
) -> int | None:
    """One of the store's own folders, opened and checked; None if absent on a read-only store."""
    try:
        return fs.open_dir_at(root_fd, sub, f"{path}/{sub}", owners, create=create)
    except FileNotFoundError:
        if create:
            raise
        return None
    except fs.UnsafePath as e:
        raise UnsafeStore(f"{e}: refusing the store (nothing in it is used or deleted)") from None


def _check_marker(root_fd: int, path: str, *, readonly: bool, create: bool) -> None:
    try:
        data, _st = fs.read_at(root_fd, MARKER, 1 << 16)
    except FileNotFoundError:
        data = None
    except fs.UnsafePath as e:
        raise StoreError(f"{path}: {e}") from None
    if data is None:
        # Several processes may create the same new store at once (the ranks of a job): another
        # one's marker being written (.KCACHE_STORE.* renamed into place) is not foreign content,
        # and neither is what it adds once its marker is in place.
        names = os.listdir(root_fd)
        foreign = [n for n in names if n != MARKER and not n.startswith(f".{MARKER}.")]
        try:
            data, _st = fs.read_at(root_fd, MARKER, 1 << 16)
        except (FileNotFoundError, fs.UnsafePath):
            data = None
        if data is None:
            if foreign:
                raise StoreError(f"{path} is not empty and is not a kcache store (no {MARKER} file)")
            if readonly or not create:
                raise StoreError(f"{path} is not a kcache store (an empty folder)")
            body = msgpack.packb({"format": "kcache-store", "schema": STORE_SCHEMA})
            tmp = f".{MARKER}.{os.getpid()}.{os.urandom(4).hex()}"
            fs.write_new_at(root_fd, tmp, body)
            os.rename(tmp, MARKER, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            return
    try:
        info = msgpack.unpackb(data, raw=False)
        schema = info.get("schema") if isinstance(info, dict) else None
    except Exception:
        schema = None
    if schema != STORE_SCHEMA:
        raise StoreError(f"{path} holds a kcache store of another schema ({schema!r})")


def _unwritable(root_fd: int) -> str | None:
    """Why the store cannot be written (a read-only filesystem, no write permission), or None."""
    try:
        if os.fstatvfs(root_fd).f_flag & getattr(os, "ST_RDONLY", 0):
            return "is on a read-only filesystem"
    except OSError:
        pass
    for sub in (".", "entries", "tmp", "locks"):
        try:
            os.stat(sub, dir_fd=root_fd, follow_symlinks=False)
        except OSError:
            continue  # not there yet: made with the store
        if not os.access(sub, os.W_OK | os.X_OK, dir_fd=root_fd):
            return (
                "is not writable (this user may not write it)"
                if sub == "."
                else f"is not writable ({sub} denies this user)"
            )
    return None


def _sha256(data: bytes) -> Any:
    import hashlib  # here, not at the top: kept off kcache's start-up

    return hashlib.sha256(data)
