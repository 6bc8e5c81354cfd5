"""When kcache may serve or keep each of Inductor's caches: torch's own switches and scopes.

kcache stands behind Inductor's remote-cache interface, and it turns those remote caches on
itself. torch then asks it whenever a cache's remote switch is on, whatever the program did to
the cache's local switch, or to the folder it asked Inductor to use. A program that turns a
cache off, or asks for a fresh one, must get from kcache what it gets without kcache: nothing,
and torch must not even notice a remote cache (its counters, its local writes and its Mega-Cache
bags would differ). So torch's own "use the remote cache?" decisions
(``should_use_remote_fx_graph_cache``, ``should_use_remote_autograd_cache``,
``should_use_remote_dynamo_pgo_cache``) are wrapped: where
the remote switch is on only because kcache turned it on (or, for AOTAutograd, is still unset
where kcache answers for it: ``ANSWERED`` in the package), and its backend is still kcache's, the
answer is also what the rules below say. A remote cache the program turned on itself is left to
torch's own answer. The autotune remote cache is decided from each kernel's ``inductor_meta``
(in the compile workers): there the switch is written into the meta as Inductor generates it. The
lookups and puts kcache gets are checked against the same rules.

Off switches (read live at every lookup; torch reads them live too):

- ``torch.compiler.config.force_disable_caches``: nothing is served or kept, of any kind;
- FX graphs: Inductor's ``fx_graph_cache`` (``TORCHINDUCTOR_FX_GRAPH_CACHE=0``);
- AOTAutograd: functorch's ``enable_autograd_cache`` (``TORCHINDUCTOR_AUTOGRAD_CACHE=0``); and
  an AOTAutograd entry is only useful with the FX graphs it names, so it is served and kept only
  while torch will ask kcache for those FX graphs too (:func:`fx_served`);
- autotune results: Inductor's ``autotune_local_cache``;
- Dynamo's profile (PGO): ``automatic_dynamic_local_pgo``.

Scopes. torch's ``fresh_cache()`` (also ``fresh_inductor_cache()``, and Inductor's own under
``force_disable_caches``) points Inductor at a new, empty folder: inside it kcache is off, as if
it were not installed (no remote cache, no C++ kernels from the store). ``FxGraphCache.clear()``
/ ``AOTAutogradCache.clear()`` / ``DynamoCache.clear()`` empty one cache of the folder in use:
from then on kcache serves that kind, in that folder, only what this process put after the
clear, as the emptied cache holds only that. Entries are never removed for it (other processes
use them).

How a fresh folder is told from a folder the program chose for good (vLLM sets
``TORCHINDUCTOR_CACHE_DIR`` itself, and must be served): every one of torch's fresh-cache
helpers calls ``clear_caches()`` (the callbacks of ``clear_on_fresh_cache``) and then sets the
folder. kcache registers such a callback; a folder first seen right after it, other than the one
in use when it ran, is a fresh one. A program that only sets the variable is not a fresh scope.
A process started inside a scope is in it from its start: kcache keeps the scope's folder in
``KCACHE_FRESH_SCOPE`` while the scope is open (:func:`wrap_fresh_cache`; ``kcache/launchenv.py``).

Nothing here imports torch: the config modules are read from ``sys.modules``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

from ..boundary import guarded
from ..forksafe import module_lock
from ..launchenv import FRESH_SCOPE, fresh_scope_folder
from ..patch import is_ours, replacing
from . import declare as _kinds
from .attached import patches
from .torchcall import TorchRaised
from .torchcall import own as torchs

_lock = module_lock(__name__, "_lock")
#: Inductor folder -> kind -> the keys this process put there since that kind was cleared.
_scoped: dict[str, dict[str, set[str]]] = {}
#: Folders that torch's fresh-cache helpers made: kcache is off there.
_fresh: set[str] = set()
#: The folder in use when torch last called ``clear_caches()``, until the next lookup.
_armed: list[str] = []
#: The fail-open boundary's topic (kcache/boundary.py) where torch calls the rules below: torch's
#: own answers, clears and metas stand when kcache's cannot be made.
TOPIC, WHAT = "inductor-policy", "kcache's rules for when torch's caches may be served"


def _cfg(name: str) -> Any:
    return sys.modules.get(name)


def _attr(mod_name: str, attr: str, default: Any) -> Any:
    mod = _cfg(mod_name)
    try:
        return torchs(getattr, mod, attr, default) if mod is not None else default
    except TorchRaised:  # torch's config object computes some values (a justknob): torch's error
        return default


def force_disabled() -> bool:
    """torch's ``force_disable_caches`` (``torch.compiler.config``; Inductor's is an alias)."""
    if _attr("torch.compiler.config", "force_disable_caches", False):
        return True
    return bool(_attr("torch._inductor.config", "force_disable_caches", False))


def _switch_on(kind: str) -> bool:
    """The local switch torch has for this kind of cache is on (and nothing forces caches off)."""
    if force_disabled():
        return False
    if kind == _kinds.INDUCTOR_FX:
        return bool(_attr("torch._inductor.config", "fx_graph_cache", True))
    if kind == _kinds.INDUCTOR_AOT:
        return bool(_attr("torch._functorch.config", "enable_autograd_cache", True)) and fx_served()
    if kind == _kinds.INDUCTOR_AUTOTUNE:
        return bool(_attr("torch._inductor.config", "autotune_local_cache", True))
    if kind == _kinds.INDUCTOR_PGO:
        return bool(_attr("torch._dynamo.config", "automatic_dynamic_local_pgo", True))
    return True


def fx_served() -> bool:
    """torch will ask kcache for FX graphs now: its FX remote switch is on, the FX remote cache's
    backend is still kcache's (a test or a program may have put its own there), and the FX
    cache's own switches are on, outside a fresh scope."""
    from .attached import backend_is_ours

    if not _attr("torch._inductor.config", "fx_graph_remote_cache", None):
        return False
    if not backend_is_ours("RemoteFxGraphCache"):
        return False
    return _switch_on(_kinds.INDUCTOR_FX) and not in_fresh_scope()


def remote_allowed(kind: str) -> bool:
    """What torch's decision to use kcache as its remote cache of ``kind`` should say now (the
    switch being kcache's): the local switch is on, caches are not forced off, and Inductor's
    folder is not a fresh one."""
    return _switch_on(kind) and not in_fresh_scope()


# ------------------------------------------------------------------------------ scopes
def _folder() -> str | None:
    """The Inductor folder in use now, as torch names it (its variable, else its default)."""
    d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if d is None:
        mod = _cfg("torch._inductor.runtime.cache_dir_utils")
        try:
            d = torchs(mod.default_cache_dir) if mod is not None else None
        except TorchRaised:  # torch's own function (user names, folders): no folder to name
            d = None
    return os.path.abspath(d) if d else None


def on_clear_caches() -> None:
    """torch's ``clear_caches()`` ran: the next folder other than this one is a fresh one. The
    folder of the first such call since the last lookup counts (a test may call it again inside
    the scope, before any lookup: ``fresh_cache()``, then ``clear_caches()``)."""
    folder = _folder()
    with _lock:
        if not _armed and folder is not None:
            _armed.append(folder)


def _current() -> str | None:
    folder = _folder()
    if folder is None:
        return None
    started_in = fresh_scope_folder()  # this process was started inside another's scope
    with _lock:
        if _armed:
            before = _armed.pop()
            if folder != before:
                _fresh.add(folder)
        if folder == started_in:
            _fresh.add(folder)
    return folder


def cleared(kind: str) -> None:
    """One of torch's caches was emptied (``FxGraphCache.clear()`` and the like): in the folder
    in use, kcache now serves that kind only what this process puts from here on."""
    folder = _current()
    if folder is None:
        return
    with _lock:
        _scoped.setdefault(folder, {})[kind] = set()


def in_fresh_scope() -> bool:
    folder = _current()
    with _lock:
        return folder in _fresh


def may_serve(kind: str, key: str) -> bool:
    """kcache may hand torch its entry for (kind, Inductor's ``key``) now."""
    if not _switch_on(kind):
        return False
    folder = _current()
    with _lock:
        if folder in _fresh:
            return False
        keys = _scoped.get(folder, {}).get(kind) if folder is not None else None
        return keys is None or key in keys


def may_keep(kind: str) -> bool:
    """kcache may store what torch gives it for this kind now (a cache that is off keeps nothing,
    and nothing is kept from inside a fresh scope)."""
    return _switch_on(kind) and not in_fresh_scope()


def kept(kind: str, key: str) -> None:
    """Note a put: inside a scope it is what kcache may serve there."""
    folder = _current()
    if folder is None:
        return
    with _lock:
        keys = _scoped.get(folder, {}).get(kind)
        if keys is not None:
            keys.add(key)


def reset() -> None:
    """Forget every scope (kcache.disable(), tests)."""
    with _lock:
        _scoped.clear()
        _fresh.clear()
        _armed.clear()


# ------------------------------------------------------------------------------ torch's hooks
class _FreshCacheHook:
    """What kcache registers with ``clear_on_fresh_cache``: torch calls ``cache_clear()`` as a
    fresh-cache scope begins and ends (and from ``clear_caches()``)."""

    def cache_clear(self) -> None:
        # The edge: torch calls this in its own clears, which must not fail for kcache (torch's
        # own folder lookup is guarded in _folder: what is left is a bug).
        with guarded(TOPIC, WHAT):
            on_clear_caches()


_hook = _FreshCacheHook()

#: module -> (class, kind) whose ``clear()`` empties that kind's cache
CLEARS = {
    "torch._inductor.codecache": ("FxGraphCache", _kinds.INDUCTOR_FX),
    "torch._functorch._aot_autograd.autograd_cache": ("AOTAutogradCache", _kinds.INDUCTOR_AOT),
    "torch._dynamo.package": ("DynamoCache", _kinds.INDUCTOR_PRECOMPILE),
}


def on_utils_import(mod: Any) -> None:
    """``torch._inductor.utils`` loaded: register the fresh-scope callback, and mark the scopes
    for the processes started inside them."""
    wrap_fresh_cache(mod)
    register = getattr(mod, "clear_on_fresh_cache", None) or getattr(
        mod, "clear_on_fresh_inductor_cache", None
    )
    registered = getattr(mod, "_registered_caches", None)
    if register is None or (isinstance(registered, list) and _hook in registered):
        return
    try:
        register(_hook)
    except (AttributeError, TypeError):  # torch's registry refused the hook (its check of
        pass  # cache_clear) or takes other arguments: no fresh scopes seen, as before them


def wrap_clear(mod: Any) -> None:
    """Wrap ``clear()`` of the cache that ``mod`` defines (see :data:`CLEARS`): a class with a
    static ``clear`` (FxGraphCache, AOTAutogradCache) or an object (DynamoCache)."""
    cls_name, kind = CLEARS[mod.__name__]
    target = getattr(mod, cls_name, None)
    own = getattr(target, "clear", None)
    if target is None or not callable(own) or is_ours(own):
        return

    def clear(*args: Any, **kwargs: Any) -> Any:
        try:
            return own(*args, **kwargs)
        finally:
            with guarded(TOPIC, WHAT):  # the edge, as cache_clear: torch's clear goes on
                cleared(kind)

    if isinstance(target, type):
        raw = target.__dict__.get("clear")
        if not isinstance(raw, (staticmethod, classmethod)):
            return  # an instance method: torch changed; leave it alone
        # ``own`` is the function, or bound to the class
        patches.wrap(target, "clear", lambda _: staticmethod(clear), raw=True)
    else:  # set on the object: on undo, its class's clear shows through again
        patches.wrap(target, "clear", lambda _: clear, raw=True)


# ------------------------------------------------------------------------------ started inside a scope
# A process started inside a fresh-cache scope inherits TORCHINDUCTOR_CACHE_DIR=<scope> and
# TRITON_CACHE_DIR=<scope>/triton: the shape a launcher gives a process of its own folder, which
# kcache serves (kcache/launchenv.py). torch's scope is told apart by kcache's variable
# FRESH_SCOPE, kept in os.environ while the scope is open; torch's fresh_cache() restores only
# its own two variables, so kcache wraps it to restore this one. (The clear_caches() callback
# cannot: it runs before torch sets the scope's folder, and again after it is restored.)
def _marking(own: Any) -> Any:
    @contextlib.contextmanager
    def fresh_cache(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with own(*args, **kwargs) as got:
            before = _mark_scope()
            try:
                yield got
            finally:
                _unmark_scope(before)

    return functools.wraps(own)(fresh_cache)


_UNMARKED = object()


def _mark_scope() -> Any:
    """The scope torch just opened: its folder into FRESH_SCOPE. Returns what to restore."""
    with guarded(TOPIC, WHAT):  # the edge: torch's scope goes on, unmarked
        utils = sys.modules.get("torch._inductor.utils")
        scope = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        # only while kcache is attached (a module may keep the wrapper it imported by name)
        if scope and any(is_ours(getattr(utils, name, None)) for name in FRESH_HELPERS):
            before = os.environ.get(FRESH_SCOPE)
            os.environ[FRESH_SCOPE] = os.path.abspath(scope)
            return before
    return _UNMARKED


def _unmark_scope(before: Any) -> None:
    if before is _UNMARKED:
        return
    with guarded(TOPIC, WHAT):
        if before is None:
            os.environ.pop(FRESH_SCOPE, None)
        else:
            os.environ[FRESH_SCOPE] = before


#: torch's fresh-cache helper, and the older name it keeps for it
FRESH_HELPERS = ("fresh_cache", "fresh_inductor_cache")


def wrap_fresh_cache(mod: Any) -> None:
    """Wrap ``fresh_cache`` of ``torch._inductor.utils`` (both names), and rebind it where
    modules took it by name (:data:`BINDERS`)."""
    own = mod.__dict__.get("fresh_cache") or mod.__dict__.get("fresh_inductor_cache")
    if not callable(own) or is_ours(own):
        return
    marking = _marking(own)
    for name in FRESH_HELPERS:
        if mod.__dict__.get(name) is own:
            patches.wrap(mod, name, replacing(marking))
            _bound[name] = (own, marking)
    rebind()


#: module -> (torch's decision function, the kind, the remote cache class whose switch it reads)
DECISIONS = {
    "torch._inductor.utils": ("should_use_remote_fx_graph_cache", _kinds.INDUCTOR_FX, "RemoteFxGraphCache"),
    "torch._functorch._aot_autograd.autograd_cache": (
        "should_use_remote_autograd_cache",
        _kinds.INDUCTOR_AOT,
        "RemoteAOTAutogradCache",
    ),
    "torch._dynamo.pgo": ("should_use_remote_dynamo_pgo_cache", _kinds.INDUCTOR_PGO, "RemoteDynamoPGOCache"),
}
#: Modules that bind a decision function or ``fresh_cache`` by name (``from ... import ...``),
#: in any torch kcache supports (2.8's ``jit_compile_runtime_wrappers`` decides there whether to
#: save an AOTAutograd entry; 2.9 moved that to ``graph_compile``). A module listed but absent
#: costs nothing; one missing here keeps torch's own function where kcache is enabled after it
#: was imported. (Scanning every loaded torch module instead: 2.4 ms a scan with torch loaded.)
BINDERS = (
    "torch._inductor.compile_fx",
    "torch._inductor.test_case",
    "torch._functorch._aot_autograd.aot_autograd_result",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._functorch._aot_autograd.graph_compile",
    "torch._functorch._aot_autograd.jit_compile_runtime_wrappers",
    "torch._functorch.aot_autograd",
)
#: function name -> (torch's own, kcache's wrapper): rebound where modules took it by name
_bound: dict[str, tuple[Any, Any]] = {}


def _kcache_switch(cls_name: str) -> bool:
    """The remote cache ``cls_name`` is on because kcache turned it on, with kcache's backend."""
    from .attached import backend_is_ours
    from .attached import switched_on as _ours

    return cls_name in _ours and backend_is_ours(cls_name)


def _unset_and_answered(cls_name: str) -> bool:
    """kcache left this cache's switch unset to answer for it here, and it is still unset (a
    program that sets it False gets torch's answer, False; set True, it is on as any switch
    kcache turned on: kcache's backend, these rules)."""
    from .attached import answered

    where = answered.get(cls_name)
    return where is not None and _attr(where[0], where[1], None) is None


def wrap_decision(mod: Any) -> None:
    """Wrap torch's decision function that ``mod`` defines (see :data:`DECISIONS`), and rebind
    it in the modules already loaded that took it by name."""
    fn_name, kind, cls_name = DECISIONS[mod.__name__]
    own = mod.__dict__.get(fn_name)
    if not callable(own) or is_ours(own):
        return

    def decide(*args: Any, **kwargs: Any) -> Any:
        answer = own(*args, **kwargs)
        # The edge: torch's config is read guarded (_attr, _folder), so what is raised here is a
        # bug, reported (raised when strict); torch's decision stands.
        with guarded(TOPIC, WHAT):
            if (answer or _unset_and_answered(cls_name)) and _kcache_switch(cls_name):
                return remote_allowed(kind)
        return answer

    decide.__wrapped__ = own  # type: ignore[attr-defined]
    decide.__name__ = fn_name
    _bound[fn_name] = (own, decide)
    patches.wrap(mod, fn_name, lambda _: decide)
    rebind()


#: Where Inductor writes ``autotune_remote_cache`` into a kernel's ``inductor_meta`` (which goes
#: with the kernel to the compile workers): module -> (class or None, function)
AUTOTUNE_META = {
    "torch._inductor.runtime.autotune_cache": (None, "inductor_meta_from_config"),
    "torch._inductor.codegen.triton": ("TritonKernel", "inductor_meta_common"),
}


def _autotune_meta(meta: Any) -> Any:
    """A kernel's ``inductor_meta`` with the autotune remote cache kcache turned on switched off
    (torch's default, None) where the local autotune cache is off, caches are forced off, or in a
    fresh scope: the compile workers that read it then do as without kcache."""
    with guarded(TOPIC, WHAT):  # the edge, as in wrap_decision: a bug, reported; torch's meta stands
        if (
            isinstance(meta, dict)
            and meta.get("autotune_remote_cache")
            and _kcache_switch("RemoteAutotuneCache")
            and not (meta.get("autotune_local_cache", True) and remote_allowed(_kinds.INDUCTOR_AUTOTUNE))
        ):
            meta["autotune_remote_cache"] = None
    return meta


def wrap_autotune_meta(mod: Any) -> None:
    cls_name, fn_name = AUTOTUNE_META[mod.__name__]
    owner = getattr(mod, cls_name, None) if cls_name else mod
    raw = (owner.__dict__ if owner is not None else {}).get(fn_name)
    if raw is None or is_ours(raw) or is_ours(getattr(raw, "__func__", None)):
        return
    # A method is a classmethod from torch 2.11 and a staticmethod in 2.8-2.10: the wrapper is
    # put back in the same kind (one that took only the classmethod left 2.8-2.10's kernels
    # unwrapped); a module's function as it is.
    descriptor = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
    if cls_name and descriptor is None:
        return
    own = raw.__func__ if descriptor is not None else raw

    def meta(*args: Any, **kwargs: Any) -> Any:
        return _autotune_meta(own(*args, **kwargs))

    patches.wrap(owner, fn_name, lambda _: descriptor(meta) if descriptor is not None else meta, raw=True)


def rebind(mod: Any = None) -> None:
    """Modules that took a decision function by name before it was wrapped get the wrapper."""
    names = [m for m in BINDERS if m in sys.modules] if mod is None else [mod.__name__]
    for name in names:
        m = sys.modules.get(name)
        if m is None:
            continue
        for fn_name, (own, decide) in list(_bound.items()):
            if m.__dict__.get(fn_name) is own:
                patches.wrap(m, fn_name, replacing(decide))
            elif m.__dict__.get(fn_name) is decide:  # imported by name after the wrap
                patches.adopt(m, fn_name, own)


def uninstall() -> None:
    """kcache.disable(): torch's functions come back with :data:`.attached.patches`; the cache
    registry forgets kcache's hook."""
    _bound.clear()
    mod = sys.modules.get("torch._inductor.utils")
    registered = getattr(mod, "_registered_caches", None) if mod is not None else None
    if isinstance(registered, list):
        while _hook in registered:
            registered.remove(_hook)
    reset()
