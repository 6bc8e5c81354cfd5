"""Reading many entries at once, for the commands that read every one (verify, export).

Each entry costs a few dozen system calls (open the folder, the record, each member; fstat;
read) and a checksum per member: the process mostly waits on the kernel, with the GIL released
(hashlib releases it for members over 2 KiB). A few threads reading side by side keep more of
those in flight; results come back in the order asked, a bounded number at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Entries handed to the readers at a time (bounds what waits in memory).
BATCH = 256


def default_jobs() -> int:
    """Readers by default: one. Measured at 100,000 entries on a 2-core box (tools/
    bench_maintenance.py, docs/benchmarks.md), threads did not help: the work is Python's, under
    the GIL. ``--jobs N`` is there for stores where reads wait on the disk or the network."""
    return 1


def ordered_map(fn: Callable[[T], R], items: Iterable[T], jobs: int) -> Iterator[R]:
    """``fn`` over ``items`` in ``jobs`` threads (1: in this thread), results in order."""
    if jobs <= 1:
        for x in items:
            yield fn(x)
        return
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="kcache-read") as pool:
        batch: list[T] = []
        for x in items:
            batch.append(x)
            if len(batch) >= BATCH:
                yield from pool.map(fn, batch)
                batch = []
        if batch:
            yield from pool.map(fn, batch)
