"""The command line under property-based fuzzing (issue 10, point 7).

Broader than tests/test_cli.py's property test: every subcommand (prewarm, export and import
too), global flags in any position, malformed values (unicode, huge and non-ASCII numbers,
empty strings, things that look like flags, NUL bytes), ``--dir`` pointing at anything (a file,
a missing path, a directory that is not a store, an empty one, a store owned by someone else or
writable by others, one with a garbage index, one with a pickle row in its index, a unicode or
very long path), and bad ``KCACHE_*`` values in the environment.

The contract checked (docs/reliability.md):
- exit 0 (done), 2 (bad arguments or settings) or 1 (a runtime failure: the store cannot be
  used, ``verify`` found problems, ``inspect PREFIX`` found nothing, a bundle or spec cannot be
  read or written); nothing else;
- exit 2 has exactly one ``kcache: error:`` line on stderr; exit 1 says why on stderr (verify:
  its problems on stdout); never a traceback;
- ``--json`` with exit 0 prints JSON;
- the store is not changed unless the command changes stores (``clear`` without ``--dry-run``,
  ``verify --fix``, ``stats --zero``, ``import``, ``prewarm``); stores that were refused are never
  changed; the pickle row never runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcache import cli

from .conftest import NOBODY, PYTHON, base_env, chown_tree, tree

WRITERS = {"import", "prewarm"}


class Playground(dict):
    def __repr__(self) -> str:  # hypothesis prints the fixture with each failure: keep it short
        return "<playground>"


@pytest.fixture(scope="module")
def playground(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every kind of --dir, built once; the writable store is copied per example."""
    from .conftest import load_chaos

    chaos = load_chaos()
    base = tmp_path_factory.mktemp("fuzz")
    tpl = base / "template"
    st_ = chaos.open_store(tpl)
    for i in range(4):
        for kind in chaos.KINDS:
            st_.put(kind, chaos.key_name(i), chaos.expected(kind, chaos.key_name(i)), components={"i": i})
    st_.get("chaos", "missing-key", {"i": 99})
    st_.close()
    paths: dict[str, Path] = {}
    paths["missing"] = base / "missing" / "store"
    paths["file"] = base / "afile.txt"
    paths["file"].write_text("not a store\n")
    paths["notstore"] = base / "notstore"
    paths["notstore"].mkdir()
    (paths["notstore"] / "precious.txt").write_text("user data")
    paths["empty"] = base / "empty"
    paths["empty"].mkdir()
    for name in ("foreign", "open", "garbage_index", "pickle_row", "störe-ü", "x" * 200):
        shutil.copytree(tpl, base / name)
        paths[name] = base / name
    chown_tree(paths["foreign"], NOBODY, NOBODY)
    os.chmod(paths["open"], 0o777)
    (paths["garbage_index"] / "index" / "kcache.sqlite").write_bytes(b"\x00garbage" * 2000)
    marker = base / "PWNED"
    con = sqlite3.connect(paths["pickle_row"] / "index" / "kcache.sqlite", isolation_level=None)
    con.execute(
        "INSERT INTO entries (id, kind, size, created, last_used, hits, record)"
        " VALUES (?, 'triton', 10, 1.0, 1.0, 0, ?)",
        ("a" * 40, b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."),
    )
    con.close()
    deep = base
    for _ in range(30):
        deep = deep / ("d" * 150)
    paths["too_long"] = deep / "store"
    paths["newline"] = base / "new\nline"
    # Files for FILE/SPEC/DIR arguments.
    files = {
        "garbage": base / "garbage.bin",
        "bad_toml": base / "bad.toml",
        "dir": paths["notstore"],
        "missing": base / "nope" / "x.tgz",
        "unicode": base / "bündel-ü.tgz",
        "out": base / "out" / "bundle.tgz",
    }
    files["garbage"].write_bytes(os.urandom(3000))
    files["bad_toml"].write_text("[[kernels]\nthis is = = not toml ]]\n")
    (base / "out").mkdir()
    pristine = base / "pristine"
    pristine.mkdir()
    for name in MUTABLE:
        if paths[name].exists():
            shutil.copytree(paths[name], pristine / name, symlinks=True)
    return Playground(template=tpl, paths=paths, files=files, marker=marker, base=base, pristine=pristine)


# --dir targets a writing command may legitimately change (create a store in, repair): put back
# as they were before the next example. Refused ones (foreign, open, file, notstore) never change.
MUTABLE = ("empty", "missing", "garbage_index", "pickle_row", "störe-ü", "x" * 200, "newline")


def restore(pg: dict[str, Any], name: str) -> None:
    p = pg["paths"][name]
    if p.exists():
        shutil.rmtree(p)
    if (pg["pristine"] / name).exists():
        shutil.copytree(pg["pristine"] / name, p, symlinks=True)
    if name == "missing":
        shutil.rmtree(p.parent, ignore_errors=True)


DIRS = st.sampled_from(
    [
        "STORE",
        "STORE",
        "STORE",
        "missing",
        "file",
        "notstore",
        "empty",
        "foreign",
        "open",
        "garbage_index",
        "pickle_row",
        "störe-ü",
        "x" * 200,
        "too_long",
        "newline",
        "",
    ]
)
WEIRD = st.sampled_from(
    [
        "",
        " ",
        "-",
        "--",
        "-1",
        "0",
        "1",
        "7",
        "9" * 40,
        "9" * 400,
        "1e309",
        "nan",
        "inf",
        "-inf",
        "0x10",
        "1_000",
        "３",
        "١٢",
        "½",
        "1.5",
        "12h",
        "7d",
        "1s",
        "-1d",
        "5x",
        "cuda:90",
        "cuda:",
        "cuda:-1",
        "cuda:99999999999999999999",
        "rocm:90",
        "triton",
        "triton-autotune",
        "nvfuser",
        "Bad Kind",
        "../etc",
        "ünïcödé",
        "日本語",
        "\u202e",
        "a\tb",
        "--json",
        "--all",
        "%s%n",
        "{}",
        "a" * 5000,
        "a\x00b",
    ]
)
TEXT = st.one_of(WEIRD, st.text(max_size=30))
FILES = st.sampled_from(["garbage", "bad_toml", "dir", "missing", "unicode", "out"])

OPTIONS: dict[str, list[Any]] = {
    "stats": [st.just(["--zero"])],
    "inspect": [
        st.tuples(st.just("--kind"), TEXT),
        st.tuples(st.just("--limit"), TEXT),
        TEXT.map(lambda t: [t]),
    ],
    "clear": [
        st.tuples(st.just("--kind"), TEXT),
        st.tuples(st.just("--older-than"), TEXT),
        st.just(["--stale"]),
        st.just(["--all"]),
        st.just(["--dry-run"]),
        st.just(["--dry-run"]),
    ],
    "verify": [st.just(["--fix"])],
    "explain": [
        st.tuples(st.just("--kind"), TEXT),
        st.tuples(st.just("--limit"), TEXT),
        st.tuples(st.just("--nearest"), TEXT),
    ],
    "config": [],
    "export": [FILES.map(lambda f: [f"FILE:{f}"]), st.tuples(st.just("--kind"), TEXT)],
    "import": [FILES.map(lambda f: [f"FILE:{f}"]), FILES.map(lambda f: ["--triton-cache", f"FILE:{f}"])],
    "prewarm": [
        FILES.map(lambda f: [f"FILE:{f}"]),
        st.tuples(st.just("--target"), TEXT),
        st.tuples(st.just("--jobs"), TEXT),
        st.tuples(st.just("--protect"), TEXT),
        st.just(["--dry-run"]),
        st.tuples(st.just("--path"), FILES.map(lambda f: f"FILE:{f}")),
    ],
    "bogus": [],
    "": [],
}
STRAY = st.sampled_from(["--json", "--frobnicate", "-x", "--help", "-h", "--version", "--", "x", "--dir"])
ENVS = st.dictionaries(
    st.sampled_from(
        ["KCACHE_MAX_SIZE", "KCACHE_LOG", "KCACHE_READONLY", "KCACHE_REMOTE", "KCACHE_KEY_TAG", "KCACHE"]
    ),
    st.one_of(WEIRD, st.sampled_from(["banana", "20GiB", "1", "0", "debug", "loud", "redis://nowhere:1/0"])),
    max_size=2,
)


@st.composite
def invocations(draw: st.DrawFn) -> tuple[str, list[str], bool, dict[str, str], str]:
    command = draw(st.sampled_from(list(OPTIONS)))
    opts = OPTIONS[command]
    chunk = st.one_of(*opts, st.just(["--json"])) if opts else st.just(["--json"])
    chunks = draw(st.lists(st.one_of(chunk, chunk, STRAY.map(lambda t: [t])), max_size=4))
    rest = [str(t) for c in chunks for t in c]
    if (
        command in ("export", "import", "prewarm")
        and not any(t.startswith("FILE:") for t in rest)
        and draw(st.booleans())
    ):
        rest.insert(0, f"FILE:{draw(FILES)}")
    return command, rest, draw(st.booleans()), draw(ENVS), draw(DIRS)


def resolve(tok: str, pg: dict[str, Any]) -> str:
    if tok.startswith("FILE:"):
        return str(pg["files"][tok[5:]])
    return tok


def run_main(argv: list[str], env_extra: dict[str, str], cwd: Path | None = None) -> tuple[Any, str, str]:
    """cli.main in this process, in ``cwd`` (relative --dir values land there, never in the
    checkout), with the environment patched and stdout/stderr captured."""
    here = os.getcwd()
    os.chdir(cwd or tempfile.gettempdir())
    try:
        return _run_main(argv, env_extra)
    finally:
        os.chdir(here)


def _run_main(argv: list[str], env_extra: dict[str, str]) -> tuple[Any, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env.update({k: v for k, v in env_extra.items() if "\x00" not in v})  # the OS refuses NUL in env
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env, clear=True),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # main must return; say so if it does not
            rc = ("SystemExit", e.code)
        except BaseException as e:  # noqa: BLE001 - anything escaping main is the failure
            rc = ("raised", repr(e))
    return rc, out.getvalue(), err.getvalue()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(inv=invocations())
def test_any_invocation_exits_cleanly_and_changes_nothing_unasked(
    playground: dict[str, Any], inv: tuple
) -> None:
    command, rest, json_first, env_extra, dir_name = inv
    pg = playground
    work = pg["base"] / "work"
    shutil.rmtree(work, ignore_errors=True)
    store = work / "store"
    shutil.copytree(pg["template"], store)
    out_file = pg["files"]["out"]
    out_file.unlink(missing_ok=True)
    target = str(store) if dir_name == "STORE" else (str(pg["paths"][dir_name]) if dir_name else "")
    argv = (
        (["--json"] if json_first else []) + ([command] if command else []) + [resolve(t, pg) for t in rest]
    )
    argv += ["--dir", target] if "--dir" not in rest and command else []
    shared = {k: tree(v) for k, v in pg["paths"].items() if k != "too_long" and v.is_dir()}
    before = tree(store)
    cwd = work / "cwd"
    cwd.mkdir()
    rc, out, err = run_main(argv, env_extra, cwd)
    assert rc in (0, 1, 2), (argv, env_extra, rc, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    errors = [line for line in err.splitlines() if re.match(r"kcache: error:", line)]
    if rc == 2:
        assert len(errors) == 1, (argv, err)
    elif rc == 1 and not ((command == "verify" or "--json" in argv) and out.strip()):
        # verify reports its problems on stdout, --json answers there; otherwise stderr says why
        assert any(line.startswith("kcache:") for line in err.splitlines()), (argv, err)
        assert len(errors) <= 1, (argv, err)
    help_or_version = any(t in ("-h", "--help", "--version") for t in argv)
    if rc == 0 and "--json" in argv and not help_or_version and command not in ("bogus", ""):
        json.loads(out)
    writes = (
        (command == "clear" and "--dry-run" not in rest)
        or (command == "verify" and "--fix" in rest)
        or (command == "stats" and "--zero" in rest)
        or command in WRITERS
    )
    if not writes or help_or_version:
        assert tree(store) == before, argv
    # Stores that are refused, and directories that are not stores, are never changed, whatever
    # the command; nothing ever unpickles the crafted row.
    for k, snap in shared.items():
        if k in ("foreign", "open", "notstore") or not writes or k != dir_name:
            assert tree(pg["paths"][k]) == snap, (k, argv)
    assert not pg["marker"].exists()
    if not writes:
        assert not pg["paths"]["missing"].exists() and not pg["paths"]["newline"].exists()
    if dir_name in MUTABLE:
        restore(pg, dir_name)


def test_huge_limit_is_a_bad_argument(tmp_path: Path) -> None:
    """A number no command can use is a bad argument (exit 2), not a runtime failure."""
    from .conftest import load_chaos

    load_chaos().open_store(tmp_path / "store").close()
    rc, _out, err = run_main(["inspect", "--limit", "9" * 30, "--dir", str(tmp_path / "store")], {})
    assert rc == 2, (rc, err)


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "--dir", "/nonexistent/störe"],
        ["inspect", "ünïcödé", "--dir", "{store}"],
        ["inspect", "--kind", "trïton", "--dir", "{store}"],
        ["config", "--dir", "{store}"],
        ["clear", "--older-than", "٣d", "--dry-run", "--dir", "{store}"],
        ["verify", "--json", "--dir", "{store}"],
        ["--json", "stats", "--dir", "{store}"],
    ],
)
@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_real_processes_with_unicode_and_narrow_encodings(
    args: list[str], encoding: str, tmp_path: Path, playground: dict[str, Any]
) -> None:
    """As a user's shell runs it, including with an ASCII-only stdout: no traceback, a clean
    exit status, a message on errors."""
    store = tmp_path / "störe"
    shutil.copytree(playground["template"], store)
    argv = [a.replace("{store}", str(store)) for a in args]
    env = base_env(tmp_path, PYTHONIOENCODING=encoding, LC_ALL="C")
    before = tree(store)
    r = subprocess.run([PYTHON, "-m", "kcache", *argv], capture_output=True, env=env, timeout=120)
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode in (0, 1, 2), err
    assert "Traceback" not in err, err
    if r.returncode:
        assert "kcache:" in err
    assert tree(store) == before
