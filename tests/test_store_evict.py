"""The size bound under concurrent writers (issue 25): ``tools/bench_evict.py``, small.

Three processes put Triton-sized groups (25-320 KB) into one store bounded at 2 MiB, six times
its bound in all; the store's bytes on disk are sampled throughout. When the last writer has
exited, the store is at or under its bound: no later process is needed (each writer that ends
with the store past its bound evicts before it goes). Before, nothing younger than the two-minute
grace period was evicted, and the store was left at 5-6x its bound.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kcache.store import Store

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
        one = _on_disk(Path(s.entry_dir(ids[0])))  # an entry's bytes on disk (all five alike)
        usage = s.disk.evictor.usage
        assert usage.total() == 5 * one
        before = usage.added()  # the recount begins
        walked = 4 * one  # it will see k1..k4: k0 is removed before its shard is walked
        assert s.remove([ids[0]]) == 1
        s.put("triton", "k5", {"a.bin": b"y" * 1000})  # behind the walk: not seen by it
        total = usage.settle(walked, before)
        on_disk = 5 * one  # k1..k5
        assert total is not None and total >= on_disk, total
        assert usage.total() == total
    finally:
        s.close()


_RECOUNT = """
import sys
from kcache.store import Store
s = Store.open(sys.argv[1], max_size=1 << 30)
print(s.disk.evictor.recount())
s.close()
"""


def test_a_recount_between_a_removals_rename_and_its_count_leaves_the_count_whole(tmp_path: Path) -> None:
    """A removal renames the entry's folder into trash/, then takes its bytes off the shared
    count. Another process's recount (its flush thread's reconcile, or eviction's) that walks the
    folders after the rename and sets the count before the subtraction does not count the entry;
    the subtraction then took it off a second time, and the count stayed an entry short until the
    next recount (an hour on), the store past its bound by as much. Seen once in CI: the
    put-past-the-bound test below counted 196,608 bytes for 9 entries of 24,576 (its own flush
    thread's first reconcile landed inside its put's eviction). Here the other process's recount
    is run at that point, by the removal's own callback; the count must hold the entries that are
    left. Fails on main (every run: the count is one entry short)."""
    root = tmp_path / "store"
    s = Store.open(root, max_size=1 << 30)
    try:
        disk = s.disk
        # This process's own flush thread stays out of it (its first turn would recount too).
        disk.catalogue.on_turn = lambda: None
        disk.catalogue.after_reconcile = lambda: None
        ids = [s.put("triton", f"k{i}", {"a.bin": bytes([i]) * 10_000}).record.id for i in range(4)]
        one = _on_disk(Path(s.entry_dir(ids[0])))
        usage = disk.evictor.usage
        assert usage.total() == 4 * one
        told = disk.entries.on_removed
        assert told is not None
        recounts: list[str] = []

        def removed(*args: object) -> None:
            # The folder is in trash/ now, its bytes still counted: another process recounts.
            r = subprocess.run(
                [sys.executable, "-c", _RECOUNT, str(root)], capture_output=True, text=True, timeout=120
            )
            assert r.returncode == 0, r.stderr
            recounts.append(r.stdout.strip())
            told(*args)

        disk.entries.on_removed = removed
        assert s.remove([ids[0]]) == 1  # a removal (clear, quarantine)
        assert recounts == [str(3 * one)]  # the recount saw the three left
        assert usage.total() == 3 * one
        # An eviction by a put (the store far past its bound: the put renames the oldest entry
        # into trash/ itself), as in the CI failure.
        for ident in ids[1:]:
            rec = Path(s.entry_dir(ident)) / "__kcache__.rec"
            os.utime(rec, (time.time() - 600,) * 2)
        disk.max_size = 2 * one + disk.evictor.measure().total
        assert s.put("triton", "new", {"a.bin": b"N" * 10_000}) is not None
        gone = [i for i in ids[1:] if disk.record_mtime(i) is None]
        assert len(gone) == len(recounts) - 1 >= 1, (gone, recounts)
        assert usage.total() == (4 - len(gone)) * one
    finally:
        s.close()


_PUT = """
import sys
from kcache.store import Store
s = Store.open(sys.argv[1], max_size=1 << 30)
s.put("triton", "late", {"a.bin": b"L" * 10_000})
s.close()
"""


def test_a_recount_that_finds_the_count_busy_as_it_begins_loses_no_put(tmp_path: Path) -> None:
    """A recount reads the bytes ever added before it walks (its mark), so that it can add what
    was put meanwhile. That read never waited: when another process was updating the count at
    that moment, the mark was None, and the recount added nothing put while it walked: an entry
    put behind the walk was counted nowhere (the count an entry short, the store past its bound,
    until the next recount). Here another process holds the count as the recount begins, and
    puts an entry once the walk is over (if it walks). The recount waits for the count, at most a
    second; this one does not get it (the holder lets go only once the walk is over), and so
    sets nothing. Fails on main (it walks at once, and the count ends one entry short)."""
    root = tmp_path / "store"
    s = Store.open(root, max_size=1 << 30)
    fd = -1
    try:
        disk = s.disk
        disk.catalogue.on_turn = lambda: None  # this process's flush thread stays out of it
        disk.catalogue.after_reconcile = lambda: None
        ids = [s.put("triton", f"k{i}", {"a.bin": bytes([i]) * 10_000}).record.id for i in range(3)]
        one = _on_disk(Path(s.entry_dir(ids[0])))
        usage = disk.evictor.usage
        assert usage.total() == 3 * one
        fd = os.open(root / "locks" / "usage.du", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process is updating the count
        settle = usage.settle

        def walked(counted: int, before: int | None) -> int | None:
            fcntl.flock(fd, fcntl.LOCK_UN)  # its update is done; then it puts (the walk is over)
            r = subprocess.run(
                [sys.executable, "-c", _PUT, str(root)], capture_output=True, text=True, timeout=120
            )
            assert r.returncode == 0, r.stderr
            return settle(counted, before)

        usage.settle = walked  # type: ignore[method-assign]
        disk.evictor.recount()
        fcntl.flock(fd, fcntl.LOCK_UN)
        entries = sum(1 for _ in disk.iter_entry_ids())
        assert usage.total() == entries * one, (usage.total(), entries)
    finally:
        if fd >= 0:
            os.close(fd)
        s.close()


def _on_disk(folder: Path) -> int:
    """What an entry counts for against the bound: its folder's blocks and its files', as du
    counts them."""
    return sum(os.lstat(p).st_blocks * 512 for p in [folder, *folder.iterdir()])


def _ten_old_entries(s: Store, root: Path) -> tuple[list[str], int]:
    """Ten entries of 10 KB, used 10 minutes ago, oldest first: their keys, and each one's bytes
    on disk."""
    disk = s.disk
    keys = [f"k{i}" for i in range(10)]
    for i, key in enumerate(keys):
        s.put("triton", key, {"a.bin": bytes([i]) * 10_000, "b.json": b"{}"})
        rec = root / "entries" / disk.entry_id("triton", key)[:2] / disk.entry_id("triton", key)
        os.utime(rec / "__kcache__.rec", (time.time() - 600 + i, time.time() - 600 + i))
    return keys, _on_disk(Path(s.entry_dir(disk.entry_id("triton", keys[0]))))


def _trash_files(root: Path) -> list[str]:
    return [f"{d}/{f}" for d in os.listdir(root / "trash") for f in os.listdir(root / "trash" / d)]


def test_a_put_past_the_bound_leaves_its_victims_files_to_the_next_turn(tmp_path: Path, monkeypatch) -> None:
    """A put that finds the store far past its bound (the flush thread behind) evicts by renaming
    the oldest entries into trash/ only: they are gone from the store and off its size count
    when it returns, and their files are deleted at the flush thread's next turn, not inside the
    put (deleting files makes the filesystem's journal wait)."""
    from kcache.store import tunables

    root = tmp_path / "store"
    s = Store.open(root, max_size=1 << 30)
    disk = s.disk
    disk.catalogue.on_turn = lambda: None  # the flush thread's turn is taken by hand below
    # Its reconcile too: a new store's first turn recounts the folder, and a recount while the
    # puts below write counts an entry it walked and that was added meanwhile twice (by design,
    # see Usage.settle): exact counts are the subject here. (A recount inside the put's
    # eviction made the count an entry short once in CI, a race of the store's own:
    # test_a_recount_between_a_removals_rename_and_its_count_leaves_the_count_whole.)
    disk.catalogue.after_reconcile = lambda: None
    # (how many bytes may wait for that turn is bounded too, and further past the bound the put
    # deletes them itself: neither is the subject here, see the next test)
    monkeypatch.setattr(tunables, "SOON_SHARE", 1.0)
    monkeypatch.setattr(tunables, "BRAKE_OVER", 100.0)
    keys, one = _ten_old_entries(s, root)
    assert disk.evictor.usage.total() == 10 * one
    # The bound counts the whole folder: room for 5 entries beside the rest (the index, written
    # now, the folders); the put below takes the entries to 2.2x that: far past HELP_OVER.
    s.flush(force=True)
    disk.max_size = 5 * one + disk.evictor.measure().total
    assert s.put("triton", "new", {"a.bin": b"N" * 10_000, "b.json": b"{}"}) is not None
    gone = [k for k in keys if disk.record_mtime(disk.entry_id("triton", k)) is None]
    assert gone, "the put evicted nothing itself"
    assert all(s.get("triton", k) is None for k in gone)
    assert disk.evictor.usage.total() == (11 - len(gone)) * one  # off the count at the rename
    left = _trash_files(root)
    assert len(left) == 3 * len(gone), left  # members and record: not deleted by the put
    # The flush thread's next turn (its own eviction is not the subject here: under a bound this
    # small, the index's write-ahead log growing by a few pages moves its target by entries).
    disk.max_size = 1 << 30
    disk._flush_turn()
    assert _trash_files(root) == []
    assert disk.evictor.usage.total() == (11 - len(gone)) * one  # nothing counted twice
    assert s.get("triton", "new") is not None
    s.close()
    assert os.listdir(root / "trash") == []


def test_a_put_far_past_the_bound_deletes_its_victims_files_itself(tmp_path: Path) -> None:
    """Past BRAKE_OVER (the flush threads far behind: a loaded box), a put that evicts deletes
    its victims' files before it returns instead of leaving them to a turn that may not come for
    seconds (their bytes are still on disk until then: the folder reached 1.6x its bound once in
    CI). Before, they waited in trash/ whatever the store's state."""
    root = tmp_path / "store"
    s = Store.open(root, max_size=1 << 30)
    disk = s.disk
    disk.catalogue.on_turn = lambda: None  # no turn comes
    disk.catalogue.after_reconcile = lambda: None  # (exact counts: see the test above)
    keys, one = _ten_old_entries(s, root)
    s.flush(force=True)
    disk.max_size = 5 * one + disk.evictor.measure().total  # the put below: 2.2x, past BRAKE_OVER
    assert s.put("triton", "new", {"a.bin": b"N" * 10_000, "b.json": b"{}"}) is not None
    gone = [k for k in keys if disk.record_mtime(disk.entry_id("triton", k)) is None]
    assert gone, "the put evicted nothing itself"
    assert all(s.get("triton", k) is None for k in gone)
    assert disk.evictor.usage.total() == (11 - len(gone)) * one
    assert _trash_files(root) == []  # deleted by the put
    assert s.get("triton", "new") is not None
    s.close()


def test_a_short_sweep_leaves_the_held_folders_turn_due(tmp_path: Path, monkeypatch) -> None:
    """Folders in trash/ once found held are tried again only at the held folders' turn (every
    HELD_SWEEP_S, or at once when a hold was let go). A put past the bound sweeps for 20 ms
    (BRAKE_SWEEP_S): one that does not reach them all must leave that turn due, or the rest wait
    30 s more while the flush thread's sweeps skip them, counted against the bound all along."""
    from kcache.store import tunables

    monkeypatch.setattr(tunables, "HELD_SWEEP_S", 3600.0)
    root = tmp_path / "store"
    s = Store.open(root, max_size=1 << 30)
    disk = s.disk
    disk.catalogue.on_turn = lambda: None  # the turns are taken by hand below
    trash = root / "trash"
    holds = []
    for i in range(300):  # removed entries a live process holds (see served.py)
        d = trash / f"{i:040x}.held"
        d.mkdir()
        for j in range(4):
            (d / f"m{j}").write_bytes(b"x" * 3000)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(fd, fcntl.LOCK_SH)
        holds.append(fd)
    state = disk.trash_state
    state.retry_held()
    state.sweep()  # a turn: every folder found held, remembered as such
    assert len(os.listdir(trash)) == 300
    for fd in holds:  # their holders let go
        os.close(fd)
    state.retry_held()  # (what letting go of a removed entry's hold asks for)
    state.sweep(1e-4)  # a put's sweep, too short for 300 folders
    left = len(os.listdir(trash))
    assert left > 0, left  # (not whole: its budget ran out)
    state.sweep()  # the flush thread's next turn
    assert os.listdir(trash) == [], f"{len(os.listdir(trash))} of {left} left for HELD_SWEEP_S"
    s.close()


def test_a_held_entry_evicted_by_a_put_keeps_its_files(tmp_path: Path) -> None:
    """The same, for an entry whose files this process was handed: the turn leaves them whole
    while they are held; they go when the process lets go."""
    root = tmp_path / "store"
    s = Store.open(root, max_size=1 << 30)
    disk = s.disk
    disk.catalogue.on_turn = lambda: None
    # The flush thread's first turn recounts the new store, and writes the hit's last use below:
    # neither is the subject, and both ran beside the put here (as in the test above). This test
    # failed once in a loaded CI run (the put evicted nothing; not reproduced in 30 runs beside
    # two CPU-bound jobs): they are its only concurrent writers; the recount is off, the use is
    # written before the put.
    disk.catalogue.after_reconcile = lambda: None
    s.put("triton", "old", {"a.bin": b"O" * 20_000})
    ident = disk.entry_id("triton", "old")
    os.utime(root / "entries" / ident[:2] / ident / "__kcache__.rec", (time.time() - 600,) * 2)
    hit = s.get("triton", "old", files=True)
    assert hit is not None and hit._pin is not None
    s.flush(force=True)
    disk.max_size = 15_000
    assert s.put("triton", "new", {"a.bin": b"N" * 1_000}) is not None
    assert disk.record_mtime(ident) is None  # evicted by the put
    disk._flush_turn()
    assert Path(hit.paths["a.bin"]).read_bytes() == b"O" * 20_000  # held: left whole
    assert len(_trash_files(root)) == 2
    s.close()  # lets go: what it held goes
    assert os.listdir(root / "trash") == []
