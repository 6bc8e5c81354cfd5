"""A kept FX graph handed to torch as a file: torch reads its pickle as it reads its own folder.

torch's remote-cache protocol wraps an FX graph in JSON around base64 (``RemoteFxGraphCache``:
``{"data": <base64 pickle>, "time_taken_ms": N}``), and its remote hit decodes both before it
unpickles. On the H100 machine that was 35 ms of a served BERT-base process (cProfile: four
base64 decodes, 19.7 ms; JSON, 14.9 ms), where Inductor's own folder hands torch the pickle's
file: most of why ``AOTAutogradCache.inductor_load`` took 1.6-1.7x Inductor's own read.

So kcache keeps an FX graph as its pickle (:data:`.entries.GRAPH`, decoded once when it is kept)
and, at torch's FX lookup, lets torch's own reading of a local folder take it: from a private
folder of kcache's (a scratch stage of the store) that holds one file, a hard link of the
member the store has just verified. torch lists the folder, reads the file and unpickles it as
it does in ``TORCHINDUCTOR_CACHE_DIR``; kcache writes no bytes and decodes nothing, and the hit
is reported as the remote hit it is.

The order of torch's lookup is kept: Inductor's own folder first (untouched: read by torch's
code as before), then kcache. Where kcache cannot name such a folder (a store whose scratch
folder is on another filesystem, a closed store) the lookup goes the remote-cache way, through
the envelope (:func:`.entries.fx_envelope`). Only ``FxGraphCache`` is wrapped, and only on a
torch whose ``iterate_over_candidates(local, remote_cache, key)`` and
``_get_tmp_dir_for_key(key)`` kcache knows (read in the sources of torch 2.8 to 2.13, seen at
work in 2.11 on the H100 machine); a redirection is this thread's and this key's, for the length
of the lookup. Its candidates are passed on in the shape torch gave them: ``(graph, content)``
up to torch 2.10, ``(graph, content, found_locally)`` from 2.11 (:func:`as_remote`).
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterator
from typing import Any

from ..boundary import guarded
from . import declare as _kinds
from .attached import cache as active_cache
from .attached import patches

MODULE = "torch._inductor.codecache"
TOPIC, WHAT = "inductor-handover", "kcache's hand-over of a kept FX graph"

#: (thread, torch's FX key) -> the folder torch's local read of that key is sent to
_redirect: dict[tuple[int, str], str] = {}


def on_import(codecache: Any) -> None:
    """``torch._inductor.codecache`` loaded: wrap ``FxGraphCache``'s candidate reading."""
    cls = getattr(codecache, "FxGraphCache", None)
    if not isinstance(cls, type) or patches.holds(cls, "iterate_over_candidates"):
        return
    iterate = inspect.getattr_static(cls, "iterate_over_candidates", None)
    tmp_dir = inspect.getattr_static(cls, "_get_tmp_dir_for_key", None)
    if not (isinstance(iterate, classmethod) and isinstance(tmp_dir, classmethod)):
        return  # a torch whose FX cache kcache does not know: the envelope's way, as before
    try:
        known = list(inspect.signature(iterate.__func__).parameters)[1:4] == ["local", "remote_cache", "key"]
    except (TypeError, ValueError):  # no signature to read: not the function kcache knows
        known = False
    if not known:
        return
    own_iterate, own_tmp_dir = iterate.__func__, tmp_dir.__func__

    def _get_tmp_dir_for_key(klass: Any, key: str) -> str:
        folder = _redirect.get((threading.get_ident(), key)) if _redirect else None
        return folder if folder is not None else own_tmp_dir(klass, key)

    def iterate_over_candidates(klass: Any, local: bool, remote_cache: Any, key: str) -> Iterator[Any]:
        if not _ours(remote_cache):
            yield from own_iterate(klass, local, remote_cache, key)
            return
        if local:  # Inductor's own folder first, read by torch as always
            yield from own_iterate(klass, True, None, key)
        stage: Any = None
        with guarded(TOPIC, WHAT):
            stage = _stage(key)
        if stage is MISS:  # nothing kept (the remote cache is kcache's store: not asked again)
            return
        if stage is None:  # the remote-cache way: torch asks kcache's backend (the envelope)
            yield from own_iterate(klass, False, remote_cache, key)
            return
        folder, _keep = stage  # (_keep: the stage lives while this lookup does)
        me = (threading.get_ident(), key)
        _redirect[me] = folder
        try:
            for found in own_iterate(klass, True, None, key):
                yield as_remote(found)
        finally:
            _redirect.pop(me, None)

    patches.wrap(cls, "_get_tmp_dir_for_key", lambda _: classmethod(_get_tmp_dir_for_key), raw=True)
    patches.wrap(cls, "iterate_over_candidates", lambda _: classmethod(iterate_over_candidates), raw=True)


def as_remote(found: tuple[Any, ...]) -> tuple[Any, ...]:
    """A candidate torch read from kcache's stage, as the remote cache's: torch 2.11 and later
    yield ``(graph, content, found_locally)`` (kcache's hit is counted as the remote hit it is:
    False), torch 2.8-2.10 ``(graph, content)``, passed on as they are."""
    return (*found[:2], False) if isinstance(found, tuple) and len(found) == 3 else found


def _ours(remote_cache: Any) -> bool:
    """``remote_cache`` is torch's FX remote cache on kcache's store."""
    backend = getattr(remote_cache, "backend", None)
    return getattr(backend, "kcache_kind", None) == _kinds.INDUCTOR_FX


#: :func:`_stage`'s answer where kcache keeps no graph for the key (counted as kcache's miss)
MISS = object()


def _stage(key: str) -> tuple[str, Any] | object | None:
    """A private folder holding one file, a hard link of the kept graph's verified pickle, and
    what keeps the folder alive; :data:`MISS` where no graph is kept for ``key`` (the lookup
    counted it, as the remote-cache way would); None where the folder cannot be made (the
    graph is then held for the remote-cache way, which serves it from memory)."""
    from . import graphs
    from .entries import GRAPH, graph_hit

    store = active_cache()
    if store is None:
        return None
    remote_key = graphs.fx_remote_key(key)
    hit = graph_hit(remote_key)
    if hit is None:
        return MISS
    try:
        member = hit.paths[GRAPH]  # the verified member, through a held folder or a private link
        folder, ticket = store.scratch_stage()
        os.link(member, os.path.join(folder, GRAPH))
    except OSError:
        graphs.hold(remote_key, hit)  # the remote-cache way takes it from memory
        return None
    return folder, (ticket, member)


def uninstall() -> None:
    """kcache.disable(): no lookup is redirected (the wrappers go with ``patches.undo()``)."""
    _redirect.clear()
