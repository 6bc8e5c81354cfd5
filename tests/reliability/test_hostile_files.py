"""Hostile inputs, round three (issue 34, points 1, 2, 4 and 5): files a user names, public
functions over a store they cannot use, the index's side files, a filesystem out of inodes.

Real processes, real files, real Triton compiles for sm_90 without a GPU, a real tmpfs with few
inodes (root; CI runs as root, where a test that cannot mount fails instead of skipping). The
crafted inputs come from ``tools/chaos_inputs.py`` (its ``phase_inputs`` runs them as a chaos
phase too). Children import the kcache of this checkout (``PYTHONPATH``), so this file can be run
against another commit's worktree; each test says what main 36acaa2 did.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import base_env, compile_in_child, kenv, store_entries, tmpfs, warning_lines

REPO = Path(__file__).resolve().parents[2]


def _load_inputs() -> Any:
    spec = importlib.util.spec_from_file_location("chaos_inputs", REPO / "tools" / "chaos_inputs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chaos_inputs", mod)
    spec.loader.exec_module(mod)
    return sys.modules["chaos_inputs"]


ci = _load_inputs()


def _text(b: bytes | str) -> str:
    return b if isinstance(b, str) else b.decode("utf-8", "replace")


def _fill(root: Path, n: int = 4, env: dict[str, str] | None = None) -> None:
    """A store with ``n`` entries and its index (every row written), closed."""
    code = (
        "import sys\nfrom kcache.store import Store\ns = Store.open(sys.argv[1])\n"
        f"for i in range({n}): s.put('chaos', f'k{{i}}', {{'m.bin': bytes([i]) * 1000}})\n"
        "s.flush(force=True); s.index(); s.close()\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(root)], env=env or ci.child_env(root.parent), capture_output=True
    )
    assert r.returncode == 0, _text(r.stderr)


def _index_files(root: Path) -> list[str]:
    return sorted(os.listdir(root / "index"))


# ============================================================================ 1. files a user names

CASES = [
    (c, a)
    for c in ci.USER_FILE_COMMANDS
    for a in ci.USER_FILE_ATTACKS
    if (c, a) not in ci.USER_FILE_CONTENT_BOUNDED
]


@pytest.mark.parametrize(("command", "attack"), CASES, ids=[f"{c}-{a}".replace(" ", "_") for c, a in CASES])
def test_a_file_a_user_names_is_refused_at_once_unless_regular_bounded_and_shallow(
    command: str, attack: str, tmp_path: Path
) -> None:
    """Each command that reads a file a user names (``explain --against`` a fingerprint or
    bundle, ``import`` a bundle, ``prewarm`` a spec) against a FIFO, a link to one, /dev/stdin on
    a pipe whose writer stays open and silent, a 1 GiB sparse file that starts like the real
    thing, and a document nested 100,000 deep: the child (address space limited to 1.5 GiB,
    killed after 30 s) ends within the time with exit 2 and one line naming the file, no
    traceback, no MemoryError, a small peak RSS, no store made by a refused import.

    On main 36acaa2: ``explain --against`` blocked for ever on the FIFO, the link and /dev/stdin
    (killed at 30 s), ended in MemoryError on the sparse file and in RecursionError on the deep
    one (exit 1); ``import`` refused the FIFO, the link and /dev/stdin with exit 1, and a deep
    manifest ended in RecursionError (exit 1); ``prewarm`` ended in RecursionError on the deep
    spec. (``prewarm`` already refused the FIFO, the link, /dev/stdin and the sparse file with
    exit 2 since issue 24: those four pass on main and are kept here with the rest.)"""
    why = ci.user_file_case(tmp_path, command, attack, ci.child_env(tmp_path), timeout=30)
    assert why is None, why


def test_a_sparse_bundle_is_bounded_by_its_manifest(tmp_path: Path) -> None:
    """The one pair the matrix leaves out: a bundle is large by nature, so a 1 GiB sparse file
    that starts like one (a MANIFEST member claiming 1 GiB) is refused by the manifest's bound
    (exit 1, one line, nothing read: its content is what is wrong), not by the file's size.
    Passes on main too (issue 18's bounds); here so the matrix has no hole."""
    why = ci.user_file_case(tmp_path, "import", "sparse-1GiB", ci.child_env(tmp_path), timeout=30)
    assert why is None, why


def test_legitimate_user_files_are_still_read(tmp_path: Path) -> None:
    """The controls: a fingerprint written by ``kcache fingerprint -o`` is read by ``explain
    --against``, and the example prewarm spec passes ``--dry-run``, under the same bounds."""
    env = ci.child_env(tmp_path)
    store = tmp_path / "store"
    _fill(store)
    fp = tmp_path / "other.json"
    r = ci.cli(["fingerprint", "-o", str(fp)], env)
    assert r.returncode == 0, _text(r.stderr)
    r = ci.cli(["explain", "--against", str(fp), "--json", "--dir", str(store)], env)
    assert r.returncode == 0, _text(r.stderr)
    assert json.loads(r.stdout)["other"]["type"] == "fingerprint"
    ex = tmp_path / "ex"
    shutil.copytree(REPO / "docs" / "examples" / "prewarm", ex)
    r = ci.cli(
        ["prewarm", str(ex / "spec.toml"), "--target", "cuda:90", "--dry-run", "--dir", str(store)], env
    )
    assert r.returncode == 0, _text(r.stderr)[-2000:]


def test_a_deep_file_in_a_triton_cache_folder_skips_its_kernel(tmp_path: Path) -> None:
    """``kcache import --triton-cache DIR`` where one kernel's ``__grp__`` file nests 100,000
    deep: that kernel is skipped with a line saying so, the good one is imported, exit 0. On
    main the RecursionError ended the whole import (exit 1, nothing imported)."""
    tc = tmp_path / "triton-cache"
    ci.triton_group(tc / ci.triton_key(0))  # a good one
    (tc / ci.triton_key(1)).mkdir(parents=True)
    (tc / ci.triton_key(1) / "__grp__k.json").write_bytes(
        b'{"child_paths": ' + b"[" * ci.DEEP + b"]" * ci.DEEP + b"}"
    )
    r = ci.cli(
        ["import", "--triton-cache", str(tc), "--dir", str(tmp_path / "store"), "--json"],
        ci.child_env(tmp_path),
    )
    assert r.returncode == 0 and b"Traceback" not in r.stderr, _text(r.stderr)[-2000:]
    rep = json.loads(r.stdout)
    assert rep["kernels"] == 1, rep
    why = {Path(s["path"]).parent.name: s["why"] for s in rep["skipped"]}
    assert "nested deeper" in why[ci.triton_key(1)], why


# ============================================================================ 2. public functions

API_CHILD = r"""
import json, sys
import kcache
out, raised = {}, {}
def run(name, fn):
    try:
        out[name] = fn()
    except BaseException as e:
        raised[name] = f"{type(e).__name__}: {e}"
run("enable", lambda: kcache.enable(dir=sys.argv[1]))
run("active_store", lambda: kcache.active_store() is not None)
run("is_enabled", kcache.is_enabled)
run("stats", lambda: {k: v for k, v in kcache.stats().items() if k in ("enabled", "entries", "index_error", "error")})
run("disable", kcache.disable)
run("enable-again", lambda: kcache.enable(dir=sys.argv[1]))
run("stats-again", lambda: kcache.stats().get("entries"))
print(json.dumps({"out": out, "raised": raised}, default=str))
"""


def _newer_index(root: Path) -> None:
    c = sqlite3.connect(root / "index" / "kcache.sqlite")
    c.execute("UPDATE meta SET value = '9' WHERE name = 'schema'")
    c.commit()
    c.close()


def _journal_folder(root: Path) -> None:
    (root / "index" / "kcache.sqlite-journal").mkdir()


def _not_a_store(root: Path) -> None:
    shutil.rmtree(root)
    root.mkdir()
    (root / "notes.txt").write_text("not a store")


STORES = {
    "index-of-a-newer-kcache": (_newer_index, 4),  # main: stats() raised IndexTooNew
    "folder-at-the-journal": (_journal_folder, 4),  # main: stats() raised OperationalError: disk I/O error
    "not-a-store": (_not_a_store, None),  # main: refused with one warning (kept so)
}


@pytest.mark.parametrize("case", list(STORES))
def test_public_functions_never_raise_for_a_store_they_cannot_use(case: str, tmp_path: Path) -> None:
    """``kcache.enable``, ``active_store``, ``is_enabled``, ``stats`` and ``disable``, with
    ``KCACHE_STRICT=0`` as a user's program runs them, on a store whose index a newer kcache
    wrote, one with a folder where SQLite's rollback journal goes, and a folder that is no store:
    nothing raises, at most one warning, and ``stats()`` still counts the store's entries (from
    its entry folders when the index cannot be used; ``index_error`` says why).

    On main 36acaa2 ``kcache.stats()`` raised ``IndexTooNew`` and ``OperationalError: disk I/O
    error`` into the program for the first two; the rest passed there too (kept as guards)."""
    root = tmp_path / "store"
    plant, n = STORES[case]
    _fill(root)
    plant(root)
    r = subprocess.run(
        [sys.executable, "-c", API_CHILD, str(root)],
        env=base_env(tmp_path, KCACHE_STRICT="0"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert not res["raised"], res
    assert len(warning_lines(r.stderr)) <= 1, r.stderr
    if n is None:
        assert res["out"]["enable"] is False and res["out"]["stats"] == {"enabled": False}, res
    else:
        assert res["out"]["enable"] is True, res
        assert res["out"]["stats"]["entries"] == n and res["out"]["stats-again"] == n, res


def test_stats_raises_only_when_strict(tmp_path: Path) -> None:
    """The same newer index under ``KCACHE_STRICT=1``: the failure is raised (for tests and
    debugging), as every fail-open edge does."""
    root = tmp_path / "store"
    _fill(root)
    _newer_index(root)
    r = subprocess.run(
        [sys.executable, "-c", API_CHILD, str(root)],
        env=base_env(tmp_path, KCACHE_STRICT="1"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert "IndexTooNew" in res["raised"].get("stats", ""), res


PREWARM_CHILD = r"""
import json, sys
import kcache
try:
    s = kcache.prewarm(sys.argv[1], target="cuda:90", dir=sys.argv[2], in_process=True)
    print(json.dumps({"exit_code": s.exit_code, "items": [[i.status, i.reason] for i in s.items]}))
except BaseException as e:
    print(json.dumps({"raised": f"{type(e).__name__}: {e}"}))
"""


@pytest.mark.parametrize("case", ["not-a-store", "read-only"])
def test_the_prewarm_api_never_raises_for_a_store_it_cannot_use(case: str, tmp_path: Path) -> None:
    """``kcache.prewarm(spec, dir=...)`` run in the program's own process (``in_process=True``)
    into a folder that is no store, or a store under ``KCACHE_READONLY=1``: with
    ``KCACHE_STRICT=0`` it returns a summary whose every item failed saying why (``exit_code``
    1; what its workers report for such a store), with one warning; with ``KCACHE_STRICT=1`` it
    raises. On main 36acaa2 it raised ``UsageError`` into the program in both cases."""
    ex = tmp_path / "ex"
    shutil.copytree(REPO / "docs" / "examples" / "prewarm", ex)
    root = tmp_path / "store"
    extra: dict[str, str] = {}
    if case == "not-a-store":
        root.mkdir()
        (root / "notes.txt").write_text("not a store")
    else:
        _fill(root)
        extra["KCACHE_READONLY"] = "1"
    for strict in ("0", "1"):
        r = subprocess.run(
            [sys.executable, "-c", PREWARM_CHILD, str(ex / "spec.toml"), str(root)],
            env=base_env(tmp_path, KCACHE_STRICT=strict, **extra), capture_output=True, text=True,
            timeout=300, cwd=str(ex),
        )  # fmt: skip
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
        res = json.loads(r.stdout.strip().splitlines()[-1])
        if strict == "1":
            assert "StoreUnusable" in res.get("raised", ""), res
            continue
        assert "raised" not in res, res
        assert res["exit_code"] == 1 and res["items"], res
        assert all(st == "failed" and str(root) in why for st, why in res["items"]), res
        assert len(warning_lines(r.stderr)) == 1, r.stderr


# ============================================================================ 3. the index's side files

SIDE_FILES = {
    "journal-folder": ("kcache.sqlite-journal", "dir"),
    "journal-fifo": ("kcache.sqlite-journal", "fifo"),
    "journal-link-to-a-folder": ("kcache.sqlite-journal", "link"),
    "wal-folder": ("kcache.sqlite-wal", "dir"),
    "shm-fifo": ("kcache.sqlite-shm", "fifo"),
    "super-journal-folder": ("kcache.sqlite-mj0123456789", "dir"),
}


def _plant(root: Path, name: str, what: str, victim: Path) -> None:
    p = root / "index" / name
    if what == "dir":
        p.mkdir()
        (p / "inside").write_text("x")
    elif what == "fifo":
        os.mkfifo(p)
    else:
        victim.mkdir(exist_ok=True)
        (victim / "keep").write_text("keep")
        os.symlink(victim, p)


@pytest.mark.parametrize("case", list(SIDE_FILES))
def test_anything_but_a_file_at_an_index_path_is_removed_before_sqlite_opens_it(
    case: str, tmp_path: Path
) -> None:
    """A folder, a FIFO or a link at any path SQLite opens for the index (its ``-journal``,
    ``-wal``, ``-shm``, a super-journal): ``kcache.stats()`` (strict: anything raised fails the
    test) counts every entry with one warning, the thing is gone and what a link pointed to is
    untouched; then, planted again with rows missing from the index, ``verify --fix`` repairs
    (exit 0) and ``verify`` is clean.

    On main 36acaa2: a folder at ``-journal`` made ``kcache.stats()`` raise
    ``sqlite3.OperationalError: disk I/O error`` and ``verify --fix`` exit 1 ("free some space and
    run it again") without repairing; a FIFO there made ``kcache.stats()`` hang (killed at
    120 s); a link to a folder there raised ``unable to open database file``; a folder at ``-wal``
    made ``verify --fix`` exit 1 ("cannot read the index ...: unable to open database file": its
    read-only open came before the rule); a folder at a super-journal's name was left in place
    (harmless until a hot journal names it). ``shm-fifo`` passed there (a guard)."""
    root = tmp_path / "store"
    name, what = SIDE_FILES[case]
    _fill(root)
    victim = tmp_path / "victim"
    _plant(root, name, what, victim)
    code = "import json, sys, kcache\nassert kcache.enable(dir=sys.argv[1])\nprint(json.dumps(kcache.stats()['entries']))"
    r = subprocess.run(
        [sys.executable, "-c", code, str(root)], env=base_env(tmp_path, KCACHE_STRICT="1"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == 4
    assert len(warning_lines(r.stderr)) == 1 and name in r.stderr, r.stderr
    assert name not in _index_files(root)
    if what == "link":
        assert (victim / "keep").read_text() == "keep"
    # Rows gone from the index (entries committed by processes that died before their flush),
    # and the thing planted again: verify --fix must repair, not fail on SQLite's open.
    c = sqlite3.connect(root / "index" / "kcache.sqlite")
    c.execute("DELETE FROM entries")
    c.commit()
    c.close()
    for n in _index_files(root):
        if n != "kcache.sqlite":
            os.unlink(root / "index" / n)
    _plant(root, name, what, victim)
    env = ci.child_env(tmp_path)
    r = ci.cli(["verify", "--fix", "--dir", str(root)], env)
    assert r.returncode == 0, (_text(r.stdout)[-2000:], _text(r.stderr)[-2000:])
    r = ci.cli(["verify", "--json", "--dir", str(root)], env)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], _text(r.stdout)[-2000:]


HALF_MADE = {
    # what a full filesystem leaves: the database made (no inode for its log), or its first page
    "empty-database": lambda idx: (idx / "kcache.sqlite").write_bytes(b""),
    "header-and-empty-log": lambda idx: (
        sqlite3.connect(idx / "kcache.sqlite").execute("PRAGMA journal_mode=WAL").fetchall(),
        (idx / "kcache.sqlite-wal").write_bytes(b""),
    ),
    "garbage": lambda idx: (idx / "kcache.sqlite").write_bytes(b"\x00garbage" * 2000),
}


@pytest.mark.parametrize("case", list(HALF_MADE))
def test_an_unreadable_index_is_read_around_then_rebuilt_by_the_next_writer(
    case: str, tmp_path: Path
) -> None:
    """The index replaced by what a full disk leaves (an empty database; its first page and an
    empty log) or by garbage: ``kcache stats`` and ``inspect`` answer from the entry folders
    (exit 0, every entry, one warning) and change nothing; the next process that writes (a
    program's ``kcache.stats()``) replaces the database, and ``kcache verify`` is then clean,
    with no ``verify --fix``.

    On main 36acaa2 ``kcache stats`` exited 1 (``CorruptIndex: not a kcache index (no meta
    table)``; for garbage: "the store's index is unreadable ...; `kcache verify --fix` rebuilds
    it") until someone ran ``verify --fix``."""
    root = tmp_path / "store"
    _fill(root)
    idx = root / "index"
    for n in _index_files(root):
        os.unlink(idx / n)
    HALF_MADE[case](idx)
    env = ci.child_env(tmp_path)
    # (A reader of a database with a log makes SQLite's shared-memory index of that log, -shm:
    # that is SQLite reading, not the store changed.)
    before = {n: (idx / n).read_bytes() for n in _index_files(root) if not n.endswith("-shm")}
    r = ci.cli(["stats", "--json", "--dir", str(root)], env)
    assert r.returncode == 0, _text(r.stderr)
    assert json.loads(r.stdout)["entries"] == 4
    warnings = [ln for ln in _text(r.stderr).splitlines() if ln.startswith("kcache: WARNING")]
    assert len(warnings) == 1 and "reading the entries" in warnings[0], warnings
    r = ci.cli(["inspect", "--json", "--dir", str(root)], env)
    assert r.returncode == 0 and len(json.loads(r.stdout)) == 4, _text(r.stderr)
    assert {n: (idx / n).read_bytes() for n in _index_files(root) if not n.endswith("-shm")} == before, (
        "a reading command changed the index"
    )
    code = "import sys, kcache\nassert kcache.enable(dir=sys.argv[1])\nassert kcache.stats()['entries'] == 4"
    r2 = subprocess.run(
        [sys.executable, "-c", code, str(root)], env=base_env(tmp_path, KCACHE_STRICT="1"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r2.returncode == 0, r2.stderr[-3000:]
    r = ci.cli(["verify", "--json", "--dir", str(root)], env)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], _text(r.stdout)[-2000:]


# ============================================================================ 4. out of inodes


@pytest.mark.parametrize("left", [0, 1, 2])
def test_a_filesystem_out_of_inodes_costs_one_warning_and_the_store_recovers(
    left: int, tmp_path: Path, chaos: Any, reference_kernels: dict, compiled_store: Any
) -> None:
    """A store on a real tmpfs of 1,000 inodes. Two kernels compiled while inodes are free; then
    the index's files are removed (the log and shared-memory file go when the last process
    closes; the database too, so that the next process must make it anew) and the inode table
    filled, leaving 0, 1 or 2 free (the database then cannot be made, or is made
    empty, or gets its first page but no shared-memory file). A program (``KCACHE=1``,
    ``KCACHE_STRICT=0``) compiles the two kernels (hits) and two new ones, and calls
    ``kcache.stats()``: every kernel is Triton's own, ``stats()`` returns (no raise) counting the
    entries on disk, and exactly one warning is printed. Once the inodes are freed, ``kcache
    stats`` works (exit 0, every entry) with no ``verify --fix``, and after the next program
    ``kcache verify`` is clean.

    On main 36acaa2: three warnings (the entry's write, the lock file, the index) and
    ``kcache.stats()`` raised ``OperationalError: unable to open database file`` into the
    program; once the inodes were freed ``kcache stats`` exited 1 with ``CorruptIndex: not a
    kcache index (no meta table)`` (left 1 and 2) until ``kcache verify --fix``."""
    specs = chaos.kernel_specs(4)
    with tmpfs(tmp_path / "fs", "64m", inodes=1000) as fs:
        store = fs / "store"
        env = kenv(tmp_path, store, KCACHE_STRICT="0")
        # The two kernels compiled while inodes are free: compiled_store(2) is that compile
        # (KCACHE=1, enabled, no warning), made once a session; copied onto the tmpfs, modes kept.
        shutil.copytree(compiled_store(2), store, symlinks=True)
        for n in _index_files(store):
            os.unlink(store / "index" / n)
        on_disk = len(store_entries(store))
        ci.fill_inodes(fs / "fill", leave=left)
        after = (
            "s = kcache.stats()\n"
            "out['stats'] = {k: s.get(k) for k in ('enabled', 'entries', 'index_error', 'error')}\n"
        )
        out, r = compile_in_child(specs, env, after=after)
        assert (
            out["kernels"] == {n: reference_kernels[n] for n in out["kernels"]} and len(out["kernels"]) == 4
        )
        warnings = warning_lines(r.stderr)
        assert len(warnings) == 1, warnings
        assert out["stats"]["enabled"] and out["stats"]["entries"] == on_disk, out["stats"]
        shutil.rmtree(fs / "fill")
        cli_env = ci.child_env(tmp_path)
        r = ci.cli(["stats", "--json", "--dir", str(store)], cli_env)
        assert r.returncode == 0, _text(r.stderr)
        assert json.loads(r.stdout)["entries"] == len(store_entries(store)) == on_disk
        out, r = compile_in_child(specs, env)  # the next program: its flush makes the index anew
        assert not warning_lines(r.stderr), r.stderr
        r = ci.cli(["verify", "--json", "--dir", str(store)], cli_env)
        assert r.returncode == 0 and json.loads(r.stdout)["ok"], _text(r.stdout)[-2000:]
