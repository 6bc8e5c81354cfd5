"""The store is a trust boundary: it holds GPU code and host launcher libraries that get loaded.

A store is used only when the current user owns it (root may own a store that is only read, baked
into an image), neither group nor others can write it (kcache creates it 0700), and no folder
above it lets another user swap it (:func:`insecure_parent`). ``KCACHE_ALLOW_INSECURE=1`` uses a
store that fails these checks, but then nothing that runs on the host (launchers, pickles) is
taken from it. Network filesystems are detected so that the SQLite index is kept off them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# Filesystems where SQLite's locking is unreliable (the SQLite FAQ; Lustre and GPFS by report).
NETWORK_FS = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "cifs",
        "smb3",
        "smbfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "9p",
        "afs",
        "panfs",
        "wekafs",
        "fuse.juicefs",
    }
)


class UnsafeStore(Exception):
    """The directory may not be used as a store; the message says why and how to opt in."""


OPT_IN = "set KCACHE_ALLOW_INSECURE=1 to use it anyway (launchers and pickled entries are then never taken from it)"


def check_root(st: os.stat_result, path: str, *, readonly: bool) -> None:
    """Refuse a store root someone else could write to. Raises :class:`UnsafeStore`."""
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStore(f"{path} is not a directory")
    uid = os.geteuid()
    if st.st_uid != uid and not (st.st_uid == 0 and readonly):
        raise UnsafeStore(
            f"{path} is owned by uid {st.st_uid}, not by you (uid {uid}); a store is trusted only when "
            f"it is yours (or root's, read with KCACHE_READONLY=1); {OPT_IN}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStore(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); anyone who can "
            f"write it can run code through it. chmod 700 it, or {OPT_IN}"
        )


def check_dir(path: Path, *, readonly: bool, allow_insecure: bool) -> None:
    """:func:`check_root` by path (for ``kcache config``, which reports without opening)."""
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStore(f"{path} is not a directory")
    if not allow_insecure:
        check_root(st, str(path), readonly=readonly)


def insecure_parent(path: str, *, resolved: bool = False) -> str | None:
    """Why a folder above ``path`` lets another user replace the store, or None.

    As ssh's StrictModes judges a key's folders: every folder from the store's parent up to ``/``
    must be owned by root or by this user, and not be writable by group or others unless its
    sticky bit is set (like /tmp, where only a name's owner may rename or delete it). Anyone
    else who can write a parent can rename the store away and put a folder of their own in its
    place after kcache checked it. ``resolved``: ``path`` is already its realpath."""
    uid = os.geteuid()
    cur = os.path.dirname(path if resolved else os.path.realpath(path))
    while True:
        try:
            st = os.stat(cur)
        except OSError as e:
            return f"cannot check {cur}: {e.strerror}"
        why = _unsafe_folder(cur, st, uid)
        if why:
            return why
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        cur = parent


def linkless_parents(path: str) -> list[tuple[str, os.stat_result]] | None:
    """The folders above ``path`` (absolute and normalised), its parent first and ``/`` last,
    each with its lstat, when every one exists and none is a link: then they are the real
    folders above ``path``, and :func:`judge_parents` says what :func:`insecure_parent` would
    say, without resolving the path and walking it a second time. None when one is a link or
    cannot be read: resolve and judge as before."""
    if not path.startswith("/") or path.startswith("//"):
        return None
    out = []
    cur = os.path.dirname(path)
    while True:
        try:
            st = os.lstat(cur)
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return None
        out.append((cur, st))
        parent = os.path.dirname(cur)
        if parent == cur:
            return out
        cur = parent


def judge_parents(parents: list[tuple[str, os.stat_result]]) -> str | None:
    """:func:`insecure_parent`'s answer for the folders :func:`linkless_parents` found."""
    uid = os.geteuid()
    for path, st in parents:
        why = _unsafe_folder(path, st, uid)
        if why:
            return why
    return None


def _unsafe_folder(path: str, st: os.stat_result, uid: int) -> str | None:
    if st.st_uid not in (0, uid):
        return f"{path} is owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"{path} is writable by group or others without the sticky bit (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def insecure_path(path: str) -> str | None:
    """Why the path as it is named, links and all, lets another user decide where it leads, or
    None. The partner of :func:`insecure_parent`, which judges the folders above the path's real
    location: a link on the way (``TRITON_CACHE_DIR=/shared/tc`` where ``/shared/tc`` is a link)
    is judged here. Every folder that holds a component of the path must be one nobody else
    could have planted a name in (the same rule), and a link on the way must be this user's or
    root's (in a sticky folder such as /tmp anyone may create a name, and a link another user
    made there would decide where this user's files go). Parts of the path that do not exist yet
    are skipped: check before creating anything (issue 17)."""
    uid = os.geteuid()
    cur = os.path.abspath(path)
    while True:
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        try:
            lst = os.lstat(cur)
            if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (0, uid):
                return f"{cur} is a link made by uid {lst.st_uid}"
        except FileNotFoundError:
            pass
        except OSError as e:
            return f"cannot check {cur}: {e.strerror}"
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            st = None
        except OSError as e:
            return f"cannot check {parent}: {e.strerror}"
        if st is not None:
            why = _unsafe_folder(parent, st, uid)
            if why:
                return why
        cur = parent


def make_private_dir(path: Path) -> None:
    """Create ``path`` and its missing parents, each 0700 (whatever the umask: a parent that
    others could write would let them swap the store); existing folders are left as they are."""
    missing = []
    p = Path(os.path.abspath(path))
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def fs_type(
    path: Path | str, mounts_file: str = "/proc/self/mounts", *, resolved: bool = False
) -> str | None:
    """The filesystem type of the mount holding ``path`` (longest matching mount point), or None.
    ``resolved``: ``path`` is already its realpath. (Read as bytes: a text file's first opening
    in a process costs 0.1 ms, the store's opening pays this.)"""
    try:
        real = os.fsencode(path if resolved else os.path.realpath(path))
        best, best_type = b"", None
        for line in _read_all(mounts_file).splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            mnt = parts[1].replace(b"\\040", b" ")
            if (real == mnt or real.startswith(mnt.rstrip(b"/") + b"/")) and len(mnt) >= len(best):
                best, best_type = mnt, parts[2]
        return None if best_type is None else best_type.decode("utf-8", "replace")
    except OSError:
        return None


def _read_all(name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def on_block_device(st: os.stat_result) -> bool:
    """Whether the file or folder of ``st`` is on a filesystem of a block device (a disk: ext4,
    xfs): never a network filesystem, which the kernel mounts without one (an anonymous device,
    major number 0: NFS, Lustre, GPFS, CephFS, SMB, FUSE; also tmpfs, overlay, btrfs). Saves
    reading the mount table, 0.1 ms of the kernel's time in a new process."""
    return os.major(st.st_dev) != 0


def is_network_fs(
    path: Path | str, mounts_file: str = "/proc/self/mounts", *, resolved: bool = False
) -> bool:
    t = fs_type(path, mounts_file, resolved=resolved)
    return t is not None and t != "" and (t in NETWORK_FS or t.split(".")[0] in NETWORK_FS)
