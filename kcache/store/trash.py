"""The store's ``trash/`` folder: entry folders on their way out.

Removal is two steps so that a reader never sees a half-deleted entry: the folder is renamed into
``trash/`` (atomic), then emptied here. Emptying never follows a link, leaves a folder that a
process still holds (see :mod:`.served`) for later, and leaves empty folders for :func:`sweep`
(removing a folder can cost milliseconds that an evicting put must not wait for). Below the
entries, the housekeeping and the eviction that all remove folders.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
import time
from typing import TYPE_CHECKING

from . import fs
from . import tunables as T
from .footprint import disk
from .footprint import folder_disk as folder_bytes

if TYPE_CHECKING:
    from .opening import Folders

__all__ = ["Trash", "drop_trash", "empty_folder", "folder_bytes", "sweep"]


def empty_folder(parent: int, name: str) -> tuple[int, bool]:
    """Delete the files in the folder ``name`` (one level, following no link): (the bytes on
    disk they took; whether it is empty now). The folder itself is left for :func:`sweep` to
    remove: on some filesystems removing a folder costs milliseconds (ext4 with ``discard``: 2.4
    ms here, against 0.03 ms per file), which an evicting put must not wait for. (What an entry
    counts for against the bound is :func:`folder_bytes`: its folder's blocks and its files'.)"""
    return _files(parent, name)


def _files(parent: int, name: str) -> tuple[int, bool]:
    try:
        dfd = os.open(name, fs.O_DIR, dir_fd=parent)
    except OSError:
        return 0, False
    total, empty = 0, True
    try:
        with os.scandir(dfd) as it:
            items = list(it)
        for e in items:
            try:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    empty = False  # not an entry's shape: the caller removes the whole tree
                    continue
                if stat.S_ISREG(st.st_mode):
                    total += disk(st)
                os.unlink(e.name, dir_fd=dfd)
            except OSError:
                empty = False
    except OSError:
        empty = False
    finally:
        os.close(dfd)
    return total, empty


def drop_trash(trash_fd: int, name: str, *, keep_empty: bool = False) -> int | None:
    """Delete what the folder ``name`` in ``trash/`` holds unless a process holds it (see
    :mod:`.served`): its files, then itself (unless ``keep_empty``: :func:`sweep` removes it
    later), following no link. The bytes deleted, or None when it is held (left whole). (The
    store's size count dropped the entry when it was moved here.)"""
    try:
        hfd = os.open(name, fs.O_DIR, dir_fd=trash_fd)
    except OSError:  # not a folder (a link, a file): removed as it is, never followed
        fs.rmtree_at(trash_fd, name)
        return 0
    try:
        try:
            # Held against any holder until emptied: one that comes late finds it taken and
            # serves private links instead.
            fcntl.flock(hfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        except OSError:
            pass  # no locks here (no holders either: see served.py)
        freed, empty = empty_folder(trash_fd, name)
        if not empty:  # not an entry's shape (a folder inside): removed whole
            freed += folder_bytes(trash_fd, name)
            fs.rmtree_at(trash_fd, name)
        elif not keep_empty:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=trash_fd)
    finally:
        os.close(hfd)
    return freed


def sweep(
    trash_fd: int, budget_s: float, held: bool = False, skip: set[str] | None = None
) -> tuple[int, bool]:
    """Remove what removals left in ``trash/``, for at most ``budget_s`` seconds: the empty
    folders that evictions left (see :func:`empty_folder`), and the folders whose files an
    evicting put left to delete, unless a process holds them (see :func:`drop_trash`). A folder
    found held (or being emptied by another process) goes into ``skip`` and is tried again only
    with ``held`` (without ``skip``: only with ``held``). Returns how many went, and whether
    every folder was tried within the budget."""
    end = time.monotonic() + budget_s
    n = 0
    try:
        names = os.listdir(trash_fd)
    except OSError:
        return 0, False
    for name in names:
        if time.monotonic() > end:
            return n, False
        try:
            os.rmdir(name, dir_fd=trash_fd)
            n += 1
            continue
        except OSError:
            pass
        if not held and (skip is None or name in skip):
            continue
        if drop_trash(trash_fd, name) is None:
            if skip is not None:
                skip.add(name)
        else:
            n += 1
    if skip:
        skip.intersection_update(names)  # gone meanwhile: forgotten
    return n, True


class Trash:
    """One process's view of ``trash/``: whether its removals left something there (``left``),
    when folders found held were last tried, and the entries its puts evicted whose files wait
    for the flush thread's sweep (bounded: :meth:`behind`)."""

    def __init__(self, folders: Folders) -> None:
        self.folders = folders
        self.left = False  # removals left folders in trash/ (see sweep)
        self._swept = -1e9  # monotonic: when held folders in trash/ were last tried
        self._held: set[str] = set()  # folders in trash/ found held: tried with those
        self._soon = 0  # entries puts evicted since the last whole sweep (their files wait for it)
        self._soon_bytes = 0  # ... and their bytes on disk
        self._sweeping = threading.Lock()

    def after_fork(self) -> None:
        # The parent's flush thread may have been sweeping at the fork: the child's copy of the
        # lock would stay taken (its sweeps skipped, its close waiting for good).
        self._sweeping = threading.Lock()

    def retry_held(self) -> None:
        """Try the held folders at the next :meth:`sweep` (a hold was let go)."""
        self.left, self._swept = True, -1e9

    def behind(self, bound: int) -> bool:
        """The flush thread is behind the puts that evict: :data:`~.tunables.SOON_MAX` entries, or
        :data:`~.tunables.SOON_SHARE` of the bound in bytes still on disk, wait for it."""
        return self._soon >= T.SOON_MAX or self._soon_bytes > T.SOON_SHARE * bound

    def note_soon(self, freed: int) -> None:
        self._soon += 1
        self._soon_bytes += freed

    def sweep(self, budget_s: float | None = None, *, closing: bool = False) -> int:
        """What removals left in ``trash/``: empty folders (evictions leave them for later), the
        files of entries that puts evicted, and, at most every :data:`~.tunables.HELD_SWEEP_S`,
        folders that a process held and no longer does. How many folders went. Never raises."""
        f = self.folders
        trfd = f.fd("trash")
        if trfd is None or f.readonly or (f.closed and not closing):
            return 0
        # One sweep at a time in a process (the flush thread's, or a put's past the bound: see
        # Upkeep._let_go): a put finds it taken and goes on; closing waits for it.
        if not self._sweeping.acquire(blocking=closing):
            return 0
        try:
            return self._sweep(trfd, budget_s)
        finally:
            self._sweeping.release()

    def _sweep(self, trfd: int, budget_s: float | None) -> int:
        now = time.monotonic()
        before = self._swept
        held = now - before >= T.HELD_SWEEP_S
        if held:
            self._swept = now
        try:
            soon, soon_bytes = self._soon, self._soon_bytes
            n, whole = sweep(
                trfd, T.FLUSH_EVERY_S / 2 if budget_s is None else budget_s, held=held, skip=self._held
            )
            if held and not whole:
                # The held folders' turn stays due: a put's 20 ms sweep that did not reach them
                # all took it, and they waited HELD_SWEEP_S more (the flush thread's sweeps skip
                # them meanwhile), counted against the bound all that while.
                self._swept = before
            if whole:  # those the puts evicted meanwhile still wait
                self._soon = max(0, self._soon - soon)
                self._soon_bytes = max(0, self._soon_bytes - soon_bytes)
            self.left = bool(os.listdir(trfd))
            return n
        except OSError:
            return 0
