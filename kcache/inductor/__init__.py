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
  ``automatic_dynamic_remote_pgo``; functorch's ``enable_remote_autograd_cache`` stays unset and
  kcache answers torch's decision for it (:data:`ANSWERED`: torch hashes it into the AOTAutograd
  key). A switch the user set (to use their own Redis, or 0 to keep a cache local) is left alone,
  and so is that cache's backend;
- when ``torch._inductor.remote_cache`` loads, those caches' backend becomes kcache's store.

Why this over Mega-Cache (``save/load_cache_artifacts``: no per-key lookup, someone must call
save, a load writes every artifact) or owning the cache folder (no lookup hook, mutable files):
the remote-cache interface is per key, is consulted only after Inductor's own local folder
(Inductor's warm path is untouched), works for several processes at once, and has kept its shape
from torch 2.8 to 2.13. docs/design.md and docs/torch-compile.md say more.

What the store holds: the bytes Inductor gives, as they are (a JSON envelope around a base64
pickle for AOT and PGO entries; JSON for autotune results), but for FX graphs, whose pickle is
kept out of its envelope and handed to torch as a file (:mod:`.handover`). kcache never decodes the pickle;
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

Beside the caches, six smaller attachments, each in its own module: the C++ builder of CPU
kernels (:mod:`.cpp`), caching-precompile packages (:mod:`.precompile`), the cached
coordinate-descent winners torch 2.11 drops on a warm start (:mod:`.coordesc`), Inductor's CPU
vector-ISA probes (:mod:`.vecisa`), its compile-worker pool, started when a graph is to be
compiled rather than at every process's first call (:mod:`.workers`), and the AOTAutograd key's
debug lines, computed by torch 2.8-2.11 at every lookup though no log reads them
(:mod:`.debuglines`).

Nothing here imports torch: every function is called from an import hook, with the module.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from ..log import logger, warn_once
from ..patch import Hooks, Integration, replacing
from . import declare as _kinds
from .attached import answered as _answered
from .attached import backend_is_ours as backend_is_ours
from .attached import cache as active_cache
from .attached import our_backends as _ours_cls
from .attached import patches
from .attached import switched_on as _ours
from .entries import MEMBER as MEMBER
from .entries import NoGpuModel as NoGpuModel
from .entries import _compile_s as _compile_s
from .entries import forget as forget
from .entries import get, put
from .entries import store_key as store_key

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

#: Switches kcache leaves unset and answers for in torch's decision function
#: (``should_use_remote_autograd_cache``, wrapped by :mod:`.policy`): torch hashes functorch's
#: portable config, this switch included, into the AOTAutograd key, so setting it gave a process
#: with kcache other AOTAutograd keys than one without: Inductor's own folder was not shared
#: between them (the other switches are not in torch's keys).
ANSWERED = frozenset({"enable_remote_autograd_cache"})

#: The modules whose import attaches this integration (declared in :mod:`.declare`).
TRIGGERS = _kinds.TRIGGERS


def on_import(mod: Any) -> None:
    """Called when one of :data:`TRIGGERS` has been imported."""
    name = getattr(mod, "__name__", "")
    if name in FLAGS:
        _turn_on(mod, FLAGS[name])
    elif name == "torch._inductor.remote_cache":
        _install_backends(mod)
    elif name == "torch._inductor.cpp_builder" and not _is_fbcode():
        from . import compilerinfo, cpp

        cpp.on_import(mod)
        compilerinfo.on_import(mod)
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
        from . import cpp, workers

        workers.on_import(mod)
        cpp.on_async_compile(mod)
    elif not _is_fbcode():
        _on_policy_module(mod, name)
        from . import debuglines, restarts

        restarts.on_import(mod)  # its two modules (:data:`.restarts.MODULES`); others: nothing
        if name == debuglines.MODULE:
            debuglines.on_import(mod)


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
    if name == "torch._inductor.codecache":
        from . import handover, pch, torchkey

        pch.on_import(mod)
        torchkey.on_import(mod)
        handover.on_import(mod)


def _is_fbcode() -> bool:
    cfg = sys.modules.get("torch._inductor.config")
    try:
        return bool(cfg is not None and cfg.is_fbcode())
    except AttributeError:  # a torch whose config has no such call: open-source torch
        return False


def _turn_on(cfg: Any, switches: tuple[tuple[str, str], ...]) -> None:
    if _is_fbcode():
        return
    for attr, cls_name in switches:
        try:
            if not hasattr(cfg, attr):
                continue  # this torch has no such cache
            if getattr(cfg, attr) is None:  # unset: off in open-source torch
                if attr in ANSWERED:  # left unset: kcache answers torch's decision (.policy)
                    _answered[cls_name] = (cfg.__name__, attr)
                else:
                    patches.set(cfg, attr, True)
                _ours.add(cls_name)
        except (AttributeError, TypeError, ValueError) as e:  # torch's config refused the value
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
        if (
            cls is None
            or not (isinstance(cls, type) and issubclass(cls, remote))
            or patches.holds(cls, "backend_override_cls")
        ):
            continue
        backend = functools.partial(backend_cls, KIND_BY_CLASS[cls_name])
        _ours_cls[cls_name] = patches.wrap(cls, "backend_override_cls", replacing(backend), raw=True)


def uninstall() -> None:
    """Give torch its own backends, switches and wrapped functions back (kcache.disable())."""
    patches.undo()
    for sub in (
        "kcache.inductor.precompile",
        "kcache.inductor.policy",
        "kcache.inductor.graphs",
        "kcache.inductor.workers",
        "kcache.inductor.pch",
        "kcache.inductor.restarts",
        "kcache.inductor.handover",
    ):
        m = sys.modules.get(sub)
        if m is not None:
            m.uninstall()
    _ours_cls.clear()
    _ours.clear()
    _answered.clear()


@functools.lru_cache(maxsize=1)
def _backend_class(base: type) -> type:
    class KcacheBackend(base):
        """Inductor's remote cache backend, on kcache's store (never raises)."""

        def __init__(self, kind: str) -> None:
            super().__init__()
            # (a name torch's own backends do not use: how kcache's wrappers tell its backends,
            # :mod:`.handover`)
            self.kcache_kind = kind

        def _get(self, key: str) -> bytes | None:
            return get(self.kcache_kind, key)

        def _put(self, key: str, data: Any) -> None:
            put(self.kcache_kind, key, data)

    return KcacheBackend


# on_import() when a trigger is imported; the detach gives torch back what it replaced.
_hooks = Hooks(active_cache, lambda mod: on_import(mod), lambda: uninstall())


def _checks() -> dict[str, Callable[[Any], str | None]]:
    """What ``kcache verify`` checks of this integration's entries: autotune results
    (:mod:`.tunecheck`), the FX graphs an AOTAutograd entry's kept list names (:mod:`.graphs`)
    and the names of a kept restart (:mod:`.restarts`)."""
    from . import restarts
    from .entries import aot_check
    from .tunecheck import checks

    return {**checks(MEMBER), _kinds.INDUCTOR_AOT: aot_check, _kinds.INDUCTOR_RESTART: restarts.check}


INTEGRATION = Integration(
    "torch",
    attach=_hooks.attach,
    on_import=_hooks.on_import,
    checks=_checks,
)
