"""The hit path with files (``get(..., files=True)``, what Triton's manager asks): every check of
the general read holds there too (a tampered entry is the same miss, with the same warning and
quarantine, as a lookup without files), and a process holds entry folders past the first 192
once its flush thread has grown the table of descriptors, which a hit never grows itself."""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fresh_process import run_body

from kcache.store import Store, fs
from kcache.store import served as served_mod
from kcache.store.records import RECORD_NAME

GROUP = {
    "add_kernel.cubin": b"\x7fELF" + bytes(range(256)) * 3,
    "add_kernel.ptx": b"//\n.version 8.0\n" * 20,
    "add_kernel.json": b'{"name": "add_kernel", "num_warps": 4}',
}


def _entry(store: Store, key: str, *names: str) -> Path:
    return Path(store.disk.entry_dir(store.entry_id("triton", key)), *names)


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))


def _swap_in_another_record(store: Store, key: str, field: str) -> None:
    hit = store.get("triton", key, count=False)
    assert hit is not None
    rec = hit.record
    setattr(rec, field, "other" if field == "key" else "triton-aux")
    _entry(store, key, RECORD_NAME).write_bytes(rec.encode())


def _link_member_out(store: Store, key: str) -> None:
    p = _entry(store, key, "add_kernel.ptx")
    outside = Path(store.root).parent / "outside.ptx"
    outside.write_bytes(p.read_bytes())  # the same bytes: only the link is wrong
    p.unlink()
    p.symlink_to(outside)


TAMPERING: dict[str, Callable[[Store, str], None]] = {
    "flipped byte": lambda s, k: _flip(_entry(s, k, "add_kernel.cubin")),
    "truncated": lambda s, k: _entry(s, k, "add_kernel.ptx").write_bytes(b"//"),
    "grown": lambda s, k: _entry(s, k, "add_kernel.json").write_bytes(GROUP["add_kernel.json"] + b" "),
    "missing member": lambda s, k: _entry(s, k, "add_kernel.ptx").unlink(),
    "garbage record": lambda s, k: _entry(s, k, RECORD_NAME).write_bytes(b"KCR1" + os.urandom(60)),
    "torn record": lambda s, k: _entry(s, k, RECORD_NAME).write_bytes(
        _entry(s, k, RECORD_NAME).read_bytes()[:-5]
    ),
    "record of another key": lambda s, k: _swap_in_another_record(s, k, "key"),
    "record of another kind": lambda s, k: _swap_in_another_record(s, k, "kind"),
    "linked member": _link_member_out,
    "group-writable member": lambda s, k: os.chmod(_entry(s, k, "add_kernel.cubin"), 0o664),
    "member a folder": lambda s, k: (
        _entry(s, k, "add_kernel.json").unlink(),
        _entry(s, k, "add_kernel.json").mkdir(),
    ),
    "no record": lambda s, k: _entry(s, k, RECORD_NAME).unlink(),
    "no entry": lambda s, k: shutil.rmtree(_entry(s, k)),
}


def _outcome(
    tmp_path: Path, name: str, tamper: Callable[[Store, str], None], files: bool, warnings: list[str]
):
    root = tmp_path / f"{name.replace(' ', '-')}-{files}" / "store"
    s = Store.open(root)
    key = f"k-{files}"  # (warnings are said once per entry and process: one key each)
    assert s.put("triton", key, GROUP) is not None
    tamper(s, key)
    n = len(warnings)
    hit = s.get("triton", key, files=files)
    out = (
        hit is None,
        _entry(s, key).exists(),
        s.counts.process_totals()["triton"].get("errors", 0),
        [w.replace(str(root), "ROOT").replace(s.entry_id("triton", key)[:12], "ID") for w in warnings[n:]],
    )
    s.close()
    return out


@pytest.mark.parametrize("name", list(TAMPERING))
def test_a_tampered_entry_is_the_same_miss_with_files(tmp_path: Path, kcache_warnings, name: str) -> None:
    """Each tampering, in two stores: the lookup with files (the one-pass read) ends as the
    general read does: a miss, the entry removed or left alone alike, one error counted alike,
    the same warning."""
    with_files = _outcome(tmp_path, name, TAMPERING[name], True, kcache_warnings)
    without = _outcome(tmp_path, name, TAMPERING[name], False, kcache_warnings)
    assert with_files[0], f"{name}: served"
    assert with_files == without


def test_a_hit_with_files_serves_what_was_put(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", GROUP)
    other = Store.open(tmp_path / "store")  # a process that never saw the entry
    hit = other.get("triton", "k", files=True)
    assert hit is not None and hit._pin is not None
    assert {n: Path(p).read_bytes() for n, p in hit.paths.items()} == GROUP
    assert {n: hit.read(n) for n in GROUP} == GROUP
    assert other.counts.process_totals()["triton"]["hits"] == 1
    other.close()
    s.close()


def _fill(s: Store, n: int) -> None:
    for i in range(n):
        assert s.put("triton", f"k{i}", {"k.cubin": i.to_bytes(4, "big") * 8, "k.json": b"{}"}) is not None


def _growth_by_hand(served: served_mod.Served) -> tuple[list[int], Callable[[], None]]:
    """The sizes ``served`` asks its flush thread to grow the table to, and the growth itself,
    to be run by the test (the flush thread's turn then does nothing)."""
    asked: list[int] = []
    served.wake = lambda: asked.append(served._grow_to)
    real_grow = served.grow_table
    served.grow_table = lambda: None  # type: ignore[method-assign]
    return asked, real_grow


def test_holds_past_the_table_only_once_the_flush_thread_grew_it(tmp_path: Path) -> None:
    """A hit never grows the process's table of descriptors (a wait of milliseconds when the
    process has threads): past the table's size it gets private links, and the flush thread is
    asked to grow the table; once grown, hits hold entry folders numbered past it. (In a fresh
    process whose table holds 256: the numbers and the table's size are the process's, which the
    tests run before this one in the same worker may have filled.)"""
    run_body("test_hit_path", "_past_the_table_body", tmp_path)


def _past_the_table_body(tmp_path: Path) -> None:
    assert fs.fd_table_size() == 256
    s = Store.open(tmp_path / "store")
    _fill(s, 320)
    served = s.disk.served
    asked, real_grow = _growth_by_hand(served)
    first = [s.get("triton", f"k{i}", files=True) for i in range(250)]
    held = [h._pin for h in first if h._pin is not None]
    assert held and max(held) < 256, "a hit took a number past the table"
    assert fs.fd_table_size() == 256, "a hit grew the table"
    unheld = [i for i, h in enumerate(first) if h._pin is None]
    assert unheld and unheld == list(range(unheld[0], 250)), "private links from the table's end on"
    assert asked == [512]
    real_grow()  # what the flush thread does when asked
    more = [s.get("triton", f"k{i}", files=True) for i in range(250, 320)]
    assert all(h._pin is not None for h in more)
    assert max(h._pin for h in more) >= 256
    for i, h in enumerate(first + more):
        assert Path(h.paths["k.cubin"]).read_bytes() == i.to_bytes(4, "big") * 8
    s.close()


def test_a_first_hit_does_not_grow_a_new_process_table(tmp_path: Path) -> None:
    """A process started by a parent with only its first descriptors open has a table of 64
    (the kernel's smallest: on the H100 machine a served torch.compile process's first hit held
    descriptor 64 and waited 12.9 ms for the table to grow; kcache took the table to hold 256).
    The size is read from the kernel: the first hit gets private links, the flush thread is
    asked to grow the table, and the hits after it hold entry folders."""
    run_body("test_hit_path", "_small_table_body", tmp_path, small_table=True)


def _small_table_body(tmp_path: Path) -> None:
    size = fs.fd_table_size()
    assert size is not None and size <= served_mod.PIN_FIRST, f"a new process's table holds {size}"
    s = Store.open(tmp_path / "store")
    _fill(s, 8)
    served = s.disk.served
    asked, real_grow = _growth_by_hand(served)
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()  # threads, as torch has
    first = s.get("triton", "k0", files=True)
    assert first is not None and Path(first.paths["k.cubin"]).read_bytes() == (0).to_bytes(4, "big") * 8
    assert fs.fd_table_size() == size, "the hit grew the table"
    assert first._pin is None and asked, "private links, and the table to be grown elsewhere"
    real_grow()  # what the flush thread does when asked
    assert fs.fd_table_size() > size
    later = [s.get("triton", f"k{i}", files=True) for i in range(1, 8)]
    assert all(h is not None and h._pin is not None for h in later)
    s.close()


def test_the_flush_thread_grows_the_table_when_asked(tmp_path: Path) -> None:
    """Without a hand in between: past the first holds, the flush thread grows the table
    (bounded wait for its turn), and later hits hold folders past 256 (a fresh process whose
    table holds 256, as above)."""
    run_body("test_hit_path", "_grown_when_asked_body", tmp_path)


def _grown_when_asked_body(tmp_path: Path) -> None:
    assert fs.fd_table_size() == 256
    s = Store.open(tmp_path / "store")
    _fill(s, 330)
    served = s.disk.served
    for i in range(250):
        assert s.get("triton", f"k{i}", files=True) is not None
    for _ in range(200):  # the thread's turn comes within a second or so; a loaded box: longer
        if served._table > 256:
            break
        s.disk.catalogue.wake()
        time.sleep(0.05)
    assert served._table > 256
    assert fs.fd_table_size() > 256
    hits = [s.get("triton", f"k{i}", files=True) for i in range(250, 330)]
    assert all(h._pin is not None for h in hits)
    s.close()


@pytest.mark.parametrize(
    ("soft", "stop"),
    [(256, 128), (512, 256), (1024, 256), (2048, 512), (20000, 896), (1 << 30, 896)],
)
def test_held_numbers_stay_within_a_share_of_the_descriptor_limit(
    tmp_path: Path, monkeypatch, soft: int, stop: int
) -> None:
    """Never more of the limit than before (numbers under 256 where the limit is 512 or more),
    at most a quarter of it past that: the program keeps the rest; and never near select()'s
    FD_SETSIZE (1024), however high the limit: the program's own descriptors are numbered past
    the held ones, and one past 1024 makes select.select raise (review m6)."""
    s = Store.open(tmp_path / "store")
    real = os.sysconf
    monkeypatch.setattr(served_mod.os, "sysconf", lambda n: soft if n == "SC_OPEN_MAX" else real(n))
    served = s.disk.served
    with served._lock:
        served._pins_allowed()
    monkeypatch.undo()
    assert served._pin_stop == stop
    s.close()


def test_a_read_only_store_holds_nothing_and_serves(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", GROUP)
    s.close()
    ro = Store.open(tmp_path / "store", readonly=True)
    hit = ro.get("triton", "k", files=True)
    assert hit is not None and hit._pin is None
    assert {n: Path(p).read_bytes() for n, p in hit.paths.items()} == GROUP
    assert stat.S_ISREG(os.stat(hit.paths["add_kernel.cubin"]).st_mode)
    ro.close()
