"""Corruption (issue 10, point 2): a flipped byte, a truncated file, a deleted group member, a
garbage record, a corrupt or deleted index. Each is detected on read (a miss, the entry
quarantined, one warning) and by ``kcache verify``; a broken index is replaced without losing the
ability to cache, and hits keep working while it is broken (they never read it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kcache import log as klog

from .conftest import PYTHON, base_env, compile_in_child, kenv, no_traceback, run_py, warning_lines

KEYS = 8


@pytest.fixture
def filled(tmp_path: Path, chaos: Any) -> Path:
    root = tmp_path / "store"
    st = chaos.open_store(root)
    for i in range(KEYS):
        for kind in chaos.KINDS:
            assert st.put(kind, chaos.key_name(i), chaos.expected(kind, chaos.key_name(i))) is not None
    st.close()
    return root


def kcache_cli(root: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "kcache", *args, "--dir", str(root), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("how", ["flip_member", "truncate_member", "delete_member", "garbage_record"])
def test_damage_found_by_verify_cli_and_fixed(how: str, filled: Path, tmp_path: Path, chaos: Any) -> None:
    """`kcache verify` (the command) names the damaged entry and exits 1; `--fix` removes it and
    exits 0; the store then verifies clean and the entry can be cached again."""
    st = chaos.open_store(filled)
    kind, key = "chaos-group", chaos.key_name(3)
    ident = st.entry_id(kind, key)
    chaos.corrupt_entry(st, kind, key, how, random.Random(1), str(tmp_path))
    st.close()
    env = base_env(tmp_path)
    r = kcache_cli(filled, "verify", env=env)
    assert r.returncode == 1, r.stderr
    no_traceback(r)
    problems = json.loads(r.stdout)["problems"]
    assert [p["id"] for p in problems if p["type"] == "corrupt_entry"] == [ident], problems
    r = kcache_cli(filled, "verify", "--fix", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = kcache_cli(filled, "verify", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"]
    assert not os.path.exists(os.path.join(filled, "entries", ident[:2], ident))
    st = chaos.open_store(filled)
    assert st.get(kind, key) is None
    hit = st.put(kind, key, chaos.expected(kind, key))
    assert hit is not None and chaos.check_hit(kind, key, hit) is None
    st.close()


def corruptions() -> list[str]:
    from .conftest import load_chaos

    return list(load_chaos().CORRUPTIONS)


@pytest.mark.parametrize("how", corruptions())
def test_damage_is_a_miss_with_one_warning(
    how: str, filled: Path, tmp_path: Path, chaos: Any, kcache_warnings: list[str]
) -> None:
    """Read in a process: a miss, exactly one warning, the entry quarantined (a second read is a
    quiet miss), verify finds it beforehand, and files outside the store are never touched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    st = chaos.open_store(filled)
    kind = "chaos" if how in ("flip_record", "truncate_record", "symlink_record") else "chaos-group"
    key = chaos.key_name(5)
    ident = st.entry_id(kind, key)
    chaos.corrupt_entry(st, kind, key, how, random.Random(2), str(outside))
    before_outside = {
        p.name: p.read_bytes() for p in outside.rglob("*") if p.is_file() and not p.is_symlink()
    }
    v = chaos.verify(filled, fix=False)
    flagged = {p["id"] for p in v["problems"]}
    assert ident in flagged, (how, v["problems"])
    klog._warned.clear()
    kcache_warnings.clear()
    assert st.get(kind, key) is None
    if how == "delete_record":
        # Nothing left that calls itself an entry: a plain miss. verify found the leftovers.
        assert kcache_warnings == []
    else:
        assert len(kcache_warnings) == 1, kcache_warnings
        assert ident[:12] in kcache_warnings[0]
    kcache_warnings.clear()
    assert st.get(kind, key) is None
    assert kcache_warnings == []
    # Other entries are untouched and still served exactly.
    for i in range(KEYS):
        for k in chaos.KINDS:
            if (k, chaos.key_name(i)) != (kind, key):
                h = st.get(k, chaos.key_name(i))
                assert h is not None and chaos.check_hit(k, chaos.key_name(i), h) is None
    hit = st.put(kind, key, chaos.expected(kind, key))
    assert hit is not None and chaos.check_hit(kind, key, hit) is None
    st.close()
    chaos.verify(filled, fix=True)
    assert chaos.verify(filled, fix=False)["ok"]
    after_outside = {p.name: p.read_bytes() for p in outside.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after_outside == before_outside


def test_damage_read_in_a_child_warns_once_on_stderr(filled: Path, tmp_path: Path, chaos: Any) -> None:
    """The warning a user sees: one line on stderr for many reads of one damaged entry."""
    st = chaos.open_store(filled)
    chaos.corrupt_entry(st, "chaos", chaos.key_name(1), "flip_member", random.Random(3), str(tmp_path))
    st.close()
    code = f"""
import json, importlib.util, sys
spec = importlib.util.spec_from_file_location("c", {str(chaos.HERE)!r}); c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
st = c.open_store({str(filled)!r})
res = [st.get("chaos", c.key_name(1)) is None for _ in range(5)]
print(json.dumps(res))
"""
    r = run_py(code, base_env(tmp_path))
    no_traceback(r)
    assert json.loads(r.stdout) == [True] * 5
    assert len(warning_lines(r.stderr)) == 1, r.stderr


INDEX_DAMAGE = ["garbage", "truncated", "db_deleted", "index_deleted", "wal_garbage"]


def damage_index(root: Path, how: str) -> None:
    idx = root / "index"
    db = idx / "kcache.sqlite"
    for suffix in ("-wal", "-shm"):
        if how != "wal_garbage":
            (idx / f"kcache.sqlite{suffix}").unlink(missing_ok=True)
    if how == "garbage":
        db.write_bytes(random.Random(4).randbytes(16384))
    elif how == "truncated":
        with open(db, "r+b") as f:
            f.truncate(1500)
    elif how == "db_deleted":
        db.unlink()
    elif how == "index_deleted":
        shutil.rmtree(idx)
    elif how == "wal_garbage":
        (idx / "kcache.sqlite-wal").write_bytes(random.Random(5).randbytes(8192))
    else:
        raise ValueError(how)


@pytest.mark.parametrize("how", INDEX_DAMAGE)
def test_broken_index_hits_and_caching_go_on(how: str, filled: Path, tmp_path: Path, chaos: Any) -> None:
    """With the index broken: hits work (before and after anything touched the index), a new put
    and its hit work, stats works, at most one warning; verify names the damage and --fix rebuilds
    the index with every entry."""
    damage_index(filled, how)
    code = f"""
import json, importlib.util, sys
spec = importlib.util.spec_from_file_location("c", {str(chaos.HERE)!r}); c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
import kcache
from kcache.maintenance.stats import store_stats
st = c.open_store({str(filled)!r})
out = {{}}
h = st.get("chaos", c.key_name(0))
out["hit_first"] = h is not None and c.check_hit("chaos", c.key_name(0), h) is None
new = st.put("chaos", "after-damage", c.expected("chaos", "after-damage"))
st.flush(force=True)
h2 = st.get("chaos", "after-damage")
out["put_then_hit"] = new is not None and h2 is not None and c.check_hit("chaos", "after-damage", h2) is None
out["hits_all"] = all(
    (g := st.get(k, c.key_name(i))) is not None and c.check_hit(k, c.key_name(i), g) is None
    for i in range({KEYS}) for k in c.KINDS
)
out["stats_entries"] = store_stats(st)["entries"]
st.close()
print(json.dumps(out))
"""
    r = run_py(code, base_env(tmp_path))
    no_traceback(r)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hit_first"] and out["put_then_hit"] and out["hits_all"], out
    assert len(warning_lines(r.stderr)) <= 1, r.stderr
    v = chaos.verify(filled, fix=True)
    assert v.get("rc") in (0, None), v
    after = chaos.verify(filled, fix=False)
    assert after["ok"], after
    st = chaos.open_store(filled)
    try:
        from kcache.maintenance.stats import store_stats

        assert store_stats(st)["entries"] == 2 * KEYS + 1
    finally:
        st.close()


def test_corrupt_index_found_by_verify(filled: Path, tmp_path: Path, chaos: Any) -> None:
    damage_index(filled, "garbage")
    r = kcache_cli(filled, "verify", env=base_env(tmp_path))
    no_traceback(r)
    assert r.returncode == 1
    types = {p["type"] for p in json.loads(r.stdout)["problems"]}
    assert "index_corrupt" in types, r.stdout


def test_broken_index_under_triton(
    tmp_path: Path, chaos: Any, reference_kernels: dict, compiled_store: Any
) -> None:
    """A real compile with KCACHE=1 while the index's database is garbage: cached kernels are hits, new ones
    compile and are cached, one warning at most, and the next process finds everything. The store
    starts with the first two kernels (a real compile's store, copied: compiled_store)."""
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    specs = chaos.kernel_specs(4)
    shutil.copytree(compiled_store(2), store, symlinks=True)
    damage_index(store, "garbage")
    out, r = compile_in_child(specs, env)
    assert len(warning_lines(r.stderr)) <= 1, r.stderr
    assert out["counts"]["triton"]["hits"] == 2, out["counts"]
    assert len(out["kernels"]) == len(specs)
    for name, d in out["kernels"].items():
        assert d == reference_kernels[name]
    out2, r2 = compile_in_child(specs, env)
    assert out2["counts"]["triton"]["hits"] == 4 and warning_lines(r2.stderr) == []


def test_random_corruption_campaign_ci(tmp_path: Path, chaos: Any) -> None:
    """26 random damages over 13 kinds, plus the index ones, through the chaos tool's checks."""
    r = chaos.phase_corrupt(tmp_path, 26, seed=11, log=lambda m: None)
    assert r["failures"] == []
    assert r["found_by_verify"] == r["entry_damage"] == 26
    assert r.get("wrong", 0) == 0
    assert r["index"]  # the index damages were made
    for how, res in r["index"].items():
        assert res["hit_while_broken"] and res["put_then_hit_after"] and res["clean_after_fix"], how
