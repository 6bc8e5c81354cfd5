"""What a store takes on disk, counted as ``du`` and a disk quota count it.

A file takes whole blocks (``st_blocks`` x 512: a 300-byte record takes 4 KiB on ext4), and so
does a folder; a file with several names is counted once. The store's size bound
(``KCACHE_MAX_SIZE``) is on this, the whole folder, in two parts:

- **committed entries** (``entries/<id[:2]>/<id>/``: the folder, its record and members), in the
  shared count every process keeps up to date (:mod:`.eviction`): a put adds what
  :func:`folder_disk` says of the folder it commits, a removal subtracts what it says of the
  folder it removes;
- **everything else** (:func:`measure`, walked by each writing process's flush thread): the
  index and its side files, the root's files and folders, the shard folders, ``locks/``, and what
  is held (``tmp/`` and ``trash/``): entries being written, removed entries that a live process
  still holds (see :mod:`.served`), the private folders of live processes (their links and
  scratch files). Eviction brings the committed entries down to what is left of the bound.

A file in ``tmp/`` with other names (a scratch file linked into the entry it was committed as, a
private link of a committed member) is counted only when every one of its names is in ``tmp/``
or ``trash/``: otherwise the committed entry counts it already (or it is outside the store).
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, NamedTuple

from ..kinds import valid_id
from . import fs

if TYPE_CHECKING:
    from .opening import Folders

#: Files of ``locks/`` that hold bytes (lock files are empty: there are one per entry id, which
#: are not listed at every turn; their folder's own blocks are counted).
LOCK_FILES = ("usage", "usage.du", "clock", "evict.lock")
_MAX_DEPTH = 6  # tmp/served.<p>/<hit>/<member>: 3; deeper is not ours, still counted to here


def disk(st: os.stat_result) -> int:
    """Bytes on disk of one file or folder, as ``du`` counts them."""
    return st.st_blocks * 512


class Footprint(NamedTuple):
    """Bytes on disk outside the committed entries (see the module doc)."""

    held: int  # tmp/ and trash/: removed entries still held, private folders, entries being written
    index_files: int  # the index and its -wal, -shm and -journal (when it is in the store)
    other: int  # the root's own files and folders, locks/
    shards: int  # the shard folders of entries/ (0: not measured)
    in_flight: int = 0  # of ``held``: entries being written (counted as committed when they land)

    @property
    def total(self) -> int:
        return self.held + self.index_files + self.other + self.shards

    @property
    def beside_entries(self) -> int:
        """What eviction leaves room for: all but the entries being written, which the shared
        count takes in as they land (counting them here too made every turn evict a few
        entries' worth more than it needed while writers wrote)."""
        return self.total - self.in_flight


def folder_disk(parent: int, name: str) -> int:
    """Bytes on disk of the entry folder ``name``: itself and its regular files (one level, its
    record too), following no link; 0 when it cannot be read."""
    try:
        dfd = os.open(name, fs.O_DIR, dir_fd=parent)
    except OSError:
        return 0
    try:
        total = disk(os.fstat(dfd))
        with os.scandir(dfd) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    st = e.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode):
                        total += disk(st)
        return total
    except OSError:
        return 0
    finally:
        os.close(dfd)


def measure(folders: Folders, shards: bool = True) -> Footprint:
    """The store's bytes on disk but its committed entries' (see the module doc). ``shards``:
    also stat every shard folder (up to 256); else they are left out (0)."""
    held, in_flight = _held(folders)
    index = 0
    ifd = folders.fd("index")
    if ifd is not None and folders.index_dir == folders.root / "index":  # not node-local elsewhere
        index = _flat(ifd, own=False)  # (its folder is the root's: counted in other)
    other = 0
    rfd = folders.fd("root")
    if rfd is not None:
        other += _flat(rfd, own=True)  # the root, its files (marker, settings), its folders themselves
    lfd = folders.fd("locks")
    if lfd is not None:
        for name in LOCK_FILES:
            with contextlib.suppress(OSError):
                other += disk(os.stat(name, dir_fd=lfd, follow_symlinks=False))
    in_shards = 0
    efd = folders.fd("entries")
    if shards and efd is not None:
        with contextlib.suppress(OSError):
            for name in os.listdir(efd):
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=efd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        in_shards += disk(st)
    return Footprint(held, index, other, in_shards, in_flight)


def report(folders: Folders, entries: int) -> dict[str, int]:
    """``kcache stats``'s figures, in bytes: ``entries`` (the committed entries, given), ``held``
    (what live processes hold: removed entries' folders they were handed, their private links and
    scratch files, entries being written), ``index``, ``other`` (folders, lock files) and
    ``total``, which the bound is on."""
    fp = measure(folders)
    out = {"entries": entries, "held": fp.held, "index": fp.index_files, "other": fp.other + fp.shards}
    out["total"] = sum(out.values())
    return out


def _flat(dfd: int, *, own: bool) -> int:
    """The blocks of what a folder holds, one level (a subfolder: its own only); ``own``: and
    the folder's own."""
    try:
        total = disk(os.fstat(dfd)) if own else 0
        with os.scandir(dfd) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    total += disk(e.stat(follow_symlinks=False))
        return total
    except OSError:
        return 0


def _held(folders: Folders) -> tuple[int, int]:
    """``tmp/`` and ``trash/``, each inode once; a file of ``tmp/`` with names elsewhere only
    when all of them were seen here (see the module doc). Returns (that, the part of it that
    is entries being written: ``tmp/<id>.<pid>.<random>/``)."""
    seen: dict[tuple[int, int], list[int]] = {}  # inode -> [blocks, links, names seen]
    total = 0
    for sub in ("trash", "tmp"):
        fd = folders.fd(sub)
        if fd is not None:  # (the folder itself is the root's: counted in other)
            total += _walk(fd, seen, sub == "trash", 0)
    in_flight = 0
    tfd = folders.fd("tmp")
    if tfd is not None:
        with contextlib.suppress(OSError):
            for name in os.listdir(tfd):
                if valid_id(name.partition(".")[0]):  # tmp/<id>.<pid>.<random>/: being written
                    in_flight += folder_disk(tfd, name)
    for blocks, links, names in seen.values():
        if names >= links:
            total += blocks
    return total, min(in_flight, total)


def _walk(dfd: int, seen: dict[tuple[int, int], list[int]], whole: bool, depth: int) -> int:
    total = 0
    try:
        with os.scandir(dfd) as it:
            items = list(it)
    except OSError:
        return 0
    for e in items:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            total += disk(st)
            if depth < _MAX_DEPTH:
                try:
                    sub = os.open(e.name, fs.O_DIR, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    total += _walk(sub, seen, whole, depth + 1)
                finally:
                    os.close(sub)
            continue
        k = (st.st_dev, st.st_ino)
        got = seen.get(k)
        if got is not None:
            got[2] += 1
        elif whole or st.st_nlink <= 1:
            # trash/: a removed entry's files have no name in entries/ (their other names, if
            # any, are this store's private links or scratch files, or outside it): counted
            seen[k] = [disk(st), 0, 1 << 30]
        else:
            seen[k] = [disk(st), st.st_nlink, 1]
    return total
