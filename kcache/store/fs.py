"""File operations that never follow a link and never resolve a path name twice.

The store is a trust boundary, and path names can be swapped under a process: a folder renamed
away and replaced, a link planted where a folder or file was expected. Everything here works on
descriptors: a folder is opened once (``O_DIRECTORY | O_NOFOLLOW``) and checked (owner, mode)
through its descriptor, and what lies inside is opened, created, renamed and removed relative to
it (``dir_fd=``). A path handed to another library (Triton opens and dlopens what kcache returns)
goes through ``/proc/self/fd/N/...``, which the kernel resolves through the open descriptor, not
through the name the folder had when it was opened.

Everything here is Linux/POSIX; kcache runs where Triton runs.
"""

from __future__ import annotations

import errno
import os
import stat

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# O_NONBLOCK: a FIFO planted where a file was expected is refused (by fstat) instead of blocking
# the open forever; it changes nothing for regular files.
O_READ = os.O_RDONLY | O_NOFOLLOW | O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
O_DIR = os.O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | O_CLOEXEC

_PROC_FD = "/proc/self/fd"
_proc_ok: bool | None = None


class UnsafePath(Exception):
    """A folder or file that must not be used: a link, not ours, writable by others (says why)."""


def proc_fd_usable(folder: int | None = None, folder_st: os.stat_result | None = None) -> bool:
    """True where ``/proc/self/fd/N/name`` resolves through descriptor N (Linux with /proc).
    Asked once per process; ``folder``: a folder descriptor the caller holds open to ask it with
    (``folder_st``: its fstat, if known), instead of opening ``/`` for the question."""
    global _proc_ok
    if _proc_ok is None:
        try:
            fd = os.open("/", O_DIR) if folder is None else folder
            try:
                st = os.fstat(fd) if folder_st is None or folder is None else folder_st
                _proc_ok = os.path.samestat(os.stat(f"{_PROC_FD}/{fd}/."), st)
            finally:
                if folder is None:
                    os.close(fd)
        except OSError:
            _proc_ok = False
    return _proc_ok


def fd_table_size() -> int | None:
    """How many descriptors this process's table holds now (Linux's ``FDSize``): numbers under
    it are taken without growing the table. None where the kernel does not say."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 1 << 16)
    except OSError:
        return None
    finally:
        os.close(fd)
    i = data.find(b"\nFDSize:")
    if i < 0:
        return None
    field = data[i + 8 : data.find(b"\n", i + 8)].strip()
    return int(field) if field.isdigit() else None


def fd_path(fd: int, *names: str, fallback: str | None = None) -> str:
    """A path to ``names`` inside the folder open as ``fd``, resolved through the descriptor.

    Without /proc (not Linux), ``fallback`` (the folder's path name) is used instead."""
    if proc_fd_usable():
        return os.path.join(f"{_PROC_FD}/{fd}", *names)
    if fallback is None:
        raise OSError(f"no /proc here to name folder descriptor {fd} by")
    return os.path.join(fallback, *names)


def trusted_owners(readonly: bool) -> frozenset[int]:
    """Who may own what kcache reads: this user; root too for a read-only store (baked into an image)."""
    uid = os.geteuid()
    return frozenset({uid, 0}) if readonly else frozenset({uid})


def check_stat(st: os.stat_result, what: str, owners: frozenset[int], *, want_dir: bool) -> None:
    """Raise :class:`UnsafePath` unless ``st`` is a folder (or a regular file) owned by one of
    ``owners`` and not writable by group or others."""
    if want_dir and not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{what} is not a folder")
    if not want_dir and not stat.S_ISREG(st.st_mode):
        raise UnsafePath(f"{what} is not a regular file")
    if st.st_uid not in owners:
        raise UnsafePath(f"{what} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePath(f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def open_dir(path: str, what: str, owners: frozenset[int] | None) -> int:
    """Open the folder ``path`` (its last component must not be a link) and check it (``owners``
    None: no ownership check). Returns the descriptor; raises UnsafePath or OSError."""
    try:
        fd = os.open(path, O_DIR)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(f"{what} is a link or not a folder") from None
        raise
    return _checked(fd, what, owners)


def open_dir_at(
    parent: int, name: str, what: str, owners: frozenset[int] | None, *, create: bool = False
) -> int:
    """Open (with ``create``, made 0700 when missing) the folder ``name`` inside ``parent``, refusing a
    link, a non-folder, and (``owners`` given) one owned by someone else or writable by others."""
    return open_dir_stat_at(parent, name, what, owners, create=create)[0]


def open_dir_stat_at(
    parent: int, name: str, what: str, owners: frozenset[int] | None, *, create: bool = False
) -> tuple[int, os.stat_result]:
    """:func:`open_dir_at`, and the fstat the folder was checked by."""
    try:
        try:
            fd = os.open(name, O_DIR, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            # Made only when missing (a store's folders exist but at its first opening: a mkdir
            # that fails takes the parent's lock all the same).
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                pass
            fd = os.open(name, O_DIR, dir_fd=parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafePath(f"{what} is a link or not a folder") from None
        raise
    return fd, _checked_stat(fd, what, owners)


def _checked(fd: int, what: str, owners: frozenset[int] | None) -> int:
    _checked_stat(fd, what, owners)
    return fd


def _checked_stat(fd: int, what: str, owners: frozenset[int] | None) -> os.stat_result:
    """The folder open as ``fd``'s fstat, once checked (as :func:`open_dir_at` says); closes
    ``fd`` and raises when it fails."""
    try:
        st = os.fstat(fd)
        if owners is None:
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath(f"{what} is not a folder")
        else:
            check_stat(st, what, owners, want_dir=True)
    except BaseException:  # re-raised: it only cleans up on the way
        os.close(fd)
        raise
    return st


def read_at(parent: int | None, name: str, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file ``name`` (in folder ``parent``; None: a plain path), refusing
    links, FIFOs, devices and anything over ``limit`` bytes. Returns (data, its fstat)."""
    fd = os.open(name, O_READ, dir_fd=parent) if parent is not None else os.open(name, O_READ)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{name} is not a regular file")
        if st.st_size > limit:
            raise UnsafePath(f"{name} is larger than {limit} bytes")
        return read_exact(fd, st.st_size), st
    finally:
        os.close(fd)


def read_exact(fd: int, size: int) -> bytes:
    """``size`` bytes from ``fd`` (fewer only at end of file), in one read when the kernel allows."""
    b = os.read(fd, size)
    if len(b) == size or not b:
        return b
    chunks = [b]
    left = size - len(b)
    while left > 0:
        b = os.read(fd, left)
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def write_new_at(parent: int, name: str, data: bytes, mode: int = 0o600) -> os.stat_result:
    """Create ``name`` in ``parent`` (it must not exist, nor be a link) holding ``data``."""
    fd = os.open(name, O_NEW, mode, dir_fd=parent)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        return os.fstat(fd)
    finally:
        os.close(fd)


def unique_name(prefix: str) -> str:
    """A name no other writer picks: pid plus 64 random bits."""
    return f"{prefix}.{os.getpid()}.{os.urandom(8).hex()}"


def rmtree_at(parent: int, name: str) -> bool:
    """Remove ``name`` in ``parent`` and everything below it, following no link: a link is removed
    as a link, never what it points to. Iterative (a crafted tree of any depth is no recursion
    limit). Best effort; True when ``name`` is gone."""
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True
    try:
        top = os.open(name, O_DIR, dir_fd=parent)
    except OSError:
        return False
    if not os.path.samestat(os.fstat(top), st):
        os.close(top)
        return False  # replaced between the stat and the open: leave it
    # A stack of (its parent's descriptor, its name, its descriptor once opened, emptied):
    # children first, then the folder itself, each removed relative to its parent's descriptor.
    # A folder is opened when its turn comes and closed once emptied: only the folders on the
    # current path are open, whatever the tree's width or depth.
    stack: list[list] = [[parent, name, top, False]]
    try:
        while stack:
            item = stack[-1]
            pfd, nm, fd, emptied = item
            if emptied:
                stack.pop()
                item[2] = None
                os.close(fd)
                try:
                    os.rmdir(nm, dir_fd=pfd)
                except OSError:
                    pass
                continue
            if fd is None:
                try:
                    fd = item[2] = os.open(nm, O_DIR, dir_fd=pfd)
                except OSError:
                    stack.pop()  # gone, or not a folder any more: left as it is
                    continue
            item[3] = True
            try:
                entries = list(os.scandir(fd))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append([fd, entry.name, None, False])
                    else:
                        os.unlink(entry.name, dir_fd=fd)
                except OSError:
                    pass
    finally:
        for item in stack:
            if item[2] is not None:
                try:
                    os.close(item[2])
                except OSError:
                    pass
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
        return False
    except FileNotFoundError:
        return True
    except OSError:
        return False


# flock's answer when another open file holds the lock; any other error means this filesystem
# cannot lock (some FUSE filesystems, Lustre without -o flock, NFS on folders): see
# :func:`locks_work`.
_HELD_ERRNOS = (errno.EWOULDBLOCK, errno.EAGAIN)


def locks_work(fd: int) -> bool:
    """Whether flock works on the filesystem of ``fd`` (a held lock counts as working)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in _HELD_ERRNOS
    return True


def hold(fd: int, parent: int | None = None, name: str | None = None) -> bool:
    """Mark the folder open as ``fd`` as in use for as long as this open file lives (a shared
    flock, dropped by the kernel when the process dies): :func:`remove_unheld_at` leaves it
    alone. False when :func:`remove_unheld_at` is removing it right now, or (given ``parent``
    and ``name``) it is no longer what sits at that name (removed since it was opened): the
    caller makes another. On a filesystem without flock it is not held, and True: clean-ups
    there go by age (``remove_unheld_at(..., trust_locks=False)``)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in _HELD_ERRNOS:
            return False
    if parent is not None and name is not None:
        try:
            return os.path.samestat(os.stat(name, dir_fd=parent, follow_symlinks=False), os.fstat(fd))
        except OSError:
            return False
    return True


def remove_unheld_at(
    parent: int,
    name: str,
    *,
    trust_locks: bool = True,
    min_age: float | None = None,
    now: float | None = None,
) -> bool:
    """Remove the folder ``name`` in ``parent`` (as :func:`rmtree_at`) if nobody holds it (see
    :func:`hold`): its owner is gone, whichever pid namespace it ran in. The folder stays locked
    while it is removed, so an owner that opened it a moment ago cannot hold it meanwhile (its
    :func:`hold` fails). A link, or something that cannot be opened: left alone, False.

    Where a lock does not say whether its owner lives (``trust_locks`` False: a network
    filesystem, whose locks may be per node; or a filesystem without flock), the folder goes
    only if it was not modified for ``min_age`` seconds (by ``now``, the filesystem's clock), and
    never when ``min_age`` is None."""
    import fcntl

    try:
        fd = os.open(name, O_DIR, dir_fd=parent)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except OSError as e:
            if e.errno in _HELD_ERRNOS:
                return False
            locked = False
        try:
            st = os.fstat(fd)
            if not os.path.samestat(os.stat(name, dir_fd=parent, follow_symlinks=False), st):
                return False
        except OSError:
            return False
        if not (locked and trust_locks):
            if min_age is None or now is None or now - st.st_mtime <= min_age:
                return False
        return rmtree_at(parent, name)
    finally:
        os.close(fd)  # drops the lock


def atomic_write(path: str, data: bytes | None = None, *, writer=None, mode: int = 0o600) -> None:  # noqa: ANN001
    """Write a new file at ``path`` that readers see whole or not at all.

    The bytes go to a uniquely named temporary file created exclusively in the target folder
    (``O_CREAT | O_EXCL | O_NOFOLLOW``: a name planted there, link or file, is never opened),
    which is then renamed over ``path``. The rename replaces a file or a link at ``path`` (a link
    is replaced, never followed); a folder, device, pipe or socket there is refused. ``writer(fileobj)``
    writes the content instead of ``data`` (for streams such as a tar). The folder may be named
    through links (the user chose it); the file itself never is."""
    folder, name = os.path.split(os.path.abspath(path))
    if not name:
        raise IsADirectoryError(errno.EISDIR, "not a file name", path)
    dfd = os.open(folder or ".", os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a folder; not replacing it", path)
        if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            # A device, a pipe, a socket: the rename would replace the node itself (as root,
            # /dev/full became a bundle). The user meant to write through it, which a bundle
            # cannot be (it is renamed into place): refused.
            raise OSError(
                errno.EINVAL, "is not a regular file (a device, pipe or socket); not replacing it", path
            )
        for attempt in range(8):
            tmp = "." + unique_name(name) + ".tmp"
            try:
                fd = os.open(tmp, O_NEW, mode, dir_fd=dfd)
                break
            except FileExistsError:
                # Someone made that name first (in a shared folder, another user may plant names
                # there): never opened; another random name is tried (issue 16).
                if attempt == 7:
                    raise FileExistsError(
                        errno.EEXIST, "cannot create a temporary file beside it (names taken)", path
                    ) from None
        try:
            with os.fdopen(fd, "wb", closefd=True) as f:
                if writer is not None:
                    writer(f)
                else:
                    f.write(data or b"")
                f.flush()
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:  # re-raised: it only cleans up on the way
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def pid_alive(pid: int) -> bool:
    """True unless no process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True
