"""kcache's Triton integration: a cache manager, autotune results, launchers, a triton_key memo.

:func:`attach` arranges for it to be installed when the program imports triton (now, if it
already has); nothing here imports triton until then.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._imports import forget, when_imported
from ..log import logger, warn_once

_installed: dict[str, Any] = {}


def _set_knob(obj: Any, name: str, value: Any) -> None:
    """Set a Triton knob for this process only: knobs export bool/str values to os.environ when
    set normally, and a child Python without kcache must not inherit them."""
    # Look the descriptor up without calling it (Triton's knob descriptors fail when read from
    # the class), so that the value goes into the instance only, and not into os.environ.
    desc = next((c.__dict__[name] for c in type(obj).__mro__ if name in c.__dict__), None)
    dname = getattr(desc, "name", None)
    if desc is not None and hasattr(desc, "__set__") and isinstance(dname, str):
        obj.__dict__[dname] = value
    else:
        setattr(obj, name, value)


def install(triton: ModuleType | None = None) -> None:
    """Install kcache's manager, autotune caching and the triton_key memo into Triton now."""
    import triton as _triton  # noqa: F401  (already imported when called from the hook)
    from triton import knobs

    from .components import install_component_capture
    from .keymemo import install_key_memo

    try:
        from .manager import KcacheCacheManager
    except ImportError:
        half = sys.modules.get(f"{__name__}.manager")
        if half is not None and not hasattr(half, "KcacheCacheManager"):
            # kcache.triton.manager was imported before triton: its own `import triton` ran this
            # hook while it was half-built. It finishes the installation at its end.
            _installed["pending"] = True
            return
        raise

    user_manager = os.environ.get("TRITON_CACHE_MANAGER", "").strip()
    if user_manager and user_manager.split(":")[0].startswith("kcache."):
        pass  # kcache's own manager, named explicitly: it is what Triton builds already
    elif user_manager:
        warn_once(
            "user-manager",
            f"TRITON_CACHE_MANAGER={os.environ['TRITON_CACHE_MANAGER']} is set: it wins, kcache does not "
            "cache Triton kernels in this process",
        )
    else:
        _installed["previous_manager"] = knobs.cache.__dict__.get("manager_class")
        _set_knob(knobs.cache, "manager_class", KcacheCacheManager)
        _installed["manager"] = True
    if os.environ.get("TRITON_CACHE_AUTOTUNING", "").strip() == "" and hasattr(knobs, "autotuning"):
        _set_knob(knobs.autotuning, "cache", True)
        _installed["autotune"] = True
    try:
        install_key_memo()
    except Exception as e:  # the memo is an optimisation: Triton's own key still works
        logger.info("triton_key memo not installed: %s", e)
    try:
        install_component_capture()
    except Exception as e:
        logger.info("key component capture not installed: %s", e)
    try:
        from .groupcheck import install_compile_guard

        install_compile_guard()
    except Exception as e:
        logger.info("compile guard not installed: %s", e)
    try:
        from .toolmemo import install_tool_memo

        install_tool_memo()
    except Exception as e:
        logger.info("tool version memo not installed: %s", e)
    try:  # Triton's own one-time work, off the first kernel's path (see warmup.py)
        from .warmup import install_libcuda_memo, start_gluon_import

        when_imported("triton.backends.nvidia.driver", install_libcuda_memo)
        start_gluon_import()
    except Exception as e:
        logger.info("Triton warm-up not started: %s", e)


def install_if_pending() -> None:
    """Finish an installation that had to wait for kcache.triton.manager (see :func:`install`)."""
    if _installed.pop("pending", False):
        install()


def uninstall() -> None:
    """Undo :func:`install`: the manager knob, autotune caching, the triton_key, tool-version and
    key-component hooks. Never imports Triton (a process that never used it does not pay 160 ms
    to turn kcache off)."""
    if "triton" not in sys.modules:
        _installed.clear()
        return
    try:
        from triton import knobs
    except Exception:
        return
    if _installed.pop("manager", False):
        knobs.cache.__dict__.pop("manager_class", None)
        prev = _installed.pop("previous_manager", None)
        if prev is not None:
            knobs.cache.__dict__["manager_class"] = prev
    if _installed.pop("autotune", False):
        knobs.autotuning.__dict__.pop("cache", None)
    for modname, fn in (
        ("kcache.triton.keymemo", "uninstall_key_memo"),
        ("kcache.triton.toolmemo", "uninstall_tool_memo"),
        ("kcache.triton.components", "uninstall_component_capture"),
        ("kcache.triton.groupcheck", "uninstall_compile_guard"),
        ("kcache.triton.warmup", "uninstall_libcuda_memo"),
    ):
        mod = sys.modules.get(modname)
        undo = getattr(mod, fn, None) if mod is not None else None
        if undo is not None:
            try:
                undo()
            except Exception as e:
                logger.debug("%s: %s", fn, e)


def _on_import(mod: ModuleType) -> None:
    install(mod)


def attach() -> Callable[[], None]:
    """Install when triton is imported; returns a function that undoes it."""
    when_imported("triton", _on_import)

    def detach() -> None:
        forget("triton", _on_import)
        uninstall()

    return detach
