"""The entry folder format: reading and verifying an entry, writing and committing one, removing one.

An entry is a folder ``entries/<id[:2]>/<id>/`` holding its member files (the library's own
names) and its record ``__kcache__.rec`` (see :mod:`.records`). Guarantees:

- Complete or absent. A writer builds the whole entry under ``tmp/`` (members, then the record
  with each member's size and checksums) and renames the folder into place in one step; if an
  entry is already there the rename fails and a valid one is kept (first writer wins; a broken
  one is moved to ``trash/`` first). Nothing is modified in place.
- Verified. A read opens the record and every member through the entry folder's descriptor,
  checks owner, mode, size and checksum (xxh3, else crc32; sha256 with ``full``): anything that
  fails is :class:`CorruptEntry` (or :class:`RefusedEntry`: not ours to trust) and never served.
- Removal renames the folder into ``trash/`` (of several removers, one wins) and deletes its
  files unless a process holds it (see :mod:`.served`), following no link.

Everything goes through the pinned descriptors of :class:`~.opening.Folders`. Raises; the disk
tier (:mod:`.disk`) decides what a failure means for its caller.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..kinds import valid_id
from . import fs
from . import tunables as T
from .clock import Clock
from .errors import CorruptEntry, RefusedEntry
from .footprint import disk
from .hit import Hit, ServeFailed, sig
from .opening import Folders
from .records import RECORD_NAME, CorruptRecord, Record, file_info, valid_name
from .served import Served
from .trash import drop_trash, folder_bytes

_W_GO = stat.S_IWGRP | stat.S_IWOTH  # writable by group or others: not ours to trust


class Entries:
    """The entry folders of one store, read and written through its pinned descriptors."""

    def __init__(
        self,
        folders: Folders,
        clock: Clock,
        served: Served,
        on_removed: Callable[[str, int, bool, int | None], None] | None = None,
    ) -> None:
        self.folders, self.clock, self.served = folders, clock, served
        #: Told of every removal: (id, the bytes it counted for, whether trash/ keeps something,
        #: what :attr:`mark` said before the rename).
        self.on_removed = on_removed
        #: Asked before each removal's rename (the size count's recounts so far, see
        #: :meth:`.usage.Usage.mark`): set by the disk tier.
        self.mark: Callable[[], int | None] = lambda: None
        self._real_shards: set[str] = set()

    # ------------------------------------------------------------------ reading
    def entry_fd(self, ident: str) -> int | None:
        """The entry's folder, opened and checked; None if absent."""
        efd = self.folders.fd("entries")
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
        owners = self.folders.owners
        if owners is not None:
            try:
                fs.check_stat(os.fstat(dfd), f"entry {ident[:12]}", owners, want_dir=True)
            except fs.UnsafePath as e:
                os.close(dfd)
                raise RefusedEntry(str(e)) from None
        return dfd

    def _check_shard(self, shard: str, st: os.stat_result) -> None:
        if not stat.S_ISDIR(st.st_mode):
            raise RefusedEntry(f"entries/{shard} is a link or not a folder")
        owners = self.folders.owners
        if owners is not None:
            try:
                fs.check_stat(st, f"entries/{shard}", owners, want_dir=True)
            except fs.UnsafePath as e:
                raise RefusedEntry(str(e)) from None
        self._real_shards.add(shard)

    def check_owner(self, st: os.stat_result, what: str) -> None:
        owners = self.folders.owners
        if owners is not None and (st.st_uid not in owners or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            raise RefusedEntry(f"{what} is owned by uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):o})")

    def read(
        self,
        ident: str,
        kind: str | None,
        key: str | None,
        *,
        full: bool = False,
        touch: bool = False,
        serve: bool = False,
    ) -> Hit | None:
        """The verified entry ``ident`` (its kind and key checked when given), or None when it is
        absent. Raises :class:`CorruptEntry` (with the record file's identity, for quarantine),
        :class:`RefusedEntry`, :class:`ServeFailed` or ``OSError``.

        ``touch``: refresh the record's mtime (the entry's last use) when it is due. ``serve``:
        make its files now (see :attr:`Hit.paths`), from the member descriptors just verified."""
        if not valid_id(ident):
            raise CorruptEntry(f"invalid entry id {ident!r}")
        dfd = self.entry_fd(ident)
        if dfd is None:
            return None
        try:
            return self._read_at(dfd, ident, kind, key, full, touch, serve)
        finally:
            os.close(dfd)

    def read_served(self, ident: str, kind: str, key: str, *, touch: bool = False) -> Hit | None:
        """:meth:`read` with ``serve``, in one pass where every check passes: the folder, its
        record and every member opened, checked and read as :meth:`_read_at` does, then the
        files served (the folder held, see :mod:`.served`) from the descriptors still open.
        Anything out of the ordinary (a check that fails, a read that comes up short, a shard
        not yet checked by this process, an error) goes the general way, :meth:`read`, which
        says what it means; so no check lives only here."""
        efd = self.folders.fd("entries")
        shard = ident[:2]
        if efd is None or not valid_id(ident):
            return self.read(ident, kind, key, touch=touch, serve=True)
        try:
            if shard not in self._real_shards:  # checked once per process, as entry_fd() does
                self._check_shard(shard, os.stat(shard, dir_fd=efd, follow_symlinks=False))
            dfd = os.open(f"{shard}/{ident}", fs.O_DIR, dir_fd=efd)
        except FileNotFoundError:
            return None
        except OSError:
            return self.read(ident, kind, key, touch=touch, serve=True)
        mfds: dict[str, int] = {}
        try:
            hit = self._served_at(dfd, ident, kind, key, touch, mfds)
            if hit is not None:
                return hit
        except FileNotFoundError:  # the record: a folder being committed or removed, as read() says
            if not mfds:
                return None
        except (OSError, CorruptRecord):
            pass
        finally:
            os.close(dfd)
            for mfd in mfds.values():
                try:  # (not contextlib.suppress: a context manager per descriptor is 0.5 µs)
                    os.close(mfd)
                except OSError:
                    pass
        return self.read(ident, kind, key, touch=touch, serve=True)

    def _served_at(
        self, dfd: int, ident: str, kind: str, key: str, touch: bool, mfds: dict[str, int]
    ) -> Hit | None:
        """The body of :meth:`read_served`: the hit, or None when a check did not pass (the
        general way then reads it again). ``mfds`` gets every descriptor opened, for the caller
        to close (the record's under ``""``)."""
        owners = self.folders.owners
        dst = os.fstat(dfd)
        if owners is not None and (dst.st_uid not in owners or dst.st_mode & _W_GO):
            return None
        mfds[""] = rfd = os.open(RECORD_NAME, fs.O_READ, dir_fd=dfd)
        st = os.fstat(rfd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_size > T.MAX_RECORD
            or (owners is not None and (st.st_uid not in owners or st.st_mode & _W_GO))
        ):
            return None
        rec = Record.decode(os.read(rfd, st.st_size))
        if rec.id != ident or rec.kind != kind or rec.key != key:
            return None
        blobs: dict[str, bytes] = {}
        inos: dict[str, tuple[int, int]] = {}
        for f in rec.files:
            name, size = f.name, f.size
            mfds[name] = mfd = os.open(name, fs.O_READ, dir_fd=dfd)
            mst = os.fstat(mfd)
            if (
                mst.st_size != size
                or not stat.S_ISREG(mst.st_mode)
                or (owners is not None and (mst.st_uid not in owners or mst.st_mode & _W_GO))
            ):
                return None
            blob = os.read(mfd, size)
            if len(blob) != size or not f.check(blob):
                return None
            blobs[name] = blob
            inos[name] = (mst.st_dev, mst.st_ino)
        if touch:
            st = self._used(rfd, st, rec)
        hit = Hit(rec, blobs, self.served, st.st_mtime, inos)
        del mfds[""]
        try:
            hit._paths, hit._pin = self.served.serve_held(hit, mfds, dfd, dst)
        except OSError as e:
            raise ServeFailed(str(e) or type(e).__name__) from None
        finally:
            os.close(rfd)
        if hit._pin is not None:
            hit.rsig = sig(st)
        return hit

    def _used(self, rfd: int, st: os.stat_result, rec: Record) -> os.stat_result:
        """The record's fstat ``st``, after this hit was recorded as a use where it is due.

        The record's mtime is the entry's last use for eviction, by the filesystem's clock:
        refreshed at most once a minute (no database write per hit). A protected entry's first
        use ends its protection (its mtime moves on from its creation). (A record of an older
        kcache with an mtime in the future, its way of protecting, is brought back to now.)"""
        mtime = st.st_mtime
        if not self.folders.readonly and (
            abs(self.clock.now() - mtime) > T.TOUCH_EVERY_S
            or (rec.protect_until and mtime <= rec.created + T.FIRST_USE_S)
        ):
            with contextlib.suppress(OSError):
                os.utime(rfd)
                st = os.fstat(rfd)
        return st

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
            self.check_owner(st, f"record of {ident[:12]}")
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
                self.check_owner(mst, f"member {f.name} of {ident[:12]}")
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
                if full and hashlib.sha256(blob).hexdigest() != f.sha256:
                    raise CorruptEntry(f"member {f.name}: sha256 mismatch", rid)
                blobs[f.name] = blob
                inos[f.name] = (mst.st_dev, mst.st_ino)
            if touch:
                st = self._used(rfd, st, rec)
            hit = Hit(rec, blobs, self.served, st.st_mtime, inos)
            if serve:
                try:
                    hit._paths, hit._pin = self.served.serve_held(hit, mfds, dfd)
                except OSError as e:
                    raise ServeFailed(str(e) or type(e).__name__) from None
                if hit._pin is not None:
                    hit.rsig = sig(os.fstat(rfd))
            return hit
        finally:
            os.close(rfd)
            for mfd in mfds.values():
                with contextlib.suppress(OSError):
                    os.close(mfd)

    def read_record(self, ident: str) -> tuple[Record | None, str | None]:
        """The entry's own record (its members are not read), or (None, why)."""
        if not valid_id(ident):
            return None, "not an entry id"
        try:
            dfd = self.entry_fd(ident)
        except (CorruptEntry, RefusedEntry, OSError) as e:
            return None, str(e)
        if dfd is None:
            return None, "missing"
        try:
            data, st = fs.read_at(dfd, RECORD_NAME, T.MAX_RECORD)
            self.check_owner(st, "record")
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
        """The record file's mtime (last use, by the filesystem's clock), or None."""
        efd = self.folders.fd("entries")
        if efd is None or not valid_id(ident):
            return None
        try:
            return os.stat(f"{ident[:2]}/{ident}/{RECORD_NAME}", dir_fd=efd, follow_symlinks=False).st_mtime
        except OSError:
            return None

    def still_the_one(self, ident: str, rid: tuple[int, ...] | None) -> bool:
        """Whether the record file at ``ident`` is still the one read as ``rid`` (its inode,
        device, times and size): a removal or a replacement since means another entry."""
        if rid is None:
            return True
        efd = self.folders.fd("entries")
        if efd is None:
            return False
        try:
            st = os.stat(f"{ident[:2]}/{ident}/{RECORD_NAME}", dir_fd=efd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns, st.st_size) == rid

    # ------------------------------------------------------------------ writing
    def write(
        self,
        rec_fields: dict[str, Any],
        ident: str,
        files: Mapping[str, bytes | str | os.PathLike[str]],
        *,
        touch_existing: bool,
    ) -> tuple[Hit | None, bool]:
        """Build the entry ``ident`` under ``tmp/`` and commit it: (the entry, True) when this
        writer's was committed; (the one already there, False) when another writer committed it
        first (or (None, False) when that one was replaced or removed again meanwhile).
        ``rec_fields``: the record's fields but ``id`` and ``files``. Raises ``OSError``,
        ``ValueError`` (a bad member name) or :class:`RefusedEntry`."""
        folders = self.folders
        tfd, efd = folders.fd("tmp"), folders.fd("entries")
        if tfd is None or efd is None:
            raise OSError(errno.ENOENT, "the store's folders are missing")
        for name in files:
            if not valid_name(name):
                raise ValueError(f"invalid member name {name!r}")
        tmp = None
        dfd = None
        try:
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
            on_disk = 0  # what the folder takes, as footprint.folder_disk counts it at its removal
            for name, data in files.items():
                blob, mst = self._write_member(dfd, name, data)
                infos.append(file_info(name, blob))
                blobs[name], inos[name] = blob, (mst.st_dev, mst.st_ino)
                on_disk += disk(mst)
            rec = Record(id=ident, files=infos, **rec_fields)
            on_disk += disk(fs.write_new_at(dfd, RECORD_NAME, rec.encode())) + disk(os.fstat(dfd))
            shard = ident[:2]
            if shard not in self._real_shards:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(shard, 0o700, dir_fd=efd)
                self._check_shard(shard, os.stat(shard, dir_fd=efd, follow_symlinks=False))
            assert tmp is not None  # made by the loop above (or it raised)
            if not self._commit(tmp, ident, rec.kind, rec.key):
                try:
                    return self.read(ident, rec.kind, rec.key, touch=touch_existing), False
                except CorruptEntry:
                    return None, False  # replaced or removed again meanwhile: this put is just not kept
            tmp = None
            hit = Hit(rec, blobs, self.served, time.time(), inos)
            hit.disk = on_disk
            return hit, True
        finally:
            if tmp is not None:
                fs.rmtree_at(tfd, tmp)
            if dfd is not None:
                os.close(dfd)  # lets go of the hold (committed, or removed above)

    def _write_member(
        self, dfd: int, name: str, data: bytes | str | os.PathLike[str]
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
        tfd, efd = self.folders.fd("tmp"), self.folders.fd("entries")
        dst = f"{ident[:2]}/{ident}"
        for _ in range(3):
            try:
                os.rename(tmp, dst, src_dir_fd=tfd, dst_dir_fd=efd)
                return True
            except FileNotFoundError:
                # The shard folder went since this writer made or checked it (eviction removes
                # the shards it empties): made again, and checked as the first time.
                self._real_shards.discard(ident[:2])
                with contextlib.suppress(FileExistsError):
                    os.mkdir(ident[:2], 0o700, dir_fd=efd)
                self._check_shard(ident[:2], os.stat(ident[:2], dir_fd=efd, follow_symlinks=False))
                continue
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
            try:
                if self.read(ident, kind, key) is not None:
                    return False  # another writer committed it first: keep theirs, immutable
            except CorruptEntry:
                pass
            self.remove(ident)  # a broken one is in the way: move it to trash
        raise OSError(errno.EEXIST, "entry is being replaced concurrently")

    # ------------------------------------------------------------------ removing
    def remove(self, ident: str, *, later: bool = False, empty: bool = True) -> int | None:
        """Move an entry's folder to trash (atomically: of several removers, one wins), delete
        its files, then the folder, following no link. A folder a process holds (its files handed
        out, see :mod:`.served`) stays whole in ``trash/`` until nobody does. ``later``
        (eviction): the empty folder is left for a later sweep (removing a folder can cost
        milliseconds). Not ``empty`` (a put that evicts): its files too are left for the sweep
        (:func:`.trash.sweep`), so that the put returns after the rename. Returns the bytes it
        counted for, or None when it was not there (or not a folder of ours); :attr:`on_removed`
        is told."""
        efd, trfd = self.folders.fd("entries"), self.folders.fd("trash")
        if efd is None or trfd is None or not valid_id(ident):
            return None  # not a path of ours (a crafted index row): only its row goes
        try:
            st = os.stat(ident[:2], dir_fd=efd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                return None  # never move (and delete) what a linked shard points to
        except OSError:
            return None
        t = fs.unique_name(ident)
        mark = self.mark()  # before the rename: a recount between it and on_removed is seen
        # Its bytes, measured before the rename: once in trash/, any process's sweep (a put's
        # too) may empty it before it could be measured there, and the count would keep them.
        freed = folder_bytes(efd, f"{ident[:2]}/{ident}")
        try:
            os.rename(f"{ident[:2]}/{ident}", t, src_dir_fd=efd, dst_dir_fd=trfd)
        except OSError:
            return None
        left = not empty or drop_trash(trfd, t, keep_empty=later) is None or later
        if self.on_removed is not None:
            self.on_removed(ident, freed, left, mark)
        return freed
