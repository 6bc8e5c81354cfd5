"""Opening a store: the checks, and the pinned folders every later call goes through.

:func:`open_folders` checks the store's path, root, marker and own folders and returns them as
:class:`Folders`: open descriptors (the root, ``entries/``, ``tmp/``, ``trash/``, ``locks/``,
``index/``) and what the checks found (read-only, trusted, on a network filesystem). Every later
open, create, rename and remove in the store is relative to these descriptors (see
:mod:`kcache.store.fs`), never to a path name that could have been swapped since. Raises
``UnsafeStore`` or ``StoreError`` with a reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import msgpack

from ..log import warn_once
from . import fs
from .errors import StoreError
from .records import DECODE_ERRORS
from .safety import (
    UnsafeStore,
    check_root,
    insecure_parent,
    insecure_path,
    is_network_fs,
    judge_parents,
    linkless_parents,
    make_private_dir,
    on_block_device,
)

MARKER = "KCACHE_STORE"
STORE_SCHEMA = 1
SUBDIRS = ("entries", "tmp", "trash", "locks", "index")
INSECURE_HINT = "set KCACHE_ALLOW_INSECURE=1 to use it anyway (launchers and pickled entries are then never taken from it)"


def node_local_index(base: str, name: str, readonly: bool) -> int | None:
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


def open_sub(root_fd: int, sub: str, path: str, owners: frozenset[int] | None, *, create: bool) -> int | None:
    """One of the store's own folders, opened and checked; None if absent on a read-only store."""
    try:
        return fs.open_dir_at(root_fd, sub, f"{path}/{sub}", owners, create=create)
    except FileNotFoundError:
        if create:
            raise
        return None
    except fs.UnsafePath as e:
        raise UnsafeStore(f"{e}: refusing the store (nothing in it is used or deleted)") from None


MARKER_BODY = msgpack.packb({"format": "kcache-store", "schema": STORE_SCHEMA})


def read_marker(root_fd: int, path: str) -> bytes | None:
    """The marker's bytes, or None when there is none (a new store, or a folder that is not one)."""
    try:
        return fs.read_at(root_fd, MARKER, 1 << 16)[0]
    except FileNotFoundError:
        return None
    except fs.UnsafePath as e:
        raise StoreError(f"{path}: {e}") from None


def check_marker(root_fd: int, path: str, *, readonly: bool, create: bool, data: bytes | None = None) -> None:
    """Refuse a folder that holds no store, or a store of another schema; make the marker of a
    new store (``create``, unless ``readonly``). ``data``: the marker as read already."""
    if data is None:
        data = read_marker(root_fd, path)
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
            tmp = f".{MARKER}.{os.getpid()}.{os.urandom(4).hex()}"
            fs.write_new_at(root_fd, tmp, MARKER_BODY)
            os.rename(tmp, MARKER, src_dir_fd=root_fd, dst_dir_fd=root_fd)
            return
    if data == MARKER_BODY:  # as this kcache writes it: nothing to decode
        return
    try:
        info = msgpack.unpackb(data, raw=False)
        schema = info.get("schema") if isinstance(info, dict) else None
    except DECODE_ERRORS:  # not this kcache's marker: refused below
        schema = None
    if schema != STORE_SCHEMA:
        raise StoreError(f"{path} holds a kcache store of another schema ({schema!r})")


def unwritable(root_fd: int, stats: dict[str, os.stat_result] | None = None) -> str | None:
    """Why the store cannot be written (a read-only filesystem, no write permission), or None.

    ``stats``: the fstat of the root (``"."``) and of its folders that are open already: a folder
    this user owns, with its owner's write and search bits, is writable by this user without
    asking the kernel (the owner's bits are what the kernel goes by, ACLs included); the others
    are asked (another owner, ACLs, root's override)."""
    try:
        if os.fstatvfs(root_fd).f_flag & getattr(os, "ST_RDONLY", 0):
            return "is on a read-only filesystem"
    except OSError:
        pass
    uid = os.geteuid()
    for sub in (".", "entries", "tmp", "locks"):
        st = stats.get(sub) if stats is not None else None
        if st is None:
            try:
                st = os.stat(sub, dir_fd=root_fd, follow_symlinks=False)
            except OSError:
                continue  # not there yet: made with the store
        if st.st_uid == uid and st.st_mode & 0o300 == 0o300:
            continue
        if not os.access(sub, os.W_OK | os.X_OK, dir_fd=root_fd):
            return (
                "is not writable (this user may not write it)"
                if sub == "."
                else f"is not writable ({sub} denies this user)"
            )
    return None


class Folders:
    """A store's pinned folders: their descriptors and what opening found. Passed to every part
    of the store instead of the store itself (see :mod:`.disk`)."""

    def __init__(
        self,
        root: str,
        fds: dict[str, int | None],
        *,
        owners: frozenset[int] | None,
        readonly: bool,
        trusted: bool,
        network_fs: bool,
        index_dir: str | None,
        stats: dict[str, os.stat_result] | None = None,
    ) -> None:
        self._root = root
        self._stats = stats or {}
        self._root_path: Path | None = None
        #: Who may own what is read from the store (None: a store used despite its checks).
        self.owners = owners
        self.readonly = readonly
        #: False when the store failed a check and was opened anyway (KCACHE_ALLOW_INSECURE=1).
        self.trusted = trusted
        self.network_fs = network_fs
        self._index_dir = index_dir
        self.closed = False
        self._fds = fds

    # Paths by name, for messages, reports and libraries (never opened here): made when asked
    # (making a Path costs microseconds that a process's first lookup need not pay).
    @property
    def root(self) -> Path:
        """The store's folder as it was named (absolute)."""
        if self._root_path is None:
            self._root_path = Path(self._root)
        return self._root_path

    def entry_dir(self, ident: str) -> str:
        """The entry's folder by its name in the store: for messages, reports and copies of the
        paths handed out (:class:`~.leases.HeldPath`); never opened by name here."""
        return os.path.join(self._root, "entries", ident[:2], ident)

    @property
    def root_name(self) -> str:
        """:attr:`root` as a string (no Path made)."""
        return self._root

    @property
    def index_dir(self) -> Path:
        """What a reading command reports: the index's folder (node-local on a network filesystem)."""
        return Path(self._index_dir) if self._index_dir else self.root / "index"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def trash(self) -> Path:
        return self.root / "trash"

    @property
    def locks(self) -> Path:
        return self.root / "locks"

    def fd(self, sub: str) -> int | None:
        """The descriptor of ``sub`` ("root", "entries", "tmp", "trash", "locks", "index"); None
        when it is absent or the store is closed."""
        return self._fds.get(sub)

    def stat(self, sub: str) -> os.stat_result | None:
        """The fstat ``sub`` was checked by when it was opened (a folder's identity does not
        change while it is open), or None when it is absent or the store is closed."""
        if self.closed:
            return None
        st = self._stats.get(sub)
        if st is None:
            fd = self._fds.get(sub)
            if fd is None:
                return None
            try:
                st = self._stats[sub] = os.fstat(fd)
            except OSError:
                return None
        return st

    def close(self) -> None:
        self.closed = True
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


def open_root(path: str, *, readonly: bool, allow_insecure: bool, create: bool) -> tuple[int, str, bool]:
    """The store's root, opened and pinned (no link from here on): its descriptor, its real path
    and whether it is trusted (False: it failed a check and ``allow_insecure`` uses it anyway).
    Made (0700) when missing and ``create``. Raises ``UnsafeStore`` or ``StoreError``."""
    # The usual case first: nothing on the way is a link and the store exists. One walk up (an
    # lstat each) says both; the long way below resolves the path and walks it again.
    parents = None if path != os.path.abspath(path) else linkless_parents(path)
    if parents is not None:
        try:
            fd = os.open(path, fs.O_DIR)  # O_NOFOLLOW: the store itself is no link either
        except OSError:
            fd = None  # a link to the store, a store to make, not a folder: the long way
        if fd is not None:
            why_parent = judge_parents(parents)
            if why_parent and not allow_insecure:
                os.close(fd)
                raise UnsafeStore(
                    f"{path}: another user can replace the store ({why_parent}); move the store to a "
                    f"folder only you (or root) can write, or {INSECURE_HINT}"
                )
            return fd, path, not why_parent
    trust = True
    # The path as named: a link on the way is fine if this user (or root) made it, in a
    # folder nobody else can write; one another user planted decides where the store is.
    real = os.path.realpath(path)  # a link the user made to their store is fine; from here on, no links
    why_named = insecure_path(path) if real != os.path.abspath(path) else None
    if why_named:
        if not allow_insecure:
            raise UnsafeStore(
                f"{path}: another user decides where this path leads ({why_named}); {INSECURE_HINT}"
            )
        trust = False
    if not os.path.lexists(real):
        if readonly or not create:
            raise StoreError(f"{path} does not exist" + (" (read-only: nothing to read)" if readonly else ""))
        make_private_dir(Path(real))
    why_parent = insecure_parent(real, resolved=True)
    if why_parent:
        if not allow_insecure:
            raise UnsafeStore(
                f"{path}: another user can replace the store ({why_parent}); move the store to a "
                f"folder only you (or root) can write, or {INSECURE_HINT}"
            )
        trust = False
    try:
        return fs.open_dir(real, str(path), None), real, trust
    except fs.UnsafePath:
        raise StoreError(f"{path} exists and is not a directory") from None


def _refused(e: fs.UnsafePath) -> UnsafeStore:
    return UnsafeStore(f"{e}: refusing the store (nothing in it is used or deleted)")


def open_folders(
    path: str, *, readonly: bool, allow_insecure: bool, create: bool, network_fs: bool | None
) -> Folders:
    """Check and pin the store at ``path`` (absolute). See :meth:`kcache.store.Store.open`."""
    root_fd, real, trust = open_root(path, readonly=readonly, allow_insecure=allow_insecure, create=create)
    owners: frozenset[int] | None = fs.trusted_owners(readonly)
    fds: dict[str, int | None] = {"root": root_fd}
    try:
        st = os.fstat(root_fd)
        try:
            check_root(st, path, readonly=readonly)
        except UnsafeStore:
            if not allow_insecure:
                raise
            trust = False
            owners = None
        if network_fs is not None:
            nfs = network_fs
        else:
            nfs = not on_block_device(st) and is_network_fs(real, resolved=True)
        marker = read_marker(root_fd, path)
        stats: dict[str, os.stat_result] = {".": st}
        if marker is not None:
            # A store already (the usual case): its folders are opened before anything else, and
            # checked by the fstat they were opened with once it is known whether the store is
            # written (whose owners then count); whether it can be written is read from them.
            for sub in SUBDIRS:
                if sub == "index" and nfs:
                    continue
                try:
                    fds[sub], stats[sub] = fs.open_dir_stat_at(root_fd, sub, f"{path}/{sub}", None)
                except FileNotFoundError:
                    pass  # made below, unless the store is only read
                except fs.UnsafePath as e:
                    raise _refused(e) from None
        if not readonly:
            why = unwritable(root_fd, stats)
            if why:
                # Used as KCACHE_READONLY=1 would: hits served, nothing written, one warning.
                warn_once(
                    "store-unwritable", f"{path} {why}: using it read-only (new kernels are not cached)"
                )
                readonly = True
                if owners is not None:
                    owners = fs.trusted_owners(True)
        if owners is not None:
            for sub, sst in stats.items():
                if sub != ".":
                    try:
                        fs.check_stat(sst, f"{path}/{sub}", owners, want_dir=True)
                    except fs.UnsafePath as e:
                        raise _refused(e) from None
        check_marker(root_fd, path, readonly=readonly, create=create, data=marker)
        for sub in SUBDIRS:
            if sub == "index" and nfs:
                fds[sub] = None  # no SQLite file on a network filesystem (below)
            elif sub not in fds:
                fds[sub] = open_sub(root_fd, sub, path, owners, create=not readonly)
        index_dir = None
        if nfs:
            # SQLite's locks are not safe on NFS/Lustre: entries stay shared (written by
            # rename, checked on read), the catalogue is kept on this node.
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
    except BaseException:  # re-raised: it only cleans up on the way
        for fd in fds.values():
            if fd is not None:
                os.close(fd)
        raise
    return Folders(
        path,
        fds,
        owners=owners,
        readonly=readonly,
        trusted=trust,
        network_fs=nfs,
        index_dir=index_dir,
        stats={("root" if k == "." else k): v for k, v in stats.items()},
    )
