"""A planted Inductor autotune result costs one tuning, never a crash or a foreign config.

Results are made and read by torch's own code (``AutotuneCache.save`` and ``read_best``, in fresh
processes: tests/torch_compile/autotune_child.py) with kcache's store as Inductor's remote
autotune cache. A hostile result is planted the way a writer of the shared tier (no
``KCACHE_SECRET``: autotune results are not signed) or of a bundle plants it: a well-formed
entry, record and checksums right, whose JSON is not what torch writes.

Before kcache checked them, torch was handed every such result: bytes that are not JSON, or a
result without ``num_stages``, raised into the program from ``read_best``; a ``num_warps`` of 3, a
block of 10**9, a string block size or an extra constexpr became the Triton config Inductor
compiles (``_reconstruct_triton_config``); and ``kcache verify`` said "ok".
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("torch") is None:  # (not imported here: the children use it)
    pytest.skip("torch is not installed", allow_module_level=True)

from kernels.harness import PYTHON, REPO, clean_env, copy_store, entries_of_kind  # noqa: E402

from kcache.inductor.declare import INDUCTOR_AUTOTUNE  # noqa: E402
from kcache.inductor.tunecheck import problem  # noqa: E402
from kcache.store import Store  # noqa: E402
from kcache.store.records import Record, file_info  # noqa: E402
from kcache.store.tiers import entry as rt  # noqa: E402
from kcache.store.tiers import redis_keys as rk  # noqa: E402

CHILD = Path(__file__).parent / "torch_compile" / "autotune_child.py"
LEGIT = ("coordesc", "plain", "reduction")
# kernel -> what replaces its result (from "plain"'s; a str is raw bytes, a dict is merged)
PLANTED: dict[str, Any] = {
    "h0": {"num_warps": 3},
    "h1": {"XBLOCK": 10**9},
    "h2": "NaN time",
    "h3": {"XBLOCK": 32, "maxnreg": 255},  # a key torch never writes
    "h4": {"XBLOCK": "128"},
    "h5": b"\x80\x81 not JSON at all",
    "h6": "no num_stages",
    "h7": {"XBLOCK": 96},
}


def _env(tmp: Path, name: str, store: Path, **extra: str) -> dict[str, str]:
    (tmp / name).mkdir(exist_ok=True)
    return clean_env(
        tmp / name,
        kcache_dir=store,
        TORCHINDUCTOR_CACHE_DIR=str(tmp / name / "inductor"),  # empty: torch's own folder misses
        OMP_NUM_THREADS="1",
        **extra,
    )


def _child(env: dict[str, str], mode: str) -> tuple[dict[str, Any], str]:
    p = subprocess.run(
        [PYTHON, str(CHILD), mode], env=env, capture_output=True, text=True, timeout=300, cwd=str(REPO)
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def _kcache(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "kcache", *args], env=env, capture_output=True, text=True, timeout=300, cwd=str(REPO)
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict[str, tuple[Path, Record]]]:
    """A store holding torch's own results, and kernel -> (entry folder, record)."""
    tmp = tmp_path_factory.mktemp("tune")
    store = tmp / "store"
    out, _ = _child(_env(tmp, "saver", store), "save")
    by_ms = {ms: name for name, ms in out["results"].items()}
    entries = {}
    for entry, rec in entries_of_kind(store, INDUCTOR_AUTOTUNE):
        entries[by_ms[json.loads((entry / "value").read_bytes())["time_taken_ms"]]] = (entry, rec)
    assert sorted(entries) == sorted(out["results"])
    return store, entries


def _hostile(good: bytes, how: Any) -> bytes:
    if isinstance(how, bytes):
        return how
    d = json.loads(good)
    if how == "NaN time":
        return json.dumps({**d, "time_taken_ms": float("nan")}).encode()  # json writes NaN
    if how == "no num_stages":
        del d["num_stages"]
        return json.dumps(d).encode()
    return json.dumps({**d, **how}).encode()


def _plant(store: Path, rec: Record, blob: bytes) -> None:
    """Replace an entry's value through the store's own writer (record and checksums right)."""
    s = Store.open(store)
    try:
        assert s.replace(INDUCTOR_AUTOTUNE, rec.key, {"value": blob}, components=rec.components) is not None
    finally:
        s.close()


def test_torch_s_own_results_have_the_shape_checked(saved) -> None:
    """What torch 2.13's ``save`` writes, key for key (a coordinate-descent winner included),
    and every result passes the check unchanged."""
    _store, entries = saved
    for name, (entry, _rec) in entries.items():
        blob = (entry / "value").read_bytes()
        assert problem(blob) is None, (name, blob)
        d = json.loads(blob)
        want = {
            "num_warps",
            "num_stages",
            "configs_hash",
            "found_by_coordesc",
            "time_taken_ms",
            "triton_cache_hash",
        }
        assert set(d) - want == ({"XBLOCK", "R0_BLOCK"} if name == "reduction" else {"XBLOCK"}), d
        assert d["found_by_coordesc"] is (name == "coordesc")


def test_planted_results_are_misses_quarantined_with_one_warning(saved, tmp_path) -> None:
    src, entries = saved
    store = copy_store(src, tmp_path / "store")
    good = (entries["plain"][0] / "value").read_bytes()
    for name, how in PLANTED.items():
        _plant(store, entries[name][1], _hostile(good, how))

    out, stderr = _child(_env(tmp_path, "victim", store), "read")
    res = out["results"]
    for name in PLANTED:
        assert res[name] is None, (name, res[name])  # was: a raise, or the planted config
    # torch's own results are served as torch wrote them
    assert res["plain"] == {
        "kwargs": {"XBLOCK": 128},
        "num_warps": 4,
        "num_stages": 1,
        "found_by_coordesc": False,
    }
    assert (
        res["reduction"]["kwargs"] == {"XBLOCK": 1, "R0_BLOCK": 2048} and res["reduction"]["num_warps"] == 16
    )
    assert res["coordesc"] == {
        "kwargs": {"XBLOCK": 512},
        "num_warps": 16,
        "num_stages": 1,
        "found_by_coordesc": True,
    }
    c = out["counts"]
    assert (c.get("quarantined"), c.get("hits"), c.get("misses")) == (
        len(PLANTED),
        len(LEGIT),
        len(PLANTED),
    ), c
    assert stderr.count("cannot be used") == 1 and "Traceback" not in stderr, stderr[-2000:]
    left = {rec.key for _e, rec in entries_of_kind(store, INDUCTOR_AUTOTUNE)}
    assert left == {entries[n][1].key for n in LEGIT}  # the planted ones removed, torch's kept
    for n in LEGIT:
        assert (store / entries[n][0].relative_to(src) / "value").read_bytes() == (
            entries[n][0] / "value"
        ).read_bytes()


def test_a_planted_result_in_the_shared_tier_is_a_miss_and_dropped(saved, redis_private, tmp_path) -> None:
    server = redis_private()
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    _src, entries = saved
    entry, rec = entries["plain"]
    bad = _hostile((entry / "value").read_bytes(), {"num_warps": 3, "XBLOCK": 10**9})
    planted = Record(
        rec.kind,
        rec.key,
        rec.id,
        [file_info("value", bad)],
        created=rec.created,
        compile_s=rec.compile_s,
        components=rec.components,
        summary=rec.summary,
    )
    r = server.client()
    r.set(rk.entry_key(prefix, rec.kind, rec.id), rt.pack_entry(planted.encode(), {"value": bad}, None))

    env = _env(
        tmp_path,
        "b",
        tmp_path / "b-store",
        KCACHE_REMOTE=server.url,
        KCACHE_REMOTE_PREFIX=prefix,
        KCACHE_REMOTE_TIMEOUT="5s",  # far above Redis's answer on a loaded box: this is about trust
    )
    out, stderr = _child(env, "read")
    assert out["results"]["plain"] is None, out  # was: Config(XBLOCK=10**9, num_warps=3)
    c = out["counts"]
    assert c.get("remote_hits") == 1 and c.get("quarantined") == 1 and c.get("remote_marked_bad") == 1, c
    assert "cannot be used" in stderr and "Traceback" not in stderr
    assert r.get(rk.entry_key(prefix, rec.kind, rec.id)) is None
    assert entries_of_kind(tmp_path / "b-store", INDUCTOR_AUTOTUNE) == []


def test_verify_reports_a_planted_result_and_fix_removes_it(saved, tmp_path) -> None:
    src, entries = saved
    store = copy_store(src, tmp_path / "store")
    rec = entries["h1"][1]
    _plant(store, rec, _hostile((entries["plain"][0] / "value").read_bytes(), {"XBLOCK": 10**9}))
    env = _env(tmp_path, "m", store)
    v = _kcache("verify", "--json", env=env)
    assert v.returncode == 1, v.stdout + v.stderr  # was: ok
    (bad,) = [p for p in json.loads(v.stdout)["problems"] if p["type"] == "bad_metadata"]
    assert bad["id"] == rec.id and "XBLOCK" in bad["detail"], bad
    fixed = _kcache("verify", "--fix", "--json", env=env)
    assert fixed.returncode == 0 and json.loads(fixed.stdout)["ok"] is True, fixed.stdout
    assert len(entries_of_kind(store, INDUCTOR_AUTOTUNE)) == len(entries) - 1


# ------------------------------------------------------------------ the check itself
@pytest.fixture(scope="module")
def good(saved) -> dict[str, Any]:
    _store, entries = saved
    return json.loads((entries["plain"][0] / "value").read_bytes())


@pytest.mark.parametrize(
    "change",
    [
        {"XBLOCK_0": 64, "YBLOCK_1": 16, "R0_BLOCK": 65536},  # combo kernels, multi-kernel reductions
        {"RSPLIT": 24, "NUM_STAGES": 2, "waves_per_eu": 2, "kpack": 2, "matrix_instr_nonkdim": 16},
        {"BLOCK_SIZE": 96, "USE_MASK": True, "scale": 0.5, "mode": "fast"},  # a user kernel's constexprs
        {"triton_cache_hash": None, "time_taken_ms": 0, "num_stages": 0, "num_warps": 32},
        {"num_consumer_groups": 2, "num_buffers_warp_spec": 3},  # a torch built with warp specialisation
        {"extra_options": {"backend": {"opt": [1, 2.5, "x"]}}},  # a third-party backend's (2.13)
        {"found_by_coordesc": True, "BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32},
    ],
)
def test_what_torch_may_write_passes(good: dict[str, Any], change: dict[str, Any]) -> None:
    assert problem(json.dumps({**good, **change}).encode()) is None


@pytest.mark.parametrize(
    "change, why",
    [
        ({"num_warps": 64}, "num_warps"),
        ({"num_warps": True}, "num_warps"),
        ({"num_stages": -1}, "num_stages"),
        ({"num_stages": 100}, "num_stages"),
        ({"XBLOCK": 0}, "XBLOCK"),
        ({"R0_BLOCK": 1 << 21}, "R0_BLOCK"),
        ({"YBLOCK_3": 48}, "YBLOCK_3"),
        ({"XBLOCK": 64.0}, "XBLOCK"),
        ({"RSPLIT": -2}, "RSPLIT"),
        ({"pre_hook": "os.system"}, "pre_hook"),
        ({"num_ctas": 2}, "num_ctas"),
        ({"not an identifier": 1}, "not an identifier"),
        ({"USER": [1, 2]}, "USER"),
        ({"USER": 1e400}, "Infinity"),
        ({"configs_hash": 7}, "configs_hash"),
        ({"configs_hash": "x y"}, "configs_hash"),
        ({"found_by_coordesc": 1}, "found_by_coordesc"),
        ({"time_taken_ms": -1}, "time_taken_ms"),
        ({"triton_cache_hash": ["a"]}, "triton_cache_hash"),
        ({"extra_options": {"a": "\x1b[2J"}}, "extra_options"),
    ],
)
def test_what_torch_never_writes_fails(good: dict[str, Any], change: dict[str, Any], why: str) -> None:
    blob = json.dumps({**good, **change}).encode()
    assert why in (problem(blob) or ""), problem(blob)


def test_malformed_bytes_fail(good: dict[str, Any]) -> None:
    body = json.dumps(good)
    assert "configs_hash" in (
        problem(json.dumps({k: v for k, v in good.items() if k != "configs_hash"}).encode()) or ""
    )
    assert problem(b"[1, 2]") and problem(b"null") and problem(b"") and problem(b"\xff\xfe")
    assert "twice" in (problem(body[:-1].encode() + b', "XBLOCK": 64}') or "")
    assert problem(json.dumps({**good, "pad": "x" * 70000}).encode())
    assert problem(b"[" * 30000 + b"]" * 30000)  # too deep for json: refused, not raised
    assert problem(json.dumps({**good, **{f"K{i}": 1 for i in range(300)}}).encode())
