"""Triton autotune results kcache keeps: never a winner whose benchmark failed.

Triton's autotuner benchmarks each config; a config that cannot run (out of resources, a
compile-time assertion, a ptxas error) gets an infinite time, and the fastest config wins. When
every config failed, the "winner" is one that failed, and Triton writes it to its autotune cache
all the same (``<fn>.autotune.json``): a later process would take it without benchmarking and
fail at its first launch instead of at tuning, where the program saw the error before. kcache
neither keeps nor serves such a result: the next process benchmarks again, as without a cache.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _first(t: Any) -> float | None:
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return float(t)
    if isinstance(t, (list, tuple)) and t and isinstance(t[0], (int, float)) and not isinstance(t[0], bool):
        return float(t[0])
    return None


def usable(blob: bytes) -> bool:
    """False when an autotune result's best config failed its benchmark (a time that is not a
    finite number). A result in a form kcache does not know is left to Triton (True)."""
    try:
        doc = json.loads(blob)
        rows = doc["configs_timings"]
    except (ValueError, KeyError, TypeError):
        return True
    if not isinstance(rows, list):
        return True
    times = []
    for row in rows:
        if not isinstance(row, (list, tuple)) or len(row) != 2:
            return True
        t = _first(row[1])
        if t is None:
            return True
        times.append(t)
    if not times:
        return False  # nothing was measured: nothing to reuse
    # Triton takes the minimum; NaN never compares smaller, so a NaN row is never chosen over a
    # finite one: the result is usable when some row is finite.
    return any(math.isfinite(t) for t in times)
