"""A process's private folders (its hits' private links, its compiles' scratch files): held by
the process for its life (a shared flock, see :func:`.fs.hold`), so that another process's
clean-up removes only the folders of processes that have gone (see :mod:`.served`)."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile

from . import fs

#: Name prefixes of private folders in the system's temporary folder (read-only stores).
TEMP_PREFIX = "kcache-private-"


class PrivateFolder:
    """A private folder of this process: its descriptor (held), its parent's, its name and path."""

    __slots__ = ("fd", "parent", "name", "path", "own_parent", "pid")

    def __init__(self, fd: int, parent: int, name: str, path: str, *, own_parent: bool) -> None:
        self.fd, self.parent, self.name, self.path, self.own_parent = fd, parent, name, path, own_parent
        self.pid = os.getpid()
        if not fs.hold(fd, parent, name):  # being removed as dead by a clean-up: make another
            os.close(fd)
            if own_parent:
                os.close(parent)
            raise OSError(f"private folder {name} was removed as it was made")

    def alive(self) -> bool:
        """Still there under its name (not removed by hand)."""
        try:
            return os.path.samestat(
                os.stat(self.name, dir_fd=self.parent, follow_symlinks=False), os.fstat(self.fd)
            )
        except OSError:
            return False

    def close(self, remove: bool) -> None:
        """Let go of it (and with ``remove``, delete it). A forked child only closes its copies
        of the descriptors: the folder is its parent's."""
        mine = self.pid == os.getpid()
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if remove and mine:
            fs.rmtree_at(self.parent, self.name)
        if self.own_parent:
            with contextlib.suppress(OSError):
                os.close(self.parent)


def temp_folder(role: str) -> PrivateFolder:
    """A new private folder under the system's temporary folder (a read-only store, or a store
    whose ``tmp/`` refuses writes); the folders dead processes left there are cleaned first."""
    base = tempfile.gettempdir()
    try:
        parent = fs.open_dir(base, "the temporary folder", None)
    except fs.UnsafePath as e:  # a linked or foreign TMPDIR: callers treat OSError as a miss
        raise OSError(errno.EACCES, f"the temporary folder {base} cannot be used: {e}") from None
    try:
        clean_dead(parent, TEMP_PREFIX)
        path = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{role}-", dir=base)  # 0700, O_EXCL semantics
        fd = fs.open_dir_at(parent, os.path.basename(path), path, fs.trusted_owners(False))
    except fs.UnsafePath as e:
        os.close(parent)
        raise OSError(errno.EACCES, f"a private folder in {base} cannot be used: {e}") from None
    except BaseException:  # re-raised: it only cleans up on the way
        os.close(parent)
        raise
    return PrivateFolder(fd, parent, os.path.basename(path), path, own_parent=True)


def clean_dead(dir_fd: int, prefix: str | tuple[str, ...]) -> int:
    """Remove this user's folders named ``prefix*`` (one of the prefixes) in ``dir_fd`` that
    nobody holds."""
    n = 0
    uid = os.geteuid()
    try:
        names = [x for x in os.listdir(dir_fd) if x.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        try:
            if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if fs.remove_unheld_at(dir_fd, name):
            n += 1
    return n
