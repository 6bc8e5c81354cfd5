"""Event counters, buffered in memory and flushed to the store's index in batches.

Counting a hit must not be a write to the index: callers add to a :class:`Counters` (a dict
update under a lock, well under a microsecond) and the store folds the buffer into its index now
and then (at most once a second on a hot path, and at exit). Integrations that are not the store
itself (the nvFuser fusion cache) use the module-level :func:`add`; the active store drains it.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from . import kinds as _kinds
from .forksafe import module_lock


class Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf: defaultdict[tuple[str, str], float] = defaultdict(float)
        self._process: defaultdict[tuple[str, str], float] = defaultdict(float)

    def add(self, kind: str, **deltas: float) -> None:
        """Add ``deltas`` (e.g. ``hits=1``, ``saved_s=0.4``) to the counters of ``kind``."""
        with self._lock:
            for name, value in deltas.items():
                self._buf[(kind, name)] += value
                self._process[(kind, name)] += value

    def add_here(self, kind: str, **deltas: float) -> None:
        """Add ``deltas`` to this process's totals only (:meth:`process_totals`), never to the
        store's: a prewarm's lookups, which are checks of what the store holds, not uses."""
        with self._lock:
            for name, value in deltas.items():
                self._process[(kind, name)] += value

    def hit(self, kind: str, saved_s: float) -> None:
        """:meth:`add` of ``hits=1, saved_s=saved_s``, as a store hit counts (no keyword dict)."""
        h, s = (kind, "hits"), (kind, "saved_s")
        with self._lock:
            buf, proc = self._buf, self._process
            buf[h] += 1
            proc[h] += 1
            buf[s] += saved_s
            proc[s] += saved_s

    def drain(self) -> dict[tuple[str, str], float]:
        """Take and clear what was added since the last drain (the store persists it)."""
        with self._lock:
            out = dict(self._buf)
            self._buf.clear()
        return out

    def restore(self, pending: dict[tuple[str, str], float]) -> None:
        """Put back counts that could not be persisted (the index was busy), so they are not lost."""
        with self._lock:
            for k, v in pending.items():
                self._buf[k] += v

    def after_fork(self) -> None:
        """In a forked child: a new lock (the parent's may have been held by a thread that the
        child does not have), and nothing of the parent's to flush (the parent flushes it)."""
        self._lock = threading.Lock()
        self._buf = defaultdict(float)
        self._process = defaultdict(float)

    def process_totals(self) -> dict[str, dict[str, float]]:
        """Counters since this object was made, by kind."""
        with self._lock:
            out: dict[str, dict[str, float]] = {}
            for (kind, name), v in self._process.items():
                out.setdefault(kind, {})[name] = v
        return out


GLOBAL = Counters()
add = GLOBAL.add
drain = GLOBAL.drain
restore = GLOBAL.restore
process_totals = GLOBAL.process_totals


# ------------------------------------------------------------------------------ "saved"
# Each hit credits the compile time its entry cost when it was made, once. Some entries are
# nested: a torch.compile graph's recorded compile time (an AOTAutograd entry's includes its FX
# graphs', an FX graph's includes its kernels' and Inductor's one-time probes) covers the
# kernels that are then fetched to run it. After a graph hit, the inner hits that follow draw on
# that graph's time first ("the budget") and credit only what exceeds it; the next graph's
# lookup starts again (a miss: its inner hits save real compile time, credited in full).
# Inductor's compile workers only ever compile for a graph of their parent: they credit nothing
# for inner kinds (their parent's graph hit covers them; a graph that missed is under-credited
# by the kernels its workers found, never over-credited). Which kinds are inner each kind says
# (its ``inner`` trait, declared by its integration: :mod:`kcache.kinds`).

_budget_lock = module_lock(__name__, "_budget_lock")
_budget = [0.0]
_worker: list[bool] = []


def in_compile_worker() -> bool:
    """This process is Inductor's compile-worker sidecar, or a worker it forked."""
    if not _worker:
        import sys

        main = (sys.argv[0] if sys.argv else "") or ""
        _worker.append(main.replace("\\", "/").endswith("_inductor/compile_worker/__main__.py"))
    return _worker[0]


def credit(kind: str, compile_s: float) -> float:
    """The seconds a hit of ``kind`` whose entry cost ``compile_s`` saves, counting nested
    entries once (see above)."""
    try:
        c = float(compile_s)
    except (TypeError, ValueError):
        return 0.0
    if not c > 0.0 or c == float("inf"):
        return 0.0
    if not _kinds.get(kind).inner:
        return c
    if in_compile_worker():
        return 0.0
    if not _budget[0]:  # no graph's time to draw on (read without the lock: a float, set whole)
        return c
    with _budget_lock:
        absorbed = min(_budget[0], c)
        _budget[0] -= absorbed
    return c - absorbed


def covered(kind: str, compile_s: float, saved: float) -> float:
    """The part of a hit's compile time that :func:`credit` did not credit because a served
    graph's time covers it (0.0 for kinds that are never nested)."""
    if not _kinds.get(kind).inner:
        return 0.0
    try:
        c = float(compile_s) - saved
    except (TypeError, ValueError):
        return 0.0
    return c if 0.0 < c < float("inf") else 0.0


def graph_lookup(served_s: float | None) -> None:
    """A torch.compile graph was looked up: served, with its recorded compile time (which then
    covers the inner hits that follow), or not (``None``: they are credited in full)."""
    try:
        s = float(served_s) if served_s is not None else 0.0
    except (TypeError, ValueError):
        s = 0.0
    with _budget_lock:
        _budget[0] = s if s > 0.0 and s != float("inf") else 0.0
