"""The local store: one for every integration. It knows records and bytes, not libraries.

Layout under the store root::

    KCACHE_STORE            marker (a kcache store; its schema)
    entries/<id[:2]>/<id>/  one committed entry: its member files and ``__kcache__.rec``
    index/                  diskcache catalogue (see index.py); node-local on network filesystems
    tmp/                    entries being written, per writer, renamed into entries/ when complete
    trash/                  entries being deleted (renamed here first, then removed)
    locks/                  single-flight locks, one per entry id

Guarantees:
- An entry directory is complete or absent: it is written under tmp/ and renamed into place in
  one step, and never modified afterwards (a replacement first moves the old one to trash/).
- A hit reads the record and every member and checks sizes and checksums (xxh3, else crc32)
  before returning: torn, truncated, flipped or missing members are a miss (the entry is
  quarantined, one warning).
- Nothing read from disk is unpickled; member names and ids from records are checked to stay
  inside the entry directory; symlinked members and entry directories are refused.
- The hit path never touches the index. Last-use times go to the index in batches, and the
  record file's mtime is refreshed at most once a minute; eviction skips entries used within the
  grace period, so a file just returned by a hit is not deleted under its reader.
- Every failure (full disk, read-only or locked store, corrupt index) degrades to a miss or a
  skipped write with one warning: a store operation never raises into the caller.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgpack

from .. import counters as _counters
from ..log import warn_once
from .records import RECORD_NAME, CorruptRecord, Record, entry_id, file_info, valid_name
from .safety import UnsafeStore, check_dir, is_network_fs, make_private_dir

MARKER = "KCACHE_STORE"
STORE_SCHEMA = 1
GRACE_S = 120.0  # eviction leaves entries used this recently alone
TOUCH_EVERY_S = 60.0  # a hit refreshes the record's mtime at most this often
FLUSH_EVERY_S = 1.0  # batched index writes (last use, counters, misses) at most this often
INDEX_BACKOFF_S = 5.0  # after an index failure, leave the index alone this long
MAX_PENDING = 10_000  # index inserts kept for a later flush while the index is busy
STALE_TMP_S = 3600.0

_ID_RE = re.compile(r"[0-9a-f]{40}")
# O_NOFOLLOW: a symlinked member is refused; O_NONBLOCK: a FIFO planted as a member is refused
# (by fstat) instead of blocking the hit forever; it changes nothing for regular files.
_O_READ = (
    os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
)
_O_DIR = (
    os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)
_MAX_RECORD = 1 << 20


class StoreError(Exception):
    """The store cannot be used (the message says why); caching stays off."""


class _Corrupt(Exception):
    def __init__(self, msg: str, ino: int | None = None) -> None:
        super().__init__(msg)
        self.ino = ino


class Hit:
    """A verified entry: ``paths`` maps member names to absolute paths of real files."""

    def __init__(self, record: Record, dir: str, paths: dict[str, str]) -> None:
        self.record, self.dir, self.paths = record, dir, paths

    def __repr__(self) -> str:
        return f"Hit({self.record!r}, dir={self.dir!r})"

    def read(self, name: str) -> bytes:
        with open(self.paths[name], "rb") as f:
            return f.read()


def _shutil():  # imported on first use: the .pth hook imports this module at every start-up
    import shutil

    return shutil


def _sha256(data: bytes):
    import hashlib

    return hashlib.sha256(data)


def _read_exact(fd: int, size: int) -> bytes:
    """``size`` bytes from ``fd`` (fewer only at end of file), in one read when the kernel allows."""
    b = os.read(fd, size)
    if len(b) == size or not b:
        return b
    chunks = [b]
    left = size - len(b)
    while left > 0:
        b = os.read(fd, left)
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """A kcache store rooted at ``root``. Construct with :meth:`open`, which checks and creates it."""

    def __init__(
        self,
        root: Path,
        *,
        max_size: int,
        readonly: bool = False,
        key_tag: str = "",
        index_dir: Path | None = None,
        network_fs: bool = False,
        drain_global: bool = False,
        index_timeout: float = 0.25,
    ) -> None:
        self.root = Path(root)
        self.max_size = max_size
        self.readonly = readonly
        self.key_tag = key_tag
        self.network_fs = network_fs
        self.drain_global = drain_global
        self.index_timeout = index_timeout
        self._entries = os.path.join(str(self.root), "entries")
        self.tmp = self.root / "tmp"
        self.trash = self.root / "trash"
        self.locks = self.root / "locks"
        self.index_dir = index_dir or (self.root / "index")
        self.counts = _counters.Counters()
        self._lock = threading.Lock()
        self._index: Any = None
        self._index_off_until = 0.0
        self._touches: dict[str, tuple[float, int]] = {}
        self._touched_records: dict[str, Record] = {}
        self._misses: list[tuple[float, str, str, dict[str, Any]]] = []
        self._pending: dict[str, tuple[Record, float | None]] = {}
        self._flush_lock = threading.Lock()
        self._flusher_pid: int | None = None
        self._size_estimate: int | None = None
        self._size_checked = 0.0
        self._closed = False
        self._real_shards: set[str] = set()  # shard dirs seen to be real directories, not symlinks

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
        drain_global: bool = False,
        network_fs: bool | None = None,
    ) -> Store:
        """Check (and unless read-only, create) the store. Raises :class:`StoreError` with a reason."""
        root = Path(root).absolute()
        try:
            if root.exists() and not root.is_dir():
                raise StoreError(f"{root} exists and is not a directory")
            if not root.exists():
                if readonly:
                    raise StoreError(f"{root} does not exist (read-only: nothing to read)")
                make_private_dir(root)
            check_dir(root, readonly=readonly, allow_insecure=allow_insecure)
            if not readonly:
                why = _unwritable(root)
                if why:
                    # Used as KCACHE_READONLY=1 would: hits served, nothing written, one warning
                    # (instead of one per failed lock, write and index update).
                    warn_once(
                        "store-unwritable", f"{root} {why}: using it read-only (new kernels are not cached)"
                    )
                    readonly = True
            marker = root / MARKER
            if not marker.exists():
                # Several processes may create the same new store at once (the ranks of a job):
                # another one's marker being written (.KCACHE_STORE.* renamed into place) is not
                # foreign content, and neither is what it adds once its marker is in place.
                foreign = any(
                    p.name != MARKER and not p.name.startswith(f".{MARKER}.") for p in root.iterdir()
                )
                if foreign and not marker.exists():
                    raise StoreError(f"{root} is not empty and is not a kcache store (no {MARKER} file)")
                if not foreign and not readonly:
                    _atomic_write(marker, msgpack.packb({"format": "kcache-store", "schema": STORE_SCHEMA}))
            if marker.exists():
                try:
                    info = msgpack.unpackb(marker.read_bytes(), raw=False)
                    schema = info.get("schema") if isinstance(info, dict) else None
                except Exception:
                    schema = None
                if schema != STORE_SCHEMA:
                    raise StoreError(f"{root} holds a kcache store of another schema ({schema!r})")
            if not readonly:
                for sub in ("entries", "tmp", "trash", "locks"):
                    make_private_dir(root / sub)
        except UnsafeStore as e:
            raise StoreError(str(e)) from None
        except OSError as e:
            raise StoreError(f"cannot use {root}: {e.strerror or e}") from None
        nfs = is_network_fs(root) if network_fs is None else network_fs
        index_dir = None
        if nfs:
            # SQLite's locks are not safe on NFS/Lustre: entries stay shared (they are written by
            # rename and checked on read), the catalogue is kept on this node.
            base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kcache-index"
            index_dir = base / _sha256(str(root.resolve()).encode()).hexdigest()[:16]
            warn_once(
                "nfs",
                f"{root} is on a network filesystem; its index is kept node-local in {index_dir} "
                "(entries are shared, stats and eviction are per node)",
            )
        store = cls(
            root,
            max_size=max_size,
            readonly=readonly,
            key_tag=key_tag,
            index_dir=index_dir,
            network_fs=nfs,
            drain_global=drain_global,
        )
        if not readonly:
            atexit.register(store.close)
        return store

    def close(self) -> None:
        if self._closed:
            return
        self.flush(force=True)
        with self._lock:
            if self._index is not None:
                with contextlib.suppress(Exception):
                    self._index.close()
                self._index = None
        self._closed = True

    # ------------------------------------------------------------------ paths
    def entry_id(self, kind: str, key: str) -> str:
        return entry_id(kind, key, self.key_tag)

    def entry_dir(self, ident: str) -> str:
        return os.path.join(self._entries, ident[:2], ident)

    @staticmethod
    def valid_id(ident: object) -> bool:
        """True for an entry id as :func:`entry_id` makes them. Ids read from the index or from a
        directory listing are checked before they become paths: a crafted index row must not
        name a directory outside the store."""
        return isinstance(ident, str) and _ID_RE.fullmatch(ident) is not None

    # ------------------------------------------------------------------ reading
    def _read_entry(self, ident: str, kind: str | None, key: str | None, full: bool = False) -> Hit | None:
        if not self.valid_id(ident):
            raise _Corrupt(f"invalid entry id {ident!r}")
        d = self.entry_dir(ident)
        if ident[:2] not in self._real_shards:
            # The entry directory is opened with O_NOFOLLOW, which covers its last component only:
            # entries/ and the shard must be real directories too (checked once per process).
            for p in (self._entries, os.path.dirname(d)):
                try:
                    mode = os.lstat(p).st_mode
                except FileNotFoundError:
                    return None  # not created yet (or being created by another writer): a miss
                if not stat.S_ISDIR(mode):
                    raise _Corrupt("entries/ or its shard directory is a symlink")
            self._real_shards.add(ident[:2])
        # Everything is opened relative to the entry directory's own descriptor: the directory is
        # checked once (not a symlink), members cannot be swapped in through a renamed parent, and
        # each open resolves one path component instead of the whole path.
        try:
            dfd = os.open(d, _O_DIR)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise _Corrupt("entry is not a directory (or is a symlink)") from None
            raise
        try:
            return self._read_entry_at(dfd, d, ident, kind, key, full)
        finally:
            os.close(dfd)

    def _read_entry_at(
        self, dfd: int, d: str, ident: str, kind: str | None, key: str | None, full: bool
    ) -> Hit | None:
        try:
            fd = os.open(RECORD_NAME, _O_READ, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _Corrupt("record is a symlink") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Corrupt("record is not a regular file", st.st_ino)
            if st.st_size > _MAX_RECORD:
                raise _Corrupt("record too large", st.st_ino)
            data = _read_exact(fd, st.st_size)
        finally:
            os.close(fd)
        try:
            rec = Record.decode(data)
        except CorruptRecord as e:
            raise _Corrupt(str(e), st.st_ino) from None
        if rec.id != ident or (kind is not None and rec.kind != kind) or (key is not None and rec.key != key):
            raise _Corrupt("record does not belong to this entry", st.st_ino)
        paths = {}
        for f in rec.files:
            try:
                mfd = os.open(f.name, _O_READ, dir_fd=dfd)
            except OSError as e:
                raise _Corrupt(f"member {f.name}: {e.strerror}", st.st_ino) from None
            try:
                mst = os.fstat(mfd)
                if not stat.S_ISREG(mst.st_mode):
                    raise _Corrupt(f"member {f.name} is not a regular file", st.st_ino)
                if mst.st_size != f.size:  # truncated or grown: no need to read it
                    raise _Corrupt(f"member {f.name}: size {mst.st_size} != {f.size}", st.st_ino)
                blob = _read_exact(mfd, f.size)
            finally:
                os.close(mfd)
            if len(blob) != f.size:
                raise _Corrupt(f"member {f.name}: size {len(blob)} != {f.size}", st.st_ino)
            if not f.check(blob):
                raise _Corrupt(f"member {f.name}: checksum mismatch", st.st_ino)
            if full and _sha256(blob).hexdigest() != f.sha256:
                raise _Corrupt(f"member {f.name}: sha256 mismatch", st.st_ino)
            paths[f.name] = d + os.sep + f.name
        hit = Hit(rec, d, paths)
        hit._mtime = st.st_mtime  # type: ignore[attr-defined]
        return hit

    def get(
        self,
        kind: str,
        key: str,
        components: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        *,
        count: bool = True,
    ) -> Hit | None:
        """The verified entry for (kind, key), or None. ``components`` (or a callable giving them)
        are remembered with a miss, for ``kcache explain``. Never raises."""
        ident = self.entry_id(kind, key)
        try:
            hit = self._read_entry(ident, kind, key)
        except _Corrupt as e:
            self._on_corrupt(ident, kind, str(e), e.ino)
            hit = None
        except Exception as e:  # permission denied, I/O error: a miss, once loudly
            warn_once(
                f"read:{type(e).__name__}", f"cannot read the store at {self.root}: {e}; compiling instead"
            )
            self.counts.add(kind, errors=1)
            hit = None
        if hit is not None:
            if count:
                self.counts.add(kind, hits=1, saved_s=hit.record.compile_s)
                self._touch(hit)
            return hit
        if count:
            self.counts.add(kind, misses=1)
            if components is not None and not self.readonly:
                try:
                    comps = dict(components() if callable(components) else components)
                except Exception:
                    comps = {}
                with self._lock:
                    self._misses.append((time.time(), kind, key, comps))
            self._maybe_flush()
        return None

    def _touch(self, hit: Hit) -> None:
        if self.readonly:
            return
        now = time.time()
        mtime = getattr(hit, "_mtime", now)
        if abs(now - mtime) > TOUCH_EVERY_S:
            # The file's mtime is what eviction checks before deleting: refreshed here, a hit is
            # safe from eviction for GRACE_S, without a database write on every hit.
            with contextlib.suppress(OSError):
                os.utime(os.path.join(hit.dir, RECORD_NAME), (now, now))
        ident = hit.record.id
        with self._lock:
            _, n = self._touches.get(ident, (0.0, 0))
            self._touches[ident] = (now, n + 1)
            self._touched_records[ident] = hit.record
        self._maybe_flush()

    def _on_corrupt(self, ident: str, kind: str, why: str, ino: int | None) -> None:
        d = self.entry_dir(ident)
        if ino is not None:
            # Only quarantine (and report) what we read: an entry removed (clear, eviction) or
            # replaced by another process while we read it loses its members under us, which is
            # a plain miss, not corruption.
            try:
                if os.lstat(os.path.join(d, RECORD_NAME)).st_ino != ino:
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
    ) -> Hit | None:
        """Store ``files`` (name -> bytes, or a path to link or copy) as one entry.

        Returns the committed entry (this writer's or an identical one already there), or None if
        it could not be written (read-only, full, broken: one warning). ``protect_s`` keeps the
        entry from eviction until its first hit or that many seconds (prewarm)."""
        if self.readonly or self._closed:
            return None
        ident = self.entry_id(kind, key)
        tmp = None
        try:
            infos = []
            for name in files:
                if not valid_name(name):
                    raise ValueError(f"invalid member name {name!r}")
            tmp = os.path.join(str(self.tmp), f"{ident}.{os.getpid()}.{os.urandom(6).hex()}")
            os.mkdir(tmp, 0o700)
            for name, data in files.items():
                dst = os.path.join(tmp, name)
                if isinstance(data, (bytes, bytearray, memoryview)):
                    blob = bytes(data)
                    with open(dst, "xb") as f:
                        f.write(blob)
                else:
                    src = os.fspath(data)
                    try:
                        os.link(src, dst)
                    except OSError:
                        _shutil().copyfile(src, dst)
                    with open(dst, "rb") as f:
                        blob = f.read()
                infos.append(file_info(name, blob))
            rec = Record(
                kind=kind,
                key=key,
                id=ident,
                files=infos,
                compile_s=float(compile_s),
                components=dict(components or {}),
                summary=dict(summary or {}),
            )
            with open(os.path.join(tmp, RECORD_NAME), "xb") as f:
                f.write(rec.encode())
            if protect_s:
                t = time.time() + protect_s
                os.utime(os.path.join(tmp, RECORD_NAME), (t, t))
            final = self.entry_dir(ident)
            os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
            committed = self._commit(tmp, final, ident, kind, key)
            tmp = None if committed else tmp
            if not committed:
                existing = self._read_entry(ident, kind, key)
                if existing is not None:
                    self._touch(existing)  # returned like a hit: kept from eviction like one
                return existing
        except Exception as e:
            what = (
                "full"
                if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
                else ""
            )
            warn_once(
                "disk-full" if what else f"write:{type(e).__name__}",
                f"cannot write to the store at {self.root} ({e}); kernels are compiled but not cached",
            )
            self.counts.add(kind, errors=1)
            return None
        finally:
            if tmp is not None:
                _shutil().rmtree(tmp, ignore_errors=True)
        self.counts.add(kind, puts=1, bytes_written=rec.size)
        access = time.time() + protect_s if protect_s else None

        def insert(idx: Any) -> bool:
            idx.insert(rec, access_time=access)
            return True

        if not self._index_call(insert):
            # The index was busy (many writers at once) or is backing off: keep the row for the
            # next flush, so the entry is counted for stats and eviction rather than lost to them.
            with self._lock:
                if len(self._pending) < MAX_PENDING:
                    self._pending[rec.id] = (rec, access)
        # The entry is what this call just wrote and checksummed: no need to read it back (and a
        # read racing a concurrent `kcache clear` could only turn a stored entry into an error).
        hit = Hit(rec, final, {f.name: final + os.sep + f.name for f in rec.files})
        hit._mtime = time.time()  # type: ignore[attr-defined]
        self._after_put(rec.size)
        return hit

    def _commit(self, tmp: str, final: str, ident: str, kind: str, key: str) -> bool:
        """Rename the finished entry into place. False if an identical valid entry is already there."""
        for _ in range(3):
            try:
                os.rename(tmp, final)
                return True
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            try:
                if self._read_entry(ident, kind, key) is not None:
                    return False  # another writer committed it first: keep theirs, immutable
            except _Corrupt:
                pass
            self._remove_dirs([ident])  # a broken one is in the way: move it to trash
        raise OSError(errno.EEXIST, "entry is being replaced concurrently")

    def _remove_dirs(self, ids: list[str]) -> int:
        """Move entry directories to trash (atomically), then delete them. Returns bytes freed (approx)."""
        n = 0
        for ident in ids:
            if not self.valid_id(ident):
                continue  # not a path of ours (a crafted index row): only its row goes
            d = self.entry_dir(ident)
            if not _real_dir(os.path.dirname(d)) or not _real_dir(self._entries):
                continue  # never move (and delete) what a symlinked shard points to outside
            t = os.path.join(str(self.trash), f"{ident}.{os.urandom(4).hex()}")
            try:
                os.rename(d, t)
            except OSError:
                continue
            n += 1
            _shutil().rmtree(t, ignore_errors=True)
        return n

    # ------------------------------------------------------------------ single flight
    def lock(self, kind: str, key: str, timeout: float) -> Any:
        """An exclusive cross-process lock for (kind, key), or None after ``timeout`` seconds.

        The lock is an flock: the kernel drops it when the holder dies, so a crashed compiler
        blocks the others only until it is gone, and a hung one only for ``timeout``."""
        if self.readonly:
            return None
        from filelock import FileLock, Timeout

        lk = FileLock(os.path.join(str(self.locks), self.entry_id(kind, key) + ".lock"), thread_local=False)
        try:
            lk.acquire(timeout=timeout)
            return lk
        except Timeout:
            warn_once(
                "lock-timeout",
                f"waited {timeout:.0f}s for another process compiling the same kernel; compiling here",
            )
            return None
        except Exception as e:
            warn_once("lock-error", f"cannot lock in {self.locks}: {e}")
            return None

    # ------------------------------------------------------------------ index (best effort)
    def index(self) -> Any:
        """The index, opened on first use; raises if it cannot be opened (callers catch)."""
        with self._lock:
            if self._index is None and self.readonly:
                # Read-only: never through diskcache, whose open writes its settings table.
                from ..maintenance import ReadOnlyIndex

                self._index = ReadOnlyIndex(self.index_dir)
            if self._index is None:
                from .index import Index

                try:
                    self._index = Index(self.index_dir, timeout=self.index_timeout)
                except Exception as e:
                    if not _is_corrupt_db(e) or self.readonly:
                        raise
                    # A broken index is replaced, not fatal: entries are intact and self-describing;
                    # they are added back as they are hit, or all at once by `kcache verify --fix`.
                    aside = self.index_dir.with_name(f"{self.index_dir.name}.corrupt.{int(time.time())}")
                    warn_once(
                        "index-corrupt", f"the index at {self.index_dir} is corrupt ({e}); starting a new one"
                    )
                    os.rename(self.index_dir, aside)
                    _shutil().rmtree(aside, ignore_errors=True)
                    self._index = Index(self.index_dir, timeout=self.index_timeout)
            return self._index

    def _index_call(self, fn: Callable[[Any], Any]) -> Any:
        if self.readonly or time.monotonic() < self._index_off_until:
            return None
        try:
            return fn(self.index())
        except Exception as e:
            self._index_off_until = time.monotonic() + INDEX_BACKOFF_S
            full = "full" in str(e).lower()  # SQLITE_FULL: the disk is full, said once for the store
            warn_once(
                "disk-full" if full else f"index:{type(e).__name__}",
                f"the store's index is unavailable ({type(e).__name__}: {e}); continuing without it",
            )
            if _is_corrupt_db(e):
                with self._lock:
                    with contextlib.suppress(Exception):
                        self._index.close()
                    self._index = None
                    aside = self.index_dir.with_name(f"{self.index_dir.name}.corrupt.{int(time.time())}")
                    with contextlib.suppress(OSError):
                        os.rename(self.index_dir, aside)
                        _shutil().rmtree(aside, ignore_errors=True)
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
        if self.readonly:
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

        def write(idx: Any) -> bool:
            for rec, access in pending.values():
                idx.insert(rec, access_time=access)
            if deltas:
                idx.add_counters(deltas)
            if touches:
                for ident in idx.touch(touches):
                    if ident in recs:  # on disk but not in the index (a crash, a new index): add it
                        idx.insert(recs[ident], access_time=touches[ident][0])
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
        90% of the bound). One process evicts at a time; others skip. Returns (entries, bytes)."""
        if self.readonly:
            return 0, 0
        from filelock import FileLock, Timeout

        target = int(self.max_size * 0.9) if target is None else target
        lk = FileLock(os.path.join(str(self.locks), "evict.lock"), thread_local=False)
        try:
            lk.acquire(timeout=0)
        except (Timeout, OSError):
            return 0, 0
        removed = freed = 0
        try:
            self.flush(force=True)
            idx = self.index()
            total = idx.total_bytes()
            now = time.time()
            while total > target:
                rows = idx.oldest(256, before=now - GRACE_S)
                if not rows:
                    break
                gone, refreshed = [], {}
                for ident, _at, size in rows:
                    try:
                        mt = os.lstat(os.path.join(self.entry_dir(ident), RECORD_NAME)).st_mtime
                    except OSError:
                        mt = None
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
                    for ident in gone:
                        # Checked again just before it goes: a hit since the check above has
                        # refreshed the record's mtime and may be reading the files now. Its row
                        # comes back with that hit's batched last-use time.
                        try:
                            mt = os.lstat(os.path.join(self.entry_dir(ident), RECORD_NAME)).st_mtime
                        except OSError:
                            mt = None
                        if mt is None or mt <= time.time() - GRACE_S:
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
        try:
            shards = sorted(os.listdir(self._entries))
        except OSError:
            return
        for shard in shards:
            sd = os.path.join(self._entries, shard)
            try:
                names = os.listdir(sd)
            except OSError:
                continue
            yield from names

    def read_any(self, ident: str, full: bool = False) -> tuple[Hit | None, str | None]:
        """(entry, None) or (None, problem) for an entry id, without counting or quarantining."""
        try:
            h = self._read_entry(ident, None, None, full=full)
            return h, None if h is not None else "missing"
        except _Corrupt as e:
            return None, str(e)
        except OSError as e:
            return None, str(e)

    def remove(self, ids: list[str]) -> int:
        """Delete entries (files and index rows)."""
        if self.readonly:
            raise StoreError("the store is read-only")
        self._index_call(lambda idx: idx.remove(ids))
        return self._remove_dirs(ids)

    def clean_tmp(self, min_age: float = STALE_TMP_S) -> int:
        """Remove what dead or long-gone writers left in tmp/ and trash/."""
        n = 0
        now = time.time()
        for sub in (self.tmp, self.trash):
            try:
                names = os.listdir(sub)
            except OSError:
                continue
            for name in names:
                p = os.path.join(str(sub), name)
                parts = name.split(".")
                pid = int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None
                try:
                    age = now - os.lstat(p).st_mtime
                except OSError:
                    continue
                if sub == self.trash or (pid is not None and not _pid_alive(pid)) or age > min_age:
                    if os.path.isdir(p) and not os.path.islink(p):
                        _shutil().rmtree(p, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            os.unlink(p)
                    n += 1
        return n


def _real_dir(path: str) -> bool:
    """A directory, not a symlink to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _unwritable(root: Path) -> str | None:
    """Why the store cannot be written (a read-only filesystem, no write permission), or None."""
    try:
        if os.statvfs(root).f_flag & getattr(os, "ST_RDONLY", 0):
            return "is on a read-only filesystem"
    except OSError:
        pass
    for p in (root, root / "entries", root / "tmp", root / "locks"):
        if p.exists() and not os.access(p, os.W_OK | os.X_OK):
            return f"is not writable ({p.name} denies this user)"
    return None


def _is_corrupt_db(e: BaseException) -> bool:
    import sqlite3

    msg = str(e).lower()
    return isinstance(e, sqlite3.DatabaseError) and (
        "malformed" in msg or "not a database" in msg or "file is encrypted" in msg or "disk image" in msg
    )


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    with open(tmp, "xb") as f:
        f.write(data)
    os.replace(tmp, path)
