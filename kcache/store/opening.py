"""Opening a store's folders: the marker, its own folders, the node-local index folder.

Functions used by :meth:`kcache.store.local.Store.open`: everything here works on descriptors
(see :mod:`kcache.store.fs`) and raises ``UnsafeStore`` or ``StoreError`` with a reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgpack

from . import fs
from .errors import StoreError
from .safety import UnsafeStore, insecure_parent, insecure_path, make_private_dir

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


def check_marker(root_fd: int, path: str, *, readonly: bool, create: bool) -> None:
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


def unwritable(root_fd: int) -> str | None:
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
