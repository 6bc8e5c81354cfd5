"""kcache: a persistent on-disk compilation cache for GPU kernels (Triton, autotune, nvFuser).

``KCACHE=1`` turns it on in every Python process (a ``.pth`` hook); in code, :func:`enable`.

Start-up is the hook's whole cost in every Python process of a user who exports ``KCACHE=1``
(every pip, every tool, every compile worker), so it does almost nothing: it registers import
hooks for the libraries the integrations attach to (:mod:`kcache.registry`). The settings are
read and checked when one of those is imported, and the store is opened at the first
integration's first use (:func:`active_store`).
This module imports nothing that a bare interpreter has not loaded already.
"""

from __future__ import annotations

import _thread
import os as _os

from . import _imports

if False:  # annotations only: typing, pathlib and the store are not loaded at start-up
    from pathlib import Path
    from typing import Any

    from . import config as _config
    from .store import Store

__version__ = "0.1.0"
__all__ = ["enable", "disable", "is_enabled", "stats", "active_store", "settings", "prewarm", "__version__"]

# (_thread, not threading, and not forksafe.module_lock: nothing more to import at start-up)
_lock = _thread.RLock()
_wanted = False  # enable() or the hook asked for caching in this process
_overrides: dict[str, Any] = {}
_settings: _config.Settings | None = None
_store: Store | None = None
_failed = False  # the settings or the store are unusable: warned once, caching off
_integrations: list[Any] = []  # functions that undo what was attached
_exit_hook = False


def enable(
    dir: str | Path | None = None,
    *,
    max_size: int | str | None = None,
    readonly: bool | None = None,
    key_tag: str | None = None,
    remote: str | None = None,
    **switches: bool,
) -> bool:
    """Turn kcache on in this process. Arguments override the ``KCACHE_*`` environment.

    ``switches``: an integration's switch set to False leaves it off (each registered integration
    declares its switch, :mod:`kcache.registry`: ``triton=False``, ``torch=False``...); an unknown
    one is a ``TypeError``, as for any unknown argument.

    Checks the settings and opens the store now; returns True when caching is on. Never raises
    for bad settings or an unusable store: it warns once and returns False, and the program
    compiles as if kcache were not there (with ``KCACHE_STRICT=1``, an error that is not a
    refusal kcache knew to make is raised)."""
    global _wanted, _failed
    from .registry import switches as _known

    unknown = sorted(set(switches) - set(_known()))
    if unknown:
        raise TypeError(f"enable() got an unexpected keyword argument {unknown[0]!r}")
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
        try:
            _attach(switches)
        except Exception as e:  # the edge: the program goes on without kcache (raised when strict)
            from .boundary import failed

            _wanted = False
            try:
                failed("enable", "kcache's enable()", e, then="caching is off")
            finally:
                disable()
            return False
        return True


def _enable_from_env() -> None:
    """The ``.pth`` hook (``KCACHE`` set): register the import hooks, nothing more."""
    global _wanted
    with _lock:
        if _wanted:
            return
        _wanted = True
        _attach({})  # every integration's switch on


def _attach(switches: dict[str, bool]) -> None:
    from .integrations import attach

    attach(active_store, _usable, switches, _integrations)


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
            protect = env_number("KCACHE_PREWARM_PROTECT_S")
            if protect:  # a child of `kcache prewarm` (a compile worker): its puts are protected too
                store.protect(protect)
        except StoreError as e:
            warn_once("store", f"caching is off: {e}")
            _failed = True
            return None
        except Exception as e:  # the edge: an error kcache did not foresee is the same fallback
            from .boundary import failed

            _failed = True
            failed("store", "kcache opening the store", e, then="caching is off")
            return None
        if not _exit_hook:
            import atexit

            # atexit runs last-registered first: integrations' counts reach the store before it closes.
            atexit.register(_push_integration_counts)
            _exit_hook = True
        _store = store
        return store


def _on_demand(**switches: bool) -> bool:
    """A library built one of kcache's objects itself (see :func:`kcache._imports.turn_on`): turn kcache on
    with the environment's settings unless it is on."""
    kwargs: dict[str, Any] = dict(switches)  # switches only (enable's other arguments stay unset)
    return is_enabled() or enable(**kwargs)


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
            except Exception as e:  # broad: one integration's undo must not keep the others attached
                from .boundary import failed

                # raised under KCACHE_STRICT=1, else one warning (it was dropped without a word)
                failed(
                    "detach",
                    "kcache's undoing of an integration",
                    e,
                    then="the others are undone all the same",
                )
        store, _store = _store, None
        _settings, _wanted, _failed = None, False, False
        if store is not None:
            from .boundary import guarded

            # Closing flushes to the index: a store that cannot be used any more (its disk
            # full, its index broken) is said once, never raised (unless KCACHE_STRICT=1).
            with guarded("disable", "kcache closing the store", then="what it had not written is lost"):
                store.close()


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
    from .integrations import push_counts

    push_counts()


def stats() -> dict[str, Any]:
    """Entries, bytes and counters of the active store, and this process's own counters.

    Never raises for a store it cannot use (unless ``KCACHE_STRICT=1``): when the store's index
    cannot be opened or read (a full disk, a damaged index), the store's entries and bytes are
    counted from its entry folders instead (its hit and miss counters, kept in the index, are
    then absent) and ``index_error`` says why; when even that fails, ``error`` says why and only
    this process's counters are given. One warning per cause."""
    from . import counters

    _push_integration_counts()
    store = active_store()
    out: dict[str, Any] = {"enabled": store is not None}
    if store is not None:
        out.update(_store_stats(store))
    proc: dict[str, dict[str, float]] = {}
    for src in ([store.counts] if store is not None else []) + [counters.GLOBAL]:
        for kind, vals in src.process_totals().items():
            for k, v in vals.items():
                proc.setdefault(kind, {}).setdefault(k, 0.0)
                proc[kind][k] += v
    out["process"] = proc
    return out


def _store_stats(store: Store) -> dict[str, Any]:
    """:func:`stats`'s part of the store, and its fallbacks (see there)."""
    from .boundary import failed
    from .maintenance.stats import store_stats
    from .store.errors import DISK_FULL, disk_full
    from .store.index import IndexTooNew

    try:
        store.flush(force=True)
        return store_stats(store)
    except Exception as e:  # the edge: raised under KCACHE_STRICT=1, else the entries answer
        # A cause the store says too (a full disk the compiles met first, an index of a newer
        # kcache): the same warning, not another.
        cause = (
            "index-newer"
            if isinstance(e, IndexTooNew)
            else DISK_FULL
            if disk_full(e, str(store.root))
            else None
        )
        failed("stats", "kcache.stats() reading the store's index", e, then="counting its entries instead",
               cause=cause)  # fmt: skip
        why = f"{type(e).__name__}: {e}"
    try:
        from .maintenance.lifecycle import close_store, open_store

        # The same store opened only to read: its index as it is, else its entry folders.
        ro = open_store(_settings if _settings is not None else settings())
        try:
            return {**store_stats(ro), "index_error": why}
        finally:
            close_store(ro)
    # broad: stats() never raises; what the store expects was warned above, a bug is sorted here
    except Exception as e:
        from .store.errors import expected

        expected(e, "stats-fallback", "kcache.stats() reading the store's entries", then="no counts")
        return {"dir": str(store.root), "index_error": why, "error": f"{type(e).__name__}: {e}"}


def __getattr__(name: str) -> Any:
    # ``kcache.prewarm`` is the subpackage (callable: ``kcache.prewarm(spec, ...)``), imported on
    # first use as ``import kcache.prewarm`` would: the facade holds none of prewarm's code.
    if name == "prewarm":
        import importlib

        return importlib.import_module(f"{__name__}.prewarm")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_imports.offer_turn_on(_on_demand)


def _renew_lock_in_child() -> None:
    """A forked child gets a free lock: another thread may have held this one (opening the store)
    at the fork, and the child's next lookup would wait for it for ever."""
    global _lock
    _lock = _thread.RLock()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_renew_lock_in_child)
