"""A process's session: its private KernelDb folder, bookkeeping, and the nvFuser side.

Processes never share a KernelDb folder (nvFuser's has no cross-process lock: two processes
overwrite each other's ``kernel_<N>`` files). Each gets ``$TMPDIR/kcache-nvfuser-<pid>-<random>/``
(0700, under the temporary directory Python had before anything changed), seeded from the store
and holding a flock for the process's life; the next process that finds a folder nobody holds (a
crash skipped the harvest at exit) stores its kernels and removes it (:func:`adopt_stale`).

``tmpdir`` mode, the fallback when :mod:`.direct` cannot be used: nvFuser opens
``temp_directory_path() / "nvfuser_kernel_db"``, and libstdc++ reads ``TMPDIR`` for it. kcache
pins Python's ``tempfile.gettempdir()`` first, then sets ``TMPDIR`` to the private folder's parent
only *during* ``FusionDefinition.execute`` calls, and only until nvFuser has opened its KernelDb
(seen from the access time of the seeded ``db.csv``); then it stays restored.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import threading
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ...log import logger, warn_once
from ...store.fs import pid_alive
from .direct import DirectKernelDb
from .fingerprint import Fingerprint
from .folder import DB_DIR, DB_FILE, read_rows
from .libs import codegen_path
from .seed_harvest import HarvestResult, SeedResult, harvest, seed

if TYPE_CHECKING:
    from ...store.api import Cache

ROOT_PREFIX = "kcache-nvfuser-"
SESSION_FILE = "kcache-session.json"


class Session:
    """One process's private KernelDb folder for one nvFuser module, and what it seeded and stored."""

    def __init__(self, store: Cache, fp: Fingerprint, root: str, module_name: str = "nvfuser_direct") -> None:
        self.store: Cache | None = store  # None once detached (kcache.disable())
        self.fp = fp
        self.root = root
        self.db_dir = os.path.join(root, DB_DIR)
        self.module_name = module_name
        self.pid = os.getpid()
        self.mode = "none"
        self.seed_result = SeedResult()
        self.known: set[str] = set()
        self.done_files: set[str] = set()
        self.used: set[str] = set()
        self.pending: set[str] = set()
        self.added = 0
        self.adopted = 0
        self.harvests: list[HarvestResult] = []
        self.start_s = 0.0  # fingerprint, folder, seeding and pointing nvFuser at it
        self.direct: DirectKernelDb | None = None
        self.tmpdir_pending = False  # tmpdir mode, nvFuser not seen opening the folder yet
        self.slow = False  # the wrapper must look at the session (tmpdir pending, or forked)
        self.forked = False
        self.disabled = False
        self.legacy: Any = None
        self._lock = threading.RLock()
        self._env_lock = threading.Lock()
        self._env_depth = 0
        self._env_saved: str | None = None
        self._lockfd: int | None = None

    # -- setting up ---------------------------------------------------------------------------
    @classmethod
    def create(cls, store: Cache, fp: Fingerprint, module_name: str = "nvfuser_direct") -> Session:
        base = tempfile.gettempdir()  # Python's value is computed (and cached) before any TMPDIR change
        root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=base)
        s = cls(store, fp, root, module_name)
        s._write_session_file()
        s.adopted = adopt_stale(store, fp, base, exclude=root)
        s.seed()
        return s

    def _write_session_file(self) -> None:
        info = {"pid": os.getpid(), "fingerprint": self.fp.hash, "module": self.module_name}
        path = os.path.join(self.root, SESSION_FILE)
        with open(path, "w") as f:
            json.dump(info, f)
        # Held for the life of the process: a folder whose lock can be taken belongs to nobody
        # (a pid check alone is wrong across pid namespaces sharing one /tmp).
        self._lockfd = _hold_lock(path)

    def seed(self) -> SeedResult:
        with self._lock:
            if self.store is None:  # detached: nothing to seed from
                return self.seed_result
            r = seed(self.store, self.db_dir, self.fp)
            self.seed_result = r
            self.known |= set(r.seeded)
            logger.info(
                "nvfuser: seeded %d kernels (%d bytes, from the %s) into %s in %.1f ms",
                len(r.seeded),
                r.bytes,
                r.source,
                self.db_dir,
                r.seconds * 1e3,
            )
            return r

    def point(self, module: ModuleType | None, prefer: str = "direct") -> str:
        """Make nvFuser use this session's folder: ``direct`` if its KernelDb entry point can be
        called, else ``tmpdir``. Returns the mode."""
        if prefer == "direct" and module is not None:
            lib = codegen_path(module)
            if lib is not None:
                try:
                    db = DirectKernelDb(lib)
                    if db.open(self.db_dir):
                        self.direct, self.mode = db, "direct"
                        self.tmpdir_pending = False
                        self.slow = self.forked
                        return self.mode
                    logger.info("nvfuser: KernelDb did not open through its entry point: %s", db.state())
                except (OSError, AttributeError) as e:
                    logger.info("nvfuser: KernelDb entry point not usable (%s); using TMPDIR", e)
        self.mode = "tmpdir"
        self.tmpdir_pending = True
        self.slow = True
        return self.mode

    # -- the per-call hook ----------------------------------------------------------------------
    def before_call(self) -> bool:
        """Run before a wrapped execute on the slow path; True when TMPDIR was set for it."""
        if self.forked:
            self._rehome()
        if not self.tmpdir_pending or self.disabled:
            return False
        with self._env_lock:
            if self._env_depth == 0:
                self._env_saved = os.environ.get("TMPDIR")
                os.environ["TMPDIR"] = self.root
            self._env_depth += 1
        return True

    def after_call(self) -> None:
        with self._env_lock:
            self._env_depth -= 1
            if self._env_depth > 0:
                return
            if self._env_saved is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = self._env_saved
            if self.opened_by_nvfuser():
                self.tmpdir_pending = False
                self.slow = self.forked

    def opened_by_nvfuser(self) -> bool:
        """True once nvFuser has read the seeded db.csv (its access time moved off 0)."""
        try:
            return os.stat(os.path.join(self.db_dir, DB_FILE)).st_atime_ns > 0
        except OSError:
            return False

    # -- fork -----------------------------------------------------------------------------------
    def after_fork_in_child(self) -> None:
        # Nothing heavy here (another thread may have held a lock at fork): the next wrapped call
        # in the child moves it to a folder of its own.
        self.forked = True
        self.slow = True
        self._lock = threading.RLock()
        self._env_lock = threading.Lock()
        self._env_depth = 0

    def _rehome(self) -> None:
        with self._lock:
            if not self.forked:
                return
            self.forked = False
            was_open = self.mode == "direct" or not self.tmpdir_pending
            base = tempfile.gettempdir()
            self.root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=base)
            self.db_dir = os.path.join(self.root, DB_DIR)
            self.pid = os.getpid()
            self.done_files = set()
            self.used = set()
            self._write_session_file()
            self.seed()
            if self.mode == "direct" and self.direct is not None:
                if not self.direct.open(self.db_dir):
                    self.disabled = True
            elif was_open:
                # nvFuser in this child still points at the parent's folder and cannot be moved.
                self.disabled = True
                warn_once(
                    "nvfuser-fork",
                    "nvfuser: a forked child cannot move nvFuser's KernelDb; it is off in this child",
                )
            self.slow = self.tmpdir_pending and not self.disabled

    # -- harvesting -----------------------------------------------------------------------------
    def flush(self) -> int:
        """Store the kernels added since the last flush. Returns how many were new to the store."""
        with self._lock:
            if self.pid != os.getpid() or self.store is None or self.store.closed:
                return 0
            if self.mode == "tmpdir" and self.tmpdir_pending:
                return 0  # nvFuser has not opened the folder: nothing of its own there
            r = harvest(
                self.store,
                self.db_dir,
                self.fp,
                self.known,
                done_files=self.done_files,
                seeded=self.seed_result.seeded,
                used=self.used,
                missing=self.seed_result.missing,
                pending=self.pending,
            )
            self.seed_result.missing = []
            if self.legacy is not None:
                try:
                    self.legacy.save()
                except Exception as e:  # broad: nvFuser's C++ raises what it meets; kernels are kept
                    warn_once("nvfuser-legacy-save", f"nvfuser: could not save the fusion cache: {e}")
            self.added += len(r.added)
            self.harvests.append(r)
            if r.added or r.bad:
                logger.info(
                    "nvfuser: stored %d new kernels (%d already stored, %d bad rows)",
                    len(r.added),
                    r.already,
                    r.bad,
                )
            return len(r.added)

    def close(self, remove: bool = True) -> None:
        try:
            self.flush()
        finally:
            if remove and self.pid == os.getpid():
                shutil.rmtree(self.root, ignore_errors=True)

    def new_rows(self) -> int:
        """Rows nvFuser added to this folder: kernels it compiled with NVRTC in this process."""
        rows, _bad = read_rows(self.db_dir)
        return sum(1 for r in rows if not r.cubin_file.startswith("seed_"))

    def status(self) -> dict[str, Any]:
        return {
            "module": self.module_name,
            "mode": self.mode,
            "root": self.root,
            "fingerprint": self.fp.hash,
            "components": dict(self.fp.components),
            "seeded": len(self.seed_result.seeded),
            "seed_source": self.seed_result.source,
            "seed_ms": round(self.seed_result.seconds * 1e3, 2),
            "start_ms": round(self.start_s * 1e3, 2),
            "shadowed": self.seed_result.shadowed,
            "new_rows": self.new_rows(),
            "stored": self.added,
            "adopted": self.adopted,
            "used": len(self.used),
            "tmpdir_pending": self.tmpdir_pending,
            "disabled": self.disabled,
            "kerneldb": self.direct.state() if self.direct is not None else None,
        }


def _hold_lock(path: str) -> int | None:
    """An exclusive flock on ``path``, held until the process ends (the fd is kept open)."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def _owned_by_nobody(root: str, pid: int) -> bool:
    """True when no live process holds ``root``: its session lock is free (or, for a folder whose
    owner died before taking it, the pid is gone and the folder is a minute old)."""
    path = os.path.join(root, SESSION_FILE)
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except ImportError:
        return not pid_alive(pid)
    except OSError:
        try:
            return not pid_alive(pid) and time.time() - os.lstat(root).st_mtime > 60
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also releases the probe's lock


def adopt_stale(store: Cache, fp: Fingerprint, base: str, exclude: str = "") -> int:
    """Harvest, then remove, private folders that dead processes of this user left in ``base``
    (a crash skips the harvest at exit). Folders of another fingerprint are only removed."""
    n = 0
    try:
        names = [x for x in os.listdir(base) if x.startswith(ROOT_PREFIX)]
    except OSError:
        return 0
    uid = os.getuid() if hasattr(os, "getuid") else None
    for name in names:
        path = os.path.join(base, name)
        if path == exclude:
            continue
        try:
            pid = int(name[len(ROOT_PREFIX) :].split("-", 1)[0])
            st = os.lstat(path)
        except (ValueError, OSError):
            continue
        if not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid) or pid == os.getpid():
            continue
        if not _owned_by_nobody(path, pid):
            continue
        try:
            with open(os.path.join(path, SESSION_FILE)) as f:
                info = json.load(f)
            if isinstance(info, dict) and info.get("fingerprint") == fp.hash and not store.readonly:
                n += len(harvest(store, os.path.join(path, DB_DIR), fp).added)
        except (OSError, ValueError):  # a dead process's leftovers (a file gone, not JSON): best
            pass  # effort, the folder goes either way
        shutil.rmtree(path, ignore_errors=True)
    return n
