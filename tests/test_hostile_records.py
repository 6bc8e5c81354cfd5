"""Records from outside are validated: finite numbers in range, bounded printable text. A record
with ``compile_s = NaN`` read from the shared tier was committed, and from then on every index
write of the process failed (the counters' NOT NULL column; one transaction held the rows, the
counters and the last-use times, so nothing was written again); escape sequences in a summary
reached ``kcache inspect`` raw. Now such a record is refused and counted, never written to the
store or its index; the index writer skips a bad row instead of failing the batch; and the
human output of ``inspect`` and ``explain`` shows control characters escaped.

Against a real redis-server (tests/conftest.py), real stores, real ``kcache`` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import msgpack
import pytest
from tier_stores import Stores

from kcache.bundle import export_bundle, import_bundle
from kcache.store import Store
from kcache.store.records import Record
from kcache.store.tiers import entry as rt
from kcache.store.tiers import redis_keys as rk

PYTHON = sys.executable
ESC = "\x1b]0;owned\x07\x1b[2J\x1b[31m"  # set the title, clear the screen, turn red

# Every store the tests open is closed, with its shared tier's sockets, and a test that leaves a
# descriptor open fails (tests/conftest.py): each used to leave 2-6 sockets for its worker's life.
pytestmark = pytest.mark.usefixtures("no_descriptors_left", "stores_closed")


def _files(tag: str) -> dict[str, bytes]:
    return {"k.json": json.dumps({"name": tag}).encode(), "k.cubin": os.urandom(512)}


# (what, the change an attacker makes to a valid record)
BAD_RECORDS: list[tuple[str, Any]] = [
    ("compile_s NaN", lambda r: setattr(r, "compile_s", float("nan"))),
    ("compile_s infinite", lambda r: setattr(r, "compile_s", float("inf"))),
    ("compile_s negative", lambda r: setattr(r, "compile_s", -5.0)),
    ("compile_s huge", lambda r: setattr(r, "compile_s", 1e300)),
    ("created NaN", lambda r: setattr(r, "created", float("nan"))),
    ("escape codes in the summary", lambda r: r.summary.update(name="k" + ESC)),
    ("a newline in a summary field name", lambda r: r.summary.update({"a\nb": 1})),
    ("a huge summary", lambda r: r.summary.update(name="x" * 100_000)),
    ("a NaN in the summary", lambda r: r.summary.update(n=float("nan"))),
    ("a summary of a list", lambda r: r.summary.update(n=[1, 2])),
    ("a component too large", lambda r: r.components.update(big="x" * 100_000)),
    ("components nested deep", lambda r: r.components.update(deep=[[[[[[1]]]]]])),
]


@pytest.mark.parametrize("what,change", BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_a_bad_record_from_the_shared_tier_is_refused_and_the_index_keeps_working(
    redis_server, tmp_path: Path, what: str, change: Any
) -> None:
    prefix = f"h{uuid.uuid4().hex[:8]}:"
    stores = Stores(tmp_path)  # (a deadline far above Redis's answer: this is about trust)
    try:
        a = stores("a", redis_server.url, prefix)
        a.put("triton", "K", _files("k"), summary={"name": "k"}, compile_s=0.5)
        assert a.tiers[0].flush(60.0)
        # The attacker: the record changed, its own crc32 and the entry's value rebuilt.
        r = redis_server.client()
        key = rk.entry_key(prefix, "triton", a.entry_id("triton", "K"))
        d = msgpack.unpackb(r.get(key), raw=False)
        rec = Record.decode(d["r"])
        change(rec)
        r.set(key, rt.pack_entry(rec.encode(), d["m"], None))

        b = stores("b", redis_server.url, prefix)
        assert b.get("triton", "K") is None, what  # refused: compiled here instead
        c = b.counts.process_totals()["triton"]
        assert c["remote_refused"] == 1 and c["misses"] == 1 and not c.get("hits"), c
        assert b.read_record(b.entry_id("triton", "K"))[0] is None  # never committed
        # and the index takes every later write: rows, counters, last use
        b.put("triton", "GOOD", _files("good"), summary={"name": "good"})
        assert b.get("triton", "GOOD") is not None
        b.flush(force=True)
        idx = b.index()
        assert idx.row(b.entry_id("triton", "GOOD")) is not None
        assert idx.row(b.entry_id("triton", "K")) is None
        assert idx.counters()["triton"]["hits"] == 1 and idx.counters()["triton"]["remote_refused"] == 1
    finally:
        stores.close()


def test_one_bad_row_never_poisons_later_index_writes(tmp_path: Path) -> None:
    """Defence in depth, below the validation: a NaN that reaches the index writer anyway (a
    local put, an older kcache's record) costs that row or counter, not every later write."""
    s = Store.open(tmp_path / "s")
    try:
        s.put("triton", "NAN", _files("nan"), compile_s=float("nan"))
        assert s.get("triton", "NAN") is not None  # a hit adds saved_s = NaN to the counters
        s.put("triton", "GOOD", _files("good"))
        s.flush(force=True)
        idx = s.index()
        assert idx.row(s.entry_id("triton", "GOOD")) is not None  # was: nothing written, ever again
        assert idx.counters()["triton"]["hits"] == 1
        # a row SQLite refuses outright (created NaN) in one batch with a good one
        bad = Record("triton", "X", s.entry_id("triton", "X"), [], created=float("nan"))
        good = Record("triton", "Y", s.entry_id("triton", "Y"), [])
        idx.insert_many([(bad, float("nan")), (good, None)])
        assert idx.row(good.id) is not None
        s.put("triton", "LATER", _files("later"))
        assert s.get("triton", "LATER") is not None
        s.flush(force=True)
        assert idx.row(s.entry_id("triton", "LATER")) is not None and idx.counters()["triton"]["hits"] == 2
    finally:
        s.close()


def test_a_bundle_with_a_bad_record_imports_the_rest(tmp_path: Path) -> None:
    src = Store.open(tmp_path / "src")
    try:
        src.put("triton", "BAD", _files("bad"), summary={"name": "k" + ESC})  # a local put is not checked
        src.put("triton", "NAN", _files("nan"), compile_s=float("nan"))
        src.put("triton", "GOOD", _files("good"), summary={"name": "good"})
        export_bundle(src, tmp_path / "b.kcache")
    finally:
        src.close()
    dst = Store.open(tmp_path / "dst")
    try:
        rep = import_bundle(dst, tmp_path / "b.kcache")
        assert rep["imported"] == 1, rep
        skipped = {s["id"]: s["why"] for s in rep["skipped"]}
        assert len(skipped) == 2 and all(w.startswith("bad record") for w in skipped.values()), rep
        assert dst.get("triton", "GOOD") is not None
        assert dst.get("triton", "BAD") is None and dst.get("triton", "NAN") is None
    finally:
        dst.close()


def test_a_warning_on_stderr_shows_control_characters_escaped(tmp_path: Path, clean_env) -> None:
    # a store path holding a terminal escape and a newline (a name made by someone else): the
    # warning names it, and must neither drive the user's terminal nor forge a line of kcache's
    bad = tmp_path / ("s" + ESC + "\nkcache: WARNING: forged")
    bad.write_text("a file, not a folder")
    env = {**clean_env, "KCACHE": "1", "KCACHE_DIR": str(bad)}
    p = subprocess.run([PYTHON, "-c", "import kcache; assert kcache.active_store() is None"], env=env,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "is not a directory" in p.stderr, p.stderr
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr, p.stderr
    assert "\\x1b" in p.stderr and "forged" in p.stderr, p.stderr  # shown, escaped
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_inspect_and_explain_show_control_characters_escaped(tmp_path: Path, clean_env) -> None:
    root = tmp_path / "s"
    s = Store.open(root)
    try:
        s.put("triton", "K" + ESC, _files("k"), summary={"name": "k" + ESC}, components={"opt" + ESC: ESC})
        s.get("triton", "K2" + ESC, components={"opt" + ESC: "other" + ESC})  # a miss, for explain
        s.flush(force=True)
    finally:
        s.close()
    env = {**clean_env, "KCACHE_DIR": str(root)}
    for args in (["inspect"], ["inspect", "K"], ["explain"]):
        p = subprocess.run(
            [PYTHON, "-m", "kcache", *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 0, p.stderr
        assert "\x1b" not in p.stdout and "\x07" not in p.stdout, (args, p.stdout)
        assert "\\x1b" in p.stdout, (args, p.stdout)  # shown, escaped
