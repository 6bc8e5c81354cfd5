"""Run a callback right after a module is imported, without importing it ourselves; and turn
kcache on for a library that names one of kcache's classes itself (:func:`turn_on`).

kcache attaches to Triton, nvFuser and torch when the program imports them: importing them at
start-up would cost seconds in every process, most of which never compile a kernel. The ``.pth``
hook loads this module in every Python process with ``KCACHE=1``, so it imports nothing that a
bare interpreter has not loaded already (no threading, no logging, no typing).
"""

from __future__ import annotations

import _thread
import sys

if False:  # annotations only (typing and collections.abc are not loaded at start-up)
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = _thread.allocate_lock()
_finder: _Finder | None = None


def _run(name: str, module: ModuleType) -> None:
    # By index over the live list: a hook may register more hooks for this module (an
    # integration that attaches its parts), and those run now too, not never.
    hooks = _hooks.get(name, [])
    i = 0
    while i < len(hooks):
        fn = hooks[i]
        i += 1
        try:
            fn(module)
        except Exception as e:  # the edge: never break the user's import (unless KCACHE_STRICT=1)
            from .boundary import failed

            failed(f"import:{name}", f"kcache's attaching to {name}", e)


class _Loader:  # a loader by protocol (importlib.abc costs ~8 ms to import at start-up)
    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _run(self._name, module)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


class _Finder:  # a meta path finder by protocol
    def __init__(self) -> None:
        self._busy = _thread._local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _hooks or getattr(self._busy, fullname, False):
            return None
        setattr(self._busy, fullname, True)
        try:
            spec = self._others(fullname, path, target)
        except Exception:  # broad: finders run any code; the import itself then reports it
            return None
        finally:
            setattr(self._busy, fullname, False)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        # a loader by protocol, not an importlib.abc.Loader (that costs ~8 ms at start-up)
        spec.loader = _Loader(spec.loader, fullname)
        return spec

    def _others(self, fullname: str, path: Any, target: Any) -> Any:
        """The spec the other finders on ``sys.meta_path`` give, asked in order as the import
        system asks them (what ``importlib.util.find_spec`` does for a module not imported yet,
        whose parent the import system has imported: importing importlib.util costs a process
        5-6 ms at start-up, for contextlib and warnings)."""
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None) if finder is not self else None
            if find is not None:
                spec = find(fullname, path, target)
                if spec is not None:
                    return spec
        return None


def when_imported(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call ``fn(module)`` once ``name`` is imported (now, if it already is)."""
    global _finder
    with _lock:
        _hooks.setdefault(name, []).append(fn)
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
    mod = sys.modules.get(name)
    if mod is not None and getattr(getattr(mod, "__spec__", None), "_initializing", False) is False:
        fn(mod)


def forget(name: str, fn: Callable[[ModuleType], None]) -> None:
    with _lock:
        if fn in _hooks.get(name, []):
            _hooks[name].remove(fn)


# ``TRITON_CACHE_MANAGER=kcache.triton.manager:KcacheCacheManager`` without ``KCACHE=1``: Triton
# imports kcache's manager and builds it, and nothing called kcache.enable(). The manager is below
# the facade and does not import it; the facade, which Python imports before any of its
# subpackages, leaves here the function that turns kcache on, and the integration asks for it.
_turn_on: Callable[..., bool] | None = None


def offer_turn_on(fn: Callable[..., bool]) -> None:
    """The facade: ``fn(**switches)`` turns kcache on (as :func:`kcache.enable` with those
    switches) unless it is on already, and returns whether it is on."""
    global _turn_on
    _turn_on = fn


def turn_on(**switches: bool) -> bool:
    """Turn kcache on with the environment's settings, unless it is on already (a store that
    cannot be used warns once). Returns whether kcache is on."""
    fn = _turn_on
    return bool(fn(**switches)) if fn is not None else False
