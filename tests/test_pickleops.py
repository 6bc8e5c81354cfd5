"""kcache reads the strings of an AOTAutograd entry's pickle without the pickle module
(kcache/inductor/pickleops.py): checked here against pickletools, the standard library's own
reading of the format, on pickles of every protocol. (The tests may use pickle to make pickles;
kcache never imports it.)"""

from __future__ import annotations

import pickle
import pickletools
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from kcache.inductor import pickleops

REPO = Path(__file__).resolve().parents[1]


class CompiledForward:  # the shape of what graphs.py looks for: a class and key strings
    def __init__(self) -> None:
        self.fx_graph_cache_info = ("f" + "a" * 51, ["f" + "b" * 51])
        self.other = {"n": 2**70, "x": 1.5, "b": b"\x00\x8c\x34" * 40, "t": (None, True, False)}


SAMPLES = [
    CompiledForward(),
    ["ascii", "é – ✓ \U0001f600", "", "x" * 300, "y" * 70_000, "line\nbreak\\u1234"],
    {"a": [1, -1, 255, 65_535, 2**31 - 1, -(2**31), 2**64, -(2**200)], "f": [0.1, -2e300]},
    OrderedDict(k=frozenset({1, 2}), s={3}, ba=bytearray(b"z" * 300), by=b"q" * 70_000),
    ("nested", ("tuple", ("deep", [{"k": "v"}] * 3))),
]


def _reference(data: bytes) -> list[str]:
    return [arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str) and "UNICODE" in op.name]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_the_strings_are_pickletools_own(protocol: int) -> None:
    for obj in SAMPLES:
        data = pickle.dumps(obj, protocol=protocol)
        assert pickleops.unicode_strings(data) == _reference(data)
    data = pickle.dumps(SAMPLES[0], protocol=protocol)
    if protocol >= 1:
        assert "f" + "a" * 51 in pickleops.unicode_strings(data)


def test_every_opcode_of_the_format_is_known_with_its_argument() -> None:
    lines = {"decimalnl_short", "decimalnl_long", "floatnl", "stringnl", "stringnl_noescape",
             "stringnl_noescape_pair", "unicodestringnl"}  # fmt: skip
    for op in pickletools.opcodes:
        code = ord(op.code.encode("latin-1"))
        if op.arg is None:
            assert code in pickleops._NO_ARG, op.name
        elif op.arg.n > 0:
            assert pickleops._FIXED.get(code) == op.arg.n, op.name
        elif op.arg.name in lines:
            assert code in pickleops._LINES or code == pickleops._UNICODE_LINE, op.name
        else:
            assert code in pickleops._SIZED, op.name


@pytest.mark.parametrize("cut", [1, 2, 10, 100])
def test_a_cut_pickle_or_a_foreign_byte_is_refused(cut: int) -> None:
    data = pickle.dumps(SAMPLES[1], protocol=4)
    with pytest.raises(pickleops.PickleFormatError):
        pickleops.unicode_strings(data[:-cut])
    with pytest.raises(pickleops.PickleFormatError, match="opcode 0xff"):
        pickleops.unicode_strings(b"\x80\x04\xff.")
    with pytest.raises(pickleops.PickleFormatError):  # a length past the end
        pickleops.unicode_strings(b"\x80\x04X\xff\xff\xff\x7fab.")


def test_reading_an_entry_loads_no_pickle_module() -> None:
    code = (
        "import sys, kcache.inductor.graphs as g\n"
        'try:\n    g.fx_keys(b\'{"data": "gARdlC4="}\')\nexcept g.Unreadable:\n    pass\n'
        "print(sorted(m for m in ('pickle', 'pickletools', '_pickle') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_kept_list_of_graphs_is_what_the_walk_reads() -> None:
    """An AOTAutograd entry's FX keys are kept beside it when it is stored (kcache/inductor/
    entries.py, ``KEYS``): the list read back is the walk's, a list kept by another reading of
    entries is not trusted (None: the entry is walked), and reading it back accepts nothing the
    walk could not have returned."""
    import json

    from kcache.inductor import graphs

    keys = graphs.fx_keys(_aot_entry())
    assert keys == ["f" + "a" * 51, "f" + "b" * 51]
    assert graphs.decode_keys(graphs.encode_keys(keys)) == keys
    assert graphs.decode_keys(graphs.encode_keys([])) == []
    many = [f"f{i:051b}".translate({48: 97, 49: 98}) for i in range(graphs.MAX_NAMED)]  # distinct keys
    assert graphs.decode_keys(graphs.encode_keys(many)) == many

    def kept(keys: Any, reading: Any = graphs.READING) -> bytes:
        return json.dumps({"reading": reading, "keys": keys}).encode()

    key = "f" + "c" * 51
    for other in (graphs.READING + 1, 0, str(graphs.READING), True, None, [graphs.READING]):
        assert graphs.decode_keys(kept([key], other)) is None, other  # walked, never trusted
    for hostile in (
        b"",
        b"not json",
        json.dumps([key]).encode(),  # no reading
        b'{"reading": 1}',
        kept({"f": 1}),  # not a list
        kept(key),  # a string, not a list of them
        kept([key, key]),  # a key twice
        kept([key + "x"]),  # not an FX key
        kept(["../" + key[3:]]),  # a path
        kept([key.upper()]),  # not base32 as torch writes it
        kept([1]),
        kept([[key]]),  # unhashable items
        kept([{}]),
        kept([*many, key]),  # more than an entry names
        b"[" * 2_000 + b"]" * 2_000,  # nested past the parser's recursion limit (RecursionError)
        b" " * 10_000 + kept([key]),  # larger than any list of keys
        b"\xff\xfe",
    ):
        with pytest.raises(graphs.Unreadable):
            graphs.decode_keys(hostile)


def _aot_entry() -> bytes:
    """Inductor's remote-cache bytes for an AOTAutograd entry naming two FX graphs."""
    import base64
    import json

    return json.dumps(
        {"data": base64.b64encode(pickle.dumps(CompiledForward(), protocol=4)).decode()}
    ).encode()


def test_verify_finds_a_kept_list_that_is_not_the_entry_s(tmp_path: Path) -> None:
    """``kcache verify`` reads each AOTAutograd entry's pickle and its kept list: a list that
    names other graphs than the pickle (changed, or written wrong) is a problem, and ``--fix``
    removes the entry; an entry whose list agrees, or has none, is sound."""
    import json

    from kcache.inductor import graphs
    from kcache.inductor.declare import INDUCTOR_AOT
    from kcache.inductor.entries import KEYS, MEMBER
    from kcache.store import Store

    value = _aot_entry()
    store = tmp_path / "store"
    s = Store.open(store)
    try:
        s.replace(INDUCTOR_AOT, "good", {MEMBER: value, KEYS: graphs.encode_keys(graphs.fx_keys(value))})
        s.replace(INDUCTOR_AOT, "old", {MEMBER: value})  # kept before lists existed
        bad = s.replace(INDUCTOR_AOT, "bad", {MEMBER: value, KEYS: graphs.encode_keys([])})
        assert bad is not None
        bad_id = bad.record.id
    finally:
        s.close()

    def verify(*more: str) -> tuple[int, dict]:
        r = subprocess.run(
            [sys.executable, "-m", "kcache", "verify", "--json", "--dir", str(store), *more],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        return r.returncode, json.loads(r.stdout)

    rc, out = verify()
    assert rc == 1, out  # was: sound (the list was never compared with the pickle)
    (problem,) = [p for p in out["problems"] if p["type"] == "bad_metadata"]  # (and its index row)
    assert problem["id"] == bad_id and "not the one its pickle names" in problem["detail"], problem
    rc, out = verify("--fix")
    assert rc == 0 and out["ok"] is True, out
    s = Store.open(store)
    try:
        assert s.get(INDUCTOR_AOT, "bad") is None
        assert s.get(INDUCTOR_AOT, "good") is not None and s.get(INDUCTOR_AOT, "old") is not None
    finally:
        s.close()
