"""Making and unmaking a store for ``kcache import``: a failed import leaves a missing or empty
folder as it found it, by descriptor, following no link (a folder swapped for a link while the
import ran is never emptied through it)."""

from __future__ import annotations

import os
from pathlib import Path

from kcache.maintenance.lifecycle import fresh_folder, undo_new_store
from kcache.store import Store


def _new_store(path: Path) -> None:
    Store.open(str(path)).close()


def _victim(tmp_path: Path) -> Path:
    """A folder of someone else's shaped like a new store (what the old code checked for), with
    files of its own below each folder a store has."""
    v = tmp_path / "victim"
    for sub in ("entries/ab", "tmp", "trash", "locks", "index"):
        (v / sub).mkdir(parents=True)
    for sub in ("tmp", "trash", "locks", "index"):
        (v / sub / "precious").write_text("keep me")
    (v / "KCACHE_STORE").write_text("not ours")
    return v


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def test_a_store_made_in_a_missing_folder_is_removed_whole(tmp_path: Path) -> None:
    d = tmp_path / "d"
    assert fresh_folder(str(d)) == "missing"
    _new_store(d)
    assert fresh_folder(str(d)) is None
    assert undo_new_store(str(d), "missing")
    assert not os.path.lexists(d)


def test_a_store_made_in_an_empty_folder_leaves_it_empty(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    assert fresh_folder(str(d)) == "empty"
    _new_store(d)
    assert undo_new_store(str(d), "empty")
    assert d.is_dir() and list(d.iterdir()) == []


def test_a_store_that_holds_an_entry_is_kept(tmp_path: Path) -> None:
    d = tmp_path / "d"
    s = Store.open(str(d))
    s.put("triton", "k", {"a.bin": b"x"})
    s.close()
    assert not undo_new_store(str(d), "missing")
    assert Store.open(str(d)).get("triton", "k") is not None


def test_a_folder_swapped_for_a_link_is_not_emptied_through_it(tmp_path: Path) -> None:
    """The store's folder replaced by a link to another folder shaped like a new store: nothing
    of that folder is removed (by path, the old code emptied its tmp/, trash/, locks/, index/)."""
    v = _victim(tmp_path)
    before = _files(v)
    d = tmp_path / "d"
    d.symlink_to(v)
    assert not undo_new_store(str(d), "missing")
    assert _files(v) == before
    assert d.is_symlink()


def test_a_link_planted_inside_the_new_store_is_removed_as_a_link(tmp_path: Path) -> None:
    v = _victim(tmp_path)
    before = _files(v)
    d = tmp_path / "d"
    _new_store(d)
    os.rename(d / "tmp", tmp_path / "old-tmp")
    (d / "tmp").symlink_to(v / "tmp")
    assert undo_new_store(str(d), "missing")
    assert not os.path.lexists(d)
    assert _files(v) == before
