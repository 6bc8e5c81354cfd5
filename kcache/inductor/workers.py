"""Inductor's compile-worker pool, started when there is something to compile.

Where Triton is installed, Inductor starts its pool of compile workers at the first
``torch.compile`` call of a process (``maybe_warm_pool`` in Inductor's backend, ``wakeup`` when
the inputs are on a GPU), before it knows whether anything will be compiled: a new Python per
worker, each importing torch and Triton. A process whose graphs all come from a cache never
uses them, and still pays for them, mostly at exit: on the H200, 13-14 s of a warm process's
30 s went to shutting the pool down (1.1-1.4 s with one compile thread).

While kcache serves Inductor's FX graphs, the pool is started when a compile is coming instead:
at the first AOTAutograd or FX graph lookup that misses (the lowering that follows overlaps the
workers' start, as the warm-up meant; not an AOTAutograd miss that kcache answers with Dynamo's
kept restart, :mod:`.restarts` through :func:`nothing_compiled_when`: nothing is compiled for
it), or when Inductor submits a kernel that is not compiled already (torch's own lazy start). A
kernel that a served graph brings compiled (Inductor's in-memory table of compiled kernels,
filled from the graph's bundle) is taken from there without starting the pool. Nothing else
changes: the same kernels, compiled by the same workers when there is something to compile.
Where kcache does not serve FX graphs (turned off, a fresh scope), torch's warm-up runs as it
would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..boundary import guarded
from ..forksafe import module_lock
from ..log import logger
from .torchcall import TorchRaised
from .torchcall import own as torchs

MODULE = "torch._inductor.async_compile"
_lock = module_lock(__name__, "_lock")
_wanted: list[bool] = []  # torch asked for the warm-up; kcache holds it until a compile comes
_own: dict[str, Any] = {}  # torch's own maybe_warm_pool, while kcache's is in place
#: Questions asked at a graph lookup's miss before the pool is started: any one answering True
#: says that nothing is compiled for this miss (:func:`nothing_compiled_when`)
_answered: list[Callable[[], bool]] = []
#: The fail-open boundary's topic (kcache/boundary.py): torch then starts its pool as it would.
TOPIC, WHAT = "inductor-workers", "kcache's scheduling of Inductor's compile pool"


def _deferring() -> bool:
    from . import policy

    # The edge (torch starts its pool): policy reads torch's config itself, so what is left is a
    # bug, reported (raised when strict); torch's warm-up runs.
    with guarded(TOPIC, WHAT):
        return policy.fx_served()
    return False


def _started(mod: Any) -> bool:
    try:
        return mod.AsyncCompile.process_pool.cache_info().currsize > 0
    except (AttributeError, TypeError):  # torch's pool is no longer a functools cache (checked
        return True  # at install, but a program may replace it): cannot tell, behave as torch does


def on_import(mod: Any) -> None:
    """Called when ``torch._inductor.async_compile`` has been imported."""
    cls = getattr(mod, "AsyncCompile", None)
    warm = getattr(mod, "maybe_warm_pool", None)
    raw_wakeup = vars(cls).get("wakeup") if cls is not None else None
    triton = vars(cls).get("triton") if cls is not None else None
    kernels = getattr(mod, "CompiledTritonKernels", None)
    if _own or not callable(warm) or not isinstance(raw_wakeup, classmethod) or not callable(triton):
        return
    if (
        kernels is None
        or cls is None
        or not hasattr(cls, "process_pool")
        or not hasattr(cls.process_pool, "cache_info")
    ):
        logger.debug("torch.compile: this Inductor's compile pool is not one kcache knows")
        return

    def maybe_warm_pool() -> None:
        if _deferring() and not _started(mod):
            with _lock:
                _wanted[:] = [True]
            return
        warm()

    def wakeup(cls_: Any) -> None:
        if _deferring() and not _started(mod):
            with _lock:
                _wanted[:] = [True]
            return
        raw_wakeup.__func__(cls_)

    def triton_(self: Any, kernel_name: str, source_code: str, *args: Any, **kwargs: Any) -> Any:
        if not _started(mod) and _deferring():
            try:
                compiled = torchs(kernels.get, source_code) is not None  # it hashes with torch_key()
            except TorchRaised:  # then the kernel goes the usual way and torch meets its own
                compiled = False  # error there
            if compiled:  # from a served graph's bundle: no worker needed for it
                self.use_process_pool = _no_pool
                try:
                    return triton(self, kernel_name, source_code, *args, **kwargs)
                finally:
                    self.__dict__.pop("use_process_pool", None)
        return triton(self, kernel_name, source_code, *args, **kwargs)

    from .attached import patches

    _own.update(maybe_warm_pool=warm)
    patches.wrap(mod, "maybe_warm_pool", lambda _: maybe_warm_pool)
    patches.wrap(cls, "wakeup", lambda _: classmethod(wakeup), raw=True)
    patches.wrap(cls, "triton", lambda _: triton_, raw=True)


def _no_pool() -> bool:
    return False


def nothing_compiled_when(answered: Callable[[], bool]) -> None:
    """Register ``answered()``, asked in the thread of a graph lookup that has just missed: True
    when kcache answers that miss itself and nothing will be compiled for it (:mod:`.restarts`:
    the attempt Dynamo throws away, answered with its kept restart). Then the pool is not started
    for that miss. Kept until :func:`uninstall` (the integration registers it again at its next
    attach)."""
    with _lock:
        if answered not in _answered:
            _answered.append(answered)


def compile_coming() -> None:
    """A graph lookup missed: start the pool torch asked for, now (it overlaps the lowering),
    unless the miss is one that kcache answers without a compile (:func:`nothing_compiled_when`)."""
    with _lock:
        if not _wanted:
            return
        questions = list(_answered)
    if any(answered() for answered in questions):
        return
    with _lock:
        if not _wanted:
            return
        _wanted.clear()
    warm = _own.get("maybe_warm_pool")
    if warm is not None:
        try:
            torchs(warm)  # (kcache's own wakeup, called by torch's, may meet a bug: it goes on)
        except TorchRaised as e:  # torch's own pool warm-up: torch starts it later anyway
            logger.debug("torch.compile: compile pool not warmed: %s", e)


def uninstall() -> None:
    """kcache.disable(): torch's functions come back with :data:`.attached.patches`; nothing
    held for torch any more."""
    _own.clear()
    _wanted.clear()
    _answered.clear()
