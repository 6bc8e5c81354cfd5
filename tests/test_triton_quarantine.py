"""A bad Triton group costs one recompile, never a crash: real sm_90 compiles on the CPU, in
fresh processes, with a group planted the way an attacker with write access to the shared tier
(no ``KCACHE_SECRET``) or to a bundle would plant it: a valid entry whose metadata JSON is
changed, with its record and checksums recomputed, so that every integrity check passes.

Before kcache checked metadata, the victim's ``triton.compile()`` raised ``ValueError`` (an
extra key ``_planted`` in ``<name>.json`` makes Triton's ``namedtuple`` refuse it), the entry
stayed in the victim's store for good, and ``kcache verify`` said "ok"."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import uuid
from pathlib import Path
from typing import Any

import msgpack
import pytest

pytest.importorskip("triton")

from kernels.harness import PYTHON, REPO, clean_env, entries_of_kind, run_kernels  # noqa: E402

from kcache.store.records import Record, file_info  # noqa: E402
from kcache.store.tiers import entry as rt  # noqa: E402
from kcache.store.tiers import redis_keys as rk  # noqa: E402


def _env(tmp: Path, machine: str, **extra: str) -> dict[str, str]:
    (tmp / machine).mkdir(exist_ok=True)
    return clean_env(tmp / machine, kcache_dir=tmp / machine / "store", **extra)


def _poison(files: dict[str, bytes], **extra: Any) -> dict[str, bytes]:
    """The group with ``extra`` added to its metadata JSON."""
    out = dict(files)
    (meta_name,) = [n for n in out if n.endswith(".json")]
    meta = json.loads(out[meta_name])
    meta.update(extra)
    out[meta_name] = json.dumps(meta).encode()
    return out


def _replant(rec: Record, files: dict[str, bytes]) -> Record:
    """The record of ``files`` (sizes and checksums recomputed), as an attacker writes it."""
    return Record(
        rec.kind,
        rec.key,
        rec.id,
        [file_info(n, files[n]) for n in (f.name for f in rec.files)],
        created=rec.created,
        compile_s=rec.compile_s,
        components=rec.components,
        summary=rec.summary,
    )


def _triton_counts(result: dict[str, Any]) -> dict[str, float]:
    return result["process"].get("triton", {})


def _kcache(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "kcache", *args], env=env, capture_output=True, text=True, timeout=300, cwd=str(REPO)
    )


def test_a_planted_group_from_the_shared_tier_is_quarantined_and_compiled(redis_private, tmp_path) -> None:
    server = redis_private()
    prefix = f"q{uuid.uuid4().hex[:8]}:"
    a = run_kernels(_env(tmp_path, "a"), tmp_path / "a" / "r.json", specs="add")
    assert a["results"][0]["cache_hit"] is False
    good_sha = a["results"][0]["cubin_sha256"]

    # The attacker: a valid group (the one machine a compiled) published with its metadata
    # changed, record and checksums redone, as any writer of the shared tier can.
    ((_entry, rec),) = entries_of_kind(tmp_path / "a" / "store", "triton")
    files = _poison({f.name: (_entry / f.name).read_bytes() for f in rec.files}, _planted=1)
    r = server.client()
    r.set(rk.entry_key(prefix, rec.kind, rec.id), rt.pack_entry(_replant(rec, files).encode(), files, None))

    # (a timeout far above Redis's answer on a loaded box: the test is about trust, not time)
    env_b = _env(
        tmp_path, "b", KCACHE_REMOTE=server.url, KCACHE_REMOTE_PREFIX=prefix, KCACHE_REMOTE_TIMEOUT="5s"
    )
    # (a second kernel after it: the shared tier's writer drops the planted group meanwhile, not
    # in the 2 s it gets at exit)
    b = run_kernels(env_b, tmp_path / "b" / "r.json", specs="add,row_sum")
    res = b["results"][0]
    assert res["error"] is None, res  # was: ValueError: Field names cannot start with an underscore
    assert res["cache_hit"] is False and res["cubin_sha256"] == good_sha  # compiled, the same kernel
    c = _triton_counts(b)
    assert c["quarantined"] == 1 and c["remote_hits"] == 1 and c["puts"] == 2, c
    assert "cannot be used" in b["stderr"] and "Traceback" not in b["stderr"]
    # The shared tier no longer holds the planted group: dropped (then replaced by b's own).
    assert c.get("remote_marked_bad") == 1, c
    value = r.get(rk.entry_key(prefix, rec.kind, rec.id))
    assert value is None or all(b"_planted" not in v for v in msgpack.unpackb(value, raw=False)["m"].values())

    # Redis emptied: b's store serves the good kernel from now on, the planted one never again.
    r.flushall()
    again = run_kernels(env_b, tmp_path / "b" / "r2.json", specs="add")
    res = again["results"][0]
    assert res["error"] is None and res["cache_hit"] is True and res["cubin_sha256"] == good_sha
    assert "quarantined" not in _triton_counts(again)
    v = _kcache("verify", "--json", env=env_b)
    assert v.returncode == 0 and json.loads(v.stdout)["ok"] is True, v.stdout + v.stderr


def _plant_in_store(env: dict[str, str], store: Path, **extra: Any) -> str:
    """Replace the store's one triton group by a copy whose metadata has ``extra``, written
    through the store's own put (so its record and checksums are right). Its entry id."""
    ((_entry, rec),) = entries_of_kind(store, "triton")
    code = f"""
        import json, sys
        from kcache.store import Store
        s = Store.open({str(store)!r})
        hit = s.get("triton", {rec.key!r}, count=False)
        files = {{n: hit.read(n) for n in hit.names}}
        (name,) = [n for n in files if n.endswith(".json")]
        meta = json.loads(files[name]); meta.update(json.loads(sys.argv[1]))
        files[name] = json.dumps(meta).encode()
        s.remove([hit.record.id])
        assert s.put("triton", {rec.key!r}, files, components=hit.record.components) is not None
        s.close()
    """
    subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code), json.dumps(extra)],
        env=env,
        check=True,
        timeout=120,
        cwd=str(REPO),
    )
    return rec.id


def test_verify_reports_a_planted_group_and_fix_removes_it(tmp_path) -> None:
    env = _env(tmp_path, "m")
    store = tmp_path / "m" / "store"
    run_kernels(env, tmp_path / "m" / "r.json", specs="add")
    ident = _plant_in_store(env, store, _planted=1)
    v = _kcache("verify", "--json", env=env)
    assert v.returncode == 1, v.stdout + v.stderr
    out = json.loads(v.stdout)
    (bad,) = [p for p in out["problems"] if p["type"] == "bad_metadata"]
    assert bad["id"] == ident and "_planted" in bad["detail"], out
    fixed = _kcache("verify", "--fix", "--json", env=env)
    assert fixed.returncode == 0 and json.loads(fixed.stdout)["ok"] is True, fixed.stdout
    assert entries_of_kind(store, "triton") == []
    human = _kcache("verify", env=env)
    assert human.returncode == 0, human.stdout


def test_the_loaders_last_word_when_the_check_misses_something(tmp_path) -> None:
    """The check before serving switched off in the child: Triton's loader itself raises on the
    served group, kcache quarantines it, and the same ``triton.compile()`` call compiles."""
    env = _env(tmp_path, "m")
    store = tmp_path / "m" / "store"
    first = run_kernels(env, tmp_path / "m" / "r.json", specs="add")
    ident = _plant_in_store(env, store, _planted=1)
    code = """
        import hashlib, json, sys
        import kcache
        try:
            import kcache.triton.groupcheck as g
            g.problem = lambda *a, **k: None  # this child trusts every group: only the guard is left
        except ImportError:  # a kcache without the check
            pass
        from kernels.specs import SPECS, compile_spec
        k = compile_spec(SPECS["add"])
        c = kcache.stats()["process"]["triton"]
        print(json.dumps({"sha": hashlib.sha256(k.asm["cubin"]).hexdigest(), "counts": c}))
    """
    p = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]  # was: ValueError from Triton's namedtuple
    # Triton 3.9's CompiledKernel.__del__, on the object its loader gave up on, printed
    # "Exception ignored in ... AttributeError: ... no attribute 'module'" after the recovery
    assert "Exception ignored" not in p.stderr, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["sha"] == first["results"][0]["cubin_sha256"]
    assert out["counts"]["quarantined"] == 1 and out["counts"]["puts"] == 1, out
    ((_e, rec),) = entries_of_kind(store, "triton")  # the fresh compile, not the planted one
    assert rec.id == ident
    hit_files = {f.name: (store / "entries" / ident[:2] / ident / f.name).read_bytes() for f in rec.files}
    assert all(b"_planted" not in v for v in hit_files.values())


# ------------------------------------------------------------------ the check against the loader
@pytest.fixture(scope="module")
def group(tmp_path_factory) -> dict[str, bytes]:
    """A real group (sm_90, compiled here) as name -> bytes."""
    import triton
    from kernels.specs import SPECS, compile_spec

    d = tmp_path_factory.mktemp("tc")
    old = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(d)
    saved = triton.knobs.cache.__dict__.pop("manager_class", None)
    try:
        k = compile_spec(SPECS["add"])
        return {Path(p).name: Path(p).read_bytes() for p in k.metadata_group.values()}
    finally:
        if saved is not None:
            triton.knobs.cache.__dict__["manager_class"] = saved
        if old is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = old


def _loads_in_triton(files: dict[str, bytes], tmp: Path) -> BaseException | None:
    """What Triton's own loader does with ``files``: None, or the exception it raises."""
    from triton.compiler.compiler import CompiledKernel

    tmp.mkdir()
    paths = {}
    for n, b in files.items():
        (tmp / n).write_bytes(b)
        paths[n] = str(tmp / n)
    try:
        CompiledKernel(None, paths, "0" * 64)
        return None
    except Exception as e:
        return e


# (what, change to the metadata, where Triton fails: its loader in compile(), or the first launch)
MUTATIONS: list[tuple[str, Any, str]] = [
    ("extra key with an underscore", lambda m: m.update(_planted=1), "loader"),
    ("keyword key", lambda m: m.update({"class": 1}), "loader"),
    ("key not an identifier", lambda m: m.update({"a-b": 1}), "loader"),
    ("non-ASCII key", lambda m: m.update({"\ufb01": 1}), "loader"),  # Python NFKC-normalises it
    ("no target", lambda m: m.pop("target"), "loader"),
    ("target a list", lambda m: m.update(target=[1, 2, 3]), "loader"),
    (
        "unknown backend",
        lambda m: m.update(target={"backend": "nope", "arch": 90, "warp_size": 32}),
        "loader",
    ),
    ("no num_warps", lambda m: m.pop("num_warps"), "loader"),
    ("no shared", lambda m: m.pop("shared"), "loader"),
    ("no name", lambda m: m.pop("name"), "loader"),
    ("shared a string", lambda m: m.update(shared="0"), "launch"),
    ("num_warps 0", lambda m: m.update(num_warps=0), "launch"),
    ("num_warps huge", lambda m: m.update(num_warps=2**40), "launch"),
    ("no launcher field", lambda m: m.pop("global_scratch_size"), "launch"),
    ("launch_pdl a string", lambda m: m.update(launch_pdl="yes"), "launch"),
    ("another arch", lambda m: m.update(target={**m["target"], "arch": 80}), "launch"),
]


# Triton 3.9's CompiledKernel.__del__ reads self.module, which a failed __init__ never set.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("what,mutate,where", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_the_check_refuses_what_the_loader_or_the_launcher_fails_on(
    group, tmp_path, what, mutate, where
) -> None:
    from kcache.triton.groupcheck import problem

    (name,) = [n for n in group if n.endswith(".json")]
    assert problem(name, group, target="cuda:90") is None  # a real group passes
    assert _loads_in_triton(group, tmp_path / "good") is None
    meta = json.loads(group[name])
    mutate(meta)
    bad = {**group, name: json.dumps(meta).encode()}
    # Triton's own loader, on the same files: it raises where said (launch: only on a GPU)
    assert (_loads_in_triton(bad, tmp_path / "bad") is not None) == (where == "loader"), what
    assert problem(name, bad, target="cuda:90") is not None, what


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
    "what,change",
    [
        ("no cubin", lambda g: {n: b for n, b in g.items() if not n.endswith(".cubin")}),
        (
            "ptx not UTF-8",
            lambda g: {n: (b"\xff\xfe" + b if n.endswith(".ptx") else b) for n, b in g.items()},
        ),
        ("metadata not JSON", lambda g: {n: (b"{" if n.endswith(".json") else b) for n, b in g.items()}),
        ("a second .json first", lambda g: {"a.json": b"{}", **g}),
        (
            "huge integer",
            lambda g: {
                n: (b'{"x": 1' + b"0" * 5000 + b"}" if n.endswith(".json") else b) for n, b in g.items()
            },
        ),
    ],
)
def test_the_check_refuses_groups_the_loader_raises_on(group, tmp_path, what, change) -> None:
    from kcache.triton.groupcheck import problem

    (name,) = [n for n in group if n.endswith(".json")]
    bad = change(group)
    assert _loads_in_triton(bad, tmp_path / "bad") is not None, what  # Triton's loader raises
    assert problem(name, bad, target="cuda:90") is not None, what


# ------------------------------------------------------------------ autotune results
def _tuned(**change: Any) -> dict[str, Any]:
    """An autotune result as Triton writes it: ``config.__dict__`` and timing per config."""
    import triton

    configs = [triton.Config({"BLOCK": 64}, num_warps=4), triton.Config({"BLOCK": 128}, num_warps=8)]
    d = {
        "key": [1024, "torch.float32"],
        "configs_timings": [[dict(c.__dict__), t] for c, t in zip(configs, [0.2, 0.1])],
    }
    d.update(change)
    return d


def _autotuner_loads(d: dict[str, Any]) -> BaseException | None:
    """What Triton's ``Autotuner.check_disk_cache`` does with the file (3.4 to 3.9, the same)."""
    import builtins

    from triton import Config

    try:
        timings = json.loads(json.dumps(d))["configs_timings"]
        timings = {Config(**config): timing for config, timing in timings}
        builtins.min(timings, key=timings.get)
        return None
    except Exception as e:
        return e


def _cfg(i: int, **change: Any) -> Any:
    def mutate(d: dict[str, Any]) -> None:
        d["configs_timings"][i][0].update(change)

    return mutate


# (what, change, where: "loader" = check_disk_cache raises in the user's kernel call; "later" =
# it loads, and the kernel's launch or compile fails or runs what it names)
TUNE_MUTATIONS: list[tuple[str, Any, str]] = [
    ("no configs_timings", lambda d: d.pop("configs_timings"), "loader"),
    ("no configs", lambda d: d.update(configs_timings=[]), "loader"),
    ("a parameter Config lacks", _cfg(0, evil=1), "loader"),
    ("unhashable kwargs", _cfg(0, kwargs={"BLOCK": [64]}), "loader"),
    ("timings that do not compare", lambda d: d["configs_timings"][0].__setitem__(1, [0.1, 0.2]), "loader"),
    ("a pre_hook", _cfg(0, pre_hook="os.system"), "later"),
    ("an ir_override", _cfg(0, ir_override="/tmp/evil.ptx"), "later"),
    ("num_warps a string", _cfg(1, num_warps="8"), "later"),
    ("num_warps 0", _cfg(1, num_warps=0), "later"),
    ("a kwarg not an identifier", _cfg(0, kwargs={"a-b": 1}), "later"),
    ("a NaN timing", lambda d: d["configs_timings"][0].__setitem__(1, float("nan")), "later"),
]


@pytest.mark.parametrize("what,mutate,where", TUNE_MUTATIONS, ids=[m[0] for m in TUNE_MUTATIONS])
def test_the_autotune_check_refuses_what_the_autotuner_fails_on(what: str, mutate: Any, where: str) -> None:
    from kcache.triton.tunecheck import problem

    good = _tuned()
    assert problem(json.dumps(good).encode()) is None and _autotuner_loads(good) is None
    bad = _tuned()
    mutate(bad)
    assert (_autotuner_loads(bad) is not None) == (where == "loader"), what
    assert problem(json.dumps(bad).encode()) is not None, what


def test_a_planted_autotune_result_is_quarantined_and_tuned_again(tmp_path: Path, monkeypatch) -> None:
    """Through kcache's cache manager, as the autotuner asks for its file."""
    import kcache
    from kcache.triton.kinds import KIND_AUTOTUNE, store_key
    from kcache.triton.manager import KcacheCacheManager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    for k in list(os.environ):
        if k.startswith("KCACHE") and k != "KCACHE_STRICT":
            monkeypatch.delenv(k)
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False)
    try:
        store = kcache.active_store()
        key = "C" * 52
        bad = _tuned()
        bad["configs_timings"][0][0]["pre_hook"] = "os.system"
        skey = store_key(key, "k.autotune.json", None)  # no GPU here: "no-gpu"
        from kcache.triton.components import components_for

        comps = components_for(key, "k.autotune.json")  # as the manager's put records them
        hit = store.put(KIND_AUTOTUNE, skey, {"k.autotune.json": json.dumps(bad).encode()}, components=comps)
        store.flush(force=True)
        from kcache.integrations import entry_checks
        from kcache.maintenance.verify import verify

        found = [p for p in verify(store, checks=entry_checks())["problems"] if p["type"] == "bad_metadata"]
        assert [p["id"] for p in found] == [hit.record.id] and "pre_hook" in found[0]["detail"], found
        assert KcacheCacheManager(key).get_file("k.autotune.json") is None  # was: served
        c = store.counts.process_totals()[KIND_AUTOTUNE]
        assert c["quarantined"] == 1 and c["misses"] == 1 and c.get("hits", 0) == 0, c
        assert store.get(KIND_AUTOTUNE, skey, count=False) is None  # removed from the store
        # the autotuner tunes again and puts its result: served from then on
        KcacheCacheManager(key).put(json.dumps(_tuned()), "k.autotune.json", binary=False)
        assert KcacheCacheManager(key).get_file("k.autotune.json") is not None
    finally:
        kcache.disable()
