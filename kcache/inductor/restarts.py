"""Dynamo's float restarts, remembered: a served process does not trace a graph torch throws away.

With dynamic shapes (``dynamic=True``, or a recompile that marks inputs dynamic) Dynamo turns
float inputs into symbols (``zf0``, ``zf1``...). AOTAutograd's tensorify pass
(``torch.fx.passes._tensorify_python_scalars``) then meets some it cannot keep symbolic: it adds
their names to ``TensorifyState`` and raises ``TensorifyScalarRestartAnalysis``, and Dynamo traces
the frame again with those floats specialised. The attempt thrown away is a whole AOTAutograd
trace of the joint graph (BERT-base with ``dynamic=True`` on an H100: 6.4-7.2 s of a 10 s first
call). torch keeps the names for the rest of the process only, and the thrown-away graph is never
compiled, so no cache holds it: every process pays the attempt again, with Inductor's own warm
folder as with kcache's store.

What kcache keeps is the outcome, under the thrown-away graph's own AOTAutograd key (torch's key:
the graph, its inputs' metadata, the configs and torch's sources), kind ``inductor-restart``:

- **kept**: AOTAutograd asked kcache for key K and missed; the tensorify pass of that compile
  then raised the restart. The names the pass added are kept under K (a JSON list).
- **served**: AOTAutograd misses K again (torch counts that miss itself, as without kcache) and
  kcache holds names for K: kcache specialises them and raises the same restart, right after the
  lookup, before the joint graph is traced. Dynamo's own restart loop does the rest: the next
  attempt is the graph torch would trace after its own restart, served from the store as usual.

Why the AOTAutograd key and not the frame: the names are positional (the N-th symbol of a trace),
so only the same graph gives the same names. A key of the code would hand one model's names to
another model with the same ``forward`` (BERT-base and BERT-large), and specialise the wrong
floats. Under K, the pass would find the same names again: the record saves the trace, it
decides nothing torch would not.

What torch's switches say wins, as for AOTAutograd entries (:mod:`.policy`): served and kept only
where kcache answers AOTAutograd's lookups (its remote switch kcache's, its backend kcache's), the
cache is on, outside a fresh scope, and not since ``AOTAutogradCache.clear()``. A record that is
not a short list of float symbol names is a miss. Each key raises at most once until torch forgets
its names (``TensorifyState.clear()``: ``torch._dynamo.reset()``), so a wrong record costs one
attempt, never a loop. A record has nothing to be checked against (a wrong one specialises a
float torch would have kept symbolic: still right, Dynamo guards the value), so it crosses
machines only signed (trait ``signed_only``, :mod:`kcache.kinds`), as torch's entries do.

Called from import hooks with ``torch._functorch._aot_autograd.autograd_cache`` and
``graph_compile``; imports nothing of torch's.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import time
from typing import Any

from ..boundary import guarded
from ..forksafe import module_lock
from ..log import logger
from . import declare as _kinds
from .attached import patches

TOPIC, WHAT = "inductor-restart", "kcache's record of Dynamo's float restarts"
KIND = _kinds.INDUCTOR_RESTART
MEMBER = "names"
#: torch names float symbols ``zf<N>`` (``SymT.FLOAT``); anything else in a record is not torch's.
_NAME = re.compile(r"zf[0-9]{1,9}")
#: Bounds on a record (a hostile one is never parsed past them). BERT-base's restart specialises
#: 65 floats (counted in ``TensorifyState``, torch 2.11): a bound of 64 kept nothing for it (found
#: on the H100, session 20). 4,096 names of ``zf`` and up to 9 digits fit in 64 KiB.
_MAX_NAMES, _MAX_BYTES = 4096, 65536
READING = 1  # the record's format; another is a miss
#: the modules whose import wraps what this module needs (both among the integration's triggers)
MODULES = ("torch._functorch._aot_autograd.autograd_cache", "torch._functorch._aot_autograd.graph_compile")


class _Pending(threading.local):
    """The AOTAutograd lookup of this thread's compile in progress: its key, when kcache missed
    it, and when (the attempt's cost, recorded as the entry's compile time)."""

    missed: str | None = None
    since: float = 0.0
    #: torch's key of the AOTAutograd lookup in progress (inside ``_lookup``)
    looking: str | None = None
    #: (key, the names kcache holds for it) read at the miss by :func:`answers`, for the
    #: ``try_load`` that follows (one read of the record per miss); reset at each lookup, so
    #: that it never outlives the lookup that read it
    looked: tuple[str, list[str] | None] | None = None


_pending = _Pending()
#: keys whose restart kcache raised since torch last forgot its names (``TensorifyState.clear()``:
#: ``torch._dynamo.reset()``, another kind of restart): never twice, so a record that does not
#: end the restarts it promises costs one attempt, not Dynamo's 100
_raised: set[str] = set()
_lock = module_lock(__name__, "_lock")


# ------------------------------------------------------------------------------ records
def encode(names: set[str]) -> bytes:
    return json.dumps({"reading": READING, "names": sorted(names)}, separators=(",", ":")).encode()


def decode(data: bytes | None) -> list[str] | None:
    """The names of a record, or None where it is not one this kcache wrote."""
    if not data or len(data) > _MAX_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("reading") != READING:
        return None
    names = doc.get("names")
    if not isinstance(names, list) or not 0 < len(names) <= _MAX_NAMES:
        return None
    if not all(isinstance(n, str) and _NAME.fullmatch(n) for n in names):
        return None
    return names


def check(hit: Any) -> str | None:
    """``kcache verify``: a record that is not a list of float symbol names."""
    return None if decode(hit.read(MEMBER)) is not None else "not a list of Dynamo's float symbol names"


def _ours() -> bool:
    """kcache answers AOTAutograd's lookups now, and may serve and keep them."""
    from .attached import backend_is_ours

    return backend_is_ours("RemoteAOTAutogradCache")


def _served(key: str) -> list[str] | None:
    from . import policy
    from .entries import _store, store_key

    if not _ours() or not policy.may_serve(_kinds.INDUCTOR_AOT, key):
        return None
    store = _store()
    if store is None:
        return None
    skey, comps = store_key(KIND, key)
    hit = store.get(KIND, skey, comps)
    return decode(hit.read(MEMBER)) if hit is not None else None


def _keep(key: str, names: set[str], took_s: float) -> None:
    from . import policy
    from .entries import _store, store_key

    if not names or not _ours() or not policy.may_keep(_kinds.INDUCTOR_AOT):
        return
    data = encode(names)
    if decode(data) is None:  # not what this module can serve back: the one check, as at a lookup
        logger.debug(
            "torch.compile: Dynamo's restart for AOTAutograd key %s not kept: %d names", key, len(names)
        )
        return
    store = _store()
    if store is None or store.readonly:
        return
    skey, comps = store_key(KIND, key)
    summary = {k: v for k, v in comps.items() if k in ("cache", "torch_version")}
    store.replace(KIND, skey, {MEMBER: data}, components=comps, summary=summary, compile_s=took_s)
    logger.debug("torch.compile: kept Dynamo's restart for AOTAutograd key %s: %s", key, sorted(names))


# ------------------------------------------------------------------------------ hooks
def on_import(mod: Any) -> None:
    """``autograd_cache``: the lookup (the key missed) and ``try_load`` (where a kept restart is
    raised); ``graph_compile``: the tensorify pass (where torch's restart is seen and kept)."""
    name = getattr(mod, "__name__", "")
    if name == MODULES[0]:
        _wrap_cache(getattr(mod, "AOTAutogradCache", None))
        from . import workers

        workers.nothing_compiled_when(answers)
    elif name == MODULES[1]:
        _wrap_pass(mod)


def _tensorify() -> tuple[Any, Any] | None:
    """torch's ``TensorifyState`` and ``TensorifyScalarRestartAnalysis`` (loaded by now: Dynamo
    is compiling), or None for a torch without them."""
    sc, exc = sys.modules.get("torch._dynamo.symbolic_convert"), sys.modules.get("torch._dynamo.exc")
    state = getattr(sc, "TensorifyState", None)
    restart = getattr(exc, "TensorifyScalarRestartAnalysis", None)
    if state is None or restart is None or not isinstance(getattr(state, "force_specializations", None), set):
        return None
    _wrap_clear(state)
    return state, restart


def _wrap_clear(state: Any) -> None:
    """torch forgetting its names lets kcache raise each key's restart again (torch would)."""
    raw = state.__dict__.get("clear")
    if not isinstance(raw, classmethod) or patches.holds(state, "clear"):
        return
    own = raw.__func__

    @functools.wraps(own)
    def clear(cls: Any) -> Any:
        try:
            return own(cls)
        finally:
            with _lock:
                _raised.clear()

    patches.wrap(state, "clear", lambda _: classmethod(clear), raw=True)


def _wrap_cache(cls: Any) -> None:
    if not isinstance(cls, type):
        return
    lookup, load = cls.__dict__.get("_lookup"), cls.__dict__.get("try_load")
    if not isinstance(lookup, staticmethod) or not isinstance(load, staticmethod):
        return  # a torch whose AOTAutograd cache kcache does not know: torch restarts as always
    own_lookup, own_load = lookup.__func__, load.__func__

    @functools.wraps(own_lookup)
    def _lookup(key: Any, local: Any, remote: Any, *args: Any, **kwargs: Any) -> Any:
        _pending.looking = key if isinstance(key, str) else None
        _pending.looked = None
        try:
            found = own_lookup(key, local, remote, *args, **kwargs)
        finally:
            _pending.looking = None
        if found is None and remote and isinstance(key, str):
            _pending.missed, _pending.since = key, time.perf_counter()
        return found

    @functools.wraps(own_load)
    def try_load(*args: Any, **kwargs: Any) -> Any:
        _pending.missed = None  # a bypass (no key) must not inherit an earlier compile's miss
        got = own_load(*args, **kwargs)
        fn = got[0] if isinstance(got, tuple) else got  # (fn, config) from torch 2.13; fn before
        key = _pending.missed
        if fn is None and key is not None:
            restart = _restart_for(key)
            if restart is not None:
                raise restart
        return got

    patches.wrap(cls, "_lookup", lambda _: staticmethod(_lookup), raw=True)
    patches.wrap(cls, "try_load", lambda _: staticmethod(try_load), raw=True)


def answers() -> bool:
    """Whether the AOTAutograd lookup in progress in this thread, which has just missed kcache's
    store, will be answered with a kept restart: then nothing is traced or compiled for it, and
    Inductor's compile workers are not wanted for it (:func:`.workers.nothing_compiled_when`). Asked
    from inside torch's lookup, where only the remote cache's form of the key is known (a
    prefix and a suffix around torch's key, which may vary): torch's own key is the one
    ``_lookup`` was given. The record read here is the one :func:`_restart_for` raises from,
    right after (read once)."""
    key = _pending.looking
    if key is None:
        return False
    with guarded(TOPIC, WHAT):
        return _planned(key) is not None
    return False


def _planned(key: str) -> tuple[Any, Any, list[str]] | None:
    """(``TensorifyState``, the restart's class, the names to specialise) for a missed key whose
    outcome kcache holds and would raise now; None: go on as torch does. Changes nothing."""
    tensorify = _tensorify()
    if tensorify is None:
        return None
    state, restart = tensorify
    with _lock:
        if key in _raised:
            return None
    looked = _pending.looked
    if looked is not None and looked[0] == key:
        names = looked[1]
    else:
        names = _served(key)
        _pending.looked = (key, names)
    if not names:
        return None
    new = [n for n in names if n not in state.force_specializations]
    if not new:
        return None  # torch would not restart for names it specialises already
    return state, restart, new


def _restart_for(key: str) -> BaseException | None:
    """The restart to raise for a missed key whose outcome kcache holds: its names specialised
    in ``TensorifyState``, as torch's pass would have left them. None: go on as torch does."""
    with guarded(TOPIC, WHAT):
        planned = _planned(key)
        _pending.looked = None  # read once per miss: the next lookup of the key reads the store
        if planned is None:
            return None
        state, restart, new = planned
        with _lock:
            _raised.add(key)
        for n in new:
            state.specialize(n)
        _pending.missed = None  # nothing will be traced for this key: nothing to keep
        logger.debug("torch.compile: Dynamo's restart for AOTAutograd key %s served: %s", key, new)
        return restart()
    return None


class _Never(Exception):
    """Caught where there is no restart of torch's to watch for: never raised."""


def _wrap_pass(mod: Any) -> None:
    own = getattr(mod, "_apply_tensorify_python_scalars", None)
    if not callable(own):
        return  # a torch without the pass's helper: nothing is kept, torch restarts as always

    @functools.wraps(own)
    def _apply_tensorify_python_scalars(module: Any, *args: Any, **kwargs: Any) -> Any:
        key, since = _pending.missed, _pending.since
        _pending.missed = None  # one pass per compile: a later pass belongs to another lookup
        tensorify = _tensorify() if key is not None else None
        state, restart = tensorify if tensorify is not None else (None, _Never)
        before = set(state.force_specializations) if state is not None else set()
        try:
            return own(module, *args, **kwargs)
        except restart:  # torch's restart, watched only when kcache missed this compile's key
            if key is not None and state is not None:
                with guarded(TOPIC, WHAT):  # torch's restart goes on whatever kcache does here
                    _keep(key, set(state.force_specializations) - before, time.perf_counter() - since)
            raise

    patches.wrap(mod, "_apply_tensorify_python_scalars", lambda _: _apply_tensorify_python_scalars)


def uninstall() -> None:
    """kcache.disable(): forget what was raised (the wrappers go with ``patches.undo()``)."""
    with _lock:
        _raised.clear()
    _pending.missed = _pending.looking = _pending.looked = None
