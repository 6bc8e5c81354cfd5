"""A Triton cache manager backed by the kcache store.

Triton builds a manager per key (``cls(key)``, ``cls(key, override=True)``, ``cls(key,
dump=True)``) and calls four methods. What goes where:

- kernel groups (the IR files, the binary and the metadata ``.json`` that ``put_group``
  names): members are written to a private scratch folder as they arrive, and ``put_group``
  commits them as one ``triton`` entry; ``get_group`` returns the entry's verified files;
- ``<fn>.autotune.json``: a ``triton-autotune`` entry, keyed also by the GPU model that measured
  the timings (Triton's key names only the target);
- ``*.so`` (launchers, utility modules): ``triton-aux`` entries, host code loaded with dlopen,
  trusted because the local store passed its ownership and permission checks when opened.

Returned paths are real files with Triton's names (Triton reads an artifact's type from the
suffix). When the store is off, read-only or full, ``put`` still returns a real file in the
scratch folder, so Triton never notices. ``override`` and ``dump`` managers are Triton's own.

A group lookup is a single flight (:meth:`kcache.store.api.Cache.single_flight`): on a
miss, this process holds the kernel's lock until ``put_group``, and processes (and, with a shared
tier, machines) that miss on the same kernel at once wait for its entry instead of compiling it
too. A compile that raises never reaches ``put_group``, and its manager may live on (a traceback
cycle) with the lock: the flight is given this manager as its owner, so that the thread's next
group lookup releases it (a thread compiles one kernel at a time).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triton.runtime.cache import CacheManager, FileCacheManager

from .._imports import turn_on
from ..boundary import fail_open, guarded
from ..forksafe import module_lock
from ..log import logger, warn_once
from ..patch import original
from ..store.leases import Lease, Ticket, hold_paths
from . import groupcheck, tunecheck, tuning
from .attached import cache as active_cache
from .attached import finish_pending, serves_folder
from .components import components_for, take, target_for
from .kinds import KIND_AUTOTUNE, KIND_AUX, KIND_GROUP, kind_of, store_key

if TYPE_CHECKING:
    from ..store.api import Cache, Flight
    from ..store.hit import Hit

__all__ = ["KIND_AUTOTUNE", "KIND_AUX", "KIND_GROUP", "KcacheCacheManager", "kind_of"]

_scratch_lock = module_lock(__name__, "_scratch_lock")
_scratch_root: list[str] = []  # this process's private temporary folder, once made
_scratch_pid = 0
#: Compile folders of the temporary folder whose last path has gone (see _new_stage).
_gone_stages: deque[Lease] = deque()


def _scratch() -> str:
    """This process's private temporary folder, for compile files where the store cannot take
    them (none, read-only, closed, or its ``tmp/`` refused them). Removed at exit."""
    global _scratch_pid
    with _scratch_lock:
        if _scratch_pid != os.getpid():  # a forked child: its parent's folder is not its own
            _scratch_root.clear()
            _gone_stages.clear()
            _scratch_pid = os.getpid()
        if not _scratch_root or not os.path.isdir(_scratch_root[0]):
            _scratch_root[:] = [tempfile.mkdtemp(prefix="kcache-triton-")]
            atexit.register(_remove_scratch, _scratch_root[0], _scratch_pid)
        return _scratch_root[0]


def _remove_scratch(root: str, pid: int) -> None:
    if pid == os.getpid():  # not from a forked child that exits normally
        shutil.rmtree(root, ignore_errors=True)


def _stage_gone(lease: Lease) -> None:
    """The last path into a compile folder of the temporary folder has gone (a weakref callback,
    run wherever the collector runs): only queued, as the store's are (kcache/store/served.py);
    the next compile folder made removes it."""
    _gone_stages.append(lease)


def _drain_stages() -> None:
    while True:
        try:
            lease = _gone_stages.popleft()
        except IndexError:
            return
        if lease.pid == os.getpid():  # a forked child's copies of the paths are its parent's files
            lease.release()


_enable_tried = False


def _try_enable() -> None:
    """Named in TRITON_CACHE_MANAGER without KCACHE=1: turn on with the environment's settings,
    once per process (a store that cannot be used is not tried again at every kernel)."""
    global _enable_tried
    _enable_tried = True
    turn_on(triton=False)


def _gpu_model() -> str | None:
    """The model of the GPU Triton is using now (autotune timings are valid only for it)."""
    try:
        from triton.runtime import driver

        dev = driver.active.get_current_device()
    except Exception:  # broad: Triton's driver asks torch or CUDA (foreign code: no GPU, no libcuda, ...)
        dev = 0
    from ..fingerprint import device_name

    try:
        return device_name(int(dev))
    except (TypeError, ValueError, OSError, AttributeError):  # a device that is no int; ctypes' errors
        return None


def _own_manager(self: KcacheCacheManager, key: str, override: bool = False, dump: bool = False) -> None:
    """The fallback of a manager whose set-up failed: Triton's own, as without kcache."""
    self.key = key
    self._file = FileCacheManager(key, override=override, dump=dump)


def _own_put(self: KcacheCacheManager, data: Any, filename: str, binary: bool = True) -> str:
    """The fallback of a put that failed: a real file all the same, in Triton's own cache."""
    return FileCacheManager(self.key).put(data, filename, binary=binary)


def _edge(topic: str, what: str, fallback: Callable[..., Any] | None = None) -> Callable[[Any], Any]:
    """A method Triton calls (the edge): a bug inside kcache is a logged miss with ``fallback``,
    or raises under KCACHE_STRICT=1 (:mod:`kcache.boundary`); what the store expects (a corrupt
    entry, a full disk, a server that does not answer) it handles itself, as a counted miss.
    Triton's own managers (override, dump, a folder of the program's) are called as they are."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        guarded_fn = fail_open(topic, what, fallback)(fn)

        @functools.wraps(fn)
        def method(self: KcacheCacheManager, *args: Any, **kwargs: Any) -> Any:
            if fn.__name__ == "__init__":
                if any(args[1:]) or any(kwargs.values()):  # override or dump: Triton's own, set up as it is
                    return fn(self, *args, **kwargs)
            elif self._file is not None:
                return getattr(self._file, fn.__name__)(*args, **kwargs)
            return guarded_fn(self, *args, **kwargs)

        return method

    return deco


class KcacheCacheManager(CacheManager):
    @_edge("triton-manager", "kcache's Triton cache manager", _own_manager)
    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._file: FileCacheManager | None = None
        if override or dump:
            self._file = FileCacheManager(key, override=override, dump=dump)
            return
        # What the get_cache_key call just before (this compile's, on this thread) was given:
        # the key's components, made only if needed (a miss) and only if they are this key's.
        self._origin = take()
        if not serves_folder():  # the program pointed Triton at a cache folder of its own
            self._file = FileCacheManager(key)
            return
        if _unkeyed_stages_hook():  # Triton 3.6's key leaves the hook out: its own cache, as without kcache
            self._file = FileCacheManager(key)
            return
        self._store = active_cache()
        if self._store is None and not _enable_tried:
            _try_enable()
            self._store = active_cache()
        self._dir: str | None = None
        self._ticket: Ticket | None = None  # keeps _dir while this manager lives (see _new_stage)
        self._staged: dict[str, str] = {}
        self._flight: Flight | None = None  # the group's single flight, held from a miss to put_group
        self._miss_t: dict[str, float] = {}

    # -- helpers ------------------------------------------------------------------------------
    def _stage_dir(self) -> str:
        if self._dir is None:
            self._new_stage()
        assert self._dir is not None
        return self._dir

    def _new_stage(self, temporary: bool = False) -> None:
        """A private folder for this compile's files, kept while the paths ``put`` returns live
        (Triton keeps them in the kernel it builds: see kcache/store/leases.py), then removed:
        a process that compiles for ever keeps only the files of the kernels it still has. In the
        store's ``tmp/`` where it can (same filesystem: members are hard-linked into entries),
        else (``temporary``, or the store cannot) in a private temporary folder. Neither is
        removed in the collector's callback: queued, and removed by the owner's next turn."""
        store = self._store
        if not temporary and store is not None and not store.readonly and not store.closed:
            try:
                self._dir, self._ticket = store.scratch_stage()
                return
            except OSError as e:
                logger.info("scratch folder in the store unusable (%s); using a private temporary one", e)
        _drain_stages()
        d = os.path.join(_scratch(), uuid.uuid4().hex[:16])
        os.mkdir(d, 0o700)
        self._dir = d
        self._ticket = Lease(functools.partial(shutil.rmtree, d, ignore_errors=True), _stage_gone).start()

    def _key_and_gpu(self, filename: str, kind: str) -> tuple[str, str | None]:
        """The store key of a file Triton puts on its own (autotune results: also by the model
        of the GPU that measured them, asked once for the key and the components)."""
        gpu = _gpu_model() if kind == KIND_AUTOTUNE else None
        return store_key(self.key, filename, gpu), gpu

    def _components(self, filename: str, gpu: str | None = None) -> dict[str, Any]:
        """The named components of this manager's key (made only when needed: misses, puts)."""
        comps = components_for(self.key, filename, self._origin)
        if gpu is not None:
            comps["gpu_name"] = gpu
        return comps

    def _write_scratch(self, data: bytes, filename: str) -> str:
        try:
            path = self._write_in(self._stage_dir(), data, filename)
        except OSError as e:
            # The store's filesystem is full or not writable: Triton still needs a real file, and
            # the compile must not fail for it. The store warns when the entry cannot be written.
            logger.info("scratch folder in the store unusable (%s); using a private temporary one", e)
            self._new_stage(temporary=True)
            assert self._dir is not None
            path = self._write_in(self._dir, data, filename)
        assert self._ticket is not None  # (made with the folder, above)
        path = hold_paths({filename: path}, self._ticket)[filename]
        self._staged[filename] = path
        return path

    @staticmethod
    def _write_in(folder: str, data: bytes, filename: str) -> str:
        """Write ``filename`` in this manager's private folder (0600: it may be linked into the
        store as it is), through a unique temporary name."""
        path = os.path.join(folder, filename)
        tmp = f"{path}.tmp.{uuid.uuid4().hex[:8]}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    # -- the CacheManager interface --------------------------------------------------------------
    @_edge("triton-get", "kcache's lookup of a Triton file")
    def get_file(self, filename: str) -> str | None:
        if self._file is not None:
            return self._file.get_file(filename)
        if filename in self._staged:
            return self._staged[filename]
        kind = kind_of(filename)
        if kind is None or self._store is None:
            return None
        if kind == KIND_AUX and not self._store.trust_host_code:
            _untrusted_store(self._store)
            return None  # host code only from a store that passed every check: rebuilt here
        skey, gpu = self._key_and_gpu(filename, kind)
        hit = self._store.get(kind, skey, lambda: self._components(filename, gpu), files=True)
        if hit is not None and kind == KIND_AUTOTUNE and not tunecheck.servable(self._store, filename, hit):
            hit = None  # quarantined: tune again, as on a miss
        if hit is None:
            self._miss_t[filename] = time.perf_counter()
            return None
        return hit.paths.get(filename)

    @_edge("triton-put", "kcache's Triton file put", _own_put)
    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        if self._file is not None:
            return self._file.put(data, filename, binary=binary)
        # As FileCacheManager: bytes as they are, anything else (str, MLIR modules) as str(data).
        blob = data if isinstance(data, bytes) else str(data).encode("utf-8")
        kind = kind_of(filename)
        if kind == KIND_AUX and self._store is not None and not self._store.trust_host_code:
            _untrusted_store(self._store)
            kind = None  # never stored in (nor served from) a store that failed its checks
        if kind == KIND_AUTOTUNE and not tuning.usable(blob):
            kind = None  # every config failed: not a result to reuse (see tuning.py)
        if kind is not None and self._store is not None:
            with guarded("triton-put", "kcache's storing of a Triton file"):  # then a scratch file
                t0 = self._miss_t.pop(filename, None)
                skey, gpu = self._key_and_gpu(filename, kind)
                comps = self._components(filename, gpu)
                hit = self._store.put(
                    kind,
                    skey,
                    {filename: blob},
                    components=comps,
                    summary=_summary(kind, filename, blob, comps),
                    compile_s=(time.perf_counter() - t0) if t0 is not None else 0.0,
                )
                if hit is not None and filename in hit.paths:
                    if _same_bytes(hit.paths[filename], blob):
                        return hit.paths[filename]
                    # The store kept other bytes under this key (first writer wins). Triton
                    # puts a file it has just built and loads the path it gets back: after a
                    # stored launcher or cuda_utils module failed to load here, it rebuilds
                    # it and puts it, and the old bytes would fail again (an ImportError in
                    # the program). It gets what it built, as from its own cache; host code
                    # this machine could not load is replaced here.
                    if kind == KIND_AUX:
                        self._store.replace(kind, skey, {filename: blob}, components=comps,
                                            summary=_summary(kind, filename, blob, comps))  # fmt: skip
        return self._write_scratch(blob, filename)

    @_edge("triton-group", "kcache's lookup of a Triton kernel")
    def get_group(self, filename: str) -> dict[str, str] | None:
        if self._file is not None:
            return self._file.get_group(filename)
        store = self._store
        if store is None:
            return None
        if _always_compile():
            # TRITON_ALWAYS_COMPILE=1: Triton compiles whatever a lookup gives, so none is made
            # (it cost a read of the entry, and a hit was counted for a kernel Triton compiled):
            # counted as the miss it is, with no lock taken for other processes to wait on.
            store.count(KIND_GROUP, misses=1)
            self._miss_t[filename] = time.perf_counter()
            return None
        skey = store_key(self.key, filename)
        self._release()  # (a manager asked twice: its earlier flight is over)
        flight = store.single_flight(
            KIND_GROUP, skey, lambda: self._components(filename), files=True, owner=self
        )
        hit = flight.hit
        if hit is None:  # compiled here: timed from now (not from the wait for another's)
            self._flight = flight
            self._miss_t[filename] = time.perf_counter()
        if hit is not None and not _servable(
            store, filename, hit, lambda: target_for(self.key, self._origin)
        ):
            hit = None  # quarantined: compile, as on a miss
            self._miss_t[filename] = time.perf_counter()
        if hit is None:
            return None
        paths = dict(hit.paths)  # made with the lookup (files=True); a failure is a miss
        if "torch._inductor" in sys.modules:
            _mirror_for_inductor(self.key, filename, paths)
        return paths

    @_edge("triton-put-group", "kcache's storing of a Triton kernel")
    def put_group(self, filename: str, group: dict[str, str]) -> str | None:
        if self._file is not None:
            return self._file.put_group(filename, group)
        try:
            if self._store is None:
                return None
            files = {}
            for child, path in group.items():
                if not isinstance(path, str) or not os.path.isfile(path):
                    raise FileNotFoundError(f"group member {child} is not a file: {path!r}")
                files[child] = path
            t0 = self._miss_t.pop(filename, None)
            comps = self._components(filename)
            meta = files.get(filename)
            meta_blob = b""
            if meta:
                with open(meta, "rb") as f:
                    meta_blob = f.read()
            hit = self._store.put(
                KIND_GROUP,
                store_key(self.key, filename),
                files,
                components=comps,
                summary=_summary(KIND_GROUP, filename, meta_blob, comps),
                compile_s=(time.perf_counter() - t0) if t0 is not None else 0.0,
            )
            if hit is not None and "torch._inductor" in sys.modules:
                _mirror_for_inductor(self.key, filename, dict(hit.paths))
        except OSError as e:  # a member gone or unreadable (the store handles its own disk)
            warn_once("triton-put-group", f"kcache could not store kernel {filename} ({e})")
        finally:
            self._release()
        return None

    def _release(self) -> None:
        flight, self._flight = self._flight, None
        if flight is not None:
            flight.release()

    def __del__(self) -> None:  # a compile that raised: let the waiters go
        try:
            self._release()
        except Exception:  # broad: a finaliser must not raise (it runs at any point, even at exit)
            pass


def _same_bytes(path: str, blob: bytes) -> bool:
    """Whether the file at ``path`` holds ``blob`` (False when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(blob) + 1) == blob
    except OSError:
        return False


def _unkeyed_stages_hook() -> bool:
    """Triton's ``knobs.runtime.add_stages_inspection_hook`` is set, and this Triton's
    ``compile`` leaves it out of the kernel's key (3.6: the hook rewrites the compile's stages,
    and 3.7 added it to the key). A kernel compiled under it would be served to processes without
    it (and the reverse): kcache steps aside, to Triton's own cache, for such compiles."""
    try:
        from triton import knobs
        from triton.compiler import compiler

        if getattr(knobs.runtime, "add_stages_inspection_hook", None) is None:
            return False
        code = getattr(original(compiler.compile), "__code__", None)
        return code is not None and "add_stages_inspection_hook" not in code.co_names
    except (ImportError, AttributeError):  # a Triton without this knob: nothing to key
        return False


def _always_compile() -> bool:
    """Triton compiles every kernel in spite of its cache (``TRITON_ALWAYS_COMPILE=1``, read as
    Triton reads it, at each compile). The only such switch of Triton's (3.4-3.9): the variables
    that change what is compiled (``MLIR_ENABLE_DUMP``, ``TRITON_DISABLE_LINE_INFO``, ...) are
    in its key, so they miss on their own."""
    try:
        from triton import knobs

        return bool(knobs.compilation.always_compile)
    except (ImportError, AttributeError):  # a Triton without this knob: as if unset
        return False


# Groups judged loadable in this process (record id -> that very record): a group served again
# from the store's memo (the same record object, its files unchanged) is not parsed again.
_servable_seen: dict[str, Any] = {}


def _servable(store: Cache, filename: str, hit: Hit, target: Callable[[], str | None]) -> bool:
    """:func:`groupcheck.servable`, once per group and process: a hit of a group already judged
    here (the same record object: the store's memo of held hits) only says again that it was
    served."""
    rec = hit.record
    if _servable_seen.get(rec.id) is rec:
        # The very record object judged before: served again from the memo, whose entry is the
        # one checked (quarantine renames an entry away: its memo entry is then dropped, and a
        # new put of the same content is another object, checked in full).
        groupcheck.note_served(store, rec)
        return True
    if not groupcheck.servable(store, filename, hit, target()):
        _servable_seen.pop(rec.id, None)
        return False
    if len(_servable_seen) >= 4096:
        _servable_seen.clear()
    _servable_seen[rec.id] = rec
    return True


def _untrusted_store(store: Cache) -> None:
    # Issue 17: a store used only because KCACHE_ALLOW_INSECURE=1 said so (it failed its
    # ownership, mode or parent-folder checks) never gives launchers; say so once, not silently.
    warn_once(
        "untrusted-host-code",
        f"not loading launchers from {store.root}: it failed its safety checks and is used only "
        "because KCACHE_ALLOW_INSECURE=1; they are built here and not stored",
    )


def _mirror_for_inductor(key: str, filename: str, paths: dict[str, str]) -> None:
    """Give torch's Inductor the layout it reads directly: ``<TRITON_CACHE_DIR>/<key>/<file>``.

    Inductor (torch 2.13, open-source defaults) bypasses the cache manager twice: its static CUDA
    launcher wants ``<dir>/<key>/<kernel>.cubin`` to exist, and its TritonBundler copies the whole
    ``<dir>/<key>/`` folder into FX graph cache entries. Without these files a kernel served by
    kcache would silently lose the static launcher and be left out of the bundle. The files are
    hard links to the served files (no copy) and a ``__grp__`` file in Triton's own format; they
    are Triton's cache, outside kcache's size bound. Only done when Inductor is loaded.

    The folder is held to the store's rules: ``TRITON_CACHE_DIR`` must be this user's and
    writable by nobody else, with no parent another user could swap; every file is created
    relative to the opened folders, through unique names, never through a link. Never raises."""
    try:
        from triton import knobs

        from ..store import fs
        from ..store.safety import insecure_parent, insecure_path, make_private_dir

        given = knobs.cache.dir
        if not given:
            return
        given = os.path.abspath(given)
        # Judged as named first (a link another user planted at TRITON_CACHE_DIR or on the way
        # would decide where these files go), before anything is created; then where it leads.
        why = insecure_path(given + "/x")
        base = os.path.realpath(given)
        if why is None:
            if not os.path.isdir(base):
                make_private_dir(Path(base))
            why = insecure_parent(base + "/x")
        if why:
            warn_once("mirror-unsafe", f"not writing Inductor's copy of kernels into {given}: {why}")
            return
        try:
            bfd = fs.open_dir(base, base, fs.trusted_owners(False))
            try:
                kfd = fs.open_dir_at(bfd, key, f"{base}/{key}", fs.trusted_owners(False), create=True)
            finally:
                os.close(bfd)
        except fs.UnsafePath as e:
            # The folder (or the kernel's folder in it) is a link, another user's, or others can
            # write it (a sticky /tmp as TRITON_CACHE_DIR): refused, and said once (issue 17);
            # it was only logged at debug level before.
            warn_once("mirror-unsafe", f"not writing Inductor's copy of kernels into {given}: {e}")
            return
        try:
            grp = f"__grp__{filename}"
            try:
                os.stat(grp, dir_fd=kfd, follow_symlinks=False)
                return  # mirrored already
            except FileNotFoundError:
                pass
            mirrored = {}
            for child, src in paths.items():
                try:
                    os.stat(child, dir_fd=kfd, follow_symlinks=False)
                except FileNotFoundError:
                    tmp = f".{child}.kcache.{uuid.uuid4().hex[:8]}"
                    try:
                        os.link(src, tmp, dst_dir_fd=kfd)
                    except OSError:
                        with open(src, "rb") as f:
                            fs.write_new_at(kfd, tmp, f.read())
                    os.rename(tmp, child, src_dir_fd=kfd, dst_dir_fd=kfd)
                mirrored[child] = os.path.join(base, key, child)
            tmp = f".{grp}.kcache.{uuid.uuid4().hex[:8]}"
            fs.write_new_at(kfd, tmp, json.dumps({"child_paths": mirrored}).encode())
            os.rename(tmp, grp, src_dir_fd=kfd, dst_dir_fd=kfd)
        finally:
            os.close(kfd)
    except OSError as e:  # the folder cannot be written: Inductor reads the manager's files instead
        logger.debug("mirror for Inductor: %s", e)


def _summary(kind: str, filename: str, blob: bytes, comps: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"file": filename}
    if kind == KIND_GROUP and blob:
        try:
            meta = json.loads(blob)
            target = meta.get("target") or {}
            out.update(
                name=meta.get("name"),
                target=f"{target.get('backend')}:{target.get('arch')}" if target else None,
                num_warps=meta.get("num_warps"),
                num_stages=meta.get("num_stages"),
                triton_version=comps.get("triton_version"),
            )
        except (ValueError, AttributeError):  # not JSON, or not the shape Triton writes
            pass
    elif kind == KIND_AUTOTUNE:
        out["gpu_name"] = comps.get("gpu_name")
    for k in ("kernel", "triton_version", "python_abi"):
        if comps.get(k) is not None and k not in out:
            out[k] = comps[k]
    return out


# Imported before triton, this module's `import triton` ran kcache's import hook while the module
# was half-built, and the hook had to wait: finish installing now.
finish_pending()
