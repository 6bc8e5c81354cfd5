"""Inductor's bytes as kcache entries: the store side of kcache's remote-cache backend (see
:mod:`kcache.inductor`): keys, :func:`get`, :func:`put` and :func:`forget`, on the cache the
integration was given (:mod:`.attached`).
"""

from __future__ import annotations

import base64
import functools
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from ..boundary import fail_open
from ..kinds import get as _kind
from ..log import logger, warn_once
from . import declare as _kinds
from .attached import cache as active_cache
from .torchcall import TorchRaised
from .torchcall import own as torchs

if TYPE_CHECKING:
    from ..store.api import Cache
    from ..store.hit import Hit

MEMBER = "value"  # the file of an inductor entry: the bytes Inductor gave
#: The file of an FX graph entry: the graph's pickle, out of torch's remote-cache envelope (JSON
#: around base64), so that torch can read it as it reads its own folder (:mod:`.handover`).
GRAPH = "graph"
#: What an FX graph's key says of the form it is kept in (an entry holding the envelope, kept
#: by an earlier kcache, is another key: neither reads the other's).
FX_FORM = "|form=pickle"
#: An AOTAutograd entry's second file: the FX graph keys its pickle names, read once when it is
#: kept (see :mod:`.graphs`), so that no lookup decodes and walks the entry for them again.
KEYS = "fx_keys"


# ------------------------------------------------------------------------------------ keys
@functools.lru_cache(maxsize=1)
def _torch_version() -> str:
    torch = sys.modules.get("torch")
    v = str(getattr(torch, "__version__", "?"))
    git = getattr(getattr(torch, "version", None), "git_version", None)
    return f"{v}+{git[:12]}" if isinstance(git, str) and git else v


_gpu: list[str | None] = []


class NoGpuModel(Exception):
    """The GPU model cannot be read here: autotune results are then neither served nor kept."""


def _gpu_model() -> str | None:
    """The GPU model autotune results were (or will be) measured on; "cpu" without CUDA; None
    when it cannot be told (results are then not cached: an "unknown" key would mix GPUs).

    Read through Inductor's device interface ``Worker`` API where torch has it: it answers in
    compile workers (forked, no CUDA of their own) from what the parent recorded, where
    ``torch.cuda.get_device_name`` would try to initialise CUDA and fail."""
    if _gpu:
        return _gpu[0]
    name: str | None = "cpu"
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torchs(torch.cuda.is_available):
            name = None
            try:
                name = str(torchs(_worker_device_name))
            except TorchRaised:  # torch's device interface varies between versions: asked directly
                name = str(torchs(lambda: torch.cuda.get_device_name(torch.cuda.current_device())))
    except TorchRaised as e:  # CUDA's initialisation (torch's) raises what the driver meets
        logger.debug("torch.compile: no GPU model (%s)", e)
        name = None
    _gpu.append(name)
    return name


def _worker_device_name() -> Any:
    """The GPU's name through Inductor's device interface (torch's code, all of it)."""
    from torch._dynamo.device_interface import get_interface_for_device

    worker = get_interface_for_device("cuda").Worker
    return worker.get_device_properties(worker.current_device()).name


def store_key(kind: str, key: str) -> tuple[str, dict[str, Any]]:
    """kcache's key for Inductor's ``key`` and its named components (for ``explain``)."""
    comps: dict[str, Any] = {"torch_version": _torch_version()}
    if key.startswith("pt2:") and "::" in key:
        comps["cache"] = key[4 : key.index("::")]
    if kind in (_kinds.INDUCTOR_PGO, _kinds.INDUCTOR_PRECOMPILE):  # keys without torch's version
        key = f"{key}|torch={comps['torch_version']}"
    elif kind == _kinds.INDUCTOR_FX:
        key += FX_FORM
    elif kind == _kinds.INDUCTOR_AUTOTUNE:
        gpu = _gpu_model()
        if gpu is None:
            raise NoGpuModel("the GPU model is unknown here")
        comps["gpu_name"] = gpu
        key = f"{key}|gpu={gpu}"
    return key, comps


def _compile_s(data: bytes) -> float:
    """The compile time Inductor recorded in its envelope (``"time_taken_ms": N``, at the end)."""
    i = data.rfind(b'"time_taken_ms"', max(0, len(data) - 256))
    if i < 0:
        return 0.0
    digits = bytearray()
    for c in data[i + 15 :]:
        if 48 <= c <= 57:
            digits.append(c)
        elif digits:
            break
    return int(digits) / 1000.0 if digits else 0.0


def fx_envelope(hit: Any) -> bytes:
    """torch's remote-cache form of a kept FX graph (what its ``RemoteFxGraphCache.get`` decodes:
    JSON around the base64 pickle), for a lookup that does not go through :mod:`.handover`."""
    data = base64.b64encode(hit.read(GRAPH)).decode("ascii")
    return json.dumps({"data": data, "time_taken_ms": round(hit.record.compile_s * 1000)}).encode("ascii")


# ------------------------------------------------------------------------------------ get/put
def _store() -> Cache | None:
    store = active_cache()
    if store is not None and not store.trust_host_code and _kind(_kinds.INDUCTOR_FX).pickled:
        # A store opened with KCACHE_ALLOW_INSECURE: torch unpickles what it is given, so
        # nothing pickled is taken from (or put into) it. Autotune JSON would be safe, but one
        # rule for the whole integration is easier to reason about.
        warn_once(
            "inductor-insecure",
            "the store failed its ownership checks: torch.compile's caches are not kept in it",
        )
        return None
    return store


@fail_open("inductor-get", "kcache's torch.compile cache lookup")
def get(kind: str, key: str) -> bytes | None:
    """The bytes stored for Inductor's ``key``, or None. Never raises."""
    from . import policy

    if kind == _kinds.INDUCTOR_FX:
        hit = _fx_hit(key)
        return None if hit is None else fx_envelope(hit)
    graph = kind == _kinds.INDUCTOR_AOT
    served: float | None = None  # a graph served: its recorded compile time ("saved", counters.py)
    try:
        if not policy.may_serve(kind, key):
            return None
        store = _store()
        if store is None:
            return None
        skey, comps = store_key(kind, key)
        hit = store.get(kind, skey, comps)
        if hit is None:
            return None
        data: bytes | None = hit.read(MEMBER)
        if data is not None and kind == _kinds.INDUCTOR_AUTOTUNE:
            from .tunecheck import servable  # torch builds Triton configs from it unchecked

            data = data if servable(store, hit, data) else None
        if data is not None and kind == _kinds.INDUCTOR_AOT:
            data = data if _with_graphs(store, key, hit, data) else None
        if data is None:
            return None
        served = hit.record.compile_s
        return data
    except NoGpuModel:
        return None
    finally:
        if graph:
            _graph_looked_up(served)


def _graph_looked_up(served: float | None) -> None:
    """Count a graph's lookup (``served``: its recorded compile time, None for a miss)."""
    from .. import counters

    counters.graph_lookup(served)
    if served is None:
        from . import workers

        # a graph will be compiled: its workers are wanted now (unless kcache answers this
        # miss itself: workers asks the modules that may, see nothing_compiled_when)
        workers.compile_coming()


@fail_open("inductor-get", "kcache's torch.compile cache lookup")
def graph_hit(key: str) -> Hit | None:
    """The kept FX graph for torch's remote key ``key`` (its pickle is the :data:`GRAPH` member),
    looked up, counted and judged by torch's switches as :func:`get` does. Never raises."""
    return _fx_hit(key)


def _fx_hit(key: str) -> Hit | None:
    from . import graphs, policy

    counted = True  # a lookup of its own, counted as a graph's (not one fetched with its AOT entry)
    served: float | None = None
    try:
        if not policy.may_serve(_kinds.INDUCTOR_FX, key):
            return None
        graphs.learn(key)
        held = graphs.take(key)  # fetched with its AOTAutograd entry a moment ago
        if held is not None:
            counted = False  # the AOT hit's compile time covers it and its kernels
            return held
        store = _store()
        if store is None:
            return None
        skey, comps = store_key(_kinds.INDUCTOR_FX, key)
        hit = store.get(_kinds.INDUCTOR_FX, skey, comps)
        if hit is None or GRAPH not in hit.names:
            return None
        served = hit.record.compile_s
        return hit
    finally:
        if counted:
            _graph_looked_up(served)


def _named(hit: Any, data: bytes) -> list[str]:
    """The FX graph keys an AOTAutograd entry names: the list kept beside it, or (an entry kept
    before that list existed, or by another reading of entries: see :data:`.graphs.READING`)
    read from its bytes. :class:`.graphs.Unreadable` otherwise."""
    from . import graphs

    if KEYS in hit.names:
        keys = graphs.decode_keys(hit.read(KEYS))
        if keys is not None:
            return keys
    return graphs.fx_keys(data)  # no list, or one kept by another reading of entries


def _with_graphs(store: Cache, key: str, hit: Any, data: bytes) -> bool:
    """Fetch the FX graphs an AOTAutograd entry names (held for torch's lookups that follow).
    False, with the hit counted as a miss, when one of them cannot be served: the entry is then
    removed if a graph is gone from the store (see :mod:`.graphs`)."""
    from . import graphs, policy

    compile_s = hit.record.compile_s
    try:
        needed = _named(hit, data)
    except graphs.Unreadable as e:
        logger.debug("torch.compile: AOTAutograd entry %s not served: %s", key, e)
        store.count(_kinds.INDUCTOR_AOT, hits=-1, misses=1, saved_s=-compile_s)
        return False
    fetched = []
    graphs.form_known()  # takes the form of FX keys from torch when this process saw none yet
    for fx_key in needed:
        remote_key = graphs.fx_remote_key(fx_key)
        hit = None
        if policy.may_serve(_kinds.INDUCTOR_FX, remote_key):
            skey, comps = store_key(_kinds.INDUCTOR_FX, remote_key)
            hit = store.get(_kinds.INDUCTOR_FX, skey, comps)
        if hit is None or GRAPH not in hit.names:
            store.count(_kinds.INDUCTOR_AOT, hits=-1, misses=1, saved_s=-compile_s)
            if graphs.form_known() and policy.may_serve(_kinds.INDUCTOR_FX, remote_key):
                forget(_kinds.INDUCTOR_AOT, key)  # its graph is gone from the store
            logger.debug("torch.compile: AOTAutograd entry %s not served: FX graph %s absent", key, fx_key)
            return False
        # the AOT entry's compile time includes its graphs': credited once, with the AOT hit
        store.count(_kinds.INDUCTOR_FX, saved_s=-hit.record.compile_s)
        fetched.append((remote_key, hit))
    for remote_key, fx in fetched:
        graphs.hold(remote_key, fx)
    return True


@fail_open("inductor-forget", "kcache's removal of an entry torch could not use")
def forget(kind: str, key: str) -> None:
    """Remove what the store holds for Inductor's ``key`` (torch could not use it). Never raises
    (a folder that cannot be changed: the entry is judged again at its next lookup)."""
    store = _store()
    if store is None or store.readonly:
        return
    skey, _ = store_key(kind, key)
    store.forget(kind, skey)


@fail_open("inductor-put", "kcache's storing of a torch.compile cache entry")
def put(kind: str, key: str, data: Any) -> None:
    """Keep Inductor's bytes for ``key`` (replacing what was there). Never raises."""
    try:
        from . import graphs, policy

        if not isinstance(data, (bytes, bytearray, memoryview)):
            warn_once(
                "inductor-put-type",
                f"torch.compile gave kcache a {type(data).__name__}, not bytes; not stored",
            )
            return
        if not policy.may_keep(kind):
            return
        if kind == _kinds.INDUCTOR_FX:
            graphs.learn(key)
        store = _store()
        if store is None:
            return
        blob = bytes(data)
        files = {MEMBER: blob}
        if kind == _kinds.INDUCTOR_FX:
            try:
                files = {GRAPH: graphs.pickle_of(blob)}  # decoded once here, never at a lookup
            except graphs.Unreadable as e:
                logger.debug("torch.compile: FX graph %s not kept: %s", key, e)
                return
        elif kind == _kinds.INDUCTOR_AOT:
            needed = _graphs_kept(store, key, blob)
            if needed is None:
                return
            files[KEYS] = graphs.encode_keys(needed)
        skey, comps = store_key(kind, key)
        summary = {k: v for k, v in comps.items() if k in ("cache", "gpu_name", "torch_version")}
        if kind in (_kinds.INDUCTOR_FX, _kinds.INDUCTOR_AOT):
            from .naming import graph_summary

            summary.update(graph_summary())  # the compiled function's name, for inspect
        t0 = time.perf_counter()
        store.replace(kind, skey, files, components=comps, summary=summary, compile_s=_compile_s(blob))
        policy.kept(kind, key)
        logger.debug(
            "torch.compile: stored %s %s (%d bytes, %.1f ms)",
            kind,
            key,
            len(blob),
            1e3 * (time.perf_counter() - t0),
        )
    except NoGpuModel:
        return


def aot_check(hit: Any) -> str | None:
    """``kcache verify``: why an AOTAutograd entry's kept list of FX graphs cannot stand for
    the graphs its pickle names (a list changed, or written wrong), or None."""
    from . import graphs

    if KEYS not in hit.names or MEMBER not in hit.names:
        return None
    return graphs.kept_list_problem(hit.read(MEMBER), hit.read(KEYS))


def _graphs_kept(store: Cache, key: str, blob: bytes) -> list[str] | None:
    """The FX graph keys an AOTAutograd entry names, when they are all in the store (torch put
    them first); None when the entry is not to be kept."""
    from . import graphs

    try:
        needed = graphs.fx_keys(blob)
    except graphs.Unreadable as e:
        logger.debug("torch.compile: AOTAutograd entry %s not kept: %s", key, e)
        return None
    if len(needed) > graphs.MAX_NAMED:
        logger.debug("torch.compile: AOTAutograd entry %s not kept: it names %d graphs", key, len(needed))
        return None
    for fx_key in needed:
        skey, _ = store_key(_kinds.INDUCTOR_FX, graphs.fx_remote_key(fx_key))
        if not store.has(_kinds.INDUCTOR_FX, skey):
            logger.debug("torch.compile: AOTAutograd entry %s not kept: FX graph %s not stored", key, fx_key)
            return None
    return needed
