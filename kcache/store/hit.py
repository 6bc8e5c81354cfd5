"""A verified entry handed to a caller (:class:`Hit`), and the memo of hits a process holds.

A :class:`Hit` carries the record and every member's verified bytes; :attr:`Hit.paths` gives
real files holding those bytes, made by :class:`~.served.Served` (held entry folders or private
links that cannot change for the life of the process).

:class:`HitMemo`: a process that looks the same kernel up again (Triton asks for a kernel's group
at every new specialisation) is given the hit it verified before, with no file read again, as
long as the entry's record file is still the one verified (not removed, replaced, or due a
refresh of its last use) and its folder is the one this process holds.
"""

from __future__ import annotations

import errno
import os
import threading
from typing import TYPE_CHECKING, Any

from . import fs
from . import tunables as T
from .errors import ServeFailed as ServeFailed  # (where it was first defined: importers keep it)
from .records import RECORD_NAME, Record

if TYPE_CHECKING:
    from .clock import Clock
    from .opening import Folders
    from .served import Served


class Hit:
    """A verified entry. :meth:`read` gives a member's verified bytes; :attr:`paths` gives real
    files holding them, with the members' own names (Triton reads a file's type from its suffix),
    that stay as they are for the life of this process."""

    __slots__ = ("record", "_blobs", "_served", "_paths", "_paths_pid", "mtime", "inos", "_pin", "rsig")

    def __init__(
        self,
        record: Record,
        blobs: dict[str, bytes],
        served: Served | None,
        mtime: float = 0.0,
        inos: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.record, self._blobs, self._served = record, blobs, served
        #: The members' (device, inode) as verified: files made later are links of these very
        #: inodes, checked after linking, else copies of the bytes (see :mod:`.served`).
        self.inos: dict[str, tuple[int, int]] = inos or {}
        self._paths: dict[str, str] | None = None
        self._paths_pid = os.getpid()
        self.mtime = mtime
        #: The held entry folder its paths name (see :mod:`.served`), or None.
        self._pin: int | None = None
        #: The record file's identity as read (see :func:`sig`), for the memo; None: not read.
        self.rsig: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        return f"Hit({self.record!r})"

    def read(self, name: str) -> bytes:
        """The member's bytes, as checked against the record."""
        return self._blobs[name]

    @property
    def blobs(self) -> dict[str, bytes]:
        """Every member's verified bytes (read again from the held folder where the memo kept
        none)."""
        return {f.name: self._blobs[f.name] for f in self.record.files}

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.record.files]

    @property
    def paths(self) -> dict[str, str]:
        """Member name -> path of a private file holding the verified bytes (made on first use;
        :class:`OSError` when they cannot be made, e.g. after ``Store.close()``: a miss)."""
        if self._paths is None or self._paths_pid != os.getpid():
            # (A forked child's own: its parent's name the parent's descriptors.)
            if self._served is None:
                raise OSError("no store to serve files from")
            self._paths, self._pin = self._served.serve_held(self)
            self._paths_pid = os.getpid()
        return self._paths


def sig(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What changes when a file is replaced or written: its inode, size and times."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


MEMO_MAX = 4096  # verified hits remembered per store and process


class _Held:
    """What the memo keeps of a verified hit whose entry folder this process holds."""

    __slots__ = ("record", "paths", "pin", "rsig", "inos", "record_path")

    def __init__(self, hit: Hit, rsig: tuple[int, ...]) -> None:
        rec = hit.record
        self.record, self.paths, self.pin, self.rsig = rec, dict(hit._paths or {}), hit._pin, rsig
        self.inos = dict(hit.inos)
        rid = rec.id
        self.record_path = f"{rid[:2]}/{rid}/{RECORD_NAME}"


class _HeldBlobs(dict):
    """A remembered hit's bytes, read again from its held entry folder when asked (and checked
    against the record as they are read): the memo holds no file's bytes."""

    __slots__ = ("_pin", "_record", "_files")

    def __init__(self, pin: int, record: Record) -> None:
        super().__init__()
        self._pin, self._record = pin, record
        self._files: dict[str, Any] | None = None  # member name -> FileInfo, made when first asked

    def __missing__(self, name: str) -> bytes:
        if self._files is None:
            self._files = {f.name: f for f in self._record.files}
        f = self._files[name]
        data, _st = fs.read_at(self._pin, name, f.size)
        if len(data) != f.size or not f.check(data):
            raise OSError(errno.EIO, f"member {name} changed since it was verified")
        return data


class HitMemo:
    """Hits verified earlier in this process whose entry folders it holds (see the module doc)."""

    def __init__(self, folders: Folders, clock: Clock, served: Served) -> None:
        self._folders, self._clock, self._served = folders, clock, served
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, str], _Held] = {}

    def __len__(self) -> int:
        return len(self._memo)

    def put(self, kind: str, key: str, hit: Hit) -> None:
        """Remember a verified hit whose entry folder this process holds (its ``rsig`` set)."""
        if hit._pin is None or hit.rsig is None:
            return
        held = _Held(hit, hit.rsig)
        with self._lock:
            memo = self._memo
            memo.pop((kind, key), None)
            if len(memo) >= MEMO_MAX:
                memo.pop(next(iter(memo)), None)
            memo[(kind, key)] = held

    def get(self, kind: str, key: str) -> Hit | None:
        """The hit of (kind, key) verified earlier in this process, if its entry is still the
        one verified: its record file the same (by inode, size and times: not removed, replaced,
        nor due a refresh of its last use). Nothing is read again: the files it names are the
        ones verified, in the entry folder this process holds (an entry's files are never
        written once it is committed: kcache writes only new files, and a removal or a
        replacement renames the folder away). None otherwise: a full lookup."""
        m = self._memo.get((kind, key))
        if m is None or m.pin is None:  # (only held hits are remembered)
            return None
        efd = self._folders.fd("entries")
        if efd is None:
            return None
        try:
            st = os.stat(m.record_path, dir_fd=efd, follow_symlinks=False)
        except OSError:
            st = None
        if st is None or sig(st) != m.rsig or abs(self._clock.now() - st.st_mtime) > T.TOUCH_EVERY_S:
            with self._lock:
                self._memo.pop((kind, key), None)
            return None
        hit = Hit(m.record, _HeldBlobs(m.pin, m.record), self._served, st.st_mtime, m.inos)
        hit._paths, hit._pin = dict(m.paths), m.pin
        return hit

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()

    def after_fork(self) -> None:
        self._lock = threading.Lock()
