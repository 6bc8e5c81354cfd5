"""Files a process hands to a library, and its scratch folder: private, held, never changing.

A hit's bytes are verified in memory. A library that wants files (Triton opens a kernel's
members and dlopens launchers) gets :attr:`Hit.paths`, which stay as they are for as long as
the paths handed out live (every one is a :class:`~.leases.HeldPath`: Triton keeps them in each
``CompiledKernel``; see :mod:`.leases`); eviction, ``kcache clear`` or a swapped folder cannot
change or remove them. Once the last has gone, what kept them is let go: a hit's private links,
and a held folder's flock once its entry is removed (until then it costs no disk and is kept,
idle, for the next lookup; its descriptor's number then names a removed, empty folder: never
another one). Two ways, the first where it can be used:

- **The entry's own folder, held.** The folder whose members were just verified is kept open
  (a descriptor numbered above the ones a process starts with, a number this process does not
  use again for another held folder) under a shared flock, and paths name its members through it: ``/proc/self/fd/<held>/<member>``. No
  file is made: a first hit costs what a FileCacheManager hit costs (making seven links and a
  folder cost 0.3-0.5 ms more on an ext4 with ``discard``). A removal (eviction, ``clear``, a
  replacement) renames an entry's folder into ``trash/`` first and deletes its files only when
  nobody holds it (an exclusive flock); a folder still held stays in ``trash/``, counted against
  the store's bound (see :mod:`.footprint`), until its holders have let go. The hold is taken after the verification, and kept
  only if the folder is still the entry's at that moment (else a removal may already be
  deleting it: the second way). Not on a network filesystem (a lock there may be per node), nor
  past :data:`MAX_PINS` (descriptors are not free).
- **Private links.** Files of this process's private "served" folder under the store's
  ``tmp/``, named through ``/proc/self/fd/N/...`` (resolved through the folder's open
  descriptor, not its name). Each file is either a hard link of the very member file that was
  read and verified (linked through ``/proc/self/fd/<member>``: the same inode, whatever now sits
  at the entry's path) or a copy of the verified bytes: it holds exactly what was checked.

Every private folder is held (a shared flock on its descriptor, see :func:`.fs.hold`) for the
life of its process (a hit's links in it, only while its paths live): ``clean_tmp`` removes only folders nobody holds, so a live process's files
are never taken, and a dead one's (killed, or ended by ``os._exit`` as pool workers are) go at
the next clean-up, which every process that opens the store also runs, off its first hit's path
(at its flush thread's first turn, or at its close). A folder removed anyway (by hand) is
made anew, and files served from it are served again.

Without /proc, paths name the folders by their path names (no pinning). After ``Store.close()``
nothing is served (``OSError``: callers treat it as a miss).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from . import fs, leases
from .leases import Lease, Ticket, hold_paths
from .private import PrivateFolder, temp_folder

if TYPE_CHECKING:
    from .opening import Folders
    from .records import Record


class Hit(Protocol):
    """What serving needs of a hit (:class:`kcache.store.hit.Hit`, which uses this module: a
    protocol here keeps the import one way)."""

    record: Record
    #: member name -> (st_dev, st_ino) of the file whose bytes were verified
    inos: dict[str, tuple[int, int]]

    def read(self, name: str) -> bytes: ...


#: Held entry folders' descriptors are numbered from 64 (above the ones a process starts with),
#: at most MAX_PINS of them per store and process, then private links. Their numbers stay under
#: a quarter of the process's descriptor limit (never under what 64 + 192 took before: 256 where
#: the limit is 512 or more), so that the program keeps the rest, and under select()'s
#: FD_SETSIZE less PIN_HEADROOM: a program's own descriptors are numbered past the held ones
#: once it has more than 64, and one past 1024 makes select.select raise (pexpect, older
#: libraries) where without kcache it would not.
PIN_FIRST, MAX_PINS = 64, 4032
FD_SETSIZE, PIN_HEADROOM = 1024, 128
#: Growing a process's table of descriptors past its size waits for an RCU grace period when the
#: process has threads (8-20 ms measured on Linux 6.18 at 256 and at 512, against 2-3 us below
#: the size; 12.9 ms in a served BERT process's first call on the H100 machine, its first hit
#: holding descriptor 64): a hit never does it. The table's size is read from the kernel
#: (``FDSize`` in ``/proc/self/status``, once, at the first hit that could hold a folder): it is
#: 64 in a process whose parent had no descriptor past 63 open when it forked, and larger where
#: the parent had (a shell holding 255 gives 256); :data:`TABLE_START` where it cannot be read.
#: Past the size, a held folder is numbered only where the table was grown by the store's flush
#: thread, which is asked to when the holds come within GROW_AHEAD of its size (until it has,
#: hits get private links).
TABLE_START, GROW_AHEAD = PIN_FIRST, 64


class Hold:
    """An entry folder this process holds (see the module doc): its descriptor, the paths of its
    members, their (device, inode) as verified, and the lease the paths handed out keep (a new
    one each time it is taken up again after its last paths went)."""

    __slots__ = ("pin", "rid", "paths", "inos", "lease", "released")

    def __init__(self, pin: int, rid: str, paths: dict[str, str], inos: dict[str, tuple[int, int]]) -> None:
        self.pin, self.rid, self.paths, self.inos = pin, rid, paths, inos
        self.lease: Lease | None = None
        self.released = False


class Served:
    """The private folders of one store in one process, and the files served from them."""

    def __init__(self, store: Folders) -> None:
        self._store = store  # the store's pinned folders
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._folders: dict[str, PrivateFolder] = {}
        # hit's identity -> (the private folder holding its files, their paths, their lease)
        self._cache: dict[tuple[Any, ...], tuple[PrivateFolder, dict[str, str], Lease]] = {}
        self._n = 0
        self._tmp_ok: bool | None = None
        self._pins: list[int] = []  # held entry folders (descriptors)
        #: entry id -> the folder of it this process holds
        self._holds: dict[str, Hold] = {}
        #: ids of holds no path handed out needs any more, kept while their entry is committed
        #: (it costs no disk then: see _let_go_pin)
        self._idle: set[str] = set()
        #: Leases whose last path has gone (see :mod:`.leases`), let go under ``_lock``.
        self._gone: deque[Lease] = deque()
        self._dead: int | None = None  # a removed empty folder: what a let-go number names
        self._closed = False
        #: A hold was let go whose folder had been removed (it waits in trash/ for a sweep).
        self.let_go_removed = False
        self._pin_next = 0  # the lowest number the next held descriptor may take
        self._pin_stop = 0  # ... and the number it must stay under
        self._table = TABLE_START  # descriptors the process's table holds without growing (read
        # from the kernel at the first hit that could hold a folder: _pins_allowed)
        self._grow_to = 0  # the size asked of the flush thread (0: none asked)
        #: Called (under ``_lock``) to have :meth:`grow_table` run soon on another thread.
        self.wake: Callable[[], None] | None = None
        # Folders replaced by a fallback: paths already handed out from them must stay valid
        # until close, and they must go then.
        self._retired: list[PrivateFolder] = []

    def after_fork(self) -> None:
        """In a forked child: its parent's folders and paths are not its own. (Held entry
        folders are kept: their descriptors are the child's too, and paths the parent handed
        out before the fork name them.)"""
        self._lock = threading.Lock()
        for f in [*self._folders.values(), *self._retired]:
            f.close(remove=False)
        self._folders, self._cache, self._retired, self._pid = {}, {}, [], os.getpid()
        self._holds, self._idle = (
            {},
            set(),
        )  # (a child's holds are its own: one that closes what it inherited may)
        self._gone = deque()  # (the parent's leases let go in the child only close its copies)
        # The child's table was sized at the fork by the highest descriptor open then, not by
        # what the parent's grew to (and a grow the parent asked for is the parent's).
        self._table, self._grow_to = fs.fd_table_size() or TABLE_START, 0

    def folder(self, role: str) -> PrivateFolder:
        """This process's private folder for ``role`` ("served", "scratch"): in ``tmp/`` of a
        writable store (same filesystem: members are hard-linked), else under the system's
        temporary folder. Call with ``_lock`` held."""
        if self._pid != os.getpid():
            self.after_fork()
        cur = self._folders.get(role)
        if cur is not None and cur.alive():
            return cur
        if cur is not None:  # removed under us (by hand): let go of it, make another
            cur.close(remove=False)
            self._cache = {k: v for k, v in self._cache.items() if v[0] is not cur}
        store = self._store
        tfd = None if store.readonly else store.fd("tmp")
        if tfd is not None and self._tmp_ok is None:
            # Only where a lock says whether its holder lives: on a network filesystem a lock
            # may be seen on one node only (another node's clean-up would take a live folder),
            # and some filesystems have no flock at all. Those serve from the system's
            # temporary folder (copies, not links: another filesystem).
            self._tmp_ok = not store.network_fs and fs.locks_work(tfd)
        if not self._tmp_ok:
            tfd = None
        made = None
        if tfd is not None:
            name = fs.unique_name(role)
            with contextlib.suppress(OSError, fs.UnsafePath):
                fd = fs.open_dir_at(tfd, name, f"tmp/{name}", fs.trusted_owners(False), create=True)
                made = PrivateFolder(
                    fd, tfd, name, os.path.join(str(store.root), "tmp", name), own_parent=False
                )
        if made is None:
            made = temp_folder(role)
        self._folders[role] = made
        return made

    def serve(self, hit: Hit, fds: dict[str, int] | None = None, dfd: int | None = None) -> dict[str, str]:
        """Paths of files holding ``hit``'s verified members (see the module doc). ``dfd``: the
        entry's folder the members were read through (held); ``fds``: the members' open
        descriptors, as read (linked as they are); else the bytes are written."""
        return self.serve_held(hit, fds, dfd)[0]

    def serve_held(
        self,
        hit: Hit,
        fds: dict[str, int] | None = None,
        dfd: int | None = None,
        dst: os.stat_result | None = None,
    ) -> tuple[dict[str, str], int | None]:
        """:meth:`serve`, and the held entry folder the paths name (None: private links).
        ``dst``: ``dfd``'s fstat, when the caller has it."""
        store = self._store
        if store.closed:
            raise OSError("the store is closed")
        with self._lock:
            if self._pid != os.getpid():
                self.after_fork()
            if self._gone:
                self._drain()
            pinned = self._pin(hit, dfd, dst)
            if pinned is not None:
                return pinned[1], pinned[0]
            key = self._key(hit)
            cached = self._cache.get(key)
            if cached is not None:
                folder, paths, lease = cached
                t = lease.ticket()
                if t is not None and self._folders.get("served") is folder and folder.alive():
                    return hold_paths(paths, t, self._store.entry_dir(hit.record.id)), None
            try:
                folder = self.folder("served")
                sub, paths = self._write(folder, hit, fds)
            except OSError:
                # A full disk, too many links: once more in the system's temporary folder.
                old = self._folders.get("served")
                folder = temp_folder("served")
                if old is not None and old is not folder:
                    self._retired.append(old)
                self._folders["served"] = folder
                sub, paths = self._write(folder, hit, None)
            lease = Lease(functools.partial(self._let_go_links, folder, sub, key), self._on_gone)
            self._cache[key] = (folder, paths, lease)
            return hold_paths(paths, lease.start(), self._store.entry_dir(hit.record.id)), None

    # ------------------------------------------------------------------ letting go (see .leases)
    def _on_gone(self, lease: Lease) -> None:
        """The last path of ``lease`` has gone (a weakref callback, run wherever the collector
        runs): queued, and let go now only if the lock is free (never waited for)."""
        self._gone.append(lease)
        if self._lock.acquire(False):
            try:
                self._drain()
            finally:
                self._lock.release()

    def drain(self) -> None:
        """Let go of what the paths handed out no longer need (the flush thread's turn), and
        report what letting go raised in a weakref callback (a bug: see :mod:`.leases`)."""
        if self._gone:
            with self._lock:
                self._drain()
        if not leases.unreported:
            return
        from ..boundary import failed

        with leases.reporting:  # one reporter at a time (any store's flush thread, a caller)
            while leases.unreported:
                e = leases.unreported.popleft()
                failed(
                    "served-let-go", "kcache's letting go of files handed out", e, then="they stay until exit"
                )

    def _drain(self) -> None:
        # Under _lock. Never raises: a file that cannot be let go now stays till close or exit.
        while self._gone:
            lease = self._gone.popleft()
            if self._closed:
                continue  # close() let go of everything (and its numbers may be others' now)
            with contextlib.suppress(OSError):  # (a descriptor, a folder's files: see _release)
                lease.release()

    def _ticket(self, hold: Hold) -> Ticket:
        """A live ticket of ``hold`` (under _lock): its lease's, or a new lease's when the last
        paths of the one before have gone (an idle hold taken up again)."""
        lease = hold.lease
        t = lease.ticket() if lease is not None else None
        if t is None:
            hold.lease = lease = Lease(functools.partial(self._let_go_pin, hold), self._on_gone)
            t = lease.start()
            self._idle.discard(hold.rid)
        return t

    def hold_of(self, rid: str, pin: int | None) -> Hold | None:
        """The hold of entry ``rid`` through descriptor ``pin``, if this process has it."""
        hold = self._holds.get(rid)
        return hold if hold is not None and hold.pin == pin and not hold.released else None

    def reissue(self, hold: Hold) -> dict[str, str] | None:
        """The paths of a hold this process still has, handed out again (the memo's), or None
        when it was let go meanwhile."""
        with self._lock:
            if hold.released or self._holds.get(hold.rid) is not hold or self._closed:
                return None
            return hold_paths(hold.paths, self._ticket(hold), self._store.entry_dir(hold.rid))

    def _let_go_pin(self, hold: Hold) -> None:
        """The last paths of ``hold`` have gone (under _lock). While its entry is still committed
        it costs no disk: kept, idle (a later lookup takes it up again, reading nothing: the
        memo). Once its entry is removed, let go (see :meth:`_release`)."""
        lease = hold.lease
        if hold.released or (lease is not None and lease.ticket() is not None):
            return  # taken up again since (a new lease's paths live)
        if self._removed(hold):
            self._release(hold)
        else:
            self._idle.add(hold.rid)

    def _removed(self, hold: Hold) -> bool:
        efd = self._store.fd("entries")
        rid = hold.rid
        try:
            return efd is None or not os.path.samestat(
                os.stat(f"{rid[:2]}/{rid}", dir_fd=efd, follow_symlinks=False), os.fstat(hold.pin)
            )
        except OSError:
            return True

    def _release(self, hold: Hold) -> None:
        """Let go of a held entry folder (under _lock) whose entry was removed: its flock goes, so
        that its files can be deleted, and its number keeps naming a removed, empty folder (never
        another one: a path kept past its object finds nothing, as it would after close)."""
        hold.released = True
        if self._holds.get(hold.rid) is hold:
            del self._holds[hold.rid]
        self._idle.discard(hold.rid)
        dead = self._dead_folder()
        if dead is not None:
            os.dup2(dead, hold.pin, inheritable=False)  # closes the folder's open file: its flock goes
        else:
            with contextlib.suppress(ValueError):
                self._pins.remove(hold.pin)
            os.close(hold.pin)
        self.let_go_removed = True  # in trash/: the flush thread's sweep deletes it now

    def removed(self, rid: str | None = None) -> None:
        """Entries were removed: the idle holds of them are let go (``rid``: this one, removed by
        this process; None: any, looked at by the flush thread's turn). Never raises."""
        if not self._idle or (rid is not None and rid not in self._idle):
            return
        with self._lock:
            for r in [rid] if rid is not None else list(self._idle):
                hold = self._holds.get(r)
                if hold is None:
                    self._idle.discard(r)
                    continue
                with contextlib.suppress(OSError):
                    if self._removed(hold):
                        self._release(hold)

    def _let_go_links(self, folder: PrivateFolder, sub: str, key: tuple[Any, ...]) -> None:
        """Delete a hit's private links (under _lock), in this process's own folder only."""
        cached = self._cache.get(key)
        if cached is not None and cached[0] is folder and cached[2].ticket() is None:
            del self._cache[key]
        self._remove_in(folder, sub)

    def _remove_in(self, folder: PrivateFolder, sub: str) -> None:
        """Delete ``sub`` in ``folder`` (under _lock), through its descriptor, while the folder is
        still one of this process's: one let go since (removed by hand, a forked parent's) has
        closed its descriptor, whose number may name another folder by now."""
        if folder.pid == os.getpid() and (folder in self._folders.values() or folder in self._retired):
            fs.rmtree_at(folder.fd, sub)

    def _dead_folder(self) -> int | None:
        """A descriptor of an empty folder that has been removed (nothing can be made in it), made
        once in tmp/; None where that cannot be done."""
        if self._dead is not None:
            return self._dead
        tfd = self._store.fd("tmp")
        if tfd is None:
            return None
        name = fs.unique_name("let-go")
        try:
            os.mkdir(name, 0o700, dir_fd=tfd)
            fd = os.open(name, fs.O_DIR, dir_fd=tfd)
        except OSError:
            return None
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=tfd)
        try:
            if os.fstat(fd).st_nlink != 0:
                raise OSError(errno.EEXIST, "not removed")
        except OSError:
            os.close(fd)
            return None
        self._dead = fd
        return fd

    @staticmethod
    def _key(hit: Hit) -> tuple[Any, ...]:
        # The inodes are part of the key: a served file is a hard link of the member verified,
        # so one served for an earlier inode (since rewritten in place, then replaced by a new
        # put of the same bytes) must not stand in for the new one.
        rec, inos = hit.record, hit.inos
        return (rec.id, tuple([(f.name, f.size, f.sha256, inos.get(f.name)) for f in rec.files]))

    def _pin(
        self, hit: Hit, dfd: int | None, dst: os.stat_result | None = None
    ) -> tuple[int, dict[str, str]] | None:
        """Hold the entry's folder and name its members through it (see the module doc), or
        None when that cannot be done here (the caller makes private links instead)."""
        store = self._store
        efd = store.fd("entries")
        rid = hit.record.id
        held = self._holds.get(rid)
        if held is not None and hit.inos == held.inos:
            # Held already (a lookup the memo could not answer: its last use was due, say), and
            # this hit's members are the very files of the held folder (their inodes, which no
            # other file can take while the folder is held, and an entry's files are never
            # written): the same hold. Any other hit of the id (of a folder removed since, made
            # without files) goes the way below, which checks its own members.
            return held.pin, hold_paths(held.paths, self._ticket(held), self._store.entry_dir(rid))
        if efd is None or store.readonly or not self._pins_allowed():
            return None
        own = None
        try:
            if dfd is None:
                # A hit made without the folder (a put's, a lookup without files): the folder at
                # the entry's name, if its members are the very inodes that were verified.
                own = dfd = os.open(f"{rid[:2]}/{rid}", fs.O_DIR, dir_fd=efd)
                dst = None
                for f in hit.record.files:
                    st = os.stat(f.name, dir_fd=dfd, follow_symlinks=False)
                    if (st.st_dev, st.st_ino) != hit.inos.get(f.name):
                        return None
            pin = fcntl.fcntl(dfd, fcntl.F_DUPFD_CLOEXEC, self._pin_next)
        except OSError:
            return None
        finally:
            if own is not None:
                os.close(own)
        self._pin_next = pin + 1  # never reused: a stale path must not name another folder
        # The table holds ``pin``: its size (a power of two from 256 on) is past it.
        self._table = max(self._table, 1 << pin.bit_length())
        try:
            if pin >= self._pin_stop:
                raise OSError(errno.EMFILE, "no room for another held folder")
            fcntl.flock(pin, fcntl.LOCK_SH | fcntl.LOCK_NB)
            # Still the entry at its name once held: no removal took it before (one that came
            # after sees the hold and leaves its files alone).
            # (``dst``: the folder's fstat as opened; ``pin`` is that very open file.)
            if not os.path.samestat(
                os.stat(f"{rid[:2]}/{rid}", dir_fd=efd, follow_symlinks=False), dst or os.fstat(pin)
            ):
                raise OSError(errno.ESTALE, "removed or replaced meanwhile")
        except OSError:
            os.close(pin)
            return None
        self._pins.append(pin)
        base = f"/proc/self/fd/{pin}/"
        paths = {f.name: base + f.name for f in hit.record.files}
        hold = self._holds[rid] = Hold(pin, rid, paths, dict(hit.inos))
        return pin, hold_paths(paths, self._ticket(hold), self._store.entry_dir(rid))

    def _pins_allowed(self) -> bool:
        # Only where a lock says whether its holder lives: not on a network filesystem, nor where
        # flock fails. Whether it fails is not asked here (a syscall on every process's first
        # hit): the hold's own flock fails there, and the hit then gets private links, whose
        # folder() asks, and remembers the answer (_tmp_ok) for every later hit.
        store = self._store
        tfd = store.fd("tmp")
        if self._tmp_ok is False or tfd is None or store.network_fs:
            return False
        if not self._pin_stop:
            try:
                soft = os.sysconf("SC_OPEN_MAX")  # RLIMIT_NOFILE's soft limit
            except (ValueError, OSError):
                soft = -1
            soft = soft if 0 < soft < (1 << 20) else 1 << 20
            self._pin_next = PIN_FIRST
            # far from the limit, whatever it is; and only where /proc names a descriptor's folder
            # (asked through tmp/'s descriptor, with the fstat it was opened with)
            stop = max(min(soft // 2, PIN_FIRST + 192), min(soft // 4, PIN_FIRST + MAX_PINS))
            stop = min(stop, FD_SETSIZE - PIN_HEADROOM)
            self._pin_stop = stop if fs.proc_fd_usable(tfd, store.stat("tmp")) else PIN_FIRST
            self._table = max(self._table, fs.fd_table_size() or TABLE_START)
        nxt = self._pin_next
        if nxt >= self._pin_stop or len(self._pins) >= MAX_PINS:
            return False
        if nxt + GROW_AHEAD >= self._table and not self._grow_to and self._table < self._pin_stop:
            self._grow_to = min(self._table * 2, self._pin_stop)
            if self.wake is not None:
                self.wake()  # (a thread that cannot start: links from here; see Catalogue.maybe_flush)
        return nxt < self._table

    def grow_table(self) -> None:
        """Grow this process's table of descriptors to the size the holds asked for (see
        :data:`TABLE_START`): on the store's flush thread, whose wait this is, never a hit's.
        Never raises."""
        want = self._grow_to
        if not want or want <= self._table:
            return
        tfd = self._store.fd("tmp")
        try:
            if tfd is None:
                raise OSError(errno.EBADF, "no folder to duplicate")
            fd = fcntl.fcntl(tfd, fcntl.F_DUPFD_CLOEXEC, want - 1)  # the table holds ``want`` now
            os.close(fd)
        except OSError:
            return  # left as it is: holds stay under its size, then private links
        self._table, self._grow_to = max(self._table, want), 0

    def _write(
        self, folder: PrivateFolder, hit: Hit, fds: dict[str, int] | None
    ) -> tuple[str, dict[str, str]]:
        self._n += 1
        sub = f"{hit.record.id[:16]}.{self._n}"
        os.mkdir(sub, 0o700, dir_fd=folder.fd)
        subfd = os.open(sub, fs.O_DIR, dir_fd=folder.fd)
        efd = self._store.fd("entries")
        rid = hit.record.id
        try:
            for f in hit.record.files:
                mfd = fds.get(f.name) if fds else None
                linked = False
                if mfd is not None and fs.proc_fd_usable():
                    try:  # the inode that was read, not whatever sits at its name now
                        os.link(f"/proc/self/fd/{mfd}", f.name, dst_dir_fd=subfd)
                        linked = True
                    except OSError:
                        pass  # removed meanwhile, another filesystem: by name, or a copy, below
                ino = hit.inos.get(f.name)
                if not linked and ino is not None and efd is not None:
                    # By name, kept only if it is the very inode verified (a put's own members,
                    # a hit made without ``files``): no copy of a large binary.
                    try:
                        os.link(
                            f"{rid[:2]}/{rid}/{f.name}",
                            f.name,
                            src_dir_fd=efd,
                            dst_dir_fd=subfd,
                            follow_symlinks=False,
                        )
                        st = os.stat(f.name, dir_fd=subfd, follow_symlinks=False)
                        linked = (st.st_dev, st.st_ino) == ino
                        if not linked:
                            os.unlink(f.name, dir_fd=subfd)
                    except OSError:
                        linked = False
                if not linked:
                    fs.write_new_at(subfd, f.name, hit.read(f.name))
        finally:
            os.close(subfd)
        paths = {f.name: fs.fd_path(folder.fd, sub, f.name, fallback=folder.path) for f in hit.record.files}
        return sub, paths

    def scratch(self) -> str:
        """The path of this process's private scratch folder (see ``Store.scratch_dir``)."""
        with self._lock:
            f = self.folder("scratch")
            return fs.fd_path(f.fd, fallback=f.path)

    def stage(self) -> tuple[str, Ticket]:
        """A new folder in this process's scratch folder for one compile's files (see
        ``Store.scratch_stage``), and the ticket its paths must keep. Once none of them lives,
        it goes as a hit's private links do: queued by the collector's callback, removed at the
        next turn (:meth:`_drain`), through the scratch folder's descriptor (review m10)."""
        if self._store.closed:
            raise OSError("the store is closed")
        with self._lock:
            if self._gone:
                self._drain()
            folder = self.folder("scratch")
            sub = fs.unique_name("stage")
            os.mkdir(sub, 0o700, dir_fd=folder.fd)
            lease = Lease(functools.partial(self._remove_in, folder, sub), self._on_gone)
            return fs.fd_path(folder.fd, sub, fallback=folder.path), lease.start()

    def close(self) -> None:
        """Delete this process's folders (at ``Store.close`` and exit)."""
        with self._lock:
            self._closed = True
            self._gone.clear()
            for f in [*self._folders.values(), *self._retired]:
                f.close(remove=True)
            for pin in [*self._pins, *([self._dead] if self._dead is not None else [])]:
                with contextlib.suppress(OSError):
                    os.close(pin)  # lets go of the hold (a forked child: of its copy only)
            self._folders, self._cache, self._retired, self._pins, self._holds = {}, {}, [], [], {}
            self._idle = set()
            self._dead = None
