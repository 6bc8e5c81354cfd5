"""A per-call fusion cache: runtime arguments -> nvFuser ``FusionDefinition``, built on a miss.

``FusionCache(build, execute)`` does what Thunder's ``FusionDefinitionWrapper`` does (descriptors
of the arguments, then an LRU from descriptors to definition) at close to the cost of reading each
tensor's shape, stride and dtype once:

1. The most recent call's entry is checked first. When torch's C++ tensor guards are available
   (``torch._C._dynamo.guards.TensorGuards``: dtype, device, sizes, strides, requires_grad and
   dispatch keys compared in C++, stricter than the key needs), one ``check(*args)`` answers for
   all tensors without building any Python object; a pass returns the definition.
2. Otherwise the exact key (dtype, sizes, strides of each tensor; type of anything else) is built
   and compared with the most recent one, then looked up in a memo from exact keys to entries.
3. A call shape never seen goes through :func:`kcache.nvfuser.descriptors.runtime_key` (memoised too) and
   the LRU of definitions; only a new runtime key calls ``build(descriptors)``.

Thread safety: the hit path takes no lock. It reads dicts and one ``_mru`` slot that is replaced
whole (a list ``[guard state, definition, exact key, runtime key, LRU slot, guard]`` whose key
and definition never change), so a reader never pairs one call's key with another's definition;
the guard state is a single reference, any value of which is safe to act on. Misses, inserts and
eviction take the lock; concurrent misses on the same runtime key build once (the others wait for
it). Under a race the ``_mru`` slot may keep an evicted definition alive (and serve it: it is
still a valid definition for that key) until the next different call shape.
"""

from __future__ import annotations

import atexit
import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from kcache import counters
from kcache.boundary import guarded
from kcache.nvfuser import descriptors as _d
from kcache.nvfuser.declare import NVFUSER_FUSION as COUNTER_KIND  # counter kind in ``kcache stats``

__all__ = ["FusionCache", "flush_all"]

#: the memo path pushes counts to kcache.counters when its tick is a multiple of this plus one
_PUSH_EVERY = 4095

_TT = _d._TENSOR_TYPES  # the same set object: types join it as kcache.nvfuser.descriptors meets them
_T: type = _d._T  # torch.Tensor once kcache.nvfuser.descriptors has met one (synced on every miss)
_exact_item = _d._exact_item
_MISSING = object()
#: the most-recent slot when there is none: no guard, an exact key no call has
_EMPTY: list = [0, None, (_MISSING,), None, [None, 0], 0]


def _default_execute(definition: Any, args: Sequence[Any]) -> Any:
    return definition.execute(args)


# ---------------------------------------------------------------------------------------------
# torch's C++ tensor guards (optional, checked once).

_guard_cls: Any = None  # None: not probed yet; False: unusable


def _tensor_guards_cls() -> Any:
    """``TensorGuards`` when torch is already imported and it behaves as expected, else False."""
    global _guard_cls
    if _guard_cls is not None:
        return _guard_cls
    torch = sys.modules.get("torch")
    if torch is None:
        return False  # not probed: torch may come later
    _guard_cls = False
    try:
        from torch._C._dynamo.guards import TensorGuards

        def make(*ts: Any) -> Any:
            return TensorGuards(
                *ts,
                dynamic_dims_sizes=[list(t.shape) for t in ts],
                dynamic_dims_strides=[list(t.stride()) for t in ts],
            )

        # Self-test: the guard must reject what would change the key (strides alone, dtype,
        # sizes, a 0-dim tensor's device) and accept the tensors it was made from.
        a = torch.empty_strided((2, 3), (3, 1))
        b = torch.empty_strided((2, 3), (1, 2))
        s = torch.empty(())
        g = make(a, s)
        ok = (
            g.check(a, s)
            and g.check(torch.empty_strided((2, 3), (3, 1)), torch.empty(()))
            and not g.check(b, s)
            and not g.check(a.double(), s)
            and not g.check(torch.empty(2, 4), s)
            and not g.check(a, torch.empty((), device="meta"))
            and not g.check(a, 1.0)
        )
        if ok:
            _guard_cls = make
    except (ImportError, AttributeError, TypeError, RuntimeError):  # probing torch's guard API,
        _guard_cls = False  # which differs between versions (a C++ error is a RuntimeError)
    return _guard_cls


# ---------------------------------------------------------------------------------------------
# Counters: pushed to kcache.counters in batches (see FusionCache._push).

_live: weakref.WeakSet[FusionCache] = weakref.WeakSet()


def flush_all() -> None:
    """Push the hit/miss counts of every live :class:`FusionCache` to :mod:`kcache.counters`."""
    for c in list(_live):
        # Counts are statistics: one cache's bug (raised when strict) must not stop the others'.
        with guarded("nvfuser-counts", "pushing a FusionCache's counts", then="they are not counted"):
            c.flush()


atexit.register(flush_all)


def _count_value(c: itertools.count) -> int:
    # itertools.count exposes its next value only through repr: "count(12)".
    return int(repr(c)[6:-1])


class FusionCache:
    """Runtime arguments -> fusion definition, built by ``build(descriptors)`` on a miss.

    ``build`` receives the call's :func:`kcache.nvfuser.descriptors.runtime_key` (one descriptor per
    argument, as Thunder's ``create_fd`` receives its descriptors) and returns a definition;
    ``execute(definition, args)`` runs it (default: ``definition.execute(args)``). Calling the
    cache with the runtime arguments finds or builds the definition and executes it;
    :meth:`lookup` returns the definition without executing.

    ``maxsize`` bounds the number of definitions (least recently used evicted first); ``static``
    lists argument positions whose values change the fusion (their value joins the key);
    ``use_guards`` allows torch's C++ tensor guards on the most recent entry (a fast path only:
    results are the same without it).
    """

    def __init__(
        self,
        build: Callable[[tuple], Any],
        execute: Callable[[Any, Sequence[Any]], Any] | None = None,
        *,
        maxsize: int = 256,
        static: Sequence[int] = (),
        use_guards: bool = True,
    ) -> None:
        if maxsize < 1:
            raise ValueError(f"FusionCache: maxsize must be at least 1, got {maxsize}")
        self._build = build
        self._execute = execute if execute is not None else _default_execute
        self.maxsize = maxsize
        st = tuple(static)
        # Non-negative positions are normalised once; negative ones depend on len(args).
        self._static: tuple | frozenset = (
            frozenset(st) if all(isinstance(i, int) and i >= 0 for i in st) else st
        )
        self._use_guards = bool(use_guards) and not self._static
        self._lock = threading.Lock()
        # runtime key -> slot [definition, last-use tick]. Recency is a tick, not an ordering:
        # a hit stores the tick it drew, eviction scans for the smallest. Moving a key in an
        # OrderedDict would hash the runtime key (a nest of tuples, not cached) on every hit.
        self._defs: dict[tuple, list] = {}
        # exact key -> entry [guard state, definition, exact key, runtime key, slot, guard]
        self._memo: dict[Any, list] = {}
        self._memo_max = max(4096, 4 * maxsize)
        self._pending: dict[tuple, tuple[threading.Event, int]] = {}
        self._mru: list = _EMPTY
        # Counting: a hit is one next() on an itertools.count (atomic under the GIL, about
        # 45 ns), which is also the recency tick. Never a call into kcache.counters on the hit
        # path: its add() takes a lock and two dict updates, about 1 us measured on the 2-core
        # box, more than a whole 1-tensor hit.
        # Deltas go to kcache.counters on every miss (already the slow path, under the lock),
        # every 4096 ticks seen by the memo path (a call shape other than the previous one),
        # on flush() / flush_all(), and at exit. The two fastest paths (the same call shape
        # again) only count: a test there would cost as much as the count itself.
        self._hitc = itertools.count(1)
        self._hits0 = 1  # the count's start: hits = next value - _hits0
        self._misses = 0
        self._pushed_hits = 0
        self._pushed_misses = 0
        if self._static:
            self.lookup = self._lookup_static  # type: ignore[method-assign]
        _live.add(self)

    # -- the per-call path ----------------------------------------------------------------------

    def __call__(self, *args: Any) -> Any:
        """Find (or build) the definition for ``args`` and execute it."""
        return self._execute(self.lookup(args), args)

    def lookup(self, args: Sequence[Any]) -> Any:
        """The definition for ``args`` (built on a miss), without executing it."""
        e = self._mru
        g = e[0]
        if g:
            try:
                if g.check(*args):
                    next(self._hitc)
                    return e[1]
            except (TypeError, RuntimeError):  # another number of arguments, or a tensor without
                pass  # strides (torch's C++ error): the Python path below decides or raises
            # Suspend the guard: calls that alternate between call shapes would otherwise pay a
            # failing check each. The next repeat of this entry's call shape re-arms it.
            e[0] = g = False
        # Module globals only inside the comprehension: a local would make it a closure, which
        # costs more per call than the global lookups.
        ex = tuple(
            [
                (a.dtype, a.shape, a.stride() or a.is_cpu)
                if type(a) is _T or type(a) in _TT
                else _exact_item(a)
                for a in args
            ]
        )
        if ex == e[2]:
            # The same call shape twice in a row: worth a C++ guard.
            if g is False:
                e[0] = e[5]  # re-arm the suspended one
            elif g is None:
                self._arm(e, args)
            next(self._hitc)
            return e[1]
        found = self._memo.get(ex)
        if found is not None:
            e = found
            # The most recent entry needs no tick: it was stamped when it became the most recent
            # and no other entry has been used since.
            e[4][1] = t = next(self._hitc)
            self._mru = e
            if not t & _PUSH_EVERY:
                self.flush()
            return e[1]
        return self._miss(args, ex)

    def _lookup_static(self, args: Sequence[Any]) -> Any:
        rk = _d.runtime_key(args, static=self._static)
        slot = self._defs.get(rk)
        if slot is not None:
            slot[1] = next(self._hitc)
            return slot[0]
        return self._miss(args, None, rk)

    def _arm(self, e: list, args: Sequence[Any]) -> None:
        """Give entry ``e`` a C++ guard made from ``args`` (0 when none can be made).

        ``e[0]`` is the guard state: None not tried yet, a guard, False suspended (the guard
        is kept in ``e[5]``), 0 none possible (not all arguments are torch tensors, no torch,
        guards off or unusable).
        """
        make: Any = _tensor_guards_cls() if self._use_guards else False
        g: Any = 0
        if make:
            try:
                tensor = sys.modules["torch"].Tensor
                if all(isinstance(a, tensor) for a in args):
                    g = make(*args)
                    if not g.check(*args):
                        g = 0
            except (TypeError, RuntimeError):  # as above (torch's guards, from these arguments)
                g = 0
        e[5] = g
        e[0] = g

    # -- the miss path --------------------------------------------------------------------------

    def _miss(self, args: Sequence[Any], ex: Any, rk: tuple | None = None) -> Any:
        global _T
        _T = _d._T
        if rk is None:
            # ex is the call's exact key (no static positions on this path): no second read of
            # the tensors.
            rk = _d.key_of_exact(ex)
        while True:
            with self._lock:
                slot = self._defs.get(rk)
                if slot is not None:
                    slot[1] = next(self._hitc)
                    return self._remember(ex, rk, slot)
                me = threading.get_ident()
                p = self._pending.get(rk)
                if p is None:
                    ev = threading.Event()
                    self._pending[rk] = (ev, me)
                    break
                ev, owner = p
                if owner == me:
                    raise RuntimeError("FusionCache: build() looked up the key it is building")
            ev.wait()  # another thread is building this key: use its result
        try:
            d = self._build(rk)
        except BaseException:  # re-raised: it only cleans up on the way
            with self._lock:
                del self._pending[rk]
            ev.set()
            raise
        with self._lock:
            del self._pending[rk]
            slot = self._defs[rk] = [d, next(self._hitc)]
            self._hits0 += 1  # that tick was not a hit
            self._misses += 1
            while len(self._defs) > self.maxsize:
                self._evict_oldest()
            out = self._remember(ex, rk, slot)
            self._push()
        ev.set()
        return out

    def _remember(self, ex: Any, rk: tuple, slot: list) -> Any:
        """Memo ``ex`` -> entry and make it the most recent (caller holds the lock)."""
        if ex is not None:
            memo = self._memo
            if len(memo) >= self._memo_max:
                memo.clear()
            e = [None, slot[0], ex, rk, slot, None]
            memo[ex] = e
            self._mru = e
        return slot[0]

    def _evict_oldest(self) -> None:
        rk = min(self._defs.items(), key=lambda kv: kv[1][1])[0]
        del self._defs[rk]
        memo = self._memo
        for k in [k for k, e in memo.items() if e[3] == rk]:
            del memo[k]
        if self._mru[3] == rk:
            self._mru = _EMPTY

    # -- bookkeeping ----------------------------------------------------------------------------

    @property
    def hits(self) -> int:
        """Calls answered without building a definition."""
        return _count_value(self._hitc) - self._hits0

    @property
    def misses(self) -> int:
        """Calls that built a definition."""
        return self._misses

    def __len__(self) -> int:
        return len(self._defs)

    def cache_info(self) -> dict[str, int]:
        """Hits, misses, current size and bound, as ``functools.lru_cache`` reports them."""
        return {"hits": self.hits, "misses": self.misses, "maxsize": self.maxsize, "currsize": len(self)}

    def definitions(self) -> list[tuple[tuple, Any]]:
        """``(descriptors, definition)`` pairs, least recently used first."""
        with self._lock:
            items = sorted(self._defs.items(), key=lambda kv: kv[1][1])
        return [(rk, slot[0]) for rk, slot in items]

    def clear(self) -> None:
        """Drop every definition (counters are kept)."""
        with self._lock:
            self._defs.clear()
            self._memo.clear()
            self._mru = _EMPTY

    def flush(self) -> None:
        """Push hit/miss counts not yet reported to :mod:`kcache.counters`."""
        with self._lock:
            self._push()

    def _push(self) -> None:
        # Caller holds self._lock.
        h = self.hits
        dh, dm = h - self._pushed_hits, self._misses - self._pushed_misses
        if dh or dm:
            self._pushed_hits, self._pushed_misses = h, self._misses
            deltas = {}
            if dh:
                deltas["hits"] = dh
            if dm:
                deltas["misses"] = dm
            counters.add(COUNTER_KIND, **deltas)
