"""Walking the store's folders: the entries on disk, strays, and leftovers in ``tmp/``.

Functions over a store's pinned folders (:class:`~.opening.Folders`) and entries, used by
``verify``, ``clear``, export and the index's fill through :class:`~.disk.DiskTier`. Everything goes through the pinned descriptors and follows no link.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

from ..kinds import valid_id
from . import fs
from . import tunables as T
from .clock import Clock
from .entries import Entries
from .errors import CorruptEntry, RefusedEntry
from .opening import Folders
from .records import RECORD_NAME, Record
from .trash import drop_trash


def iter_entry_ids(folders: Folders) -> Iterator[str]:
    """The ids of the entry folders on disk (names that are not ids are skipped)."""
    for _shard, name, problem in scan(folders):
        if problem is None:
            yield name


def scan(folders: Folders) -> Iterator[tuple[str, str, str | None]]:
    """(shard, name, problem) for everything under ``entries/``: problem None for an entry
    folder, else why the path does not belong there (a stray, for ``verify``)."""
    efd = folders.fd("entries")
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
        if len(shard) != 2 or not all(c in "0123456789abcdef" for c in shard) or not stat.S_ISDIR(st.st_mode):
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


def entry_extras(entries: Entries, ident: str, rec: Record) -> list[str]:
    """Files in the entry's folder that are not its members (strays, for ``verify``)."""
    try:
        dfd = entries.entry_fd(ident)
    except (CorruptEntry, RefusedEntry, OSError):
        return []
    if dfd is None:
        return []
    try:
        return sorted(set(os.listdir(dfd)) - {f.name for f in rec.files} - {RECORD_NAME})
    except OSError:
        return []
    finally:
        os.close(dfd)


def remove_stray(entries: Entries, shard: str, name: str = "", member: str = "") -> bool:
    """Remove a path under ``entries/`` that is not an entry (or a stray file in an entry),
    following no link. True when it is gone."""
    efd = entries.folders.fd("entries")
    if (
        entries.folders.readonly
        or efd is None
        or "/" in shard + name + member
        or ".." in (shard, name, member)
    ):
        return False
    if member:
        dfd = entries.entry_fd(name)
        if dfd is None:
            return True
        try:
            return fs.rmtree_at(dfd, member)
        finally:
            os.close(dfd)
    trfd = entries.folders.fd("trash")
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


def clean_tmp(folders: Folders, clock: Clock, min_age: float = T.STALE_TMP_S) -> int:
    """Remove what dead writers left in ``tmp/``, and what is in ``trash/`` unless a live
    process holds it (a removed entry whose files it handed out). Follows no link: a link in
    there is removed, not followed.

    A folder in ``tmp/`` (an entry being written, a process's private scratch or served
    folder) is removed only when nobody holds it: every live writer and process keeps a
    shared flock on its folder, which the kernel drops when it dies, so a live process's
    files are never taken (whatever its pid namespace), and a dead one's go at once. Other
    files there go after ``min_age``, and so do folders where locks cannot tell (a network
    filesystem, whose locks may be per node, or one without flock). Run by ``kcache clear``
    and ``verify --fix``; dead processes' private folders are also removed by every process
    that opens the store (``DiskTier.clean_dead_folders``)."""
    if folders.readonly:
        return 0
    n = 0
    now = clock.refresh()
    for sub in ("tmp", "trash"):
        dfd = folders.fd(sub)
        if dfd is None:
            continue
        try:
            names = os.listdir(dfd)
        except OSError:
            continue
        for name in names:
            if sub == "trash":
                # A removed entry's folder that a live process holds (it handed out its
                # files, see .served) stays until nobody does; anything else goes.
                if folders.network_fs:
                    fs.rmtree_at(dfd, name)
                    n += 1
                elif drop_trash(dfd, name) is not None:
                    n += 1
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                # On a network filesystem a lock may be seen on one node only: there a
                # folder goes by age, as a file does (a writer on another node is alive).
                if fs.remove_unheld_at(
                    dfd, name, trust_locks=not folders.network_fs, min_age=min_age, now=now
                ):
                    n += 1
            elif now - st.st_mtime > min_age:
                fs.rmtree_at(dfd, name)
                n += 1
    return n
