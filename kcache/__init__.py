"""kcache: a persistent on-disk compilation cache for GPU kernels (Triton, autotune, nvFuser).

``KCACHE=1`` turns it on in every Python process (a ``.pth`` hook); in code, :func:`enable`.

Start-up is the hook's whole cost in every Python process of a user who exports ``KCACHE=1``
(every pip, every tool, every compile worker), so it does almost nothing: it registers import
hooks for triton, nvFuser and torch. The settings are read and checked when one of those is
imported, and the store is opened at the first integration's first use (:func:`active_store`).
This module imports nothing that a bare interpreter has not loaded already.
"""

from __future__ import annotations

import _thread

if False:  # annotations only: typing, pathlib and the store are not loaded at start-up
    from pathlib import Path
    from typing import Any

    from . import config as _config
    from .store import Store

__version__ = "0.1.0"
__all__ = ["enable", "disable", "is_enabled", "stats", "active_store", "settings", "prewarm", "__version__"]

_lock = _thread.RLock()
_wanted = False  # enable() or the hook asked for caching in this process
_overrides: dict[str, Any] = {}
_settings: _config.Settings | None = None
_store: Store | None = None
_failed = False  # the settings or the store are unusable: warned once, caching off
_integrations: list[Any] = []  # functions that undo what was attached
_exit_hook = False

#: Modules whose import attaches an integration, and the function that attaches it. torch's are
#: its config modules (the remote-cache switches) and its remote-cache module (the backends).
_TRIGGERS = (
    ("triton", "_on_triton"),
    ("nvfuser_direct", "_on_nvfuser"),
    ("nvfuser", "_on_nvfuser"),
    ("torch._inductor.config", "_on_torch"),
    ("torch._functorch.config", "_on_torch"),
    ("torch._dynamo.config", "_on_torch"),
    ("torch._inductor.remote_cache", "_on_torch"),
    ("torch._inductor.cpp_builder", "_on_torch"),
    ("torch._dynamo.package", "_on_torch"),
    ("torch._inductor.runtime.triton_heuristics", "_on_torch"),
    ("torch._inductor.cpu_vec_isa", "_on_torch"),
    ("torch._inductor.utils", "_on_torch"),
    ("torch._inductor.codecache", "_on_torch"),
    ("torch._functorch._aot_autograd.autograd_cache", "_on_torch"),
    ("torch._dynamo.pgo", "_on_torch"),
    ("torch._inductor.runtime.autotune_cache", "_on_torch"),
    ("torch._inductor.compile_fx", "_on_torch"),
    ("torch._functorch._aot_autograd.aot_autograd_result", "_on_torch"),
    ("torch._functorch._aot_autograd.graph_compile", "_on_torch"),
    ("torch._functorch.aot_autograd", "_on_torch"),
    ("torch._inductor.async_compile", "_on_torch"),
    ("torch._inductor.codegen.triton", "_on_torch"),
)


def enable(
    dir: str | Path | None = None,
    *,
    max_size: int | str | None = None,
    readonly: bool | None = None,
    key_tag: str | None = None,
    remote: str | None = None,
    triton: bool = True,
    nvfuser: bool = True,
    torch: bool = True,
) -> bool:
    """Turn kcache on in this process. Arguments override the ``KCACHE_*`` environment.

    Checks the settings and opens the store now; returns True when caching is on. Never raises
    for bad settings or an unusable store: it warns once and returns False, and the program
    compiles as if kcache were not there."""
    global _wanted, _failed
    with _lock:
        if _wanted:
            disable()
        overrides = dict(dir=dir, max_size=max_size, readonly=readonly, key_tag=key_tag, remote=remote)
        _overrides.clear()
        _overrides.update({k: v for k, v in overrides.items() if v is not None})
        _wanted, _failed = True, False
        if active_store() is None:
            _wanted = False
            return False
        _attach(triton=triton, nvfuser=nvfuser, torch=torch)
        return True


def _enable_from_env() -> None:
    """The ``.pth`` hook (``KCACHE`` set): register the import hooks, nothing more."""
    global _wanted
    with _lock:
        if _wanted:
            return
        _wanted = True
        _attach(triton=True, nvfuser=True, torch=True)


def _attach(*, triton: bool, nvfuser: bool, torch: bool) -> None:
    from ._imports import forget, when_imported

    wanted = {"triton": triton, "nvfuser": nvfuser, "torch": torch}
    for name, fn_name in _TRIGGERS:
        if wanted[name.split(".")[0].split("_")[0]]:
            fn = globals()[fn_name]
            when_imported(name, fn)
            _integrations.append(lambda name=name, fn=fn: forget(name, fn))


def _usable() -> bool:
    """The settings are good (warned once when not): an integration may attach."""
    with _lock:
        if not _wanted or _failed:
            return False
        return _load_settings() is not None


def _load_settings() -> _config.Settings | None:
    global _settings, _failed
    if _settings is not None:
        return _settings
    from . import config
    from .log import configure, warn_once

    s = config.load(**_overrides)
    if s.problems:
        configure(s.log if not any("KCACHE_LOG" in p for p in s.problems) else None)
        warn_once("settings", "caching is off: " + "; ".join(s.problems))
        _failed = True
        return None
    configure(s.log)
    s.enabled = True
    _settings = s
    return s


def active_store() -> Store | None:
    """The store this process uses, opened on first use; None when kcache is off (or the store
    cannot be used: warned once, then caching stays off in this process)."""
    global _store, _failed, _exit_hook
    store = _store
    if store is not None or not _wanted or _failed:
        return store
    with _lock:
        if _store is not None or not _wanted or _failed:
            return _store
        s = _load_settings()
        if s is None:
            return None
        from .config import env_number
        from .log import warn_once
        from .store import Store, StoreError

        try:
            store = Store.from_settings(s, write=True, drain_global=True)
        except StoreError as e:
            warn_once("store", f"caching is off: {e}")
            _failed = True
            return None
        protect = env_number("KCACHE_PREWARM_PROTECT_S")
        if protect:  # a child of `kcache prewarm` (a compile worker): its puts are protected too
            store.protect(protect)
        if not _exit_hook:
            import atexit

            # atexit runs last-registered first: integrations' counts reach the store before it closes.
            atexit.register(_push_integration_counts)
            _exit_hook = True
        _store = store
        return store


def _on_triton(mod: Any) -> None:
    if not _usable():
        return
    from .triton import install, uninstall

    install(mod)
    _integrations.append(uninstall)
    s = _settings
    if s is not None and s.record:
        from .prewarm.record import attach as _attach_prewarm

        _integrations.append(_attach_prewarm(s.record))
    else:
        _check_prewarm_build(mod)


def _on_nvfuser(mod: Any) -> None:
    if not _usable():
        return
    from .nvfuser import kerneldb

    kerneldb.on_import(mod)
    _integrations.append(kerneldb.detach_all)


def _on_torch(mod: Any) -> None:
    if not _usable():
        return
    from . import inductor

    inductor.on_import(mod)
    if inductor.uninstall not in _integrations:
        _integrations.append(inductor.uninstall)


def _check_prewarm_build(_mod: Any) -> None:
    from .log import logger
    from .prewarm.meta import check_store_build

    try:
        check_store_build(active_store())
    except Exception as e:  # broad: an advisory check at Triton's import; raised under KCACHE_STRICT=1
        from .boundary import strict

        if strict():
            raise
        logger.debug("prewarm build check: %s", e)


def disable() -> None:
    """Turn kcache off in this process: integrations detach (Triton's manager and memos are
    removed only if Triton was imported: disabling never imports it), the store is flushed and
    closed."""
    global _store, _wanted, _settings, _failed
    with _lock:
        while _integrations:
            detach = _integrations.pop()
            try:
                detach()
            except Exception:  # broad: one integration's undo must not keep the others attached
                from .boundary import strict

                if strict():
                    raise
        if _store is not None:
            _store.close()
        _store, _settings, _wanted, _failed = None, None, False, False


def is_enabled() -> bool:
    """True when caching is on in this process (this opens the store if it is not open yet)."""
    return active_store() is not None


def settings() -> _config.Settings:
    """The effective settings (those in use when enabled, else what the environment says)."""
    if _settings is not None and _store is not None:
        return _settings
    from . import config

    return config.load(**_overrides)


def _push_integration_counts() -> None:
    """Integrations that count hits without a lock push their counts to kcache.counters now."""
    import sys

    mod = sys.modules.get("kcache.nvfuser.fusion_cache")
    if mod is not None:
        from .boundary import guarded

        with guarded("nvfuser-counts", "kcache's count of nvFuser's cache hits"):
            mod.flush_all()


def stats() -> dict[str, Any]:
    """Entries, bytes and counters of the active store, and this process's own counters."""
    from . import counters
    from .maintenance.stats import store_stats

    _push_integration_counts()
    store = active_store()
    out: dict[str, Any] = {"enabled": store is not None}
    if store is not None:
        store.flush(force=True)
        out.update(store_stats(store))
    proc: dict[str, dict[str, float]] = {}
    for src in ([store.counts] if store is not None else []) + [counters.GLOBAL]:
        for kind, vals in src.process_totals().items():
            for k, v in vals.items():
                proc.setdefault(kind, {}).setdefault(k, 0.0)
                proc[kind][k] += v
    out["process"] = proc
    return out


def prewarm(spec: Any, **kwargs: Any) -> Any:
    """Prepare what a prewarm spec lists (see :mod:`kcache.prewarm`)."""
    from .prewarm import prewarm as _prewarm

    return _prewarm(spec, **kwargs)
