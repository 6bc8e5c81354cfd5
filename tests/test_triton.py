"""Triton through kcache, with real compiles (``triton.compile`` for ``cuda:90`` needs no GPU), each
in fresh processes started with ``KCACHE=1`` as a user would start them.

One store is populated once per module (the cold run); each test that changes a store works on a
copy of it. What kcache serves is compared with what Triton alone builds (the reference run, no
kcache): the cold run's binaries are read back from the files kcache's manager wrote, so they
cannot stand for Triton's own. Kernels: tests/kernels (elementwise, reduction, a ``tl.dot``
matmul at three block configurations, a kernel calling a ``@triton.jit`` helper, constexpr
branches, integer arguments specialised by divisibility).
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

# Triton is a dependency of kcache on Linux (pyproject.toml) and CI installs it (.ci/run): these
# tests skip only where Triton does not exist (other platforms), never in CI.
pytest.importorskip("triton")

from kernels.harness import (  # noqa: E402
    PYTHON,
    by_label,
    clean_env,
    copy_store,
    entries_by_kind,
    entries_of_kind,
    run_kernels,
)
from kernels.specs import SPECS  # noqa: E402
from kernels.variations import (  # noqa: E402
    NOT_SETTABLE,
    OPTION_CHANGES,
    REJECTED_ON_SM90,
    listed_env_vars,
    options_fields,
)

KERNEL_KINDS = {"elementwise", "reduction", "matmul", "helper", "branches", "divisibility"}


HIP_NAMES = ["add", "row_sum", "matmul_64x64x32", "helper", "act_relu", "copy_div16"]


def _hip_plan(prefix: str = "") -> list[dict[str, Any]]:
    return [{"spec": n, "label": prefix + n, "backend": "hip", "arch": "gfx942"} for n in HIP_NAMES]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The cold run (a store populated by one process that compiled every spec) and, at the same
    time in another process without kcache, the reference run: every spec (and the ROCm plan,
    labelled ``hip:<name>``) compiled by Triton alone, the binaries kcache must serve."""
    tmp = tmp_path_factory.mktemp("triton-cold")
    ref = tmp / "plain"
    ref.mkdir()
    plan = ref / "plain.plan.json"
    plan.write_text(json.dumps(_hip_plan("hip:")))
    cmd = [PYTHON, "-m", "kernels.run", "--out", str(ref / "plain.json"), "--plan", str(plan)]
    cmd += ["--specs", "all"]
    proc = subprocess.Popen(
        cmd, env=clean_env(ref), cwd=str(ref), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        store = tmp / "store"
        result = run_kernels(clean_env(tmp, kcache_dir=store), tmp / "cold.json", specs="all")
    finally:
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    plain = json.loads((ref / "plain.json").read_text())
    return {
        "cold": {"tmp": tmp, "store": store, "result": result, "cubins": _cubins(result)},
        "reference": {"tmp": ref, "result": plain, "cubins": _cubins(plain)},
    }


@pytest.fixture(scope="module")
def cold(runs: dict[str, Any]) -> dict[str, Any]:
    return runs["cold"]


@pytest.fixture(scope="module")
def reference(runs: dict[str, Any]) -> dict[str, Any]:
    return runs["reference"]


@pytest.fixture(scope="module")
def warm(cold: dict[str, Any]) -> dict[str, Any]:
    """A second fresh process (and its own child process) on the populated store."""
    env = clean_env(cold["tmp"], kcache_dir=cold["store"])
    return run_kernels(env, cold["tmp"] / "warm.json", specs="all", child=True)


def _cubins(result: dict[str, Any]) -> dict[str, str]:
    return {r["label"]: r["cubin_sha256"] for r in result["results"]}


def _assert_all_hit(result: dict[str, Any], reference_cubins: dict[str, str]) -> None:
    assert len(result["results"]) == len(SPECS)
    for r in result["results"]:
        assert r["error"] is None, r
        assert r["cache_hit"] is True, f"{r['label']}: Triton compiled it"
        assert r["kcache"]["hits"] == 1 and r["kcache"]["puts"] == 0, r
        assert r["cubin_sha256"] == reference_cubins[r["label"]], f"{r['label']}: not Triton's cubin"
    totals = result["process"].get("triton", {})
    assert totals.get("hits", 0) == len(result["results"])
    assert totals.get("puts", 0) == 0 and totals.get("misses", 0) == 0


# ------------------------------------------------------------------------------------ cold, warm
def test_cold_process_compiles_and_stores_every_kernel(
    cold: dict[str, Any], reference: dict[str, Any]
) -> None:
    result = cold["result"]
    assert result["kcache_enabled"] and result["triton_key_memo"]
    assert result["manager_class"] == "kcache.triton.manager:KcacheCacheManager"
    assert result["env_TRITON_CACHE_MANAGER"] is None  # set as a knob, never exported
    assert {SPECS[n].module.split(".")[1] for n in SPECS} >= KERNEL_KINDS
    assert len(result["results"]) == len(SPECS) >= 6
    for r in result["results"]:
        assert r["error"] is None, r
        assert r["cache_hit"] is False
        assert r["kcache"] == {"hits": 0, "misses": 1, "puts": 1, "errors": 0}, r
    # distinct kernels, distinct binaries (divisibility and constexprs change the code)
    assert len(set(cold["cubins"].values())) == len(SPECS)
    assert cold["cubins"] == {n: reference["cubins"][n] for n in SPECS}  # what Triton alone builds
    assert entries_by_kind(cold["store"])["triton"] == len(SPECS)


def test_second_process_gets_every_kernel_from_kcache(
    cold: dict[str, Any], warm: dict[str, Any], reference: dict[str, Any]
) -> None:
    _assert_all_hit(warm, reference["cubins"])
    assert warm["manager_class"] == "kcache.triton.manager:KcacheCacheManager"
    assert entries_by_kind(cold["store"])["triton"] == len(SPECS)


def test_child_process_of_a_kcache_program_hits(
    cold: dict[str, Any], warm: dict[str, Any], reference: dict[str, Any]
) -> None:
    assert warm["child_rc"] == 0, warm["child_stderr"]
    child = warm["child"]
    assert child["kcache_enabled"]
    assert child["env_TRITON_CACHE_MANAGER"] is None
    _assert_all_hit(child, reference["cubins"])


def test_group_files_keep_triton_suffixes(cold: dict[str, Any]) -> None:
    entries = entries_of_kind(cold["store"], "triton")
    assert len(entries) == len(SPECS)
    for entry, rec in entries:
        names = {f.name for f in rec.files}
        kernel = rec.key.split("/", 1)[1][: -len(".json")]
        assert {f"{kernel}.json", f"{kernel}.cubin", f"{kernel}.ptx", f"{kernel}.ttir"} <= names, names
        assert all((entry / n).is_file() for n in names)


# ------------------------------------------------------------------------------- relocation
def test_copied_store_hits_with_the_original_moved_away(
    cold: dict[str, Any], reference: dict[str, Any], tmp_path: Path
) -> None:
    original = copy_store(cold["store"], tmp_path / "original")
    copy = copy_store(original, tmp_path / "copy")
    original.rename(tmp_path / "moved-away")
    result = run_kernels(clean_env(tmp_path, kcache_dir=copy), tmp_path / "r.json", specs="all")
    _assert_all_hit(result, reference["cubins"])


# ------------------------------------------------------------------------------- what misses
def _miss_plan_result(cold: dict[str, Any], tmp_path: Path, plan: list[dict[str, Any]]) -> dict[str, Any]:
    store = copy_store(cold["store"], tmp_path / "store")
    return run_kernels(clean_env(tmp_path, kcache_dir=store), tmp_path / "r.json", plan=plan)


def _assert_missed(r: dict[str, Any]) -> None:
    assert r["kcache"]["hits"] == 0, f"{r['label']}: served a kernel built under other settings"
    assert r["cache_hit"] is not True, r
    if r["error"] is None and not r.get("probed"):
        assert r["kcache"]["misses"] == 1 and r["kcache"]["puts"] == 1, r


def test_changed_source_misses_also_a_helpers(cold: dict[str, Any], tmp_path: Path) -> None:
    kdir = Path(SPECS["add"].module.replace(".", "/")).parent
    src = Path(__file__).parent / kdir
    copies = tmp_path / "copies"
    copies.mkdir()

    def edited(module: str, old: str, new: str, name: str) -> str:
        text = (src / f"{module}.py").read_text()
        assert old in text
        path = copies / f"{name}.py"
        path.write_text(text.replace(old, new))
        return str(path)

    plan = [
        {"spec": "add", "label": "add-unchanged"},
        {"spec": "helper", "label": "helper-unchanged"},
        {
            "spec": "add",
            "label": "add-edited-kernel",
            "module_file": edited("elementwise", "x + y", "x - y", "ew_edit"),
        },
        {
            "spec": "helper",
            "label": "helper-edited-helper",
            "module_file": edited("helper", "x * scale + 1.0", "x * scale + 2.0", "helper_edit"),
        },
        {
            "spec": "helper",
            "label": "helper-edited-comment",  # Triton hashes the source text: a comment counts
            "module_file": edited("helper", "    return x * scale", "    # note\n    return x * scale", "hc"),
        },
    ]
    res = by_label(_miss_plan_result(cold, tmp_path, plan))
    for label in ("add-unchanged", "helper-unchanged"):
        assert res[label]["kcache"]["hits"] == 1 and res[label]["cache_hit"] is True
    for label in ("add-edited-kernel", "helper-edited-helper", "helper-edited-comment"):
        _assert_missed(res[label])
        assert res[label]["error"] is None
    assert res["add-edited-kernel"]["cubin_sha256"] != cold["cubins"]["add"]
    assert res["helper-edited-helper"]["cubin_sha256"] != cold["cubins"]["helper"]


def test_each_option_triton_keys_on_misses(cold: dict[str, Any], tmp_path: Path) -> None:
    fields = options_fields()
    uncovered = [f for f in fields if f not in OPTION_CHANGES and f not in NOT_SETTABLE]
    assert not uncovered, f"options of this Triton that the test does not change: {uncovered}"
    tmp = str(tmp_path)
    plan: list[dict[str, Any]] = [{"spec": "add", "label": "baseline", "save_ttir": f"{tmp}/add_kernel.ttir"}]
    plan += [
        {"spec": "add", "label": f, "option_change": f, "tmp": tmp} for f in fields if f in OPTION_CHANGES
    ]
    plan += [{"spec": "add", "label": f, "options": {f: 7}} for f in fields if f in NOT_SETTABLE]
    plan.append({"spec": "add", "label": "baseline-again"})
    res = by_label(_miss_plan_result(cold, tmp_path, plan))
    assert res["baseline"]["kcache"]["hits"] == 1
    base_key = res["baseline"]["key"]
    compiled = []
    for f in fields:
        r = res[f]
        if f in NOT_SETTABLE:  # Triton overwrites it: same key, and a hit is right
            assert r["key"] == base_key and r["kcache"]["hits"] == 1, r
            continue
        _assert_missed(r)
        if f in REJECTED_ON_SM90 and r["error"] is not None:
            assert r["kcache"]["misses"] == 0  # rejected before any lookup
            continue
        assert r["kcache"]["misses"] == 1, r
        if r["error"] is None:
            assert r["key"] != base_key
            compiled.append(f)
    assert {"num_warps", "num_stages", "enable_fp_fusion", "maxnreg", "debug"} <= set(compiled)
    assert res["baseline-again"]["kcache"]["hits"] == 1


def test_arch_misses(cold: dict[str, Any], tmp_path: Path) -> None:
    plan = [
        {"spec": "add", "label": "sm90"},
        {"spec": "add", "label": "sm80", "arch": 80},
        {"spec": "matmul_64x64x32", "label": "mm-sm80", "arch": 80},
        {"spec": "add", "label": "sm80-again", "arch": 80},
    ]
    res = by_label(_miss_plan_result(cold, tmp_path, plan))
    assert res["sm90"]["kcache"]["hits"] == 1
    for label in ("sm80", "mm-sm80"):
        _assert_missed(res[label])
        assert res[label]["error"] is None
    assert res["sm80"]["cubin_sha256"] != cold["cubins"]["add"]
    assert res["sm80-again"]["kcache"]["hits"] == 1


def test_each_cache_invalidating_env_var_misses(cold: dict[str, Any], tmp_path: Path) -> None:
    names = listed_env_vars()
    assert {"TRITON_DEFAULT_FP_FUSION", "DISABLE_PTXAS_OPT", "TRITON_DISABLE_LINE_INFO"} <= set(names)
    tmp = str(tmp_path)
    compiled = ["TRITON_DEFAULT_FP_FUSION", "DISABLE_PTXAS_OPT", "TRITON_DISABLE_LINE_INFO"]
    plan = [{"spec": "add", "label": "baseline"}]
    # Most are probed: Triton computes its key and kcache looks it up as in any compile, then the
    # compile stops (dumps and LLVM debug output would take a minute); a few compile for real.
    plan += [
        {"spec": "add", "label": n, "env_change": n, "tmp": tmp, "probe": n not in compiled} for n in names
    ]
    plan.append({"spec": "add", "label": "baseline-again"})
    res = by_label(_miss_plan_result(cold, tmp_path, plan))
    assert res["baseline"]["kcache"]["hits"] == 1
    for n in names:
        _assert_missed(res[n])
        assert res[n]["kcache"]["misses"] == 1, res[n]
        assert res[n]["error"] is None, res[n]
    for n in compiled:
        assert res[n]["kcache"]["puts"] == 1 and res[n]["cubin_sha256"]
    assert res["baseline-again"]["kcache"]["hits"] == 1


# ---------------------------------------------------------------------------- damaged stores
def _store_key(result: dict[str, Any], label: str) -> str:
    """The store key kcache's manager uses for a compiled spec: Triton's key (base32) / metadata file."""
    r = by_label(result)[label]
    b32 = base64.b32encode(bytes.fromhex(r["key"])).decode().rstrip("=")
    spec = SPECS[r["spec"]]
    return f"{b32}/{spec.fn}.json"


def test_store_with_a_group_member_deleted_recompiles_cleanly(
    cold: dict[str, Any], reference: dict[str, Any], tmp_path: Path
) -> None:
    store = copy_store(cold["store"], tmp_path / "store")
    damaged = {"add": "cubin", "matmul_128x64x32": "json"}
    keys = {_store_key(cold["result"], label): (label, ext) for label, ext in damaged.items()}
    for entry, rec in entries_of_kind(store, "triton"):
        if rec.key in keys:
            label, ext = keys.pop(rec.key)
            (entry / f"{SPECS[label].fn}.{ext}").unlink()
    assert not keys
    env = clean_env(tmp_path, kcache_dir=store)
    first = run_kernels(env, tmp_path / "r1.json", specs="all")
    assert len(first["results"]) == len(SPECS)
    for r in first["results"]:
        assert r["error"] is None
        assert r["cubin_sha256"] == reference["cubins"][r["label"]]  # Triton's own binary: correct
        if r["label"] in damaged:
            assert r["cache_hit"] is False and r["kcache"]["hits"] == 0 and r["kcache"]["puts"] == 1, r
        else:
            assert r["kcache"]["hits"] == 1, r
    assert first["stderr"].count("corrupt") == len(damaged)  # one warning each, then compiled
    second = run_kernels(env, tmp_path / "r2.json", specs="all")
    _assert_all_hit(second, reference["cubins"])
    assert entries_by_kind(store)["triton"] == len(SPECS)


def test_read_only_store_still_compiles_and_returns_real_files(
    cold: dict[str, Any], reference: dict[str, Any], tmp_path: Path
) -> None:
    store = copy_store(cold["store"], tmp_path / "store")
    before = entries_by_kind(store)
    env = clean_env(tmp_path, kcache_dir=store, KCACHE_READONLY="1")
    plan = [
        {"spec": "add", "label": "stored"},
        {"spec": "add", "label": "new", "options": {"num_warps": 8}},
        {"spec": "matmul_64x64x32", "label": "new-mm", "options": {"num_stages": 2}},
    ]
    res = run_kernels(env, tmp_path / "r.json", plan=plan)
    r = by_label(res)
    assert r["stored"]["kcache"]["hits"] == 1 and r["stored"]["cubin_sha256"] == reference["cubins"]["add"]
    for label in ("new", "new-mm"):
        assert r[label]["error"] is None and r[label]["cubin_sha256"]  # a real cubin, read from a file
        assert r[label]["kcache"]["puts"] == 0
    assert entries_by_kind(store) == before
    assert not list((tmp_path / "triton-cache").glob("*/*.cubin"))  # nothing went to Triton's cache


# -------------------------------------------------------------------------- settings and env
def test_user_triton_cache_manager_wins_with_one_warning(tmp_path: Path) -> None:
    env = clean_env(
        tmp_path, kcache_dir=tmp_path / "store", TRITON_CACHE_MANAGER="triton.runtime.cache:FileCacheManager"
    )
    res = run_kernels(env, tmp_path / "r.json", specs="add,row_sum", child=True)
    assert res["manager_class"] == "triton.runtime.cache:FileCacheManager"
    assert res["process"].get("triton", {}).get("puts", 0) == 0
    assert all(r["error"] is None for r in res["results"])
    assert len(list((tmp_path / "triton-cache").glob("*/__grp__*.json"))) == 2  # Triton's cache used
    warnings = [ln for ln in res["stderr"].splitlines() if "TRITON_CACHE_MANAGER" in ln]
    assert len(warnings) == 1, res["stderr"]
    assert res["child"]["manager_class"] == "triton.runtime.cache:FileCacheManager"


def test_kcache_manager_named_by_the_user_is_not_warned_about(tmp_path: Path) -> None:
    env = clean_env(
        tmp_path,
        kcache_dir=tmp_path / "store",
        TRITON_CACHE_MANAGER="kcache.triton.manager:KcacheCacheManager",
    )
    res = run_kernels(env, tmp_path / "r.json", specs="add")
    assert res["manager_class"] == "kcache.triton.manager:KcacheCacheManager"
    assert res["process"]["triton"]["puts"] == 1
    assert "TRITON_CACHE_MANAGER" not in res["stderr"]


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("0", False), ("1", True)])
def test_triton_cache_autotuning_setting_is_respected(
    tmp_path: Path, value: str | None, expected: bool
) -> None:
    extra = {} if value is None else {"TRITON_CACHE_AUTOTUNING": value}
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store", **extra)
    res = run_kernels(env, tmp_path / "r.json", plan=[])
    assert res["autotune_cache"] is expected


def test_without_kcache_nothing_changes(reference: dict[str, Any]) -> None:
    res = reference["result"]  # the reference run: Triton alone
    assert not res["kcache_enabled"] and not res["triton_key_memo"]
    assert res["manager_class"].endswith(":None") or "FileCacheManager" in res["manager_class"]
    for label in SPECS:  # each kernel compiled and kept in Triton's own cache folder
        r = by_label(res)[label]
        assert r["error"] is None and r["cache_hit"] is False, r
        b32, fn = _store_key(res, label).split("/")
        assert (reference["tmp"] / "triton-cache" / b32 / f"__grp__{fn}").is_file(), label


def test_env_has_no_triton_settings_exported(cold: dict[str, Any], tmp_path: Path) -> None:
    """kcache sets Triton's knobs for its own process only: nothing TRITON_* lands in os.environ."""
    code = (
        "import os, json, triton, kcache; print(kcache.is_enabled()); "
        "print(json.dumps(sorted(k for k in os.environ if k.startswith('TRITON_') and k != 'TRITON_CACHE_DIR')))"
    )
    env = clean_env(tmp_path, kcache_dir=cold["store"])
    out = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "[]"]


def test_importing_kcaches_manager_before_triton_still_installs_it(tmp_path: Path) -> None:
    code = (
        "from kcache.triton.manager import KcacheCacheManager\n"
        "import triton\n"
        "assert triton.knobs.cache.manager_class is KcacheCacheManager, triton.knobs.cache.manager_class\n"
        "from kcache.triton import keymemo\n"
        "assert keymemo.installed()\n"
        "print('ok')\n"
    )
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    out = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert "kcache" not in out.stderr, out.stderr


def test_rocm_target_goes_through_the_same_manager(reference: dict[str, Any], tmp_path: Path) -> None:
    """Triton's AMD backend compiles for ``hip:gfx942`` without a GPU too: its kernels (``.hsaco``)
    take the same path through kcache: stored cold, served warm byte for byte (Triton's own
    binaries, from the reference run), keyed by arch."""
    plan = _hip_plan()
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    cold = run_kernels(env, tmp_path / "cold.json", plan=plan)
    version = tuple(int(x) for x in cold["triton_version"].split(".")[:2])
    if "ld.lld" in (cold["results"][0]["error"] or "") and version < (3, 5):
        # wheels before 3.5 do not ship the linker (CI runs 3.6 and the newest: never skipped there)
        pytest.skip("this Triton wheel has no ROCm linker: " + cold["results"][0]["error"])
    assert len(cold["results"]) == len(HIP_NAMES)
    for r in cold["results"]:
        assert r["error"] is None and r["kcache"]["puts"] == 1, r
        assert r["cubin_sha256"] == reference["cubins"][f"hip:{r['label']}"], f"{r['label']}: not Triton's"
    plan.append({"spec": "add", "label": "add-gfx90a", "backend": "hip", "arch": "gfx90a"})
    warm = run_kernels(env, tmp_path / "warm.json", plan=plan)
    res = by_label(warm)
    for r in cold["results"]:
        w = res[r["label"]]
        assert w["cache_hit"] is True and w["kcache"]["hits"] == 1, w
        assert w["cubin_sha256"] == r["cubin_sha256"]
    _assert_missed(res["add-gfx90a"])
    assert any(
        f.name.endswith(".hsaco")
        for _, rec in entries_of_kind(tmp_path / "store", "triton")
        for f in rec.files
    )
