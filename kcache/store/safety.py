"""The store is a trust boundary: it holds GPU code and host launcher libraries that get loaded.

A store is used only when the current user owns it (root may own a store that is only read, baked
into an image) and neither group nor others can write it; kcache creates it 0700. Network
filesystems are detected so that the SQLite index is kept off them.
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


def check_dir(path: Path, *, readonly: bool, allow_insecure: bool) -> None:
    """Refuse a store directory someone else could write to. Raises :class:`UnsafeStore`."""
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeStore(f"{path} is not a directory")
    if allow_insecure:
        return
    uid = os.geteuid()
    if st.st_uid != uid and not (st.st_uid == 0 and readonly):
        raise UnsafeStore(
            f"{path} is owned by uid {st.st_uid}, not by you (uid {uid}); a store is trusted only when "
            "it is yours (or root's, read with KCACHE_READONLY=1). Set KCACHE_ALLOW_INSECURE=1 to use it anyway"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeStore(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); anyone who can "
            "write it can run code through it. chmod 700 it, or set KCACHE_ALLOW_INSECURE=1"
        )


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) with the leaf at 0700; an existing one is left as it is."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


def fs_type(path: Path, mounts_file: str = "/proc/self/mounts") -> str | None:
    """The filesystem type of the mount holding ``path`` (longest matching mount point), or None."""
    try:
        real = os.path.realpath(path)
        best, best_type = "", None
        with open(mounts_file, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, best_type = mnt, parts[2]
        return best_type
    except OSError:
        return None


def is_network_fs(path: Path, mounts_file: str = "/proc/self/mounts") -> bool:
    t = fs_type(path, mounts_file)
    return bool(t) and (t in NETWORK_FS or t.split(".")[0] in NETWORK_FS)
