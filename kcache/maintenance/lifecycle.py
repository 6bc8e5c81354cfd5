"""A store's life as maintenance sees it: opened for a command (never created by one), closed;
made by an import, and unmade when that import fails.

A command that reads or changes a store never makes one: a missing folder opens as an
:class:`~.empty.EmptyStore`. Only ``kcache import`` (and a compile) makes a new store; when an
import fails, the folder is left as it was found (missing, or empty). Removal goes by
descriptor, as everywhere in the store (``docs/design.md``, "Pinned"): the folder is opened
once, with no link followed, and everything below it is removed relative to that descriptor
(:func:`kcache.store.fs.rmtree_at`), so that a link planted in it, or a folder swapped for a link
meanwhile, is removed as a link and never followed out of the store.
"""

from __future__ import annotations

import atexit
import contextlib
import os

from ..config import Settings
from ..store import Store, StoreError
from ..store import fs as _fs
from ..store.api import Admin
from ..store.opening import MARKER, SUBDIRS
from .empty import EmptyStore

#: How long a maintenance command waits for a busy index (a compile waits a quarter second).
WRITE_TIMEOUT_S = 10.0


def open_store(settings: Settings, *, write: bool = False) -> Admin:
    """The store at ``settings.dir``: read-only unless ``write``.

    A missing folder is never created: it opens as an empty read-only store. An existing folder
    that holds no store (empty or not) is refused, for writing too: only a compile or an import
    makes a new store. Raises :class:`StoreError` when the folder cannot be used, and for
    ``write`` when the settings say read-only."""
    root = os.path.abspath(os.fspath(settings.dir))
    if write and settings.readonly:
        raise StoreError(f"{root} is read-only (KCACHE_READONLY=1): nothing may be changed")
    try:
        exists = os.path.lexists(root)
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot use {root!r}: {e}") from None
    if not exists:
        return EmptyStore(settings)
    if not write:
        with contextlib.suppress(OSError):
            if os.path.isdir(root) and not os.listdir(root):
                return EmptyStore(settings)
    return Store.from_settings(
        settings, write=write, create=False, index_timeout=WRITE_TIMEOUT_S if write else 1.0
    )


def close_store(store: Admin) -> None:
    """Close ``store`` and drop its exit hook."""
    store.close()
    atexit.unregister(store.close)  # (never raises: a function not registered is no error)


def fresh_folder(path: str) -> str | None:
    """Whether ``path`` holds no store yet: "missing", "empty", else None. An import makes a
    store there, and a failed import must not leave it behind (:func:`undo_new_store`)."""
    try:
        if not os.path.lexists(path):
            return "missing"
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            return "empty"
    except OSError:
        pass
    return None


def undo_new_store(path: str, fresh: str) -> bool:
    """After a failed import into a folder that was ``fresh`` ("missing" or "empty"): remove the
    store the import made, unless it holds an entry (another process started using it
    meanwhile), leaving the folder as it was found. By descriptor, following no link. Returns
    whether it was removed."""
    parent_path, name = os.path.split(os.path.abspath(path))
    try:
        parent = os.open(parent_path or "/", _fs.O_DIR)
    except OSError:
        return False
    try:
        try:
            root = os.open(name, _fs.O_DIR, dir_fd=parent)
        except OSError:
            return False  # gone, or replaced by something that is not a folder: not ours to judge
        try:
            if not _holds_no_store_but_ours(root):
                return False
            for sub in SUBDIRS:
                if not _fs.rmtree_at(root, sub):
                    return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(MARKER, dir_fd=root)
            if os.listdir(root):
                return False  # something else appeared in it: the folder stays
        except OSError:
            return False
        finally:
            os.close(root)
        if fresh == "missing":
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                return False
        return True
    finally:
        os.close(parent)


def _holds_no_store_but_ours(root: int) -> bool:
    """True when the folder open at ``root`` holds a store with no entry in it (raises OSError
    for anything a new store does not hold)."""
    try:
        entries = os.open("entries", _fs.O_DIR, dir_fd=root)
    except FileNotFoundError:
        return True
    try:
        for shard in os.listdir(entries):
            fd = os.open(shard, _fs.O_DIR, dir_fd=entries)  # a file or a link: raises, kept
            try:
                if os.listdir(fd):
                    return False
            finally:
                os.close(fd)
        return True
    finally:
        os.close(entries)
