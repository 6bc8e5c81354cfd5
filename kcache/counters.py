"""Process-wide event counters, buffered in memory and flushed to the store in batches.

Counting a hit must not be a write to the index: integrations call :func:`add` (a dict update
under a lock, well under a microsecond) and the store folds the buffer into its index now and
then (at most once a second on the hot path, and at exit).
"""

from __future__ import annotations

import threading
from collections import defaultdict

_lock = threading.Lock()
_buf: defaultdict[tuple[str, str], float] = defaultdict(float)
# Totals since the process started, never drained: what `kcache.stats()` reports for "this process".
_process: defaultdict[tuple[str, str], float] = defaultdict(float)

#: Counter names the store and the CLI know about.
NAMES = ("hits", "misses", "puts", "evictions", "bytes_written", "saved_s", "errors")


def add(kind: str, **deltas: float) -> None:
    """Add ``deltas`` (e.g. ``hits=1``, ``saved_s=0.4``) to the counters of ``kind``."""
    with _lock:
        for name, value in deltas.items():
            _buf[(kind, name)] += value
            _process[(kind, name)] += value


def drain() -> dict[tuple[str, str], float]:
    """Take and clear what was added since the last drain (the store persists it)."""
    with _lock:
        out = dict(_buf)
        _buf.clear()
    return out


def restore(pending: dict[tuple[str, str], float]) -> None:
    """Put back counts that could not be persisted (the index was busy), so they are not lost."""
    with _lock:
        for k, v in pending.items():
            _buf[k] += v


def process_totals() -> dict[str, dict[str, float]]:
    """Counters of this process since it started, by kind."""
    with _lock:
        out: dict[str, dict[str, float]] = {}
        for (kind, name), v in _process.items():
            out.setdefault(kind, {})[name] = v
    return out
