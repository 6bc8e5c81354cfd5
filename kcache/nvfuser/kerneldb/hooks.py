"""Integration: the import hooks and the wrapped ``FusionDefinition.execute``.

At ``import nvfuser_direct`` kcache only wraps ``FusionDefinition.execute``; the session starts at
the first call (see :func:`_start`). The option itself is turned on per call: the wrapped
``execute`` adds ``kernel_db`` to its ``_enable_options`` (nvFuser's per-call equivalent of
``NVFUSER_ENABLE``), so no environment variable leaks into child processes.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ...boundary import guarded
from ...forksafe import module_lock
from ...log import logger, warn_once

if TYPE_CHECKING:
    from ...store.api import Cache
from .fingerprint import current_fingerprint
from .session import Session

#: "direct" or "tmpdir": how to point nvFuser at the folder ("direct" falls back to "tmpdir").
#: Read when a session starts (:func:`_start`), so setting it here takes effect (tests do).
PREFER = "direct"

_lock = module_lock(__name__, "_lock", reentrant=True)
_sessions: dict[str, Session] = {}
_states: dict[str, _ModuleState] = {}
_fork_registered = False
_KERNEL_DB = ("kernel_db",)


class _ModuleState:
    """kcache's hold on one nvFuser module: its store and, once started, its session."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.name = module.__name__
        self.store: Cache | None = None
        self.session: Session | None = None
        self.failed = False


def _start(st: _ModuleState) -> Session | None:
    """Create the module's session (fingerprint, private folder, seeding, pointing nvFuser at it).

    For ``nvfuser_direct`` this runs at the first ``execute``, not at import: the fingerprint's
    ``arch`` initialises the CUDA driver, which an import must not do (a process that forks
    before using CUDA keeps CUDA usable in its children); at the first execute the inputs are
    already CUDA tensors."""
    with _lock:
        if st.session is not None or st.failed:
            return st.session
        if st.store is None:
            return None
        s = None  # stays None when the session cannot be made: nvFuser runs without kcache
        # The edge (nvFuser's execute): a bug, reported (raised when strict).
        with guarded("nvfuser-attach", "kcache's nvFuser session"):
            try:
                t0 = time.perf_counter()
                fp = current_fingerprint(st.module)
                made = Session.create(st.store, fp, st.name)
                made.point(st.module, prefer=PREFER)
                made.start_s = time.perf_counter() - t0
                if st.name == "nvfuser":
                    from ..legacy import LegacyFusionCache

                    made.legacy = LegacyFusionCache.install(st.module, made)
                s = made
            except OSError as e:  # its private folder could not be made, seeded or pointed at
                warn_once("nvfuser-attach", f"nvfuser: kernels are not kept by kcache in this process: {e}")
        if s is None:
            st.failed = True
            return None
        st.session = s
        _sessions[st.name] = s
    logger.info("nvfuser: kernels kept by kcache (%s mode, %s)", s.mode, s.db_dir)
    return s


def _make_execute(orig: Callable[..., Any], st: _ModuleState) -> Callable[..., Any]:
    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        session = st.session
        if session is None:
            session = _start(st)
            if session is None:
                return orig(self, *args, **kwargs)
        if session.disabled:
            return orig(self, *args, **kwargs)
        opts = kwargs.get("_enable_options")
        if not opts:
            kwargs["_enable_options"] = list(_KERNEL_DB)
        elif "kernel_db" not in opts:
            kwargs["_enable_options"] = [*opts, "kernel_db"]
        if not session.slow:
            return orig(self, *args, **kwargs)
        scoped = False
        with guarded("nvfuser-call", "kcache's set-up of an nvFuser call"):
            scoped = session.before_call()
        try:
            return orig(self, *args, **kwargs)
        finally:
            if scoped:
                with guarded("nvfuser-call", "kcache's set-up of an nvFuser call"):
                    session.after_call()

    execute.__wrapped__ = orig  # type: ignore[attr-defined]
    execute.__doc__ = getattr(orig, "__doc__", None)
    execute.__name__ = "execute"
    return execute


def _wrap(st: _ModuleState) -> bool:
    """Wrap ``FusionDefinition.execute`` (once: the wrapper reads the module's state, which
    outlives a detach, so an enable after another finds it in place)."""
    from ..attached import patches

    cls = getattr(st.module, "FusionDefinition", None)
    if getattr(cls, "execute", None) is None:
        return False
    patches.wrap(cls, "execute", lambda orig: _make_execute(orig, st))
    return True


def _active_store() -> Any:
    from ..attached import cache

    return cache()


def _install(module: ModuleType) -> None:
    name = module.__name__
    store = _active_store()
    if store is None:
        return
    with _lock:
        st = _states.get(name)
        if st is None:
            st = _states[name] = _ModuleState(module)
        st.store = store
        if st.session is not None:  # kcache enabled again: keep nvFuser's folder, use the new store
            st.session.store = store
        if not _wrap(st):
            warn_once(
                f"nvfuser-wrap:{name}",
                f"nvfuser: {name}.FusionDefinition.execute not found; kernels not kept",
            )
            return
        if name == "nvfuser":
            import warnings

            # The legacy frontend warns on every per-call option; kernel_db changes no result.
            warnings.filterwarnings("ignore", message="Reset the FusionCache manually", category=UserWarning)
        # Our harvest must run before the store closes at exit (atexit runs last-registered first).
        atexit.unregister(_at_exit)
        atexit.register(_at_exit)
        global _fork_registered
        if not _fork_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork)
            _fork_registered = True
    if name == "nvfuser":
        # The legacy FusionCache must be loaded before the first definition fills it (and
        # FusionCache.get initialises CUDA itself): start now.
        _start(st)


def on_import(module: ModuleType) -> None:
    with guarded("nvfuser-attach", "kcache's attaching to nvFuser"):
        _install(module)


def _after_fork() -> None:
    for s in list(_sessions.values()):
        s.after_fork_in_child()


def _at_exit() -> None:
    for s in list(_sessions.values()):
        # A session's flush never raises for a bad folder or store (harvest counts those): what
        # it raises is a bug, reported (raised when strict); the other sessions are stored.
        with guarded("nvfuser-exit", "storing nvFuser's new kernels at exit", then="they are not kept"):
            s.close()


def flush() -> int:
    """Store the nvFuser kernels compiled since the last flush (also done at exit). Returns the
    number of kernels that were new to the store."""
    n = 0
    for s in list(_sessions.values()):
        with guarded(
            "nvfuser-flush", "storing nvFuser's new kernels", then="they are not kept"
        ):  # as at exit
            n += s.flush()
    return n


def status() -> dict[str, Any]:
    """Per nvFuser module: mode, folder, fingerprint, kernels seeded, compiled here, stored."""
    return {name: s.status() for name, s in list(_sessions.items())}


def detach_all() -> None:
    """Store what is new, then unwrap nvFuser and forget the store (kcache.disable())."""
    with _lock:
        for s in list(_sessions.values()):
            # As at exit; detaching goes on (unwrap nvFuser) whatever the flush met.
            with guarded("nvfuser-detach", "storing nvFuser's new kernels", then="they are not kept"):
                s.flush()
            s.store = None
        from ..attached import patches

        patches.undo()
        for st in _states.values():
            st.store = None
