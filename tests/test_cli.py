"""The command line (issue 7, point 6): stats, inspect, clear, verify, explain and config.

Real processes (``python -m kcache``) on real stores under tmp_path, filled through the store's
own put/get. Each test fails when the behaviour it names breaks: read-only commands must leave
the store byte-for-byte alone (and never create one), clear must remove exactly what its
selectors say, verify must find each kind of damage and --fix must repair it, and bad arguments
must exit 2 with one line and no traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import ptys
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kcache import cli, fingerprint, maintenance
from kcache.store import Store
from kcache.store.records import RECORD_NAME

TRITON_VERSION = fingerprint.current("triton_version")
PYTHON_ABI = fingerprint.current("python_abi")


def components(i: int, **over: object) -> dict[str, object]:
    c: dict[str, object] = {
        "kernel": f"kern{i}",
        "src_hash": f"{i:016x}",
        "target": "cuda:90",
        "option.num_warps": 4,
        "triton_version": TRITON_VERSION,
        "python_abi": PYTHON_ABI,
    }
    c.update(over)
    return c


def fill(root: Path, triton: int = 3, nvfuser: int = 2) -> dict[str, str]:
    """A store with entries of two kinds, one hit and one miss with components; key -> id."""
    s = Store.open(root)
    ids = {}
    for kind, n in (("triton", triton), ("nvfuser", nvfuser)):
        for i in range(n):
            key = f"{kind.upper()}KEY{i}"
            files = {"k.cubin": bytes([i]) * (100 + i), "k.json": b'{"name": "kern%d"}' % i}
            hit = s.put(
                kind,
                key,
                files,
                components=components(i),
                summary={"name": f"kern{i}", "target": "cuda:90", "triton_version": TRITON_VERSION},
                compile_s=0.5,
            )
            assert hit is not None
            ids[key] = hit.record.id
    if triton:
        assert s.get("triton", "TRITONKEY0") is not None
        assert s.get("triton", "WANTEDKEY", components=components(1, **{"option.num_warps": 8})) is None
    s.close()
    return ids


def kc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kcache", *args], env=env, capture_output=True, text=True, timeout=60
    )


def kjson(env: dict[str, str], *args: str) -> object:
    r = kc(env, *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its type, size, mtime and content hash."""
    out: dict[str, tuple] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            out[str(p.relative_to(root))] = (st_.st_mode, st_.st_size, st_.st_mtime_ns, digest)
    return out


def one_line_error(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("kcache: error: ")


@pytest.fixture
def filled(store_dir: Path) -> tuple[Path, dict[str, str]]:
    return store_dir, fill(store_dir)


# ---------------------------------------------------------------------------------- stats
def test_stats_json_shape_and_values(filled, clean_env):
    root, _ids = filled
    data = kjson(clean_env, "stats", "--dir", str(root))
    for k in ("entries", "bytes", "hits", "misses", "hit_rate", "saved_s", "evictions", "by_kind"):
        assert k in data
    assert data["entries"] == 5 and data["hits"] == 1 and data["misses"] == 1
    assert data["bytes"] == sum(100 + i + len(b'{"name": "kern0"}') for i in (0, 1, 2, 0, 1))
    assert set(data["by_kind"]) == {"triton", "nvfuser"}
    for v in data["by_kind"].values():
        assert {"entries", "bytes", "hits", "misses"} <= set(v)
    assert data["by_kind"]["triton"]["entries"] == 3 and data["by_kind"]["nvfuser"]["entries"] == 2
    assert data["saved_s"] == pytest.approx(0.5)


def test_stats_human_and_global_flags_before_command(filled, clean_env):
    root, _ = filled
    r = kc(clean_env, "--dir", str(root), "stats")
    assert r.returncode == 0, r.stderr
    assert "hit rate" in r.stdout and "50.0%" in r.stdout and "nvfuser" in r.stdout
    assert json.loads(kc(clean_env, "--json", "--dir", str(root), "stats").stdout)["entries"] == 5


def test_stats_zero_resets_counters_not_entries(filled, clean_env):
    root, _ = filled
    data = kjson(clean_env, "stats", "--zero", "--dir", str(root))
    assert data["zeroed"] and data["hits"] == 0 and data["misses"] == 0 and data["entries"] == 5
    assert kjson(clean_env, "stats", "--dir", str(root))["hits"] == 0


def test_default_dir_comes_from_the_environment(filled, clean_env):
    root, _ = filled
    env = dict(clean_env, KCACHE_DIR=str(root))
    assert kjson(env, "stats")["entries"] == 5


# ---------------------------------------------------------------------------------- inspect
def test_inspect_json_list(filled, clean_env):
    root, ids = filled
    rows = kjson(clean_env, "inspect", "--dir", str(root))
    assert len(rows) == 5
    for row in rows:
        assert {"kind", "key", "size", "created", "last_used", "hits", "id", "summary"} <= set(row)
    by_key = {r["key"]: r for r in rows}
    assert by_key["TRITONKEY0"]["hits"] == 1 and by_key["TRITONKEY1"]["hits"] == 0
    assert by_key["TRITONKEY0"]["id"] == ids["TRITONKEY0"]
    assert by_key["NVFUSERKEY1"]["summary"]["name"] == "kern1"
    assert rows[0]["key"] == "TRITONKEY0"  # most recently used first
    assert len(kjson(clean_env, "inspect", "--limit", "2", "--dir", str(root))) == 2
    only = kjson(clean_env, "inspect", "--kind", "nvfuser", "--dir", str(root))
    assert {r["kind"] for r in only} == {"nvfuser"} and len(only) == 2


def test_inspect_human_table(filled, clean_env):
    root, ids = filled
    r = kc(clean_env, "inspect", "--dir", str(root))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["kind", "id", "key", "size"]
    assert len(lines) == 6 and ids["TRITONKEY2"][:12] in r.stdout and "kern2 cuda:90" in r.stdout


def test_inspect_prefix_shows_whole_record(filled, clean_env):
    root, ids = filled
    ident = ids["TRITONKEY2"]
    (rec,) = kjson(clean_env, "inspect", ident[:8], "--dir", str(root))
    assert rec["id"] == ident and rec["status"] == "ok" and rec["key"] == "TRITONKEY2"
    assert rec["components"] == components(2)
    assert {f["name"] for f in rec["files"]} == {"k.cubin", "k.json"}
    # by key prefix too, and the people's view names every component
    (by_key,) = kjson(clean_env, "inspect", "NVFUSERKEY1", "--dir", str(root))
    assert by_key["id"] == ids["NVFUSERKEY1"]
    r = kc(clean_env, "inspect", ident[:10], "--dir", str(root))
    assert r.returncode == 0
    for name in components(2):
        assert name in r.stdout
    miss = kc(clean_env, "inspect", "NOSUCHKEY", "--dir", str(root))
    assert miss.returncode == 1 and "no entry" in miss.stderr


# ---------------------------------------------------------------------------------- clear
def test_clear_without_selector_refuses(filled, clean_env):
    root, _ = filled
    before = snapshot(root)
    r = kc(clean_env, "clear", "--dir", str(root))
    assert r.returncode == 2 and "--all" in r.stderr
    one_line_error(r)
    assert snapshot(root) == before


def test_clear_kind(filled, clean_env):
    root, ids = filled
    res = kjson(clean_env, "clear", "--kind", "nvfuser", "--dir", str(root))
    assert res["count"] == 2 and {e["kind"] for e in res["entries"]} == {"nvfuser"}
    assert res["bytes"] == (100 + len(b'{"name": "kern0"}')) + (101 + len(b'{"name": "kern1"}'))
    s = Store.open(root)
    assert s.get("nvfuser", "NVFUSERKEY0", count=False) is None
    assert s.get("triton", "TRITONKEY1", count=False) is not None
    s.close()
    assert kjson(clean_env, "stats", "--dir", str(root))["entries"] == 3


def test_clear_older_than(store_dir, clean_env):
    ids = fill(store_dir, triton=3, nvfuser=0)
    old = time.time() - 10 * 86400
    s = Store.open(store_dir)
    for key in ("TRITONKEY1", "TRITONKEY2"):  # last used 10 days ago: in the index and on disk
        s.index().touch({ids[key]: (old, 0)})
        os.utime(os.path.join(s.entry_dir(ids[key]), RECORD_NAME), (old, old))
    s.index().remove([ids["TRITONKEY2"]])  # and one the index lost: its record's mtime decides
    s.close()
    dry = kjson(clean_env, "clear", "--older-than", "7d", "--dry-run", "--dir", str(store_dir))
    assert {e["id"] for e in dry["entries"]} == {ids["TRITONKEY1"], ids["TRITONKEY2"]}
    assert kjson(clean_env, "clear", "--older-than", "11d", "--dir", str(store_dir))["count"] == 0
    res = kjson(clean_env, "clear", "--older-than", "7d", "--dir", str(store_dir))
    assert res["count"] == 2
    s = Store.open(store_dir)
    assert s.get("triton", "TRITONKEY0", count=False) is not None
    assert s.get("triton", "TRITONKEY1", count=False) is None
    assert s.get("triton", "TRITONKEY2", count=False) is None
    s.close()
    r = kc(clean_env, "clear", "--older-than", "12h", "--dir", str(store_dir))
    assert r.returncode == 0 and "removed 0 entries" in r.stdout


def test_clear_dry_run_changes_nothing(filled, clean_env):
    root, ids = filled
    (root / "trash" / "leftover.123.abc").mkdir()
    before = snapshot(root)
    for args in (["--all"], ["--kind", "triton"], ["--older-than", "0s"], ["--stale"]):
        r = kc(clean_env, "clear", *args, "--dry-run", "--dir", str(root))
        assert r.returncode == 0, r.stderr
        assert snapshot(root) == before, args
    r = kc(clean_env, "clear", "--all", "--dry-run", "--dir", str(root))
    assert "would remove 5 entries" in r.stdout
    for ident in ids.values():
        assert ident[:12] in r.stdout


def test_clear_all_removes_everything_and_leftovers(filled, clean_env):
    root, _ = filled
    (root / "trash" / "leftover.123.abc").mkdir()
    res = kjson(clean_env, "clear", "--all", "--dir", str(root))
    assert res["count"] == 5 and res["bytes"] > 0 and res["leftovers"] == 1
    assert not any((root / "entries").rglob(RECORD_NAME))
    assert not any((root / "trash").iterdir())
    assert kjson(clean_env, "stats", "--dir", str(root))["entries"] == 0
    assert kjson(clean_env, "verify", "--dir", str(root))["ok"]


def test_clear_stale_judges_library_versions_not_the_gpu(store_dir, clean_env):
    s = Store.open(store_dir)
    put = {}
    for key, comps in {
        "OLDTRITON": components(0, triton_version="0.0.1"),
        "OLDPYTHON": components(1, python_abi="cpython-27"),
        # built for a GPU this machine lacks, by another machine: current libraries, not stale
        "OTHERGPU": components(2, target="cuda:100", arch="sm_100a", gpu_name="B200", driver="99.9"),
        "CURRENT": components(3),
        "NOVERSIONS": {"kernel": "k"},
    }.items():
        put[key] = s.put("triton", key, {"a.bin": key.encode()}, components=comps).record.id
    s.close()
    res = kjson(clean_env, "clear", "--stale", "--dir", str(store_dir))
    assert {e["id"] for e in res["entries"]} == {put["OLDTRITON"], put["OLDPYTHON"]}
    assert "triton_version" in next(e["why"] for e in res["entries"] if e["id"] == put["OLDTRITON"])
    left = {r["key"] for r in kjson(clean_env, "inspect", "--dir", str(store_dir))}
    assert left == {"OTHERGPU", "CURRENT", "NOVERSIONS"}


def test_stale_reasons_ignores_what_this_machine_lacks():
    comps = {"triton_version": "3.5.0", "nvfuser_version": "nvfuser==0.2.30", "arch": "sm_90a"}
    here = {"triton_version": "3.6.0", "nvfuser_version": None, "arch": "sm_80"}.get
    names = maintenance.version_components()
    assert "arch" not in names and "gpu_name" not in names
    assert [d["name"] for d in maintenance.stale_reasons(comps, here, names)] == ["triton_version"]
    assert maintenance.stale_reasons({"triton_version": "3.6.0"}, here, names) == []


# ---------------------------------------------------------------------------------- verify
def _damage(root: Path, ids: dict[str, str]) -> dict[str, str]:
    """Damage of every sort verify knows; returns the id each was done to."""
    e = lambda key: root / "entries" / ids[key][:2] / ids[key]  # noqa: E731
    cubin = e("TRITONKEY0") / "k.cubin"
    data = bytearray(cubin.read_bytes())
    data[10] ^= 0x01
    cubin.write_bytes(bytes(data))  # flipped byte, same size: only the checksum tells
    (e("TRITONKEY1") / "k.json").unlink()  # a member deleted
    (e("TRITONKEY2") / RECORD_NAME).write_bytes(b"KCR1" + os.urandom(40))  # garbage record
    (e("NVFUSERKEY0") / "extra.txt").write_bytes(b"not a member")  # stray file
    s = Store.open(root)
    s.index().remove([ids["NVFUSERKEY1"]])  # an entry the index lost
    s.close()
    db = root / "index" / "kcache.sqlite"
    con = sqlite3.connect(db)
    row = "INSERT INTO entries (id, kind, size, created, last_used, hits, record) VALUES (?, 'triton', 5, 0, 0, 0, ?)"
    # a row whose record is a pickle (never unpickled: refused), and one whose id is not an id
    con.execute(row, ("e" * 40, b"\x80\x04N."))
    con.execute(row, ("\x80\x04K\x01.", b"x"))
    con.commit()
    con.close()
    s = Store.open(root)
    ghost = s.put("triton", "GHOST", {"g.bin": b"ghost"}).record.id
    s.close()
    shutil.rmtree(root / "entries" / ghost[:2] / ghost)  # an index row pointing at nothing
    # a member whose crc32 matches but whose sha256 does not: only the full check sees it
    s = Store.open(root)
    sha_only = s.put("triton", "SHAONLY", {"s.bin": b"payload"}).record
    s.close()
    sha_only.files[0].sha256 = "0" * 64
    (root / "entries" / sha_only.id[:2] / sha_only.id / RECORD_NAME).write_bytes(sha_only.encode())
    s = Store.open(root)
    assert s.get("triton", "SHAONLY", count=False) is not None  # served on the fast path
    s.close()
    return {
        "flipped": ids["TRITONKEY0"],
        "member": ids["TRITONKEY1"],
        "record": ids["TRITONKEY2"],
        "ghost": ghost,
        "sha": sha_only.id,
    }


def test_verify_clean_store(filled, clean_env):
    root, _ = filled
    before = snapshot(root)
    r = kc(clean_env, "verify", "--dir", str(root))
    assert r.returncode == 0 and "ok" in r.stdout
    res = kjson(clean_env, "verify", "--dir", str(root))
    assert res["ok"] and res["entries"] == 5 and res["problems"] == []
    assert snapshot(root) == before


def test_verify_finds_damage_and_fix_repairs_it(filled, clean_env):
    root, ids = filled
    hurt = _damage(root, ids)
    before = snapshot(root)
    r = kc(clean_env, "verify", "--dir", str(root), "--json")
    assert r.returncode == 1
    res = json.loads(r.stdout)
    assert snapshot(root) == before  # without --fix, verify only reads
    found = {(p["type"], p["id"]) for p in res["problems"]}
    assert ("corrupt_entry", hurt["flipped"]) in found
    assert ("corrupt_entry", hurt["member"]) in found
    assert ("corrupt_entry", hurt["record"]) in found
    assert ("stray_file", ids["NVFUSERKEY0"]) in found
    assert ("unindexed_entry", ids["NVFUSERKEY1"]) in found
    assert ("dangling_row", hurt["ghost"]) in found
    assert ("bad_row", "e" * 40) in found
    assert sum(1 for t, _ in found if t == "bad_row") == 2
    assert "checksum" in next(p["detail"] for p in res["problems"] if p["id"] == hurt["flipped"])
    assert ("corrupt_entry", hurt["sha"]) in found
    assert "sha256" in next(p["detail"] for p in res["problems"] if p["id"] == hurt["sha"])
    human = kc(clean_env, "verify", "--dir", str(root))
    assert human.returncode == 1 and "verify --fix" in human.stdout

    r = kc(clean_env, "verify", "--fix", "--dir", str(root), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    fixed = json.loads(r.stdout)
    assert fixed["ok"] and fixed["remaining"] == [] and len(fixed["fixed"]) == len(res["problems"])
    again = kjson(clean_env, "verify", "--dir", str(root))
    assert again["ok"] and again["entries"] == 2
    s = Store.open(root)
    assert s.get("nvfuser", "NVFUSERKEY0", count=False) is not None
    assert s.get("nvfuser", "NVFUSERKEY1", count=False) is not None
    assert s.get("triton", "TRITONKEY0", count=False) is None
    s.close()
    stats = kjson(clean_env, "stats", "--dir", str(root))
    assert stats["entries"] == 2


def test_verify_fix_rebuilds_a_corrupt_index(filled, clean_env):
    root, ids = filled
    db = root / "index" / "kcache.sqlite"
    for extra in ("-wal", "-shm"):
        Path(str(db) + extra).unlink(missing_ok=True)
    db.write_bytes(b"this is not a database" * 500)
    r = kc(clean_env, "verify", "--dir", str(root), "--json")
    assert r.returncode == 1
    assert [p["type"] for p in json.loads(r.stdout)["problems"]] == ["index_corrupt"]
    # read-only commands answer from the entry folders, and say what is wrong in one warning
    # (issue 34: they exited 1 until `verify --fix`)
    st_ = kc(clean_env, "stats", "--dir", str(root), "--json")
    assert st_.returncode == 0 and json.loads(st_.stdout)["entries"] == len(ids), st_.stderr
    assert [ln for ln in st_.stderr.splitlines() if ln.strip()] == [
        ln for ln in st_.stderr.splitlines() if ln.startswith("kcache: WARNING: the index")
    ] and len(st_.stderr.splitlines()) == 1, st_.stderr
    r = kc(clean_env, "verify", "--fix", "--dir", str(root), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = kjson(clean_env, "inspect", "--dir", str(root))
    assert {r["id"] for r in rows} == set(ids.values())
    assert kjson(clean_env, "verify", "--dir", str(root))["ok"]


# ---------------------------------------------------------------------------------- explain
def test_explain_names_the_differing_component(filled, clean_env):
    root, ids = filled
    (miss,) = kjson(clean_env, "explain", "--dir", str(root))
    assert miss["kind"] == "triton" and miss["key"] == "WANTEDKEY" and not miss["stored_now"]
    nearest = miss["nearest"][0]
    assert nearest["id"] == ids["TRITONKEY1"]  # kern1 with other num_warps: all else equal
    assert nearest["differ"] == [{"name": "option.num_warps", "stored": 4, "wanted": 8}]
    assert nearest["equal"] == nearest["total"] - 1
    assert all(n["id"] not in (ids["NVFUSERKEY0"], ids["NVFUSERKEY1"]) for n in miss["nearest"])
    r = kc(clean_env, "explain", "--dir", str(root))
    assert r.returncode == 0 and "option.num_warps: 4 -> 8" in r.stdout
    assert kjson(clean_env, "explain", "--kind", "nvfuser", "--dir", str(root)) == []


def test_explain_groups_repeated_misses(store_dir, clean_env):
    fill(store_dir)
    s = Store.open(store_dir)
    for _ in range(3):
        s.get("triton", "AGAIN", components=components(0, kernel="other"))
    s.close()
    res = kjson(clean_env, "explain", "--limit", "1", "--dir", str(store_dir))
    assert len(res) == 1 and res[0]["key"] == "AGAIN" and res[0]["count"] == 3
    assert res[0]["nearest"][0]["differ"] == [{"name": "kernel", "stored": "kern0", "wanted": "other"}]


# ---------------------------------------------------------------------------------- config
def test_config_shows_values_and_sources(store_dir, clean_env):
    fill(store_dir)
    env = dict(clean_env, KCACHE_MAX_SIZE="2GiB", KCACHE_DIR=str(store_dir))
    res = kjson(env, "config")
    rows = {r["name"]: r for r in res["settings"]}
    assert rows["max_size"]["value"] == 2 * 1024**3 and rows["max_size"]["source"] == "env KCACHE_MAX_SIZE"
    assert rows["dir"]["value"] == str(store_dir) and rows["log"]["source"] == "default"
    assert res["store"]["safe"] is True and res["store"]["network_fs"] is False
    other = kjson(env, "config", "--dir", str(store_dir / "elsewhere"))
    assert {r["name"]: r for r in other["settings"]}["dir"]["source"] == "argument"
    assert other["store"]["exists"] is False and not (store_dir / "elsewhere").exists()
    r = kc(dict(env, KCACHE_MAX_SIZE="banana"), "config")
    assert r.returncode == 0 and "banana" in r.stdout and "KCACHE_MAX_SIZE" in r.stdout


def test_config_reports_an_unsafe_store(store_dir, clean_env):
    fill(store_dir)
    store_dir.chmod(0o777)
    res = kjson(clean_env, "config", "--dir", str(store_dir))
    assert res["store"]["safe"] is False and "writable" in res["store"]["safety"]
    r = kc(clean_env, "stats", "--dir", str(store_dir))  # the store itself refuses it: exit 1
    assert r.returncode == 1
    one_line_error(r)


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["stats", "--nope"],
        ["inspect", "--limit", "x"],
        ["inspect", "--limit", "-3"],
        ["inspect", "--kind", "Bad Kind"],
        ["clear", "--older-than", "7x"],
        ["clear", "--older-than"],
        ["clear"],
        ["clear", "--dry-run"],
        ["explain", "--nearest", "many"],
        ["verify", "extra"],
        ["stats", "--dir"],
        ["stats", "--dir", ""],
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, store_dir, clean_env):
    r = kc(clean_env, *argv)
    assert r.returncode == 2, (argv, r.stdout, r.stderr)
    one_line_error(r)
    assert r.stdout == ""


def test_bad_values_exit_2(store_dir, clean_env, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for cmd in ("stats", "config"):
        r = kc(clean_env, cmd, "--dir", str(a_file))
        assert r.returncode == 2 and "not a directory" in r.stderr
        one_line_error(r)
    r = kc(dict(clean_env, KCACHE_MAX_SIZE="banana"), "stats", "--dir", str(store_dir))
    assert r.returncode == 2 and "KCACHE_MAX_SIZE" in r.stderr
    one_line_error(r)
    # a bad KCACHE_DIR that --dir overrides is no problem (the folder exists: a missing one that
    # --dir names is an error of its own, tests/test_newcomer.py)
    store_dir.mkdir(mode=0o700)
    r = kc(dict(clean_env, KCACHE_DIR=str(a_file)), "stats", "--dir", str(store_dir))
    assert r.returncode == 0, r.stderr


def test_not_a_store_exits_1(tmp_path, clean_env):
    d = tmp_path / "notastore"
    d.mkdir(mode=0o700)
    (d / "somefile").write_text("mine")
    r = kc(clean_env, "inspect", "--dir", str(d))
    assert r.returncode == 1 and "not a kcache store" in r.stderr
    one_line_error(r)


@pytest.mark.parametrize(
    "argv",
    [
        ["stats"],
        ["inspect"],
        ["inspect", "abc"],
        ["explain"],
        ["verify"],
        ["config"],
        ["clear", "--all", "--dry-run"],
        ["clear", "--all"],
        ["verify", "--fix"],
        ["stats", "--zero"],
        ["trim"],
        ["dir"],
        ["inspect", "--group"],
        ["inspect", "add_kernel"],
        ["clear", "--name", "add_kernel"],
        ["export", "{tmp}/out.kcb"],
    ],
)
def test_missing_store_is_not_created(argv, tmp_path, clean_env):
    missing = tmp_path / "missing" / "store"
    r = kc(clean_env, *(a.format(tmp=tmp_path) for a in argv), "--dir", str(missing))
    assert r.returncode in (0, 1), r.stderr  # inspect PREFIX: nothing matches
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "missing").exists()
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()


def test_readonly_setting_refuses_changes(filled, clean_env):
    root, _ = filled
    before = snapshot(root)
    env = dict(clean_env, KCACHE_READONLY="1")
    for argv in (["clear", "--all"], ["verify", "--fix"], ["stats", "--zero"], ["trim"],
                 ["config", "--set", "max_size=1GiB"]):  # fmt: skip
        r = kc(env, *argv, "--dir", str(root))
        assert r.returncode == 1 and "read-only" in r.stderr
        one_line_error(r)
    assert kjson(env, "stats", "--dir", str(root))["entries"] == 5
    assert snapshot(root) == before


def test_console_script_and_help(clean_env):
    # pyproject.toml declares the `kcache` script; installing the package (pip install -e ., as
    # .ci/run does) puts it next to the interpreter. Its absence is a failure, not a reason to skip.
    script = Path(sys.executable).with_name("kcache")
    assert script.exists(), f"no console script at {script}: is kcache installed (pip install -e .)?"
    r = subprocess.run([str(script), "--help"], env=clean_env, capture_output=True, text=True)
    assert r.returncode == 0 and "inspect" in r.stdout
    r = kc(clean_env, "clear", "--help")
    assert r.returncode == 0 and "--older-than" in r.stdout


# ---------------------------------------------------------------------------------- property
KINDS = st.sampled_from(["triton", "nvfuser", "triton-aux", "Bad", ""])
AGES = st.sampled_from(["7d", "1s", "0", "12h", "5x", "-1d"])
COUNTS = st.sampled_from(["0", "1", "3", "-1", "x"])
PREFIXES = st.sampled_from(["TRITONKEY", "WANTED", "ab", "0", "zz", ""])
OPTIONS = {
    "stats": [st.just(["--zero"])],
    "inspect": [
        st.tuples(st.just("--kind"), KINDS),
        st.tuples(st.just("--limit"), COUNTS),
        PREFIXES.map(lambda p: [p]),
    ],
    "clear": [
        st.tuples(st.just("--kind"), KINDS),
        st.tuples(st.just("--older-than"), AGES),
        st.just(["--stale"]),
        st.just(["--all"]),
        st.just(["--dry-run"]),
    ],
    "verify": [st.just(["--fix"])],
    "explain": [
        st.tuples(st.just("--kind"), KINDS),
        st.tuples(st.just("--limit"), COUNTS),
        st.tuples(st.just("--nearest"), COUNTS),
    ],
    "config": [],
    "trim": [st.tuples(st.just("--to"), st.sampled_from(["5GiB", "1", "x", "0"]))],
    "dir": [],
    "bogus": [],
}
ANY_TOKEN = st.sampled_from(
    ["--json", "--kind", "--limit", "--fix", "--all", "--zero", "--stale", "x", "7d", ""]
)


@st.composite
def argvs(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A command and its arguments: mostly its own options with valid or invalid values, now
    and then a stray token."""
    command = draw(st.sampled_from(list(OPTIONS)))
    chunk = st.one_of(*OPTIONS[command], st.just(["--json"])) if OPTIONS[command] else st.just(["--json"])
    chunks = draw(st.lists(st.one_of(chunk, chunk, chunk, ANY_TOKEN.map(lambda t: [t])), max_size=4))
    return command, [tok for c in chunks for tok in c]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template") / "store"
    fill(root)
    return root


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=argvs(), json_first=st.booleans())
@example(drawn=("clear", ["x"]), json_first=False)  # what CI drew: a name matching nothing
@example(drawn=("clear", ["x"]), json_first=True)
def test_any_argv_exits_cleanly_and_reads_never_write(template, tmp_path_factory, drawn, json_first):
    command, rest = drawn
    root = tmp_path_factory.mktemp("prop") / "store"
    shutil.copytree(template, root)
    argv = (["--json"] if json_first else []) + ["--dir", str(root), command, *rest]
    before = snapshot(root)
    out, err = io.StringIO(), io.StringIO()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    with (
        mock.patch.dict(os.environ, env, clear=True),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # main returns; a SystemExit would be a bug too, but say which
            rc = e.code
    # 1: verify found damage; inspect and clear were given an id or name that matches nothing
    # (a typo, said in one line: issue 36)
    allowed = {0, 2} | ({1} if command in ("verify", "inspect", "clear") else set())
    assert rc in allowed, (argv, rc, err.getvalue())
    if rc == 1 and command == "clear":  # said once: as one line, or as nothing removed (--json)
        if "--json" in rest or json_first:
            assert json.loads(out.getvalue())["count"] == 0, out.getvalue()
        else:
            assert "matches" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1, (
                err.getvalue()
            )
    assert "Traceback" not in err.getvalue()
    if rc == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    writes = (
        (command == "clear" and "--dry-run" not in rest)
        or (command == "verify" and "--fix" in rest)
        or (command == "stats" and "--zero" in rest)
        or command == "trim"
    )
    if not writes:
        assert snapshot(root) == before, argv
    if rc == 0 and ("--json" in rest or json_first):
        json.loads(out.getvalue())
    shutil.rmtree(root.parent, ignore_errors=True)


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "--kind", "nosuchkind"),
        ("clear", "--kind", "triton-kernal"),
        ("explain", "--kind", "Triton"),
    ],
)
def test_an_unknown_kind_is_a_bad_argument(filled, clean_env, args) -> None:
    """A misspelt --kind used to exit 0 having done nothing: now exit 2, naming the kinds."""
    root, _ids = filled
    r = kc(clean_env, *args, "--dir", str(root))
    assert r.returncode == 2
    one_line_error(r)
    assert "triton-autotune" in r.stderr and "inductor-fx" in r.stderr
    assert len(kjson(clean_env, "inspect", "--dir", str(root))) == len(_ids), "nothing was removed"


# ---------------------------------------------------------------------------------- the operator's CLI
def test_store_settings_file_is_honoured_by_every_process(store_dir, clean_env):
    """`kcache config --set max_size=...` keeps the bound with the store: a program started without
    KCACHE_MAX_SIZE uses it, one with the variable uses the variable, and config says which."""
    fill(store_dir)
    r = kc(clean_env, "config", "--dir", str(store_dir), "--set", "max_size=3MiB")
    assert r.returncode == 0 and "max_size: 3.0 MiB" in r.stdout, r.stderr
    assert (store_dir / "kcache.conf").read_text().count("max_size = 3MiB") == 1
    probe = "import kcache; kcache.enable(); s = kcache.active_store(); print(s.max_size, s.max_size_source)"
    env = {**clean_env, "KCACHE_DIR": str(store_dir)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == [str(3 << 20), "store"], out.stderr
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "KCACHE_MAX_SIZE": "5MiB"},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.stdout.split() == [str(5 << 20), "argument"], out.stderr
    rows = {r["name"]: r for r in kjson(clean_env, "config", "--dir", str(store_dir))["settings"]}
    assert rows["max_size"]["value"] == 3 << 20 and rows["max_size"]["source"] == "store kcache.conf"
    rows = {
        r["name"]: r
        for r in kjson({**clean_env, "KCACHE_MAX_SIZE": "5MiB"}, "config", "--dir", str(store_dir))[
            "settings"
        ]
    }
    assert rows["max_size"]["value"] == 5 << 20
    assert rows["max_size"]["source"] == "env KCACHE_MAX_SIZE (over the store's kcache.conf: 3.0 MiB)"
    # stats: the store's bound, whatever this shell says
    data = kjson({**clean_env, "KCACHE_MAX_SIZE": "5MiB"}, "stats", "--dir", str(store_dir))
    assert data["max_size"] == 3 << 20 and data["bound"]["env"] == 5 << 20
    assert data["bound"]["store_source"] == "the store's kcache.conf"
    human = kc({**clean_env, "KCACHE_MAX_SIZE": "5MiB"}, "stats", "--dir", str(store_dir)).stdout
    assert "of 3.0 MiB" in human and "KCACHE_MAX_SIZE=5.0 MiB wins" in human, human
    r = kc(clean_env, "config", "--dir", str(store_dir), "--unset", "max_size")
    assert r.returncode == 0 and "max_size = " not in (store_dir / "kcache.conf").read_text()
    assert kjson(clean_env, "stats", "--dir", str(store_dir))["max_size"] == 10 << 30


def test_store_settings_bad_names_values_and_files(store_dir, clean_env, kcache_warnings):
    fill(store_dir)
    for bad in ("max_size=lots", "colour=blue", "max_size"):
        r = kc(clean_env, "config", "--dir", str(store_dir), "--set", bad)
        assert r.returncode == 2, bad
        one_line_error(r)
    assert not (store_dir / "kcache.conf").exists()
    (store_dir / "kcache.conf").write_text("max_size = 1MiB\n")
    os.chmod(store_dir / "kcache.conf", 0o666)  # anyone could choose this store's bound: not used
    s = Store.open(store_dir)
    try:
        assert s.max_size == 10 << 30 and s.max_size_source == "default"
    finally:
        s.close()
    assert any("kcache.conf" in m for m in kcache_warnings), kcache_warnings


def test_trim_removes_least_recently_used_down_to_the_bound(store_dir, clean_env, monkeypatch, capsys):
    from kcache.store import tunables

    s = Store.open(store_dir)
    for i in range(20):
        assert s.put("triton", f"T{i}", {"k.cubin": bytes([i]) * 10_000}) is not None
    s.close()
    # The bound is on the whole folder as du counts it: an entry is its blocks (the member's, the
    # record's, the folder's), and the index and the folders count too. 90% of it leaves room
    # for 9.5 entries beside them (measured as trim will: the store opened, its index read).
    s = Store.open(store_dir)
    s.index().total_bytes()
    d = Path(s.entry_dir(s.entry_id("triton", "T0")))
    one = sum(os.lstat(p).st_blocks * 512 for p in [d, *d.iterdir()])
    bound = int((s.disk.evictor.measure().total + 9.5 * one) / 0.9)
    s.close()
    assert kc(clean_env, "config", "--dir", str(store_dir), "--set", f"max_size={bound}").returncode == 0
    monkeypatch.setattr(tunables, "GRACE_S", 0.0)  # the entries were written a moment ago
    monkeypatch.setattr(os, "environ", {**clean_env})
    assert cli.main(["trim", "--dir", str(store_dir), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["bound"] == bound and res["bound_source"] == "the store's kcache.conf"
    assert res["before"] == 200_000 and res["bytes"] <= 90_000 and res["removed"] == 11, res
    left = Store.open(store_dir)
    try:
        keys = sorted(left.read_any(i)[0].record.key for i in left.iter_entry_ids())
    finally:
        left.close()
    assert len(keys) == 9 and "T0" not in keys and "T19" in keys  # the oldest went first


def test_dir_prints_the_store_folder(tmp_path, clean_env):
    r = kc(clean_env, "dir")
    assert r.returncode == 0 and r.stdout.strip() == str(Path(clean_env["XDG_CACHE_HOME"]) / "kcache")
    r = kc({**clean_env, "KCACHE_DIR": str(tmp_path / "s")}, "dir", "--json")
    assert json.loads(r.stdout) == {"dir": str(tmp_path / "s"), "source": "env KCACHE_DIR", "exists": False}
    rows = {r["name"]: r for r in kjson(clean_env, "config")["settings"]}
    assert rows["dir"]["source"] == "env XDG_CACHE_HOME"  # where the folder came from, not "default"


def test_inspect_by_name_sort_and_group(filled, clean_env):
    root, ids = filled
    d = ["--dir", str(root)]
    named = kjson(clean_env, "inspect", "kern1", *d)
    assert sorted(e["kind"] for e in named) == ["nvfuser", "triton"] and {e["name"] for e in named} == {
        "kern1"
    }
    assert {e["name"] for e in kjson(clean_env, "inspect", "--name", "kern[02]", *d)} == {"kern0", "kern2"}
    r = kc(clean_env, "inspect", "add_kernel", *d)
    assert r.returncode == 1 and "no entry id, key or name matches 'add_kernel'" in r.stderr
    by_size = kjson(clean_env, "inspect", "--sort", "size", *d)
    assert [e["size"] for e in by_size] == sorted((e["size"] for e in by_size), reverse=True)
    assert kjson(clean_env, "inspect", "--sort", "hits", *d)[0]["id"] == ids["TRITONKEY0"]  # the one hit
    groups = {g["name"]: g for g in kjson(clean_env, "inspect", "--group", *d)}
    assert groups["kern0"]["entries"] == 2 and groups["kern0"]["kinds"] == {"triton": 1, "nvfuser": 1}
    assert groups["kern2"]["entries"] == 1 and groups["kern0"]["hits"] == 1
    table_ = kc(clean_env, "inspect", "--group", *d).stdout
    assert table_.splitlines()[0].split()[:3] == ["name", "entries", "size"] and "kern0" in table_


def test_clear_by_id_and_by_name(filled, clean_env):
    root, ids = filled
    d = ["--dir", str(root)]
    one = ids["TRITONKEY1"]
    r = kc(clean_env, "clear", one[:10], *d)
    assert r.returncode == 0 and "removed 1 entry" in r.stdout, r.stderr
    assert not (root / "entries" / one[:2] / one).exists()
    r = kc(clean_env, "clear", "--id", "ffffffffff", *d)
    assert r.returncode == 2 and "no entry has it" in r.stderr
    res = kjson(clean_env, "clear", "--name", "kern0", *d)
    assert res["count"] == 2 and {e["name"] for e in res["entries"]} == {"kern0"}
    left = {e["name"] for e in kjson(clean_env, "inspect", *d)}
    assert left == {"kern1", "kern2"}  # the nvfuser kern1 and the triton kern2


def _pty_run(env: dict[str, str], *args: str) -> tuple[int, str, bytes]:
    """Run kcache with stderr on a terminal (a pty); (exit status, stdout, what the terminal got)."""
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "kcache", *args], env=env, stdout=subprocess.PIPE,
                             stderr=slave, text=True)  # fmt: skip
        os.close(slave)
        got = ptys.drain(master)
        out = p.stdout.read() if p.stdout else ""
        return p.wait(timeout=120), out, got
    finally:
        os.close(master)


def test_progress_only_on_a_terminal_and_never_with_json(store_dir, clean_env):
    s = Store.open(store_dir)
    for i in range(1200):  # a large store: progress from the start
        assert s.put("triton", f"P{i}", {"k.cubin": b"x" * 64}) is not None
    s.close()
    d = ["--dir", str(store_dir)]
    rc, out, term = _pty_run(clean_env, "verify", *d)
    assert rc == 0 and b"verify: " in term and b"of 1,200 entries" in term, term[-300:]
    assert out.startswith("checked 1,200 entries") and "verify:" not in out
    rc, out, term = _pty_run(clean_env, "verify", "--json", *d)
    assert rc == 0 and term == b"" and json.loads(out)["ok"]
    rc, out, term = _pty_run(clean_env, "export", str(store_dir.parent / "b.kcb"), *d)
    assert rc == 0 and b"export: read" in term and out.startswith("exported 1200 entries")
    r = kc(clean_env, "verify", *d)  # not a terminal: nothing but the result
    assert r.returncode == 0 and r.stderr == ""
    rc, out, term = _pty_run(clean_env, "clear", "--all", *d)
    assert rc == 0 and b"clear: " in term and "removed 1,200 entries" in out


@pytest.fixture(scope="module")
def top_help(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``kcache --help``, run once for the module: every command's test below reads its listing
    (it ran once per command, the same output each time)."""
    home = tmp_path_factory.mktemp("top-help")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    env.update(HOME=str(home / "home"), XDG_CACHE_HOME=str(home / "xdg"))  # as clean_env makes it
    env.pop("PYTHONPATH", None)
    r = kc(env, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_has_complete_help(command, clean_env, top_help):
    r = kc(clean_env, command, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: kcache {command}"), r.stdout
    body = r.stdout.split("\n\n", 1)[1]
    assert not body.startswith(("positional arguments", "options")), "a description of what it does"
    assert len(body.strip().splitlines()[0]) > 20, "a description of what the command does"
    assert "\nexamples:\n  kcache " in r.stdout
    for action in cli.build_parser()._subparsers._group_actions[0].choices[command]._actions:  # type: ignore[union-attr]
        if action.option_strings and action.dest != "help":
            assert action.help, f"{command} {action.option_strings} has no help"
    assert f"    {command}" in top_help
