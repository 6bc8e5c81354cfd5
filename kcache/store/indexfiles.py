"""The index's files on disk: which they are, whose they are, and opening them.

SQLite opens a database by path and follows what it finds there, so the store checks what sits
where each of the index's files goes before SQLite does (:func:`not_ours`: a link, a folder,
another user's file), and removes it on the way to a writable index (:func:`open_writable`,
which also replaces a corrupt database). A reading command opens the database as it is, or
reads the entry folders instead (:func:`open_for_reading`). What the store does with the index
once open is :mod:`.catalogue`'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat

from ..log import warn_once
from . import fs
from .errors import EXPECTED, StoreError, filesystem_full, warn_full
from .index import DB_NAME, CorruptIndex, Index, IndexTooNew, is_corrupt_db
from .opening import Folders

_OLD_INDEX_FILES = ("cache.db", "cache.db-wal", "cache.db-shm")  # the diskcache index of kcache 0.1


#: Every path SQLite opens for the index (sqlite.org/tempfiles.html): the database, its rollback
#: journal, write-ahead log and shared-memory file, all beside it. A super-journal
#: (``<db>-mjHHHHHHHHH``, a transaction over attached databases) is never made by kcache, but a
#: hot journal names one, and SQLite then opens it: :func:`db_files` finds those by prefix.
_DB_FILES = (DB_NAME, DB_NAME + "-journal", DB_NAME + "-wal", DB_NAME + "-shm")
_SUPER_JOURNAL = DB_NAME + "-mj"


def db_files(ifd: int) -> list[str]:
    """The names of the index's files present in the folder ``ifd``: :data:`_DB_FILES` and any
    super-journal."""
    try:
        names = os.listdir(ifd)
    except OSError:
        return list(_DB_FILES)
    return [n for n in names if n in _DB_FILES or n.startswith(_SUPER_JOURNAL)]


def remove_files(ifd: int, *, strict: bool = False) -> None:
    """Delete the index's files in the folder ``ifd``, whatever each is (a folder at ``-journal``
    too; never what a link points to). ``strict``: a file that stays raises (a rebuild must not
    claim a new index that it could not make); else every failure is ignored (best effort, on
    the way to a miss)."""
    for name in db_files(ifd):
        if not fs.rmtree_at(ifd, name) and strict:
            raise OSError(errno.EIO, f"cannot remove the index's {name}", name)


def not_ours(ifd: int, owners: frozenset[int] | None) -> list[str]:
    """The index's paths (:func:`db_files`) where something other than a regular file of ours
    sits: a folder, a link, a FIFO, a device, another user's file. SQLite would fail on it
    (a folder at ``-journal``: "disk I/O error" for every statement), follow it or write it."""
    out = []
    for name in db_files(ifd):
        try:
            st = os.stat(name, dir_fd=ifd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError:
            out.append(name)
            continue
        if not stat.S_ISREG(st.st_mode) or (owners is not None and st.st_uid not in owners):
            out.append(name)
    return out


def open_writable(folders: Folders, ifd: int, timeout: float) -> Index:
    """Open (create) the writable index in the folder ``ifd``: what sits where the database
    goes must be a regular file of ours (else removed: SQLite would follow a link); a corrupt
    database is replaced; one of a newer kcache is left alone (:class:`IndexTooNew`)."""
    for name in _OLD_INDEX_FILES:  # kcache 0.1's diskcache index: superseded, rebuilt from entries
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=ifd)
    for name in not_ours(ifd, folders.owners):
        # A link, a folder or someone else's file where one of the index's files goes:
        # SQLite would follow it, write it or fail on it. Removed (only our folder's entry,
        # never what it points to) before SQLite opens anything.
        warn_once("index-unsafe", f"{folders.index_dir}/{name} is not a file of ours; removed")
        fs.rmtree_at(ifd, name)
    path = fs.fd_path(ifd, DB_NAME, fallback=str(folders.index_dir))
    try:
        return Index.open(path, timeout=timeout)
    except (sqlite3.DatabaseError, CorruptIndex) as e:  # a corrupt database is replaced, else raised
        if not is_corrupt_db(e):
            raise
        # A broken index is replaced, not fatal: entries are intact and self-describing.
        warn_once("index-corrupt", f"the index at {folders.index_dir} is corrupt ({e}); starting a new one")
        remove_files(ifd)
        return Index.open(path, timeout=timeout)


def open_readonly(folders: Folders, ifd: int | None) -> Index:
    """A new connection to the index in the folder ``ifd`` that never writes, creates or
    checkpoints anything (it works on a full disk and while another process holds the index):
    raises for what sits there if it is not a database of ours (:class:`CorruptIndex`)."""
    if ifd is None:
        return Index.open_readonly(None)
    bad = not_ours(ifd, folders.owners)
    if bad:
        # A folder at -wal: SQLite's read-only open fails ("unable to open database file")
        # where the writable one would remove it first. Damage, as `verify` reports it and
        # `--fix` repairs it (the rebuild removes whatever is there).
        raise CorruptIndex(f"not a file of ours at {', '.join(sorted(bad))}")
    try:
        st = os.stat(DB_NAME, dir_fd=ifd, follow_symlinks=False)
    except FileNotFoundError:
        return Index.open_readonly(None)
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{folders.index_dir}/{DB_NAME} is not a regular file")
    try:
        os.stat(DB_NAME + "-wal", dir_fd=ifd, follow_symlinks=False)
        immutable = False
    except FileNotFoundError:
        immutable = True
    return Index.open_readonly(fs.fd_path(ifd, DB_NAME, fallback=str(folders.index_dir)), immutable=immutable)


def open_for_reading(folders: Folders, ifd: int | None) -> Index:
    """The index a store opened read-only reads (``kcache stats``, ``inspect``, ``explain``):
    the database as it is; when there is none (a new store, a disk that was full when it was
    to be made), it is a newer kcache's, or it cannot be read (corrupt, empty, half made when
    inodes ran out, a folder where its journal goes), the entry folders, read into a private
    in-memory index: the command answers from what the store holds (its counters aside),
    with one warning when the index is damaged, and changes nothing. The next process that writes the store
    replaces the database (:func:`open_writable`); ``kcache verify`` reads the database itself
    (:func:`open_readonly`) and reports it."""
    why = None
    if ifd is not None:
        try:
            bad = not_ours(ifd, folders.owners)
            if bad:
                why = f"{', '.join(sorted(bad))}: not a file of ours"
            elif DB_NAME in db_files(ifd):
                return open_readonly(folders, ifd)
        except IndexTooNew as e:  # a newer kcache's: read as absent, never rewritten
            warn_once("index-newer", f"{e}: stats and eviction are off in this process (entries are used)")
        except EXPECTED as e:  # whatever the database is, the entries answer instead
            why = f"{type(e).__name__}: {e}"
    if why is not None and ifd is not None and filesystem_full(ifd):
        # Half made when the disk (or its inodes) ran out: the store's one full-disk warning.
        warn_full(folders.root_name, OSError(errno.ENOSPC, f"the index cannot be read: {why}"))
    elif why is not None:
        warn_once(
            "index-unreadable",
            f"the index at {folders.index_dir} cannot be read ({why}); reading the entries "
            "instead (the next process that writes to the store rebuilds it)",
        )
    idx = Index.open_readonly(None)
    idx.created = True  # filled from the entry folders by index()
    return idx
