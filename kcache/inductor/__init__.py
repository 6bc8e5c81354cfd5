"""kcache's torch.compile integration: Inductor's own caches, kept in kcache's store.

A warm torch.compile start needs what Inductor keeps beside the Triton kernels: the FX graph
cache, the AOTAutograd cache, autotune results and Dynamo's profile of dynamic dimensions (PGO).
Inductor can keep each of those in a remote cache as well as in ``TORCHINDUCTOR_CACHE_DIR``; the
remote caches all go through one small interface (``torch._inductor.remote_cache``:
``RemoteCacheBackend._get/_put``, bytes in, bytes out), and each cache class has a
``backend_override_cls`` hook (the one torch's own ``mock_cache`` test helper uses; present from
torch 2.8 to 2.13). kcache plugs its store in there:

- when torch's config modules load, the remote switches the user left unset are turned on, in
  this process only (config attributes, never environment variables that children without
  kcache would inherit): ``fx_graph_remote_cache``, ``autotune_remote_cache``,
  ``enable_remote_autograd_cache``, ``automatic_dynamic_remote_pgo``. A switch the user set (to
  use their own Redis, or 0 to keep a cache local) is left alone, and so is that cache's backend;
- when ``torch._inductor.remote_cache`` loads, those caches' backend becomes kcache's store.

Why this over Mega-Cache (``save/load_cache_artifacts``: no per-key lookup, someone must call
save, a load writes every artifact) or owning the cache folder (no lookup hook, mutable files):
the remote-cache interface is per key, is consulted only after Inductor's own local folder
(Inductor's warm path is untouched), works for several processes at once, and has kept its shape
from torch 2.8 to 2.13. docs/design.md and docs/torch-compile.md say more.

What the store holds: the bytes Inductor gives, as they are (a JSON envelope around a base64
pickle for FX, AOT and PGO entries; JSON for autotune results). kcache never decodes the pickle;
these kinds are "pickled" in :mod:`kcache.kinds`: taken from a bundle (or a shared tier) only
when signed, and never from a store opened with ``KCACHE_ALLOW_INSECURE``. Inductor's remote
caches overwrite (last writer wins: the PGO profile grows under one key; a new guard variant
replaces the old): puts here replace the entry.

Keys: Inductor's own key (``pt2:<cache id>::<key>:c1``; FX, AOT and autotune keys already hash
torch's sources), plus the torch version for PGO (whose key is only job id, rank and tag) and the
GPU model for autotune results (Triton's key says sm_90, not H100 or H200; timings are per model).

What torch's own switches say wins: a cache the program turned off, ``force_disable_caches``
and torch's fresh-cache scopes are honoured at every lookup (:mod:`.policy`), and an AOTAutograd
entry is served and kept only with the FX graphs it names (:mod:`.graphs`).

Beside the caches, five smaller attachments, each in its own module: the C++ builder of CPU
kernels (:mod:`.cpp`), caching-precompile packages (:mod:`.precompile`), the cached
coordinate-descent winners torch 2.11 drops on a warm start (:mod:`.coordesc`), Inductor's CPU
vector-ISA probes (:mod:`.vecisa`) and its compile-worker pool, started when a graph is to be
compiled rather than at every process's first call (:mod:`.workers`).

Nothing here imports torch: every function is called from an import hook, with the module.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any

from .. import kinds as _kinds
from ..boundary import fail_open
from ..log import logger, warn_once

MEMBER = "value"  # the one file of an inductor entry: the bytes Inductor gave

#: torch's remote cache class -> kcache kind
KIND_BY_CLASS = {
    "RemoteFxGraphCache": _kinds.INDUCTOR_FX,
    "RemoteAOTAutogradCache": _kinds.INDUCTOR_AOT,
    "RemoteAutotuneCache": _kinds.INDUCTOR_AUTOTUNE,
    "RemoteDynamoPGOCache": _kinds.INDUCTOR_PGO,
}

#: config module -> (switch, the cache class it turns on). Not ``bundled_autotune_remote_cache``:
#: it enters the FX graph key, and without a Triton backend (a CPU machine) it fails the compile.
FLAGS: dict[str, tuple[tuple[str, str], ...]] = {
    "torch._inductor.config": (
        ("fx_graph_remote_cache", "RemoteFxGraphCache"),
        ("autotune_remote_cache", "RemoteAutotuneCache"),
    ),
    "torch._functorch.config": (("enable_remote_autograd_cache", "RemoteAOTAutogradCache"),),
    "torch._dynamo.config": (("automatic_dynamic_remote_pgo", "RemoteDynamoPGOCache"),),
}

#: The modules whose import attaches this integration (see kcache/__init__.py).
TRIGGERS = (
    *FLAGS,
    "torch._inductor.remote_cache",
    "torch._inductor.cpp_builder",
    "torch._dynamo.package",
    "torch._inductor.runtime.triton_heuristics",
    "torch._inductor.cpu_vec_isa",
    "torch._inductor.utils",
    "torch._inductor.codecache",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._dynamo.pgo",
    "torch._inductor.runtime.autotune_cache",
    "torch._inductor.compile_fx",
    "torch._functorch._aot_autograd.aot_autograd_result",
    "torch._functorch._aot_autograd.graph_compile",
    "torch._functorch.aot_autograd",
    "torch._inductor.async_compile",
    "torch._inductor.codegen.triton",
)

_ours: set[str] = set()  # cache classes whose switch kcache turned on in this process
_installed: dict[str, Any] = {}  # cache class name -> the backend_override_cls it had before
_ours_cls: dict[str, Any] = {}  # cache class name -> the backend_override_cls kcache set


def on_import(mod: Any) -> None:
    """Called when one of :data:`TRIGGERS` has been imported."""
    name = getattr(mod, "__name__", "")
    if name in FLAGS:
        _turn_on(mod, FLAGS[name])
    elif name == "torch._inductor.remote_cache":
        _install_backends(mod)
    elif name == "torch._inductor.cpp_builder" and not _is_fbcode():
        from . import cpp

        cpp.on_import(mod)
    elif name == "torch._dynamo.package" and not _is_fbcode():
        from . import policy, precompile

        precompile.on_import(mod)
        policy.wrap_clear(mod)
    elif name == "torch._inductor.runtime.triton_heuristics" and not _is_fbcode():
        from . import coordesc

        coordesc.on_import(mod)
    elif name == "torch._inductor.cpu_vec_isa" and not _is_fbcode():
        from . import vecisa

        vecisa.on_import(mod)
    elif name == "torch._inductor.async_compile" and not _is_fbcode():
        from . import workers

        workers.on_import(mod)
    elif not _is_fbcode():
        _on_policy_module(mod, name)


def _on_policy_module(mod: Any, name: str) -> None:
    """torch's modules whose switches, scopes and clears :mod:`.policy` watches."""
    from . import policy

    if name in policy.DECISIONS:
        policy.wrap_decision(mod)
    if name in policy.AUTOTUNE_META:
        policy.wrap_autotune_meta(mod)
    if name in policy.CLEARS:
        policy.wrap_clear(mod)
    if name in policy.BINDERS:
        policy.rebind(mod)
    if name == "torch._inductor.utils":
        policy.on_utils_import(mod)


def _is_fbcode() -> bool:
    cfg = sys.modules.get("torch._inductor.config")
    try:
        return bool(cfg is not None and cfg.is_fbcode())
    except Exception:  # broad: torch's own config call; an error means open-source torch
        return False


def _turn_on(cfg: Any, switches: tuple[tuple[str, str], ...]) -> None:
    if _is_fbcode():
        return
    for attr, cls_name in switches:
        try:
            if not hasattr(cfg, attr):
                continue  # this torch has no such cache
            if getattr(cfg, attr) is None:  # unset: off in open-source torch
                setattr(cfg, attr, True)
                _ours.add(cls_name)
        except Exception as e:  # broad: torch's config objects validate with their own errors
            logger.info("torch.compile: could not turn on %s: %s", attr, e)
    rc = sys.modules.get("torch._inductor.remote_cache")
    if rc is not None:  # loaded before this config (not the usual order): install now
        _install_backends(rc)


def _install_backends(rc: Any) -> None:
    base = getattr(rc, "RemoteCacheBackend", None)
    remote = getattr(rc, "RemoteCache", None)
    if base is None or remote is None or "backend_override_cls" not in vars(remote):
        warn_once(
            "inductor-interface",
            "this torch's Inductor has no remote-cache backend hook kcache knows; "
            "torch.compile's own caches are not kept in kcache's store (Triton kernels still are)",
        )
        return
    backend_cls = _backend_class(base)
    for cls_name in sorted(_ours):
        cls = getattr(rc, cls_name, None)
        if cls is None or not (isinstance(cls, type) and issubclass(cls, remote)) or cls_name in _installed:
            continue
        _installed[cls_name] = cls.__dict__.get("backend_override_cls")
        cls.backend_override_cls = _ours_cls[cls_name] = functools.partial(
            backend_cls, KIND_BY_CLASS[cls_name]
        )


def backend_is_ours(cls_name: str) -> bool:
    """torch's remote cache class ``cls_name`` has kcache's store as its backend (or will have,
    when ``torch._inductor.remote_cache`` loads: kcache turned its switch on)."""
    rc = sys.modules.get("torch._inductor.remote_cache")
    if rc is None:
        return cls_name in _ours
    cls = getattr(rc, cls_name, None)
    ours = _ours_cls.get(cls_name)
    return ours is not None and cls is not None and cls.__dict__.get("backend_override_cls") is ours


def uninstall() -> None:
    """Give torch its own backends, switches and wrapped functions back (kcache.disable())."""
    for sub in (
        "kcache.inductor.cpp",
        "kcache.inductor.precompile",
        "kcache.inductor.coordesc",
        "kcache.inductor.vecisa",
        "kcache.inductor.policy",
        "kcache.inductor.graphs",
        "kcache.inductor.workers",
    ):
        m = sys.modules.get(sub)
        if m is not None:
            m.uninstall()
    rc = sys.modules.get("torch._inductor.remote_cache")
    for cls_name, before in list(_installed.items()):
        cls = getattr(rc, cls_name, None) if rc is not None else None
        if cls is not None:
            if before is None:
                try:
                    del cls.backend_override_cls
                except AttributeError:
                    pass
            else:
                cls.backend_override_cls = before
        del _installed[cls_name]
        _ours_cls.pop(cls_name, None)
    for mod_name, switches in FLAGS.items():
        cfg = sys.modules.get(mod_name)
        for attr, cls_name in switches:
            if cfg is not None and cls_name in _ours:
                try:
                    setattr(cfg, attr, None)
                except Exception:  # broad: as above; undoing goes on
                    pass
    _ours.clear()


@functools.lru_cache(maxsize=1)
def _backend_class(base: type) -> type:
    class KcacheBackend(base):  # type: ignore[misc, valid-type]
        """Inductor's remote cache backend, on kcache's store (never raises)."""

        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind

        def _get(self, key: str) -> bytes | None:
            return get(self.kind, key)

        def _put(self, key: str, data: Any) -> None:
            put(self.kind, key, data)

    return KcacheBackend


# ------------------------------------------------------------------------------------ keys
@functools.lru_cache(maxsize=1)
def _torch_version() -> str:
    torch = sys.modules.get("torch")
    v = str(getattr(torch, "__version__", "?"))
    git = getattr(getattr(torch, "version", None), "git_version", None)
    return f"{v}+{git[:12]}" if isinstance(git, str) and git else v


_gpu: list[str | None] = []


class NoGpuModel(Exception):
    """The GPU model cannot be read here: autotune results are then neither served nor kept."""


def _gpu_model() -> str | None:
    """The GPU model autotune results were (or will be) measured on; "cpu" without CUDA; None
    when it cannot be told (results are then not cached: an "unknown" key would mix GPUs).

    Read through Inductor's device interface ``Worker`` API where torch has it: it answers in
    compile workers (forked, no CUDA of their own) from what the parent recorded, where
    ``torch.cuda.get_device_name`` would try to initialise CUDA and fail."""
    if _gpu:
        return _gpu[0]
    name: str | None = "cpu"
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            name = None
            try:
                from torch._dynamo.device_interface import get_interface_for_device

                worker = get_interface_for_device("cuda").Worker
                name = str(worker.get_device_properties(worker.current_device()).name)
            except Exception:  # broad: torch's device interface varies between versions (then asked directly)
                name = str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception as e:  # broad: CUDA's initialisation raises what the driver meets
        logger.debug("torch.compile: no GPU model (%s)", e)
        name = None
    _gpu.append(name)
    return name


def store_key(kind: str, key: str) -> tuple[str, dict[str, Any]]:
    """kcache's key for Inductor's ``key`` and its named components (for ``explain``)."""
    comps: dict[str, Any] = {"torch_version": _torch_version()}
    if key.startswith("pt2:") and "::" in key:
        comps["cache"] = key[4 : key.index("::")]
    if kind in (_kinds.INDUCTOR_PGO, _kinds.INDUCTOR_PRECOMPILE):  # keys without torch's version
        key = f"{key}|torch={comps['torch_version']}"
    elif kind == _kinds.INDUCTOR_AUTOTUNE:
        gpu = _gpu_model()
        if gpu is None:
            raise NoGpuModel("the GPU model is unknown here")
        comps["gpu_name"] = gpu
        key = f"{key}|gpu={gpu}"
    return key, comps


def _compile_s(data: bytes) -> float:
    """The compile time Inductor recorded in its envelope (``"time_taken_ms": N``, at the end)."""
    i = data.rfind(b'"time_taken_ms"', max(0, len(data) - 256))
    if i < 0:
        return 0.0
    digits = bytearray()
    for c in data[i + 15 :]:
        if 48 <= c <= 57:
            digits.append(c)
        elif digits:
            break
    return int(digits) / 1000.0 if digits else 0.0


# ------------------------------------------------------------------------------------ get/put
def _store() -> Any:
    from .. import active_store

    store = active_store()
    if store is not None and not store.trust_host_code and _kinds.get(_kinds.INDUCTOR_FX).pickled:
        # A store opened with KCACHE_ALLOW_INSECURE: torch unpickles what it is given, so
        # nothing pickled is taken from (or put into) it. Autotune JSON would be safe, but one
        # rule for the whole integration is easier to reason about.
        warn_once(
            "inductor-insecure",
            "the store failed its ownership checks: torch.compile's caches are not kept in it",
        )
        return None
    return store


@fail_open("inductor-get", "kcache's torch.compile cache lookup")
def get(kind: str, key: str) -> bytes | None:
    """The bytes stored for Inductor's ``key``, or None. Never raises."""
    from .. import counters
    from . import graphs, policy

    graph = kind in (_kinds.INDUCTOR_FX, _kinds.INDUCTOR_AOT)
    served: float | None = None  # a graph served: its recorded compile time ("saved", counters.py)
    try:
        if not policy.may_serve(kind, key):
            return None
        if kind == _kinds.INDUCTOR_FX:
            graphs.learn(key)
            held = graphs.take(key)  # fetched with its AOTAutograd entry a moment ago
            if held is not None:
                graph = False  # the AOT hit's compile time covers it and its kernels
                return held
        store = _store()
        if store is None:
            return None
        skey, comps = store_key(kind, key)
        hit = store.get(kind, skey, comps)
        data = hit.read(MEMBER) if hit is not None else None
        if data is not None and kind == _kinds.INDUCTOR_AOT:
            data = data if _with_graphs(store, key, data, hit.record.compile_s) else None
        if data is None:
            return None
        served = hit.record.compile_s
        return data
    except NoGpuModel:
        return None
    finally:
        if graph:
            counters.graph_lookup(served)
            if served is None:
                from . import workers

                workers.compile_coming()  # a graph will be compiled: its workers are wanted now


def _with_graphs(store: Any, key: str, data: bytes, compile_s: float) -> bool:
    """Fetch the FX graphs an AOTAutograd entry names (held for torch's lookups that follow).
    False, with the hit counted as a miss, when one of them cannot be served: the entry is then
    removed if a graph is gone from the store (see :mod:`.graphs`)."""
    from . import graphs, policy

    try:
        needed = graphs.fx_keys(data)
    except graphs.Unreadable as e:
        logger.debug("torch.compile: AOTAutograd entry %s not served: %s", key, e)
        store.counts.add(_kinds.INDUCTOR_AOT, hits=-1, misses=1, saved_s=-compile_s)
        return False
    fetched = []
    graphs.form_known()  # takes the form of FX keys from torch when this process saw none yet
    for fx_key in needed:
        remote_key = graphs.fx_remote_key(fx_key)
        hit = None
        if policy.may_serve(_kinds.INDUCTOR_FX, remote_key):
            skey, comps = store_key(_kinds.INDUCTOR_FX, remote_key)
            hit = store.get(_kinds.INDUCTOR_FX, skey, comps)
        if hit is None:
            store.counts.add(_kinds.INDUCTOR_AOT, hits=-1, misses=1, saved_s=-compile_s)
            if graphs.form_known() and policy.may_serve(_kinds.INDUCTOR_FX, remote_key):
                forget(_kinds.INDUCTOR_AOT, key)  # its graph is gone from the store
            logger.debug("torch.compile: AOTAutograd entry %s not served: FX graph %s absent", key, fx_key)
            return False
        # the AOT entry's compile time includes its graphs': credited once, with the AOT hit
        store.counts.add(_kinds.INDUCTOR_FX, saved_s=-hit.record.compile_s)
        fetched.append((remote_key, hit.read(MEMBER)))
    for remote_key, blob in fetched:
        graphs.hold(remote_key, blob)
    return True


@fail_open("inductor-forget", "kcache's removal of an entry torch could not use")
def forget(kind: str, key: str) -> None:
    """Remove what the store holds for Inductor's ``key`` (torch could not use it). Never raises."""
    try:
        store = _store()
        if store is None or store.readonly:
            return
        skey, _ = store_key(kind, key)
        store.remove([store.entry_id(kind, skey)])
    except OSError as e:  # the store's folder could not be changed: the entry is judged again
        logger.debug("torch.compile: could not remove %s %s: %s", kind, key, e)


@fail_open("inductor-put", "kcache's storing of a torch.compile cache entry")
def put(kind: str, key: str, data: Any) -> None:
    """Keep Inductor's bytes for ``key`` (replacing what was there). Never raises."""
    try:
        from . import graphs, policy

        if not isinstance(data, (bytes, bytearray, memoryview)):
            warn_once(
                "inductor-put-type",
                f"torch.compile gave kcache a {type(data).__name__}, not bytes; not stored",
            )
            return
        if not policy.may_keep(kind):
            return
        if kind == _kinds.INDUCTOR_FX:
            graphs.learn(key)
        store = _store()
        if store is None:
            return
        blob = bytes(data)
        if kind == _kinds.INDUCTOR_AOT and not _graphs_kept(store, key, blob):
            return
        skey, comps = store_key(kind, key)
        summary = {k: v for k, v in comps.items() if k in ("cache", "gpu_name", "torch_version")}
        if kind in (_kinds.INDUCTOR_FX, _kinds.INDUCTOR_AOT):
            from .naming import graph_summary

            summary.update(graph_summary())  # the compiled function's name, for inspect
        t0 = time.perf_counter()
        store.replace(
            kind, skey, {MEMBER: blob}, components=comps, summary=summary, compile_s=_compile_s(blob)
        )
        policy.kept(kind, key)
        logger.debug(
            "torch.compile: stored %s %s (%d bytes, %.1f ms)",
            kind,
            key,
            len(blob),
            1e3 * (time.perf_counter() - t0),
        )
    except NoGpuModel:
        return


def _graphs_kept(store: Any, key: str, blob: bytes) -> bool:
    """The FX graphs an AOTAutograd entry names are all in the store (torch put them first)."""
    from . import graphs

    try:
        needed = graphs.fx_keys(blob)
    except graphs.Unreadable as e:
        logger.debug("torch.compile: AOTAutograd entry %s not kept: %s", key, e)
        return False
    for fx_key in needed:
        skey, _ = store_key(_kinds.INDUCTOR_FX, graphs.fx_remote_key(fx_key))
        rec, _why = store.read_record(store.entry_id(_kinds.INDUCTOR_FX, skey))
        if rec is None:
            logger.debug("torch.compile: AOTAutograd entry %s not kept: FX graph %s not stored", key, fx_key)
            return False
    return True
