"""The local store (issue 7, point 4): round trips, integrity, the index as a trust boundary,
eviction, counters, concurrency, failure modes and the safety checks on the store directory.

Each test fails when the behaviour it names breaks: corrupt entries must be misses (never
served), hostile index rows must be refused without running or touching anything, and every
failure must degrade to a miss or a skipped write without raising.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcache.maintenance.stats import store_stats
from kcache.store import Store, StoreError, fs, tunables
from kcache.store import opening as store_local
from kcache.store.index import DB_NAME, Index
from kcache.store.records import RECORD_NAME, FileInfo, Record, crc32, valid_name
from kcache.store.safety import fs_type, is_network_fs

PYTHON = sys.executable

# A group shaped like one of Triton's: several files, a few KB in all, Triton's names.
TRITON_GROUP = {
    "add_kernel.ttir": b"module { tt.func @add_kernel() }\n" * 20,
    "add_kernel.ttgir": b"#blocked = #ttg.blocked<{}>\n" * 30,
    "add_kernel.llir": b"define void @add_kernel() {}\n" * 40,
    "add_kernel.ptx": b".version 8.4\n.target sm_90a\n" * 30,
    "add_kernel.cubin": bytes(range(256)) * 6,
    "add_kernel.json": b'{"name": "add_kernel", "num_warps": 4}',
    "__grp__add_kernel.json": b'{"child_paths": {"add_kernel.cubin": "add_kernel.cubin"}}',
    "__triton_launcher.cpython-311-x86_64-linux-gnu.so": b"\x7fELF" + b"\0" * 512,
}


def read_all(hit) -> dict[str, bytes]:
    """A hit's members, read twice independently: the verified bytes it holds and the files its
    paths name (what Triton opens). The two must agree."""
    held = {name: hit.read(name) for name in hit.names}
    on_disk = {name: Path(p).read_bytes() for name, p in hit.paths.items()}
    assert held == on_disk, "a hit's files differ from its verified bytes"
    return held


def entry_path(store: Store, h, name: str | None = None) -> str:
    """The entry's own folder (or a member in it): what a hit reads, not the served copy."""
    d = store.entry_dir(h.record.id)
    return d if name is None else os.path.join(d, name)


def backdate(store: Store, ident: str, seconds_ago: float) -> None:
    """Make an entry look last used ``seconds_ago``: its record's mtime and its index row."""
    t = time.time() - seconds_ago
    os.utime(os.path.join(store.entry_dir(ident), RECORD_NAME), (t, t))
    store.flush(force=True)  # a put's row is written by the flush thread: written now
    with store.disk.catalogue._index_lock:
        cur = store.index().conn.execute("UPDATE entries SET last_used = ? WHERE id = ?", (t, ident))
    assert cur.rowcount == 1, ident


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and directory under root with its kind, size, mode and mtime (ns)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            out[os.path.relpath(p, root)] = (
                stat.S_IFMT(st_.st_mode),
                st_.st_size,
                st_.st_mode,
                st_.st_mtime_ns,
            )
    return out


def run_py(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


# ---------------------------------------------------------------------------------------- round trips
VALUES = {
    "bytes": {"a.bin": b"hello kcache"},
    "bytearray": {"a.bin": bytearray(b"\x00\x01\x02")},
    "memoryview": {"a.bin": memoryview(b"view of bytes")},
    "empty": {"empty.cubin": b""},
    "large_2mb": {"big.cubin": os.urandom(2 * 1024 * 1024)},
    "many_members": {f"m{i:03d}.json": f'{{"i": {i}}}'.encode() * (i + 1) for i in range(200)},
    "triton_group": TRITON_GROUP,
    "dotted_names": {
        "k.cubin": b"c",
        "k.json": b"{}",
        "__grp__x.json": b"{}",
        "__triton_launcher.cpython-311-x86_64-linux-gnu.so": b"\x7fELF",
        "fn.autotune.json": b"[]",
        "a-b_c+d=e@f,g.ptx": b".ptx",
    },
}


@pytest.mark.parametrize("case", sorted(VALUES))
def test_round_trip(store: Store, case: str) -> None:
    files = VALUES[case]
    expected = {k: bytes(v) for k, v in files.items()}
    put = store.put("triton", f"key-{case}", files, summary={"name": case}, compile_s=0.5)
    assert put is not None
    assert read_all(put) == expected

    hit = store.get("triton", f"key-{case}")
    assert hit is not None
    assert read_all(hit) == expected
    assert hit.record.kind == "triton" and hit.record.key == f"key-{case}"
    assert hit.record.summary == {"name": case}
    assert hit.record.size == sum(len(v) for v in expected.values())
    for name, path in hit.paths.items():
        # Triton reads an artifact's type from the path's suffix: real files, names kept.
        assert os.path.basename(path) == name
        assert os.path.isfile(path) and not os.path.islink(path)
        # and reached through the store's pinned folder, not by the store's path name
        assert path.startswith("/proc/self/fd/")
    # A fresh Store instance (another process) sees the same entry.
    other = Store.open(store.root)
    assert read_all(other.get("triton", f"key-{case}")) == expected
    other.close()


@pytest.mark.parametrize("link_works", [True, False], ids=["linked", "copied"])
def test_round_trip_path_source(store: Store, tmp_path: Path, monkeypatch, link_works: bool) -> None:
    src = tmp_path / "src" / "k.cubin"
    src.parent.mkdir()
    data = os.urandom(70_000)
    src.write_bytes(data)
    other = tmp_path / "src" / "k.json"
    other.write_text('{"a": 1}')
    if not link_works:

        def no_link(*a, **k):
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(store_local.os, "link", no_link)
    h = store.put("triton", "pathsrc", {"k.cubin": src, "k.json": str(other), "k.ptx": b"ptx"})
    assert h is not None
    assert read_all(store.get("triton", "pathsrc")) == {
        "k.cubin": data,
        "k.json": b'{"a": 1}',
        "k.ptx": b"ptx",
    }
    assert src.read_bytes() == data  # the source is left alone
    assert os.path.realpath(h.paths["k.cubin"]).startswith(str(store.root))
    assert Path(entry_path(store, h, "k.cubin")).read_bytes() == data
    # If the caller later rewrites its source in place (a hard link shares it), the entry must be a
    # miss rather than serve bytes that do not match its record.
    with open(src, "r+b") as f:
        f.write(b"\xff" * 16)
    h2 = store.get("triton", "pathsrc")
    assert h2 is None or read_all(h2)["k.cubin"] == data


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.dictionaries(
        st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.+=@,-]{0,30}", fullmatch=True).filter(valid_name),
        st.binary(max_size=3000),
        min_size=1,
        max_size=8,
    ),
    key=st.text(min_size=0, max_size=60),
)
def test_round_trip_property(store: Store, files: dict[str, bytes], key: str) -> None:
    # A key no earlier example used (entries are immutable: a reused key keeps its first value).
    key = f"{os.urandom(8).hex()}/{key}"
    h = store.put("prop", key, files)
    assert h is not None
    assert read_all(h) == files
    hit = store.get("prop", key)
    assert hit is not None and hit.record.key == key
    assert read_all(hit) == files
    assert {f.name: Path(entry_path(store, hit, f.name)).read_bytes() for f in hit.record.files} == files


def test_miss_and_key_tag(store_dir: Path) -> None:
    a = Store.open(store_dir)
    assert a.get("triton", "nothing") is None
    a.put("triton", "k", {"a.bin": b"1"})
    tagged = Store.open(store_dir, key_tag="salt")
    assert tagged.get("triton", "k") is None  # the tag breaks the cache on purpose
    assert a.get("triton-autotune", "k") is None  # kinds do not share entries
    assert a.get("triton", "k") is not None
    a.close()
    tagged.close()


# ---------------------------------------------------------------------------------- integrity
def _put(store: Store, key: str = "k", files=None):
    h = store.put("triton", key, files or TRITON_GROUP)
    assert h is not None
    return h


def _assert_quarantined(store: Store, h, kcache_warnings) -> None:
    assert store.get("triton", h.record.key) is None
    assert not os.path.exists(entry_path(store, h)), "a corrupt entry is removed"
    assert h.record.id not in store.index().ids(), "and so is its index row"
    assert store.counts.process_totals()["triton"]["errors"] == 1
    assert len([m for m in kcache_warnings if "corrupt" in m]) == 1
    # The key can be stored again.
    assert store.put("triton", h.record.key, TRITON_GROUP) is not None
    assert read_all(store.get("triton", h.record.key)) == TRITON_GROUP


def test_missing_member_is_a_miss(store: Store, kcache_warnings) -> None:
    h = _put(store)
    os.unlink(entry_path(store, h, "add_kernel.cubin"))
    _assert_quarantined(store, h, kcache_warnings)


def test_flipped_byte_is_a_miss(store: Store, kcache_warnings) -> None:
    h = _put(store)
    p = entry_path(store, h, "add_kernel.ptx")
    data = bytearray(Path(p).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(p).write_bytes(bytes(data))
    _assert_quarantined(store, h, kcache_warnings)


@pytest.mark.parametrize("change", ["truncated", "grown", "emptied"])
def test_resized_member_is_a_miss(store: Store, kcache_warnings, change: str) -> None:
    h = _put(store)
    p = entry_path(store, h, "add_kernel.llir")
    data = Path(p).read_bytes()
    Path(p).write_bytes({"truncated": data[: len(data) // 2], "grown": data + b"\0", "emptied": b""}[change])
    _assert_quarantined(store, h, kcache_warnings)


@pytest.mark.parametrize(
    "garbage",
    [b"", b"KCR1", b"garbage" * 50, os.urandom(300), "torn"],
    ids=["empty", "header-only", "text", "random", "torn"],
)
def test_garbage_record_is_a_miss(store: Store, kcache_warnings, garbage) -> None:
    h = _put(store)
    rec = entry_path(store, h, RECORD_NAME)
    if garbage == "torn":
        garbage = Path(rec).read_bytes()[:-7]
    Path(rec).write_bytes(garbage)
    _assert_quarantined(store, h, kcache_warnings)


def test_record_of_another_schema_is_a_miss(store: Store, kcache_warnings) -> None:
    h = _put(store)
    rec = h.record
    rec.schema = 2
    Path(entry_path(store, h, RECORD_NAME)).write_bytes(rec.encode())
    _assert_quarantined(store, h, kcache_warnings)


def test_symlinked_member_is_refused(store: Store, tmp_path: Path, kcache_warnings) -> None:
    h = _put(store)
    p = entry_path(store, h, "add_kernel.cubin")
    outside = tmp_path / "outside.cubin"
    outside.write_bytes(Path(p).read_bytes())  # same bytes, same checksum: only the link is wrong
    os.unlink(p)
    os.symlink(outside, p)
    _assert_quarantined(store, h, kcache_warnings)
    assert outside.exists()


def test_symlinked_record_and_entry_dir_are_refused(store: Store, tmp_path: Path) -> None:
    h = _put(store, "a")
    rec = entry_path(store, h, RECORD_NAME)
    elsewhere = tmp_path / "rec"
    shutil.copyfile(rec, elsewhere)
    os.unlink(rec)
    os.symlink(elsewhere, rec)
    assert store.get("triton", "a") is None

    h2 = _put(store, "b")
    real = tmp_path / "realdir"
    shutil.copytree(entry_path(store, h2), real)
    shutil.rmtree(entry_path(store, h2))
    os.symlink(real, entry_path(store, h2))
    assert store.get("triton", "b") is None
    assert real.exists() and (real / RECORD_NAME).exists(), "nothing outside the store is removed"


@pytest.mark.parametrize("field", ["id", "key", "kind"])
def test_record_not_matching_its_dir_is_refused(store: Store, field: str) -> None:
    a = _put(store, "a")
    b = _put(store, "b", {"x.bin": b"b"})
    if field == "id":
        # Entry a's files and record moved into b's directory: a valid entry, in the wrong place.
        shutil.rmtree(entry_path(store, b))
        shutil.copytree(entry_path(store, a), entry_path(store, b))
        assert store.get("triton", "b") is None
        assert store.get("triton", "a") is not None
        return
    rec = b.record
    setattr(rec, field, "other" if field == "key" else "triton-aux")
    Path(entry_path(store, b, RECORD_NAME)).write_bytes(rec.encode())  # same id, another key or kind
    assert store.get("triton", "b") is None


@pytest.mark.parametrize(
    "name", ["../x", "/etc/passwd", "a/b", "", ".", "..", ".hidden", RECORD_NAME, "a\0b"]
)
def test_escaping_member_name_rejected_at_put(
    store: Store, tmp_path: Path, name: str, kcache_warnings
) -> None:
    before = set(os.listdir(tmp_path))
    assert store.put("triton", "bad", {"ok.bin": b"1", name: b"evil"}) is None
    assert store.get("triton", "bad") is None
    assert set(os.listdir(tmp_path)) == before
    assert os.listdir(store.tmp) == []
    assert not os.path.exists(tmp_path / "x")
    assert any("invalid member name" in m for m in kcache_warnings)


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/hostname", "sub/inner.bin", ".."])
def test_escaping_member_name_in_crafted_record(store: Store, name: str) -> None:
    h = _put(store, "k", {"a.bin": b"a"})
    # Make the crafted member's target exist with matching size and checksum, so that only the
    # name check stands between the record and a file outside the entry.
    if name == "/etc/hostname":
        if not os.path.isfile(name):
            pytest.skip("no /etc/hostname")
        target = name
    elif name == "..":
        target = None
    else:
        target = os.path.normpath(os.path.join(entry_path(store, h), name))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).write_bytes(b"secret")
    data = Path(target).read_bytes() if target else b""
    rec = h.record
    rec.files.append(FileInfo(name, len(data), crc32(data), ""))
    Path(entry_path(store, h, RECORD_NAME)).write_bytes(rec.encode())
    assert store.get("triton", "k") is None
    if target and name != "/etc/hostname" and not target.startswith(entry_path(store, h) + os.sep):
        assert os.path.exists(target), "a file outside the entry is never removed"


# ----------------------------------------------------------------------- the index as trust boundary
def _pickle_payload(marker: Path) -> bytes:
    """Protocol-0 pickle bytes (written out by hand, no pickle import) that create ``marker``
    when unpickled: ``builtins.open(marker, 'w')``."""
    assert "'" not in str(marker) and "\n" not in str(marker)
    return f"cbuiltins\nopen\n(S'{marker}'\nS'w'\ntR.".encode()


_INSERT = (
    "INSERT INTO entries (id, kind, size, created, last_used, hits, record) VALUES (?, ?, ?, 0, 0, 0, ?)"
)


def test_pickle_payload_control(tmp_path: Path) -> None:
    """The control: the payload the tests below plant really runs code when unpickled. Without
    this the refusal tests would prove nothing. (pickle is imported here, in the test only.)"""
    import pickle

    marker = tmp_path / "MARKER"
    pickle.loads(_pickle_payload(marker))  # noqa: S301
    assert marker.exists()


def test_crafted_rows_are_refused_and_never_run(store: Store, tmp_path: Path) -> None:
    """Rows kcache did not write (a pickle where a record goes, a record that belongs to another
    id, an id that is a path, a number where text goes) are reported as bad rows by every reader;
    nothing in them is run, opened or deleted."""
    marker_v = tmp_path / "MARKER_VALUE"
    marker_k = tmp_path / "MARKER_KEY"
    victim_dir = tmp_path / "victimdir"
    victim_dir.mkdir()
    (victim_dir / "f").write_text("precious")
    good = _put(store, "good")
    other = _put(store, "other", {"o.bin": b"o"})
    idx = store.index()
    escape = os.path.relpath(victim_dir, store.root / "entries" / "xx")
    rows = [
        ("e" * 40, "triton", 100, _pickle_payload(marker_v)),  # a pickle where the record goes
        (_pickle_payload(marker_k).decode(), "triton", 100, b"x"),  # an id that is a pickle
        (escape, "triton", 100, other.record.encode()),  # an id that names a folder outside
        ("f" * 40, "triton", 100, other.record.encode()),  # another entry's record
        (12345, "triton", 100, b"x"),  # not text at all
    ]
    for r in rows:
        idx.conn.execute(_INSERT, r)
    idx.conn.execute(
        "UPDATE entries SET record = ? WHERE id = ?", (_pickle_payload(marker_v), good.record.id)
    )
    got = {r.id: r for r in idx.rows()}
    bad = [r for r in got.values() if r.error]
    assert len(bad) == 6 and all(r.record is None for r in bad)
    assert got[other.record.id].record == other.record  # good rows still decode
    # Everything kcache does with the index goes on working around the bad rows.
    assert store.get("triton", "good") is not None  # hits do not read the index
    store.flush(force=True)
    store_stats(store)
    idx.totals()
    idx.ids()
    store.evict(target=0)
    store.remove([escape, "e" * 40])
    store.close()
    reopened = Store.open(store.root)
    reopened.put("triton", "after", {"a.bin": b"a"})
    list(reopened.index().rows())
    reopened.close()
    assert not marker_v.exists() and not marker_k.exists()
    assert (victim_dir / "f").read_text() == "precious"


def test_a_database_of_another_program_is_not_an_index(store: Store, kcache_warnings) -> None:
    """A SQLite file kcache did not make (other tables, no schema row) is replaced, not used."""
    import sqlite3

    store.put("triton", "k", {"a.bin": b"a"})
    store.close()
    db = store.root / "index" / "kcache.sqlite"
    for extra in ("-wal", "-shm"):
        Path(str(db) + extra).unlink(missing_ok=True)
    db.unlink()
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE Cache (key BLOB, value BLOB)")
    con.execute("INSERT INTO Cache VALUES ('k', 'v')")
    con.commit()
    con.close()
    s = Store.open(store.root)
    assert s.get("triton", "k") is not None
    s.flush(force=True)
    assert s.index().ids() == {s.entry_id("triton", "k")}, "rebuilt from the entries"
    assert any("corrupt" in m for m in kcache_warnings)
    s.close()


def test_old_diskcache_index_is_superseded(store_dir: Path) -> None:
    """kcache 0.1 kept its index in diskcache's cache.db: the new index is built from the entries
    and the old files are removed (entries themselves are unchanged)."""
    s = Store.open(store_dir)
    s.put("triton", "k", {"a.bin": b"a"})
    s.close()
    for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
        (store_dir / "index" / name).write_bytes(b"old")
    for name in ("kcache.sqlite", "kcache.sqlite-wal", "kcache.sqlite-shm"):
        (store_dir / "index" / name).unlink(missing_ok=True)
    s = Store.open(store_dir)
    assert s.index().ids() == {s.entry_id("triton", "k")}
    assert not (store_dir / "index" / "cache.db").exists()
    s.close()


# ---------------------------------------------------------------------------------------- eviction
def _entry_disk(s: Store, ident: str) -> int:
    """What an entry counts for against the bound: its folder's blocks and its files', as du
    counts them (a 1,000-byte member takes 4 KiB, and so do the record and the folder)."""
    d = Path(s.entry_dir(ident))
    return sum(os.lstat(p).st_blocks * 512 for p in [d, *d.iterdir()])


def test_eviction_keeps_the_store_under_the_bound(store_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(tunables, "GRACE_S", 0.0)
    s = Store.open(store_dir, max_size=1 << 30)
    one = _entry_disk(s, s.put("triton", "first", {"a.bin": os.urandom(1000)}).record.id)
    s.flush(force=True)  # the index as it will be (its size is part of what the bound counts)
    # The bound is on the whole folder: room for about 30 entries beside the index and folders
    # as they are now (fewer stay: the index grows with them, and each shard is a folder).
    max_size = s.disk.evictor.measure().total + 30 * one
    s.max_size = max_size
    ids = []
    for i in range(60):
        h = s.put("triton", f"k{i}", {"a.bin": os.urandom(1000)})
        assert h is not None
        ids.append(h.record.id)
        time.sleep(0.002)  # distinct last-use times
        s.evict()  # the store also evicts on its own; here after every put to check the bound
        assert s.disk.evictor.usage.total() + s.disk.evictor.measure().total <= max_size
        assert s.index().total_bytes() <= max_size
    on_disk = sum(
        len(Path(p).read_bytes()) for i in s.iter_entry_ids() for p in s.read_any(i)[0].paths.values()
    )
    assert on_disk <= max_size
    assert on_disk == s.index().total_bytes()
    assert set(s.iter_entry_ids()) == s.index().ids()
    survivors = [i for i in ids if os.path.exists(s.entry_dir(i))]
    assert survivors == ids[-len(survivors) :], "the most recently used survive, in order"
    assert 3 <= len(survivors) <= 30
    s.flush(force=True)
    assert s.index().counters()["store"]["evictions"] == 61 - len(survivors)
    s.close()


def test_eviction_runs_on_put_without_being_asked(store_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(tunables, "GRACE_S", 0.0)
    s = Store.open(store_dir, max_size=1 << 30)
    one = _entry_disk(s, s.put("triton", "first", {"a.bin": os.urandom(1000)}).record.id)
    s.flush(force=True)
    # Room for about 40 entries beside the index and folders as they are now: fewer stay (the
    # index grows with its rows and its log, up to 128 KiB, and each shard is a 4 KiB folder).
    s.max_size = bound = s.disk.evictor.measure().total + 40 * one
    for i in range(40):
        assert s.put("triton", f"k{i}", {"a.bin": os.urandom(1000)}) is not None
    # Eviction is the flush thread's work (off the compiling thread's path): it happens soon, and
    # its rows leave the index at a later flush (a forced one here may find the index busy with
    # the thread's own write on a loaded box, and leave the rows for the next: waited for too).
    # (What is checked is the state seen at one moment: the flush thread keeps writing the
    # index's log meanwhile, so a second measure a moment later may see the log grown past the
    # bound again until its next turn evicts: CI saw that once.)
    ev = s.disk.evictor
    deadline = time.monotonic() + 30
    seen = None
    while time.monotonic() < deadline:
        n = len(list(s.iter_entry_ids()))
        on_disk = ev.usage.total() + ev.measure().total
        seen = (n, on_disk, None)
        if n < 40 and on_disk <= bound:
            s.flush(force=True)
            indexed = s.index().total_bytes()
            seen = (n, on_disk, indexed)
            if indexed <= n * 1000:
                break
        time.sleep(0.05)
    else:
        raise AssertionError(f"(entries, bytes on disk, indexed bytes) {seen}, bound {bound}")
    assert s.get("triton", "k39") is not None
    s.close()


def test_eviction_is_least_recently_used(store_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(tunables, "GRACE_S", 0.0)
    s = Store.open(store_dir, max_size=1 << 30)
    for i in range(10):
        s.put("triton", f"k{i}", {"a.bin": b"x" * 1000})
        time.sleep(0.002)
    time.sleep(0.01)
    assert s.get("triton", "k0") is not None  # used last: must survive
    one = _entry_disk(s, s.entry_id("triton", "k0"))
    s.evict(target=5 * one)  # the committed entries down to five entries' blocks
    alive = {i for i in range(10) if s.get("triton", f"k{i}", count=False) is not None}
    assert 0 in alive and 1 not in alive and 9 in alive
    s.close()


def test_an_entry_hit_by_another_process_is_evicted_last(store_dir: Path) -> None:
    """Another process hits k3 and has not flushed its last use to the index yet: the hit
    refreshed the record's mtime (the filesystem's clock), which eviction reads, so k3 goes
    last. (There is no grace period: what the reader was handed is a private link.)"""
    writer = Store.open(store_dir, max_size=1 << 30)
    ids = [writer.put("triton", f"k{i}", {"a.bin": b"x" * 1000}).record.id for i in range(10)]
    for n, i in enumerate(ids):
        backdate(writer, i, 3600 - n)  # all long unused
    reader = Store.open(store_dir)
    hit = reader.get("triton", "k3", files=True)
    assert hit is not None
    assert writer.index().row(ids[3]) is not None
    one = writer.disk.evictor.usage.total() // 10 + 1  # room for one entry
    removed, _ = writer.evict(target=one)
    assert removed == 9
    assert writer.get("triton", "k3", count=False) is not None
    assert all(writer.get("triton", f"k{i}", count=False) is None for i in range(10) if i != 3)
    # Evicted too, and its reader still reads what it was handed.
    assert writer.evict(target=0)[0] == 1
    assert writer.get("triton", "k3", count=False) is None
    assert Path(hit.paths["a.bin"]).read_bytes() == b"x" * 1000
    reader.close()
    writer.close()


def test_protected_entries_survive_until_their_first_hit(store_dir: Path, monkeypatch) -> None:
    s = Store.open(store_dir, max_size=1 << 30)
    p = s.put("triton", "prewarmed", {"a.bin": b"p" * 1000}, protect_s=3600).record.id
    others = [s.put("triton", f"k{i}", {"a.bin": b"x" * 1000}).record.id for i in range(5)]
    for i in others:
        backdate(s, i, 7200)
    assert s.evict(target=0)[0] == 5
    assert s.get("triton", "prewarmed", count=False) is not None
    # Even with no grace period at all, the protection holds until the entry is used.
    monkeypatch.setattr(tunables, "GRACE_S", 0.0)
    assert s.evict(target=0)[0] == 0
    assert s.get("triton", "prewarmed") is not None  # the first hit ends the protection
    time.sleep(0.01)
    assert os.path.getmtime(os.path.join(s.entry_dir(p), RECORD_NAME)) <= time.time()
    assert s.evict(target=0)[0] == 1
    assert s.get("triton", "prewarmed") is None
    s.close()


# ---------------------------------------------------------------------------------------- counters
def test_counters_persist_across_instances(store_dir: Path) -> None:
    a = Store.open(store_dir)
    a.put("triton", "k", {"a.bin": b"a"}, compile_s=1.5)
    a.put("nvfuser", "n", {"n.bin": b"n"}, compile_s=0.25)
    assert a.get("triton", "k") is not None
    assert a.get("triton", "k") is not None
    assert a.get("nvfuser", "n") is not None
    assert a.get("triton", "nope") is None
    bad = a.put("triton", "bad", {"b.bin": b"b"})
    Path(entry_path(a, bad, "b.bin")).write_bytes(b"B")
    assert a.get("triton", "bad") is None
    a.flush(force=True)
    a.close()

    b = Store.open(store_dir)
    c = b.index().counters()
    assert c["triton"]["hits"] == 2
    assert c["triton"]["misses"] == 2  # the unknown key and the corrupt entry
    assert c["triton"]["puts"] == 2
    assert c["triton"]["errors"] == 1
    assert c["triton"]["saved_s"] == pytest.approx(3.0)
    assert c["triton"]["bytes_written"] == 2
    assert c["nvfuser"]["saved_s"] == pytest.approx(0.25)
    assert b.get("triton", "k") is not None
    b.close()  # close flushes

    s = Store.open(store_dir)
    st_ = store_stats(s)
    assert st_["hits"] == 4 and st_["by_kind"]["triton"]["hits"] == 3
    assert st_["misses"] == 2
    assert st_["saved_s"] == pytest.approx(4.75)
    assert st_["entries"] == 2 and st_["by_kind"]["triton"]["entries"] == 1
    assert st_["hit_rate"] == pytest.approx(4 / 6)
    s.close()


def test_counters_are_kept_when_the_index_is_busy(store_dir: Path, monkeypatch) -> None:
    s = Store.open(store_dir)
    s.put("triton", "k", {"a.bin": b"a"})
    s.flush(force=True)
    real = s.disk.catalogue.call

    def busy(fn):
        s.disk.catalogue._index_off_until = time.monotonic() + 30
        return None

    monkeypatch.setattr(s.disk.catalogue, "call", busy)
    assert s.get("triton", "k") is not None
    s.flush(force=True)  # fails: the counts must come back for the next flush
    monkeypatch.setattr(s.disk.catalogue, "call", real)
    s.disk.catalogue._index_off_until = 0.0
    s.flush(force=True)
    assert s.index().counters()["triton"]["hits"] == 1
    s.close()


def test_hits_do_not_write_the_index(store: Store) -> None:
    store.put("triton", "k", {"a.bin": b"a"})
    store.flush(force=True)
    db = store.index_dir / "kcache.sqlite"
    before = (db.stat().st_mtime_ns, (store.index_dir / "kcache.sqlite-wal").stat().st_size)
    for _ in range(50):
        assert store.get("triton", "k") is not None
    after = (db.stat().st_mtime_ns, (store.index_dir / "kcache.sqlite-wal").stat().st_size)
    assert before == after, "hits are batched, not one write each"
    store.flush(force=True)
    assert store.index().counters()["triton"]["hits"] == 50


# ------------------------------------------------------------------------------------- concurrency
WORKER = textwrap.dedent(
    """
    import hashlib, json, sys, time
    from kcache.store import Store
    root, wid, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

    def content(key):
        h = hashlib.sha256(key.encode()).digest()
        return {
            "k.ttir": h * 40,
            "k.cubin": h[::-1] * 100,
            "k.json": json.dumps({"key": key}).encode(),
            "__grp__k.json": key.encode() * 3,
        }

    s = Store.open(root, max_size=1 << 30)
    keys = [f"shared-{j}" for j in range(30)] + [f"own-{wid}-{j}" for j in range(20)]
    while time.time() < start:
        time.sleep(0.001)
    bad = 0
    for rnd in range(3):
        for key in keys if (wid + rnd) % 2 else reversed(keys):
            h = s.get("triton", key)
            if h is None:
                h = s.put("triton", key, content(key), compile_s=0.1)
            if h is None or {n: open(p, "rb").read() for n, p in h.paths.items()} != content(key):
                bad += 1
    s.close()
    print(json.dumps({"bad": bad, "counts": s.counts.process_totals()}))
    """
)


def test_concurrent_processes(tmp_path: Path, clean_env) -> None:
    root = tmp_path / "shared"
    Store.open(root).close()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    start = time.time() + 1.5
    n = 4
    procs = [
        subprocess.Popen(
            [PYTHON, str(script), str(root), str(w), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env,
        )
        for w in range(n)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        # no warnings: nothing failed, nothing was corrupt (the index being busy for a moment
        # under four writers is said once, and is not a failure)
        assert [ln for ln in err.splitlines() if "kcache" in ln and "index" not in ln] == [], err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["bad"] == 0 for r in results)
    assert all(r["counts"]["triton"].get("errors", 0) == 0 for r in results)
    puts = sum(r["counts"]["triton"].get("puts", 0) for r in results)
    distinct = 30 + 20 * n
    assert puts == distinct, "a racing second writer gets the first one's entry, not a second put"

    s = Store.open(root)
    assert len(list(s.iter_entry_ids())) == distinct
    assert s.index().ids() == set(s.iter_entry_ids())
    assert os.listdir(s.tmp) == [], "every writer cleaned up after itself"
    for key in [f"shared-{j}" for j in range(30)] + [f"own-{w}-{j}" for w in range(n) for j in range(20)]:
        assert s.get("triton", key) is not None
    c = s.index().counters()["triton"]
    assert c["hits"] + c["misses"] == n * 50 * 3
    s.close()


def test_two_writers_of_one_entry_first_commit_wins(store_dir: Path) -> None:
    a = Store.open(store_dir)
    b = Store.open(store_dir)
    first = a.put("triton", "same", {"k.cubin": b"first"})
    second = b.put("triton", "same", {"k.cubin": b"second", "k.json": b"{}"})
    assert first is not None and second is not None
    assert read_all(second) == {"k.cubin": b"first"}
    assert second.record == first.record
    assert read_all(a.get("triton", "same")) == {"k.cubin": b"first"}
    a.close()
    b.close()
    assert os.listdir(a.tmp) == [] and os.listdir(a.trash) == []


def test_writer_replaces_a_broken_entry(store: Store) -> None:
    h = store.put("triton", "k", {"k.cubin": b"old"})
    Path(entry_path(store, h, RECORD_NAME)).write_bytes(b"junk")
    new = store.put("triton", "k", {"k.cubin": b"new"})
    assert new is not None and read_all(new) == {"k.cubin": b"new"}
    assert read_all(store.get("triton", "k")) == {"k.cubin": b"new"}


# ------------------------------------------------------------------------------ failure modes
def test_index_deleted(store_dir: Path) -> None:
    s = Store.open(store_dir)
    s.put("triton", "k", {"a.bin": b"a"})
    s.close()
    shutil.rmtree(store_dir / "index")
    s = Store.open(store_dir)
    assert s.get("triton", "k") is not None  # hits never use the index
    s.put("triton", "k2", {"a.bin": b"b"})
    s.flush(force=True)  # (the flush thread would, within a second)
    assert (store_dir / "index" / "kcache.sqlite").exists()
    s.flush(force=True)
    assert s.index().ids() == {s.entry_id("triton", "k"), s.entry_id("triton", "k2")}
    s.close()


@pytest.mark.parametrize("garbage", [b"this is not a database" * 100, b""], ids=["garbage", "empty-wal"])
def test_index_replaced_with_garbage(store_dir: Path, kcache_warnings, garbage: bytes) -> None:
    s = Store.open(store_dir)
    s.put("triton", "k", {"a.bin": b"a"})
    s.close()
    db = store_dir / "index" / "kcache.sqlite"
    for extra in ("kcache.sqlite-wal", "kcache.sqlite-shm"):
        (store_dir / "index" / extra).unlink(missing_ok=True)
    db.write_bytes(garbage or os.urandom(8192))
    s = Store.open(store_dir)
    assert s.get("triton", "k") is not None
    assert s.put("triton", "k2", {"a.bin": b"b"}) is not None
    assert s.get("triton", "k2") is not None
    s.flush(force=True)
    assert s.entry_id("triton", "k2") in s.index().ids()
    s.put("triton", "k3", {"a.bin": b"c"})
    s.close()
    s = Store.open(store_dir)
    s.put("triton", "k4", {"a.bin": b"d"})
    assert len(s.index().ids()) >= 3
    s.close()
    warnings = [m for m in kcache_warnings if "index" in m]
    assert len(warnings) == 1, kcache_warnings
    assert not any(p.name.startswith("index.corrupt") for p in store_dir.iterdir())


def test_readonly_store_never_writes(store_dir: Path, tmp_path: Path) -> None:
    s = Store.open(store_dir)
    s.put("triton", "good", TRITON_GROUP, compile_s=1.0)
    bad = s.put("triton", "bad", {"b.bin": b"bbbb"})
    old = s.put("triton", "old", {"o.bin": b"o"})
    s.get("triton", "missing", components={"a": 1})
    s.close()
    Path(entry_path(s, bad, "b.bin")).write_bytes(b"BBBB")
    t = time.time() - 3600
    os.utime(entry_path(s, old, RECORD_NAME), (t, t))  # a hit would refresh this mtime
    before = snapshot(store_dir)

    ro = Store.open(store_dir, readonly=True)
    for _ in range(3):
        assert read_all(ro.get("triton", "good")) == TRITON_GROUP
        assert ro.get("triton", "old") is not None
        assert ro.get("triton", "bad") is None
        assert ro.get("triton", "missing", components={"a": 1}) is None
    assert ro.put("triton", "new", {"n.bin": b"n"}) is None
    assert ro.lock("triton", "good", timeout=0) is None
    assert ro.evict(target=0) == (0, 0)
    ro.flush(force=True)
    ro.close()
    assert snapshot(store_dir) == before
    with pytest.raises(StoreError):
        ro.remove([bad.record.id])

    with pytest.raises(StoreError):
        Store.open(tmp_path / "nothing-here", readonly=True)
    assert not (tmp_path / "nothing-here").exists()


DISK_FULL = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    from kcache.store import Store
    s = Store.open(sys.argv[1], max_size=1 << 30)
    s.put("triton", "small-before", {"a.bin": b"a" * 1000})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
    out = {}
    out["big_put"] = s.put("triton", "big", {"a.ttir": b"t" * 1000, "a.cubin": os.urandom(2 << 20)}) is None
    out["big_get"] = s.get("triton", "big") is None
    out["small_hit"] = s.get("triton", "small-before") is not None
    small = s.put("triton", "small-after", {"a.bin": b"b" * 1000})
    out["small_put"] = small is not None and small.read("a.bin") == b"b" * 1000
    out["tmp"] = os.listdir(s.tmp)
    s.close()
    print(json.dumps(out))
    """
)


def test_disk_full_put_returns_none(tmp_path: Path, clean_env) -> None:
    root = tmp_path / "full"
    r = subprocess.run(
        [PYTHON, "-c", DISK_FULL, str(root)], capture_output=True, text=True, env=clean_env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"big_put": True, "big_get": True, "small_hit": True, "small_put": True, "tmp": []}
    assert "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.startswith("kcache:")]) == 1, r.stderr
    s = Store.open(root)
    assert s.get("triton", "big") is None and s.get("triton", "small-after") is not None
    s.close()


def test_put_never_raises(store: Store, monkeypatch) -> None:
    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_local.os, "rename", boom)
    assert store.put("triton", "k", {"a.bin": b"a"}) is None
    monkeypatch.undo()
    assert os.listdir(store.tmp) == []
    assert store.put("triton", "k", {"a.bin": b"a"}) is not None
    store.close()
    assert store.put("triton", "k2", {"a.bin": b"a"}) is None  # closed: skipped, not raised


# ------------------------------------------------------------------------------ the directory
def test_new_store_is_private(store: Store) -> None:
    store.put("triton", "k", {"a.bin": b"a"})
    store.index()
    for d in ("", "entries", "tmp", "index", "trash", "locks"):
        assert stat.S_IMODE(os.stat(store.root / d).st_mode) & 0o077 == 0, d
    for p in store.root.rglob("*"):
        assert stat.S_IMODE(p.lstat().st_mode) & 0o022 == 0, p


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_store_owned_by_another_user_refused(store_dir: Path) -> None:
    Store.open(store_dir).close()
    os.chown(store_dir, 12345, 12345)
    try:
        with pytest.raises(StoreError, match="owned by uid 12345"):
            Store.open(store_dir)
        with pytest.raises(StoreError, match="owned by"):
            Store.open(store_dir, readonly=True)
        Store.open(store_dir, allow_insecure=True).close()
    finally:
        os.chown(store_dir, 0, 0)


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o720])
def test_group_or_other_writable_store_refused(store_dir: Path, mode: int) -> None:
    Store.open(store_dir).close()
    os.chmod(store_dir, mode)
    with pytest.raises(StoreError, match="writable by group or others"):
        Store.open(store_dir)
    with pytest.raises(StoreError, match="writable by group or others"):
        Store.open(store_dir, readonly=True)
    s = Store.open(store_dir, allow_insecure=True)
    assert s.put("triton", "k", {"a.bin": b"a"}) is not None
    s.close()


def test_readable_store_is_accepted(store_dir: Path) -> None:
    Store.open(store_dir).close()
    os.chmod(store_dir, 0o755)  # others may read, not write
    Store.open(store_dir).close()


def test_insecure_opt_in_from_the_environment(tmp_path: Path, clean_env) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    code = (
        "import kcache, sys; from kcache.store import Store; s = kcache.settings();"
        "Store.open(s.dir, allow_insecure=s.allow_insecure).close(); print('ok', s.allow_insecure)"
    )
    r = run_py(code, {**clean_env, "KCACHE_DIR": str(d), "KCACHE_ALLOW_INSECURE": "1"})
    assert r.returncode == 0 and r.stdout.split() == ["ok", "True"], r.stderr
    r = run_py(code, {**clean_env, "KCACHE_DIR": str(d)})
    assert r.returncode != 0 and "StoreError" in r.stderr


@pytest.mark.parametrize("content", ["file", "dir"])
def test_non_empty_foreign_dir_refused(tmp_path: Path, content: str) -> None:
    d = tmp_path / "home"
    d.mkdir(mode=0o700)
    (d / "thesis.tex").write_text("do not delete") if content == "file" else (d / "photos").mkdir()
    before = snapshot(d)
    with pytest.raises(StoreError, match="not a kcache store"):
        Store.open(d)
    assert snapshot(d) == before


def test_store_path_that_is_a_file_refused(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(StoreError, match="not a directory"):
        Store.open(f)


def test_store_of_another_schema_refused(store_dir: Path) -> None:
    Store.open(store_dir).close()
    (store_dir / store_local.MARKER).write_bytes(b"\x82\xa6format\xacX\xa6schema\x63")
    with pytest.raises(StoreError, match="another schema"):
        Store.open(store_dir)


MOUNTS = """\
/dev/vda1 / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
server:/export /mnt/nfs nfs4 rw,vers=4.2 0 0
/dev/vdb /mnt/nfs/scratch ext4 rw 0 0
10.0.0.1@tcp:/lus /lustre lustre rw 0 0
user@host:/ /mnt/ssh fuse.sshfs rw 0 0
//srv/share /mnt/with\\040space cifs rw 0 0
tmpfs /mnt/nfsish tmpfs rw 0 0
"""


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/mnt/nfs/home/u/.cache/kcache", True),
        ("/mnt/nfs", True),
        ("/mnt/nfs/scratch/kcache", False),  # a local mount inside the NFS one: longest wins
        ("/mnt/nfsish/kcache", False),  # a prefix of the name is not a parent
        ("/lustre/project/kcache", True),
        ("/mnt/ssh/x", True),
        ("/mnt/with space/x", True),
        ("/home/u/.cache/kcache", False),
    ],
)
def test_network_fs_detection(tmp_path: Path, path: str, expected: bool) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert is_network_fs(Path(path), mounts_file=str(mounts)) is expected


def test_network_fs_detection_without_mounts_file(tmp_path: Path) -> None:
    assert fs_type(tmp_path, mounts_file=str(tmp_path / "absent")) is None
    assert is_network_fs(tmp_path, mounts_file=str(tmp_path / "absent")) is False


def test_network_fs_store_keeps_its_index_node_local(tmp_path: Path, monkeypatch, kcache_warnings) -> None:
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    root = tmp_path / "nfs-store"
    s = Store.open(root, network_fs=True)
    assert s.network_fs
    assert str(s.index_dir).startswith(str(xdg / "kcache-index"))
    s.put("triton", "k", TRITON_GROUP)
    assert s.get("triton", "k") is not None
    s.flush(force=True)
    assert s.index().ids() == {s.entry_id("triton", "k")}
    assert not (root / "index").exists(), "no SQLite file on the network filesystem"
    assert (s.index_dir / "kcache.sqlite").exists()
    assert len([m for m in kcache_warnings if "network filesystem" in m]) == 1
    s.close()
    # Another node (its own index) sees the same entries.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other-node"))
    s2 = Store.open(root, network_fs=True)
    assert s2.index_dir != s.index_dir
    assert read_all(s2.get("triton", "k")) == TRITON_GROUP
    s2.close()


def test_store_on_local_fs_detected_as_local(store: Store) -> None:
    assert store.index_dir == store.root / "index"


def test_clean_tmp_removes_what_dead_writers_left(store: Store) -> None:
    dead = store.tmp / f"{'a' * 40}.999999999.abc"
    dead.mkdir()
    (dead / "x").write_bytes(b"x")
    old = time.time() - tunables.STALE_TMP_S - 60
    live = store.tmp / f"{'b' * 40}.{os.getpid()}.abc"
    live.mkdir()
    os.utime(live, (old, old))  # its writer is alive but it is old: stale
    fresh = store.tmp / f"{'c' * 40}.{os.getppid()}.abc"
    fresh.mkdir()  # a live writer's entry being written: held by it (here, by this test)
    held = os.open(fresh, os.O_RDONLY | os.O_DIRECTORY)
    assert fs.hold(held)
    scratch = store.scratch_dir()  # this process's own private folder
    assert store.clean_tmp() == 2
    assert not dead.exists() and not live.exists() and fresh.exists()
    assert any(p.name.startswith("scratch.") for p in store.tmp.iterdir()) and os.path.isdir(scratch)
    os.close(held)  # its writer died: it goes at the next clean-up
    assert store.clean_tmp() == 1 and not fresh.exists()


def test_clean_tmp_removes_links_not_their_targets(store: Store, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    for sub in ("tmp", "trash"):
        os.symlink(victim, store.root / sub / f"link.999999999.{sub}")
    store.clean_tmp(min_age=0)
    assert (victim / "precious").read_text() == "keep"
    assert not any(p.is_symlink() for p in (store.root / "trash").iterdir())


def test_lock_is_exclusive_across_instances(store_dir: Path) -> None:
    a = Store.open(store_dir)
    b = Store.open(store_dir)
    lk = a.lock("triton", "k", timeout=1)
    assert lk is not None
    t0 = time.monotonic()
    assert b.lock("triton", "k", timeout=0.2) is None
    assert time.monotonic() - t0 < 5
    lk.release()
    lk2 = b.lock("triton", "k", timeout=1)
    assert lk2 is not None
    lk2.release()
    a.close()
    b.close()


def test_record_round_trip_and_refusals() -> None:
    r = Record(kind="triton", key="k", id="0" * 40, files=[FileInfo("a.bin", 1, 2, "s")], summary={"n": 1})
    assert Record.decode(r.encode()) == r
    body = bytearray(r.encode())
    body[-1] ^= 1
    from kcache.store.records import CorruptRecord

    with pytest.raises(CorruptRecord):
        Record.decode(bytes(body))
    with pytest.raises(CorruptRecord):
        Record.decode(Record(kind="t", key="k", id="../x", files=[]).encode())
    with pytest.raises(CorruptRecord):
        Record.decode(Record(kind="t", key="k", id="0" * 40, files=[FileInfo("../x", 1, 2, "")]).encode())


def test_index_waits_briefly_on_a_locked_database(store: Store, tmp_path: Path) -> None:
    """Another process holding a write transaction stalls a put by the busy timeout (a quarter
    second), never by SQLite's or diskcache's defaults (5 s, 60 s)."""
    import sqlite3

    store.put("triton", "k0", {"a.bin": b"a"})
    assert isinstance(store.index(), Index) and store.index_timeout <= 1.0
    holder = sqlite3.connect(store.root / "index" / "kcache.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        t0 = time.monotonic()
        assert store.put("triton", "k1", {"a.bin": b"b"}) is not None  # the entry is written anyway
        assert time.monotonic() - t0 < 5.0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store.disk.catalogue._index_off_until = 0.0
    store.flush(force=True)
    assert store.entry_id("triton", "k1") in store.index().ids(), "the row was kept for a later flush"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------------------------- checksums, FIFOs
def test_fifo_member_is_refused_without_blocking(store: Store) -> None:
    import threading

    h = _put(store)
    p = entry_path(store, h, "add_kernel.cubin")
    os.unlink(p)
    os.mkfifo(p)
    result: list = []
    t = threading.Thread(target=lambda: result.append(store.get("triton", "k")), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # release the blocked reader before failing
        os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("a FIFO member blocked the hit")
    assert result == [None]


@pytest.mark.parametrize("writer_has_xxh3", [True, False])
@pytest.mark.parametrize("reader_has_xxh3", [True, False])
def test_checksums_with_and_without_xxhash(
    store: Store, monkeypatch, writer_has_xxh3, reader_has_xxh3
) -> None:
    from kcache.store import records

    real = records.xxh3
    if real is None and (writer_has_xxh3 or reader_has_xxh3):
        pytest.skip("xxhash is not installed")
    monkeypatch.setattr(records, "xxh3", real if writer_has_xxh3 else None)
    h = _put(store)
    assert all((f.xxh3 is not None) == writer_has_xxh3 for f in h.record.files)
    monkeypatch.setattr(records, "xxh3", real if reader_has_xxh3 else None)
    assert read_all(store.get("triton", "k")) == TRITON_GROUP
    data = bytearray(Path(entry_path(store, h, "add_kernel.ttgir")).read_bytes())
    data[3] ^= 0x40
    Path(entry_path(store, h, "add_kernel.ttgir")).write_bytes(bytes(data))
    assert store.get("triton", "k") is None


def test_each_recorded_checksum_is_checked(store: Store) -> None:
    """A record whose fast checksum disagrees with the bytes is refused, whichever one it is."""
    from kcache.store import records

    for field in ("crc32", "xxh3"):
        if field == "xxh3" and records.xxh3 is None:
            continue
        h = _put(store, f"k-{field}")
        rec = h.record
        if field == "crc32":
            for f in rec.files:
                f.xxh3 = None  # a record without xxh3: crc32 is what decides
        f = rec.files[0]
        setattr(f, field, (getattr(f, field) + 1) & 0xFFFFFFFF)
        Path(entry_path(store, h, RECORD_NAME)).write_bytes(rec.encode())
        assert store.get("triton", f"k-{field}") is None, field


def test_record_member_lists() -> None:
    from kcache.store.records import CorruptRecord

    r = Record(
        kind="t", key="k", id="0" * 40, files=[FileInfo("a.bin", 1, 2, "s", 7), FileInfo("b.bin", 1, 2, "s")]
    )
    back = Record.decode(r.encode())
    assert back.files[0].xxh3 == 7 and back.files[1].xxh3 is None
    for bad in (["a.bin", 1, 2, "s", "x"], ["a.bin", 1, 2, "s", 7, 8], ["a.bin", 1, 2], "a.bin"):
        d = r.to_dict()
        d["files"] = [bad]
        with pytest.raises(CorruptRecord):
            Record.from_dict(d)


def test_entry_dir_replaced_by_a_file_is_a_miss(store: Store) -> None:
    h = _put(store)
    shutil.rmtree(entry_path(store, h))
    Path(entry_path(store, h)).write_bytes(b"not a directory")
    assert store.get("triton", "k") is None
    assert store.put("triton", "k", TRITON_GROUP) is not None
    assert read_all(store.get("triton", "k")) == TRITON_GROUP


# ------------------------------------------------------------------------ many openers of a new store
def test_new_store_while_another_process_writes_its_marker(tmp_path: Path) -> None:
    root = tmp_path / "new"
    root.mkdir(mode=0o700)
    (root / f".{store_local.MARKER}.4242.deadbeef").write_bytes(b"")  # another creator, mid-write
    Store.open(root).close()


def test_new_store_created_by_another_process_between_checks(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "new"
    other = Store.open(tmp_path / "template")  # what the other process leaves: marker, entries/, ...
    other.close()
    real_listdir = os.listdir
    root.mkdir(mode=0o700)

    def racing_listdir(where=None):
        # The store lists its new root (by descriptor) to see that it is empty; meanwhile the
        # other process finishes creating the store.
        if isinstance(where, int) and not (root / store_local.MARKER).exists():
            for p in (tmp_path / "template").iterdir():
                if p.is_dir():
                    (root / p.name).mkdir(mode=0o700)
                else:
                    shutil.copy(p, root / p.name)
        return real_listdir(where) if where is not None else real_listdir()

    monkeypatch.setattr(store_local.os, "listdir", racing_listdir)
    s = Store.open(root)
    assert s.put("triton", "k", {"a.bin": b"a"}) is not None
    s.close()


OPENER = textwrap.dedent(
    """
    import sys, time
    from kcache.store import Store, StoreError
    root, start = sys.argv[1], float(sys.argv[2])
    while time.time() < start:
        pass
    try:
        s = Store.open(root)
    except StoreError as e:
        print("refused", e)
        sys.exit(0)
    print("ok" if s.put("triton", "k", {"a.bin": b"a"}) is not None else "put-failed")
    """
)


def test_many_processes_create_one_new_store(tmp_path: Path, clean_env) -> None:
    """The ranks of a job starting together on a fresh machine: every one gets the store."""
    outs = []
    for rnd in range(3):
        root = tmp_path / f"fresh{rnd}"
        start = time.time() + 1.0
        procs = [
            subprocess.Popen(
                [PYTHON, "-c", OPENER, str(root), str(start)],
                stdout=subprocess.PIPE,
                text=True,
                env=clean_env,
            )
            for _ in range(6)
        ]
        outs += [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["ok"] * len(outs), outs


def test_readonly_stats_never_write(tmp_path: Path) -> None:
    """kcache.stats() on a KCACHE_READONLY store reads the index without writing: no file in the
    store changes (not even SQLite's shared-memory file)."""
    import subprocess
    import sys

    root = tmp_path / "ro"
    s = Store.open(root, max_size=1 << 30)
    s.put("triton", "k", {"a.cubin": b"x" * 100})
    s.flush(force=True)
    s.close()
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}
    code = (
        "import kcache; assert kcache.enable(readonly=True, triton=False); print(kcache.stats()['entries'])"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KCACHE_DIR": str(root)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize("state", ["empty file", "being made"])
def test_an_index_another_process_is_creating_lists_nothing_without_a_warning(
    tmp_path: Path, state: str, capfd
) -> None:
    """The index is made by the first process that writes one, and between the database's file
    and its committed tables there is a moment when another process' listing (Store.keys, which
    nvFuser's kernel-db harvest calls) finds a database without kcache's tables. That is a
    database about to be made, not a corrupt one: listed as empty, no warning (CI caught the
    warning when six processes harvested into one new store at once)."""
    root = tmp_path / "s"
    Store.open(root, max_size=1 << 30).close()  # the store's folders; no index yet
    db = root / "index" / DB_NAME
    maker = None
    if state == "empty file":
        db.write_bytes(b"")  # what sqlite3.connect leaves before its first write
    else:
        # The maker's own steps (Index.open), in another process (SQLite shares one process'
        # view of a file between its connections): WAL on, then the schema inside a write
        # transaction, held open while this process lists.
        code = (
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.execute('PRAGMA journal_mode=WAL'); c.execute('BEGIN IMMEDIATE')\n"
            "c.execute('CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)')\n"
            "print('made', flush=True); sys.stdin.readline(); c.execute('ROLLBACK')\n"
        )
        maker = subprocess.Popen(
            [sys.executable, "-c", code, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert maker.stdout is not None and maker.stdout.readline().strip() == "made"
    s = Store.open(root, max_size=1 << 30)
    try:
        assert s.keys("triton") == []
    finally:
        s.close()
        if maker is not None:
            maker.communicate("go\n", timeout=60)
    assert "warning" not in capfd.readouterr().err.lower()


@pytest.mark.parametrize("remover", ["this", "another"])
def test_a_hit_flushed_after_its_entry_was_removed_does_not_bring_its_row_back(
    store: Store, remover: str
) -> None:
    """A hit's last use is written later (the flush); an entry removed meanwhile, by this store
    (torch.compile's forget) or another process' (clear), must not come back into the index,
    where stats and inspect would list an entry that is not there. Found when a removed caching
    precompile package still showed in `kcache inspect`."""
    h = _put(store)
    store.flush(force=True)
    assert store.get("triton", "k") is not None  # a hit: its last use waits for the flush
    if remover == "this":
        assert store.remove([h.record.id]) == 1
    else:
        other = Store.open(store.root)
        assert other.remove([h.record.id]) == 1
        other.close()
    store.flush(force=True)
    assert h.record.id not in store.index().ids()
    assert store.get("triton", "k") is None


def test_inspect_shows_real_dates_for_protected_entries(store_dir: Path) -> None:
    """A prewarmed entry (protected for 7 days) is listed with the dates it really has: made and
    last used now, not a week ahead; its protection is said on its own line (issue 28)."""
    import subprocess
    import sys

    from kcache import maintenance

    s = Store.open(store_dir)
    undo = s.protect(7 * 86400)
    ident = s.put("triton", "prewarmed", {"a.bin": b"p" * 100}).record.id
    undo()
    s.flush(force=True)
    now = time.time()
    (row,) = maintenance.list_entries(s)
    assert abs(row["last_used"] - now) < 60 and abs(row["created"] - now) < 60
    assert row["protected_until"] > now + 6.9 * 86400
    s.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    r = subprocess.run(
        [sys.executable, "-m", "kcache", "inspect", ident[:12], "--dir", str(store_dir)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    lines = {ln.split("  ")[0].strip(): ln for ln in r.stdout.splitlines() if "  " in ln}
    today = time.strftime("%Y-%m-%d", time.localtime(now))
    week = time.strftime("%Y-%m-%d", time.localtime(now + 7 * 86400))
    assert today in lines["last used"] and today in lines["created"], r.stdout
    assert week in lines["protected until"], r.stdout
