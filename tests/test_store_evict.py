"""The size bound under concurrent writers (issue 25): ``tools/bench_evict.py``, small.

Three processes put Triton-sized groups (25-320 KB) into one store bounded at 2 MiB, six times
its bound in all; the store's bytes on disk are sampled throughout. When the last writer has
exited, the store is at or under its bound: no later process is needed (each writer that ends
with the store past its bound evicts before it goes). Before, nothing younger than the two-minute
grace period was evicted, and the store was left at 5-6x its bound.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_bound_holds_with_concurrent_writers(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    cmd = [sys.executable, str(REPO / "tools" / "bench_evict.py"), "--writers", "3", "--bound", "2MB"]
    # Work, not time, decides how much is written (a loaded box writes slower); the exit
    # eviction's time limit is lifted for the same reason (2 s by default).
    cmd += ["--puts", "40", "--sample-ms", "20", "--exit-budget", "60", "--json", str(out)]
    cmd += ["--dir", str(tmp_path / "work")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.exists(), r.stdout + r.stderr
    run = json.loads(out.read_text())["runs"][0]
    assert run["errors"] == [] and run["writers_ok"] == 3, run["errors"]
    assert run["wrong_bytes"] == 0, run["wrong_examples"]
    bound = 2 << 20
    assert run["bytes_put"] > 4 * bound, run["bytes_put"]  # the bound was passed many times over
    # When the last writer is gone, the store is within its bound: nothing waits for a later one.
    assert run["at_exit_ratio"] <= 1.0, run["at_exit_ratio"]
    assert run["after_5s_ratio"] <= 1.0
    assert run["evictions"] > 0
    # How near its bound it stays while they write is a figure, not a guarantee a test can hold
    # on a loaded box: the sampler walks the folders as entries come and go (an entry renamed
    # from its temporary folder mid-walk counts twice), and how far eviction lags the writers
    # depends on scheduling (2.5x was sampled once beside a parallel test run).
    # tools/bench_evict.py measures it against the 1.25x target; docs/benchmarks.md has figures.
    assert run["peak_committed_ratio"] > 0


def test_a_recount_keeps_what_was_put_while_it_walked(tmp_path: Path) -> None:
    """A recount walks the folders while other threads and processes put and evict. An entry put
    behind the walk (its shard walked already) and an entry removed ahead of it (not there when
    its shard was walked) are both missed by the walk; the count must still hold the new entry.
    Before, the recount added only the net change meanwhile (here +1,000 - 1,000 = 0) and the
    count stayed an entry short for good: a store of 11 entries of 1,000 bytes under a 10,000
    bound counted 10,000 and was never evicted (tests/test_store.py's eviction test, 1 run in
    12 on a loaded box)."""
    from kcache.store import Store

    s = Store.open(tmp_path / "s", max_size=1 << 30)
    try:
        ids = [s.put("triton", f"k{i}", {"a.bin": b"x" * 1000}).record.id for i in range(5)]
        usage = s.disk.evictor.usage
        assert usage.total() == 5000
        before = usage.added()  # the recount begins
        walked = 4000  # it will see k1..k4: k0 is removed before its shard is walked
        assert s.remove([ids[0]]) == 1
        s.put("triton", "k5", {"a.bin": b"y" * 1000})  # behind the walk: not seen by it
        total = usage.settle(walked, before)
        on_disk = 5000  # k1..k5
        assert total is not None and total >= on_disk, total
        assert usage.total() == total
    finally:
        s.close()
