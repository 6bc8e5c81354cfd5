"""Event counters, buffered in memory and flushed to the store's index in batches.

Counting a hit must not be a write to the index: callers add to a :class:`Counters` (a dict
update under a lock, well under a microsecond) and the store folds the buffer into its index now
and then (at most once a second on a hot path, and at exit). Integrations that are not the store
itself (the nvFuser fusion cache) use the module-level :func:`add`; the active store drains it.
"""

from __future__ import annotations

import threading
from collections import defaultdict


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
