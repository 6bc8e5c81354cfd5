"""kcache: a persistent on-disk compilation cache for GPU kernels (Triton, autotune, nvFuser).

``KCACHE=1`` turns it on in every Python process (a ``.pth`` hook); in code, :func:`enable`.
Importing kcache is cheap: the store, Triton and nvFuser integrations load on first use.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import config as _config
from .log import configure as _configure_log
from .log import warn_once as _warn_once

if TYPE_CHECKING:
    from .store import Store

__version__ = "0.1.0"
__all__ = ["enable", "disable", "is_enabled", "stats", "active_store", "settings", "prewarm", "__version__"]

_lock = threading.RLock()
_store: Store | None = None
_settings: _config.Settings | None = None
_integrations: list[Any] = []


def enable(
    dir: str | Path | None = None,
    *,
    max_size: int | str | None = None,
    readonly: bool | None = None,
    key_tag: str | None = None,
    remote: str | None = None,
    triton: bool = True,
    nvfuser: bool = True,
) -> bool:
    """Turn kcache on in this process. Arguments override the ``KCACHE_*`` environment.

    Returns True when caching is on. Never raises for bad settings or an unusable store: it warns
    once and returns False, and the program compiles as if kcache were not there."""
    global _store, _settings
    with _lock:
        s = _config.load(dir=dir, max_size=max_size, readonly=readonly, key_tag=key_tag, remote=remote)
        _configure_log(s.log)
        if s.problems:
            _warn_once("settings", "caching is off: " + "; ".join(s.problems))
            return False
        s.enabled = True
        from .store import Store, StoreError

        try:
            store = Store.open(
                s.dir,
                max_size=s.max_size,
                readonly=s.readonly,
                key_tag=s.key_tag,
                allow_insecure=s.allow_insecure,
                drain_global=True,
            )
        except StoreError as e:
            _warn_once("store", f"caching is off: {e}")
            return False
        if _store is not None:
            disable()
        _store, _settings = store, s
        import atexit

        # atexit runs last-registered first: integrations' counts reach the store before it closes.
        atexit.register(_push_integration_counts)
        if triton:
            from .triton import attach as _attach_triton

            _integrations.append(_attach_triton())
        if nvfuser:
            try:
                from .nvfuser import attach as _attach_nvfuser
            except ImportError:
                pass
            else:
                _integrations.append(_attach_nvfuser())
        if triton:  # KCACHE_RECORD, and the check of a prewarmed store's Triton build
            import os

            if s.record or os.environ.get("KCACHE_PREWARM_PROTECT_S"):
                from .prewarm.record import attach as _attach_prewarm

                _integrations.append(_attach_prewarm(s.record))
            else:
                # Only the build check is needed: a hook, with kcache.prewarm loaded when triton is.
                from ._imports import forget, when_imported

                when_imported("triton", _check_prewarm_build)
                _integrations.append(lambda: forget("triton", _check_prewarm_build))
        return True


def _check_prewarm_build(_mod: Any) -> None:
    from .log import logger
    from .prewarm.meta import check_store_build

    try:
        check_store_build(_store)
    except Exception as e:
        logger.debug("prewarm build check: %s", e)


def _enable_from_env() -> None:
    s = _config.load()
    if s.problems:
        _configure_log(s.log if not any("KCACHE_LOG" in p for p in s.problems) else None)
        _warn_once("settings", "caching is off: " + "; ".join(s.problems))
        return
    if s.enabled:
        enable()


def disable() -> None:
    """Turn kcache off in this process (integrations detach; the store is flushed and closed)."""
    global _store
    with _lock:
        while _integrations:
            detach = _integrations.pop()
            try:
                if callable(detach):
                    detach()
            except Exception:
                pass
        if _store is not None:
            _store.close()
        _store = None


def is_enabled() -> bool:
    return _store is not None


def active_store() -> Store | None:
    """The store this process uses, or None when kcache is off."""
    return _store


def settings() -> _config.Settings:
    """The effective settings (those in use when enabled, else what the environment says)."""
    return _settings if _settings is not None and _store is not None else _config.load()


def _push_integration_counts() -> None:
    """Integrations that count hits without a lock push their counts to kcache.counters now."""
    import sys

    mod = sys.modules.get("kcache.nvfuser.fusion_cache")
    if mod is not None:
        try:
            mod.flush_all()
        except Exception:
            pass


def stats() -> dict[str, Any]:
    """Entries, bytes and counters of the active store, and this process's own counters."""
    from . import counters
    from .report import store_stats

    _push_integration_counts()

    out: dict[str, Any] = {"enabled": _store is not None}
    if _store is not None:
        _store.flush(force=True)
        out.update(store_stats(_store))
    proc: dict[str, dict[str, float]] = {}
    for src in ([_store.counts] if _store is not None else []) + [counters.GLOBAL]:
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
