"""Hits whose files are the entry's own folder, held (kcache/store/served.py), and the memo of
held hits (Store._memo_get): what a process was handed never changes or vanishes, a removal
waits for its holders before deleting files, and a repeated lookup reads nothing again unless
the entry changed (issue 25, point 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fresh_process import run_body

from kcache.store import Store, fs, tunables
from kcache.store import hit as hit_mod
from kcache.store import served as served_mod

PYTHON = sys.executable


def _trash(root: Path) -> list[str]:
    return sorted(os.listdir(root / "trash"))


def _on_disk(folder: Path) -> int:
    """An entry folder's bytes on disk as du counts them: the folder's blocks and its files'."""
    return sum(os.lstat(p).st_blocks * 512 for p in [folder, *folder.iterdir()])


def test_a_hit_names_the_held_entry_folder(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"k.cubin": b"C" * 100, "k.json": b"{}"})
    hit = s.get("triton", "k", files=True)
    assert hit is not None and hit._pin is not None
    for name, p in hit.paths.items():
        assert p == f"/proc/self/fd/{hit._pin}/{name}" and p.endswith(name)  # Triton reads suffixes
        assert os.path.samestat(os.stat(p), os.stat(s.entry_dir(hit.record.id) + "/" + name))
    assert not any(n.startswith("served.") for n in os.listdir(s.tmp)), "no private files were made"
    s.close()


def test_eviction_of_a_held_entry_keeps_its_files_until_let_go(tmp_path: Path, monkeypatch) -> None:
    """Removed from the store at once (off its size count, a miss for everyone), but its files
    stay in trash/ while this process holds them, and go when it lets go."""
    root = tmp_path / "store"
    reader = Store.open(root)
    reader.put("triton", "k", {"a.bin": b"A" * 5000})
    hit = reader.get("triton", "k", files=True)
    evictor = Store.open(root, max_size=1)
    before = evictor.disk.evictor.usage.total()
    one = _on_disk(Path(reader.entry_dir(hit.record.id)))  # what the entry counts for: its blocks
    assert one >= 5000 + 4096  # (its member, its record's block, its folder's)
    assert evictor.evict(target=0)[0] == 1
    assert evictor.disk.evictor.usage.total() == before - one
    assert evictor.get("triton", "k") is None and reader.get("triton", "k") is None
    assert Path(hit.paths["a.bin"]).read_bytes() == b"A" * 5000  # still there, unchanged
    (held,) = _trash(root)
    assert os.listdir(root / "trash" / held) != []
    evictor.clean_tmp()  # a clean-up leaves a held folder alone
    assert _trash(root) == [held]
    reader.close()  # lets go: what it held goes
    assert _trash(root) == []
    assert evictor.disk.evictor.usage.total() == before - one  # not twice
    evictor.close()


def test_a_held_entry_removed_in_another_process(tmp_path: Path) -> None:
    """`kcache clear --all` while a process holds an entry: the entry is gone from the store,
    the process's files are not."""
    root = tmp_path / "store"
    s = Store.open(root)
    s.put("triton", "k", {"a.bin": b"A" * 100})
    hit = s.get("triton", "k", files=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    r = subprocess.run(
        [PYTHON, "-m", "kcache", "clear", "--all", "--dir", str(root)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert Path(hit.paths["a.bin"]).read_bytes() == b"A" * 100
    assert s.get("triton", "k", files=True) is None
    s.close()
    assert _trash(root) == []


def test_a_late_hold_on_an_entry_being_removed_makes_private_links(tmp_path: Path, monkeypatch) -> None:
    """Another process removes the entry between this one's check and its hold: the hold finds
    the folder no longer the entry's, and the verified bytes are served from private files."""
    root = tmp_path / "store"
    a = Store.open(root)
    other = Store.open(root)
    a.put("triton", "k", {"a.bin": b"1" * 4096})
    real_pin = served_mod.Served._pin

    def pin_after_a_removal(self, hit, dfd, dst=None):  # noqa: ANN001, ANN202
        assert other.remove([other.entry_id("triton", "k")]) == 1
        return real_pin(self, hit, dfd, dst)

    monkeypatch.setattr(served_mod.Served, "_pin", pin_after_a_removal)
    hit = a.get("triton", "k", files=True)
    monkeypatch.undo()
    assert hit is not None and hit._pin is None
    assert Path(hit.paths["a.bin"]).read_bytes() == b"1" * 4096
    assert "/tmp/served." in os.path.realpath(hit.paths["a.bin"])  # a private link
    a.close()
    other.close()


def test_past_the_budget_of_held_folders_private_links(tmp_path: Path) -> None:
    # in a fresh process: with a budget of 2 the held numbers stop at 256, and the tests run
    # before this one in the same worker may have left descriptors open up to there
    run_body("test_store_held", "_past_the_budget_body", tmp_path)


def _past_the_budget_body(tmp_path: Path) -> None:
    served_mod.MAX_PINS = 2  # (a process of its own: nothing to restore)
    s = Store.open(tmp_path / "store")
    hits = []
    for i in range(4):
        s.put("triton", f"k{i}", {"a.bin": bytes([i]) * 100})
        hits.append(s.get("triton", f"k{i}", files=True))
    assert [h._pin is not None for h in hits] == [True, True, False, False]
    for i, h in enumerate(hits):
        assert Path(h.paths["a.bin"]).read_bytes() == bytes([i]) * 100
    s.close()


def test_a_path_handed_out_names_the_entry_in_another_process(tmp_path: Path) -> None:
    """A path handed out is this process' ``/proc/self/fd/N/...``. Copied (Inductor pickles a
    compiled kernel's ``metadata_group`` from its compile workers to the parent, and into its FX
    graph entries) it must name the same bytes in the process that reads it, not whatever that
    process has at descriptor N: a copy is the entry's path in the store. Held folders and
    private links (a read-only store's hits) alike."""
    import copy

    s = Store.open(tmp_path / "store")
    ro = Store.open(tmp_path / "store", readonly=True)
    handed = {}
    for i, store in enumerate([s, ro]):
        s.put("triton", f"k{i}", {"k.ttgir": bytes([65 + i]) * 100})
        hit = store.get("triton", f"k{i}", files=True)
        assert hit is not None and (hit._pin is not None) == (store is s)
        handed[i] = copy.copy(hit.paths["k.ttgir"])
        assert type(handed[i]) is str and not handed[i].startswith("/proc/")
        assert open(handed[i], "rb").read() == bytes([65 + i]) * 100
    # the reader: another process, whose descriptors are its own
    for i, p in handed.items():
        out = subprocess.run(
            [PYTHON, "-c", "import sys; sys.stdout.write(open(sys.argv[1], 'rb').read().decode())", p],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and out.stdout == chr(65 + i) * 100, out.stderr
    ro.close()
    s.close()


def test_a_repeated_lookup_reads_nothing_again(tmp_path: Path, monkeypatch) -> None:
    """The memo: the second lookup of an entry this process holds opens no file of it (a stat of
    its record by name); it is a hit with the same files, counted as one."""
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"k.cubin": b"C" * 100, "k.json": b'{"a": 1}'})
    first = s.get("triton", "k", files=True)
    reads = []
    real = fs.read_exact
    monkeypatch.setattr(fs, "read_exact", lambda fd, n: reads.append(n) or real(fd, n))
    again = s.get("triton", "k", files=True)
    assert reads == [] and again is not None
    assert again.paths == first.paths and again.record is first.record
    assert again.read("k.json") == b'{"a": 1}'  # read from the held folder when asked, checked
    assert s.counts.process_totals()["triton"]["hits"] == 2
    s.close()


def test_the_memo_sees_a_replacement_and_a_removal(tmp_path: Path) -> None:
    root = tmp_path / "store"
    a = Store.open(root)
    other = Store.open(root)
    a.put("triton", "k", {"a.bin": b"1" * 100})
    old = a.get("triton", "k", files=True)
    assert a.get("triton", "k", files=True).paths == old.paths  # from the memo
    other.replace("triton", "k", {"a.bin": b"2" * 100})
    new = a.get("triton", "k", files=True)
    assert new.read("a.bin") == b"2" * 100 and Path(new.paths["a.bin"]).read_bytes() == b"2" * 100
    assert Path(old.paths["a.bin"]).read_bytes() == b"1" * 100  # what it was handed stays
    other.remove([other.entry_id("triton", "k")])
    assert a.get("triton", "k", files=True) is None
    a.close()
    other.close()


def test_the_memo_leaves_the_last_use_refresh_to_a_full_lookup(tmp_path: Path, monkeypatch) -> None:
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"a.bin": b"1" * 100})
    s.get("triton", "k", files=True)
    rec = Path(s.entry_dir(s.entry_id("triton", "k"))) / "__kcache__.rec"
    t = rec.stat().st_mtime - 3600
    os.utime(rec, (t, t))  # (changes the record's times: the memo lets go of it)
    s.get("triton", "k", files=True)  # a full lookup: refreshes the last use
    assert rec.stat().st_mtime > t + 3000
    monkeypatch.setattr(tunables, "TOUCH_EVERY_S", 0.0)
    before = rec.stat().st_mtime_ns
    s.get("triton", "k", files=True)  # due again at once: not served from the memo
    assert rec.stat().st_mtime_ns >= before
    s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_what_its_parent_was_handed(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"a.bin": b"F" * 100})
    hit = s.get("triton", "k", files=True)
    paths = dict(hit.paths)
    report = tmp_path / "child.txt"
    pid = os.fork()
    if pid == 0:  # the child: the parent's paths, and a lookup of its own; never back into pytest
        try:
            got = [Path(paths["a.bin"]).read_bytes() == b"F" * 100]
            h = s.get("triton", "k", files=True)
            got.append(h is not None and Path(h.paths["a.bin"]).read_bytes() == b"F" * 100)
            report.write_text(repr(got))
        except BaseException as e:  # noqa: BLE001
            report.write_text(repr(e))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert report.read_text() == "[True, True]"
    assert Path(paths["a.bin"]).read_bytes() == b"F" * 100
    s.close()


def test_a_network_filesystem_holds_nothing(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store", network_fs=True)
    s.put("triton", "k", {"a.bin": b"N" * 100})
    hit = s.get("triton", "k", files=True)
    assert hit._pin is None and Path(hit.paths["a.bin"]).read_bytes() == b"N" * 100
    assert s.get("triton", "k", files=True).read("a.bin") == b"N" * 100  # no memo either
    assert not len(s.disk.memo)
    s.close()


def test_memo_entries_are_bounded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hit_mod, "MEMO_MAX", 3)
    s = Store.open(tmp_path / "store")
    for i in range(5):
        s.put("triton", f"k{i}", {"a.bin": bytes([i])})
        assert s.get("triton", f"k{i}", files=True) is not None
    assert len(s.disk.memo) == 3
    s.close()


def test_a_process_with_many_descriptors_still_holds(tmp_path: Path) -> None:
    """A busy process (300 descriptors open, past the 64-255 a small one would use) holds entry
    folders above its own descriptors, and the numbers it holds are never taken again by it."""
    extra = [os.open(os.devnull, os.O_RDONLY) for _ in range(300)]
    try:
        s = Store.open(tmp_path / "store")
        pins = []
        for i in range(3):
            s.put("triton", f"k{i}", {"a.bin": bytes([i]) * 10})
            h = s.get("triton", f"k{i}", files=True)
            assert h._pin is not None and Path(h.paths["a.bin"]).read_bytes() == bytes([i]) * 10
            pins.append(h._pin)
        assert pins == sorted(pins) and len(set(pins)) == 3 and min(pins) > max(extra)
        s.close()
    finally:
        for fd in extra:
            os.close(fd)


def test_a_lookup_past_the_memo_takes_no_second_hold(tmp_path: Path) -> None:
    """A full lookup of an entry this process holds already (the memo let go of it: its last use
    was due, say) is served from the same hold; once the entry is removed and put again, its new
    folder gets a hold of its own (the old one is not mistaken for it)."""
    root = tmp_path / "store"
    s = Store.open(root)
    other = Store.open(root)
    s.put("triton", "k", {"a.bin": b"1" * 100})
    first = s.get("triton", "k", files=True)
    s.disk.memo.clear()
    again = s.get("triton", "k", files=True)
    assert again._pin == first._pin and again.paths == first.paths
    assert len(s.disk.served._pins) == 1
    other.remove([other.entry_id("triton", "k")])
    other.put("triton", "k", {"a.bin": b"2" * 100})
    s.disk.memo.clear()
    new = s.get("triton", "k", files=True)
    assert new._pin is not None and new._pin != first._pin
    assert Path(new.paths["a.bin"]).read_bytes() == b"2" * 100
    assert Path(first.paths["a.bin"]).read_bytes() == b"1" * 100  # what it was handed stays
    s.close()
    other.close()


def test_a_hit_of_a_removed_folder_is_never_served_from_the_new_folders_hold(tmp_path: Path) -> None:
    """A hit verified from one folder of an entry (a lookup without files, a put's own) whose
    files are asked for once the entry was removed and put again, and this process holds the
    new folder: its paths hold the bytes it verified, not the new folder's (found by review:
    the hold was reused by the entry's id alone)."""
    root = tmp_path / "store"
    s = Store.open(root)
    other = Store.open(root)
    put_hit = s.put("triton", "k", {"a.bin": b"1" * 100})
    old = s.get("triton", "k")  # verified, no files made yet
    other.remove([other.entry_id("triton", "k")])
    other.put("triton", "k", {"b.bin": b"2" * 50})  # the same key, other members
    new = s.get("triton", "k", files=True)  # this process holds the new folder now
    assert new is not None and new._pin is not None
    for hit in (old, put_hit):
        assert set(hit.paths) == {"a.bin"}
        assert Path(hit.paths["a.bin"]).read_bytes() == hit.read("a.bin") == b"1" * 100
    assert Path(new.paths["b.bin"]).read_bytes() == b"2" * 50
    s.close()
    other.close()
