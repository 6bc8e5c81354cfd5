"""kcache's Triton integration: a cache manager, autotune results, launchers, a triton_key memo.

:data:`INTEGRATION` (named in :mod:`.declare`, which :mod:`kcache.registry` reads) installs it when the program
imports triton (now, if it already has); nothing here imports triton until then.

A program that points Triton at a cache folder while it runs (``triton.knobs.cache.dir = d``,
or ``os.environ["TRITON_CACHE_DIR"] = d`` after Triton is imported; Triton's own tests do it to
get a fresh cache, torch's ``fresh_cache()`` too) asks for that cache: kcache steps aside, and
Triton's own cache manager serves that folder as it would without kcache
(:func:`.attached.serves_folder`).
The folder Triton had when kcache attached (the environment's, or Triton's default) is kcache's,
and so is the one Inductor picks for itself (``<TORCHINDUCTOR_CACHE_DIR>/triton/<device>``, set
when the program left ``TRITON_CACHE_DIR`` unset): a torch.compile warm start stays served.

Autotune caching: with ``TRITON_CACHE_AUTOTUNING`` unset, kcache turns it on, so a process
whose autotune results are in the store does not benchmark. An autotuner built with its own
``pre_hook`` or ``post_hook`` is left uncached (its hooks watch the benchmark: a program that
set them expects them to run), unless the program asked for caching itself
(``cache_results=True`` or ``TRITON_CACHE_AUTOTUNING=1``); ``TRITON_CACHE_AUTOTUNING=0`` turns
it off everywhere.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from types import ModuleType
from typing import Any

from .._imports import when_imported
from ..boundary import guarded
from ..log import logger, warn_once
from ..patch import Hooks, Integration, is_ours
from . import attached, entrycheck
from .attached import patches

_WITHOUT = "Triton and kcache work without it"


def _set_knob(obj: Any, name: str, value: Any) -> None:
    """Set a Triton knob for this process only: knobs export bool/str values to os.environ when
    set normally, and a child Python without kcache must not inherit them."""
    # Look the descriptor up without calling it (Triton's knob descriptors fail when read from
    # the class), so that the value goes into the instance only, and not into os.environ.
    desc = next((c.__dict__[name] for c in type(obj).__mro__ if name in c.__dict__), None)
    dname = getattr(desc, "name", None)
    if desc is not None and hasattr(desc, "__set__") and isinstance(dname, str):
        patches.set(obj, dname, value, in_dict=True)
    else:
        patches.set(obj, name, value)


def _autotuner_init(original: Any) -> Any:
    """Autotune caching, as kcache turns it on, left off for autotuners with hooks of their own."""
    try:
        sig = inspect.signature(original)
    except (TypeError, ValueError):
        return None

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            bound = sig.bind(self, *args, **kwargs).arguments
            hooks = bound.get("pre_hook") is not None or bound.get("post_hook") is not None
            if hooks and not bound.get("cache_results") and getattr(self, "cache_results", False):
                self.cache_results = False
        except TypeError:  # arguments its own signature does not bind: the autotuner is built
            pass

    return __init__


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
            attached.wait_for_manager(install)
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
    elif not patches.holds(knobs.cache, "manager_class"):
        _set_knob(knobs.cache, "manager_class", KcacheCacheManager)
    try:
        attached.set_folder(attached.folder(knobs.cache.dir))
    except AttributeError as e:  # a Triton without this knob (they vary between versions)
        logger.info("Triton's cache folder not known: %s", e)
    if os.environ.get("TRITON_CACHE_AUTOTUNING", "").strip() == "" and hasattr(knobs, "autotuning"):
        if not patches.holds(knobs.autotuning, "cache"):
            _set_knob(knobs.autotuning, "cache", True)
        try:
            from triton.runtime.autotuner import Autotuner

            own = Autotuner.__dict__.get("__init__")
            wrapped = _autotuner_init(own) if own is not None and not is_ours(own) else None
            if wrapped is not None:
                patches.wrap(Autotuner, "__init__", lambda _: wrapped)
        except (ImportError, AttributeError) as e:  # a Triton whose autotuner is elsewhere
            logger.info("autotuners with hooks of their own are cached too: %s", e)
    # Each of these checks the Triton it finds (and does nothing where a part is missing): an
    # exception is kcache's bug, one warning (raised under KCACHE_STRICT=1); caching goes on.
    with guarded("triton-key-memo-install", "installing kcache's triton_key memo", then=_WITHOUT):
        install_key_memo()
    with guarded("triton-components-install", "installing kcache's key component capture", then=_WITHOUT):
        install_component_capture()
    with guarded(
        "triton-compile-guard-install", "installing kcache's guard of triton.compile", then=_WITHOUT
    ):
        from .groupcheck import install_compile_guard

        install_compile_guard()
    with guarded("triton-tool-memo-install", "installing kcache's tool version memo", then=_WITHOUT):
        from .toolmemo import install_tool_memo

        install_tool_memo()
    # Triton's own one-time work, off the first kernel's path (see warmup.py)
    with guarded("triton-warmup-install", "starting kcache's Triton warm-up", then=_WITHOUT):
        from .warmup import arm_gluon_import, install_libcuda_memo

        when_imported("triton.backends.nvidia.driver", install_libcuda_memo)
        if not _inductor_compile_worker():
            arm_gluon_import()  # started at the program's first kernel of its own


def _inductor_compile_worker() -> bool:
    """This process is Inductor's compile-worker sidecar (or a worker it forked). It compiles with
    ``triton.compile`` and never launches, so the gluon pre-import would be of no use there; worse,
    it runs while the sidecar starts, and its workers are forked after it ends: the pool is ready
    later, and Inductor, which hands kernels to the pool early only when it is ready at code
    generation, compiles more of them at module load, some in the parent (seen under
    ``mode="reduce-overhead"`` on the H200: fewer ``async_compile`` calls, slower recompiles)."""
    from ..counters import in_compile_worker

    return in_compile_worker()


def uninstall() -> None:
    """Undo :func:`install`: the manager knob, autotune caching, the triton_key, tool-version and
    key-component hooks (:data:`.attached.patches`). Never imports Triton (a process that never
    used it does not pay 160 ms to turn kcache off)."""
    patches.undo()
    attached.forget_folder()
    if "triton" not in sys.modules:
        attached.drop_pending()
        return
    toolmemo = sys.modules.get("kcache.triton.toolmemo")
    if toolmemo is not None:
        with guarded(
            "triton-uninstall", "undoing kcache's tool version memo", then="kcache is off all the same"
        ):
            toolmemo.uninstall_tool_memo()


# install() when Triton is imported; the detach uninstalls it (late-bound: tests replace them).
_hooks = Hooks(attached.cache, lambda mod: install(mod), lambda: uninstall())


INTEGRATION = Integration(
    "triton",
    attach=_hooks.attach,
    on_import=_hooks.on_import,
    checks=entrycheck.checks,
)
