"""Prewarm for a GPU this machine does not have (``--target cuda:90``), with real compiles, in fresh
processes; then fresh "program" processes that warm the same kernels through Triton's JIT (the
stand-in driver, meta tensors: what a launch on the GPU would compile) must get every kernel from
kcache with no compile. And KCACHE_RECORD: programs record a spec, which replays to the same
store entries.

The programs build their arguments by hand (``torch.empty_strided(..., device="meta")``, a view
one element in for an unaligned pointer), independently of prewarm's own tensor code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import ptys
import pytest

pytest.importorskip("triton")
if importlib.util.find_spec("torch") is None:  # (not imported here, 2 s of CPU: the children use it)
    pytest.skip("torch is not installed", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_DIR = REPO / "docs" / "examples" / "prewarm"
PY = sys.executable

OTHERS = textwrap.dedent(
    '''
    """Kernels exercising the JIT's specialisation: do_not_specialize, an i64 scalar, ==1, a bool,
    a float, a constexpr string, an unaligned pointer, non-contiguous strides, heuristics, an
    autotuner with early_config_prune; plus a callable factory and an nvFuser builder."""
    import triton
    import triton.language as tl


    @triton.jit(do_not_specialize=["seed"])
    def scale_kernel(x_ptr, out_ptr, n, stride, scale, seed, flag, big, MODE: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs * stride, mask=m, other=0.0)
        if MODE == "double":
            x = x * 2
        y = x * scale + seed + big
        if flag:
            y = -y
        tl.store(out_ptr + offs, y, mask=m)


    @triton.heuristics({"BLOCK": lambda args: triton.next_power_of_2(args["n"])})
    @triton.jit
    def heur_kernel(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        m = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)


    def _prune(configs, named_args, **kwargs):
        return [c for c in configs if c.kwargs["BLOCK"] <= 2 * named_args["n"]] or configs[:1]


    @triton.autotune(
        configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((32, 1), (64, 2), (128, 4), (256, 4))],
        key=["n"],
        prune_configs_by={"early_config_prune": _prune},
    )
    @triton.jit
    def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 3, mask=m)


    def make_identity():
        return lambda x: x


    def build_fusion(descriptors):
        raise RuntimeError("not called without a GPU")
    '''
)

OTHERS_SPEC = """
version = 1
[env]
TRITON_DEFAULT_FP_FUSION = "0"

[[triton]]
kernel = "pw_others:scale_kernel"
options = { num_warps = 8, num_stages = 2 }
args = [
  { x_ptr = { tensor = "float32", shape = [64, 33], strides = [1, 64] }, out_ptr = { tensor = "float32", shape = [2112], alignment = 4 }, n = 2112, stride = 1, scale = 0.5, seed = 7, flag = true, big = 8589934592, MODE = "double", BLOCK = 256 },
  { x_ptr = { tensor = "float32", shape = [4096] }, out_ptr = { tensor = "float32", shape = [4096] }, n = 17, stride = 32, scale = 1.5, seed = 16, flag = false, big = 1, MODE = "plain", BLOCK = 128 },
]

[[triton]]
kernel = "pw_others:heur_kernel"
sizes = [{ N = 100 }]
[triton.args]
x_ptr = { tensor = "float16", shape = ["=N"] }
n = "=N"

[[triton]]
kernel = "pw_others:tuned_kernel"
sizes = [{ N = 64 }]
[triton.args]
x_ptr = { tensor = "float32", shape = ["=N"] }
y_ptr = { tensor = "float32", shape = ["=N"] }
n = "=N"

[[callable]]
factory = "pw_others:make_identity"
args = [{ tensor = "float32", shape = [4] }]

[[nvfuser]]
fusion = "pw_others:build_fusion"
args = [{ tensor = "float32", shape = [4, 4] }]
"""

# A "program": warms kernels through the JIT as a launch on the GPU would (stand-in driver, meta
# tensors), then reports what compiled (Triton's compile listener) and what kcache served.
PROGRAM_HEAD = textwrap.dedent(
    """
    import json, sys
    import kcache
    import torch
    import triton
    from triton import knobs
    from kcache.prewarm.triton_aot import install_stand_in

    install_stand_in(90, host_code=False)
    compiled, hits = [], []
    def listener(*, src, metadata, metadata_group, times, cache_hit):
        (hits if cache_hit else compiled).append(src.name)
    knobs.compilation.listener = listener

    def meta(shape, dtype=torch.float32, strides=None):
        if strides is None:
            return torch.empty(shape, dtype=dtype, device="meta")
        return torch.empty_strided(shape, strides, dtype=dtype, device="meta")

    def unaligned(n, dtype=torch.float32):
        return torch.empty(n + 1, dtype=dtype, device="meta")[1:]
    """
)
PROGRAM_TAIL = textwrap.dedent(
    """
    p = kcache.stats()["process"].get("triton", {})
    print(json.dumps({"compiled": compiled, "hits": hits, "store_puts": p.get("puts", 0),
                      "store_hits": p.get("hits", 0), "control": control}))
    """
)

EXAMPLE_PROGRAM = textwrap.dedent(
    """
    import kernels
    x = meta((1048576,))
    kernels.add_kernel.warmup(x, x, x, 1048576, BLOCK_SIZE=1024, num_warps=4, grid=(1,))
    x = meta((4194304,))
    kernels.add_kernel.warmup(x, x, x, 4194304, BLOCK_SIZE=1024, num_warps=4, grid=(1,))
    for c in (64, 1000):
        h = meta((8, c), torch.float16)
        kernels.softmax_kernel.warmup(h, h, c, c, c, BLOCK_SIZE=triton.next_power_of_2(c), grid=(1,))
    for m, n, k in ((256, 256, 256), (512, 512, 128)):
        a, b, c = meta((m, k), torch.float16), meta((k, n), torch.float16), meta((m, n), torch.float16)
        kernels.matmul_kernel.warmup(a, b, c, m, n, k, k, 1, n, 1, n, 1, grid=(1,))
    control = None
    """
)

OTHERS_PROGRAM = textwrap.dedent(
    """
    import pw_others as o
    x = meta((64, 33), strides=(1, 64))
    o.scale_kernel.warmup(x, unaligned(2112), 2112, 1, 0.5, 7, True, 2**33, MODE="double", BLOCK=256,
                          num_warps=8, num_stages=2, grid=(1,))
    o.scale_kernel.warmup(meta((4096,)), meta((4096,)), 17, 32, 1.5, 16, False, 1, MODE="plain", BLOCK=128,
                          num_warps=8, num_stages=2, grid=(1,))
    o.heur_kernel.warmup(meta((100,), torch.float16), 100, grid=(1,))
    o.tuned_kernel.warmup(meta((64,)), meta((64,)), 64, grid=(1,))
    # control: the same call with an ALIGNED output pointer is another specialisation: it compiles
    n0 = len(compiled)
    o.scale_kernel.warmup(x, meta((2112,)), 2112, 1, 0.5, 7, True, 2**33, MODE="double", BLOCK=256,
                          num_warps=8, num_stages=2, grid=(1,))
    control = len(compiled) - n0
    del compiled[n0:]
    """
)


def _env(tmp: Path, store: Path | None, *paths: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env["HOME"] = str(tmp / "home")
    env["XDG_CACHE_HOME"] = str(tmp / "xdg")
    env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    env["PYTHONWARNINGS"] = "ignore"
    if store is not None:
        env["KCACHE"] = "1"
        env["KCACHE_DIR"] = str(store)
    env.update(extra)
    return env


def _prewarm(spec: Path, store: Path, tmp: Path, *args: str, paths: tuple[Path, ...] = ()) -> dict[str, Any]:
    env = _env(tmp, None, *paths)
    p = subprocess.run(
        [PY, "-m", "kcache", "prewarm", str(spec), "--dir", str(store), "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp),
        timeout=400,
    )
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return json.loads(p.stdout)


def _program(body: str, tmp: Path, store: Path, *paths: Path, **env_extra: str) -> dict[str, Any]:
    script = tmp / f"program_{abs(hash(body)) % 10**8}.py"
    script.write_text(PROGRAM_HEAD + body + PROGRAM_TAIL)
    p = subprocess.run(
        [PY, str(script)],
        capture_output=True,
        text=True,
        env=_env(tmp, store, *paths, **env_extra),
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _triton_entries(store: Path) -> dict[str, str]:
    """key -> kernel name of every ``triton`` entry of a store."""
    from kcache.store import Store

    s = Store.open(store, readonly=True)
    out = {}
    for ident in s.iter_entry_ids():
        h, _ = s.read_any(ident)
        if h is not None and h.record.kind == "triton":
            out[h.record.key] = str(h.record.summary.get("name"))
    return out


# ------------------------------------------------------------------------------ the example
@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("prewarm-example")
    store = tmp / "store"
    summary = _prewarm(EXAMPLE_DIR / "spec.toml", store, tmp, "--target", "cuda:90", "--jobs", "2")
    return {
        "tmp": tmp,
        "store": store,
        "summary": summary,
        "mtimes": _record_mtimes(store),
        "protected": _protection(store),
        "records": _records(store),
        "at": time.time(),
    }


def _record_mtimes(store: Path) -> dict[str, tuple[str, float]]:
    """id -> (kind, record mtime) of every entry."""
    return {i: (kind, mtime) for i, (kind, mtime, _p) in _protection(store).items()}


def _protection(store: Path) -> dict[str, tuple[str, float, bool]]:
    """id -> (kind, record mtime, kept from eviction now) of every entry."""
    from kcache.store import Store
    from kcache.store.eviction import is_protected

    s = Store.open(store, readonly=True)
    try:
        idx = s.index_readonly()
        try:
            uses = idx.last_uses()
        finally:
            idx.close()
        out = {}
        for ident in s.iter_entry_ids():
            h, _ = s.read_any(ident)
            assert h is not None
            mtime = s.record_mtime(ident)
            kept = is_protected(h.record, mtime, uses.get(ident, (0.0, 0))[1], time.time())
            out[ident] = (h.record.kind, mtime, kept)
        return out
    finally:
        s.close()


def test_example_prewarms_for_cuda90_without_a_gpu(example: dict[str, Any]) -> None:
    s = example["summary"]
    t = s["totals"]
    assert s["ok"] and s["exit_code"] == 0 and s["mode"] == "target" and s["target"] == "cuda:90"
    assert t["items"] == 6 and t["failed"] == 0
    # add: 1 kernel (both sizes specialise alike); softmax: 2 (1000 is not divisible by 16); matmul: 4 configs
    assert t["kernel_compiles"] == 7, s
    assert t["configs_compiled"] == 8  # 4 configs for each of the 2 sizes (the second from the cache)
    # Host code: Triton <= 3.6 builds a launcher per signature; 3.7+ has one generic launcher
    # inside the driver's utility module, which is built either way. Only without a C compiler
    # (the lookup of triton_aot.stub_libcuda) may the summary say why instead: with one, a reason
    # is a failure to build, not an excuse.
    import triton

    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")
    if cc is None:
        assert "no C compiler" in (s["host_code"] or "") and t["launcher_builds"] == 0, s
    else:
        assert s["host_code"] is None, s["host_code"]
        assert t["utils_builds"] >= 1, s
        if tuple(int(x) for x in triton.__version__.split(".")[:2]) <= (3, 6):
            assert t["launcher_builds"] >= 1, s
        else:
            assert t["launcher_builds"] == 0, s
    assert any("autotune timings need the GPU" in n for n in s["not_prepared"])
    names = sorted(_triton_entries(example["store"]).values())
    assert names == [
        "add_kernel",
        "matmul_kernel",
        "matmul_kernel",
        "matmul_kernel",
        "matmul_kernel",
        "softmax_kernel",
        "softmax_kernel",
    ]


@pytest.fixture(scope="module")
def example_program(example: dict[str, Any]) -> dict[str, Any]:
    """The example's program run once on the prewarmed store: the first use of its entries (a
    fresh process importing torch and Triton: one run serves both tests that look at it)."""
    return _program(EXAMPLE_PROGRAM, example["tmp"], example["store"], EXAMPLE_DIR)


def test_example_program_gets_every_kernel_from_kcache(example_program: dict[str, Any]) -> None:
    r = example_program
    assert r["compiled"] == [], r
    assert r["store_puts"] == 0
    assert r["store_hits"] == 7 and len(r["hits"]) == 7


def _records(store: Path) -> dict[str, Any]:
    from kcache.store import Store

    s = Store.open(store, readonly=True)
    try:
        return {i: s.read_record(i)[0] for i in s.iter_entry_ids()}
    finally:
        s.close()


def test_prewarmed_entries_are_protected_until_first_use(
    example: dict[str, Any], example_program: dict[str, Any]
) -> None:
    """Protected for 7 days or until first used, said in the record; the entries' last use (the
    record's mtime, the index's last use, what `inspect` shows) is their real creation, not a
    date a week ahead."""
    from kcache.store import Store

    kinds: dict[str, int] = {}
    for ident, (kind, mtime, kept) in example["protected"].items():
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind in ("triton", "triton-aux"):  # protected from eviction: for 7 days ...
            assert kept and example["records"][ident].protect_until > example["at"] + 6.9 * 86400
            assert mtime < example["at"] + 60  # ... with true dates
    assert kinds.get("triton") == 7  # (the loop above checked something)
    assert kinds.get("triton-meta", 0) >= 3  # the build (any, by ABI, by libtriton) and the key memo
    s = Store.open(example["store"], readonly=True)
    try:
        idx = s.index_readonly()
        try:
            assert all(row.last_used < example["at"] + 60 for row in idx.rows())
        finally:
            idx.close()
    finally:
        s.close()
    build = example["summary"]["build"]
    assert build["python_abi"] and len(build["libtriton_sha256"]) == 64
    # ... or until first used: the example's program (its first use) hit every kernel
    assert example_program["store_hits"] == 7
    after = _protection(example["store"])
    now = time.time()
    for ident, (kind, _m, _k) in example["protected"].items():
        if kind == "triton":
            assert after[ident][1] < now + 60 and not after[ident][2], (ident, after[ident])


def _prewarm_on_a_terminal(store: Path, tmp: Path, *args: str) -> tuple[int, bytes, bytes]:
    """The example's prewarm for cuda:90 with its stderr on a terminal (a pty): (exit status,
    stdout, what the terminal got)."""
    import pty
    import threading

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen(
            [PY, "-m", "kcache", "prewarm", str(EXAMPLE_DIR / "spec.toml"), "--target", "cuda:90",
             "--dir", str(store), *args],
            env=_env(tmp, None), cwd=str(tmp), stdout=subprocess.PIPE, stderr=slave,
        )  # fmt: skip
        os.close(slave)
        assert p.stdout is not None
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        got = ptys.drain(master)
        rc = p.wait(timeout=400)
        reader.join(60)
        return rc, b"".join(out), got
    finally:
        os.close(master)


def test_second_prewarm_is_all_cached(example: dict[str, Any]) -> None:
    """Run with --json and its stderr on a terminal: the summary alone, no progress bar."""
    before = _record_mtimes(example["store"])
    rc, out, term = _prewarm_on_a_terminal(example["store"], example["tmp"], "--json")
    assert rc == 0 and b"/6 ok " not in term, term[-500:]  # no bar with --json, even on a terminal
    s = json.loads(out)
    t = s["totals"]
    assert t["kernel_compiles"] == 0 and t["launcher_builds"] == 0 and t["prepared"] == 0
    assert t["cached"] == 6 and t["kernel_hits"] >= 7
    # Nothing is built again, Triton's own cuda_utils included: on Triton 3.9 its key holds the
    # folder of the stand-in libcuda, which must be the same folder in every prewarm process.
    assert t["utils_builds"] == 0, s
    after = _record_mtimes(example["store"])
    assert sorted(set(after) - set(before)) == [], {i: after[i][0] for i in set(after) - set(before)}


# ------------------------------------------------------------------------------ other kernels
def test_specialisations_env_and_skipped_kinds(tmp_path: Path) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "pw_others.py").write_text(OTHERS)
    spec = tmp_path / "others.toml"
    spec.write_text(OTHERS_SPEC)
    store = tmp_path / "store"
    s = _prewarm(spec, store, tmp_path, "--target", "cuda:90", paths=(mods,))
    t = s["totals"]
    assert t["failed"] == 0 and t["skipped"] == 2, s
    assert t["kernel_compiles"] == 2 + 1 + 3  # two scale sets, one heuristics, three pruned configs
    skipped = {i["kind"]: i["reason"] for i in s["items"] if i["status"] == "skipped"}
    assert set(skipped) == {"callable", "nvfuser"} and all("GPU" in r for r in skipped.values())
    assert s["env"] == {"0": {"TRITON_DEFAULT_FP_FUSION": "0"}}
    # a program with the same environment gets everything from kcache ...
    r = _program(OTHERS_PROGRAM, tmp_path, store, mods, TRITON_DEFAULT_FP_FUSION="0")
    assert r["compiled"] == [] and r["store_hits"] == 6, r
    # ... and an unaligned pointer was really a different specialisation: the control compiled
    assert r["control"] == 1 and r["store_puts"] == 1
    # without the spec's environment, nothing matches: the environment is part of Triton's key
    r = _program(OTHERS_PROGRAM.split("# control")[0] + "control = None\n", tmp_path, store, mods)
    assert len(r["compiled"]) == 6 and r["store_hits"] == 0


# ------------------------------------------------------------------------------ recording
RECORD_PROGRAM = textwrap.dedent(
    """
    import sys, json
    import triton
    from triton import knobs
    user_calls = []
    # a hook set by the program BEFORE kcache attaches: kept and called
    knobs.runtime.jit_cache_hook = lambda **kw: user_calls.append(("cache", kw["fn"].name)) and None
    import kcache
    assert kcache.enable()
    from kcache.prewarm.triton_aot import install_stand_in
    import torch
    install_stand_in(90, host_code=False)
    # ... and one set AFTER: chained too
    knobs.runtime.jit_post_compile_hook = lambda **kw: user_calls.append(("post", kw["fn"].name))
    import kernels, pw_others as o
    meta = lambda shape, dt=torch.float32: torch.empty(shape, dtype=dt, device="meta")
    x = meta((4096,))
    kernels.add_kernel.warmup(x, x, x, 4096, BLOCK_SIZE=1024, grid=(4,))
    h = meta((8, 100), torch.float16)
    kernels.softmax_kernel.warmup(h, h, 100, 100, 100, BLOCK_SIZE=128, grid=(8,))
    a, b, c = meta((64, 32), torch.float16), meta((32, 48), torch.float16), meta((64, 48), torch.float16)
    kernels.matmul_kernel.warmup(a, b, c, 64, 48, 32, 32, 1, 48, 1, 48, 1, grid=(1,))
    xs = torch.empty_strided((64, 33), (1, 64), dtype=torch.float32, device="meta")
    out = torch.empty(2113, dtype=torch.float32, device="meta")[1:]
    o.scale_kernel.warmup(xs, out, 2112, 1, 0.5, 7, True, 2**33, MODE="double", BLOCK=256, num_warps=8, grid=(1,))
    o.heur_kernel.warmup(meta((100,), torch.float16), 100, grid=(1,))
    o.tuned_kernel.warmup(meta((64,)), meta((64,)), 64, grid=(1,))
    if sys.argv[1] == "extra":
        o.tuned_kernel.warmup(meta((256,)), meta((256,)), 256, grid=(1,))

    import triton.language as tl
    @triton.jit
    def main_kernel(p, BLOCK: tl.constexpr):
        tl.store(p + tl.arange(0, BLOCK), tl.arange(0, BLOCK).to(tl.float32))
    main_kernel.warmup(meta((16,)), BLOCK=16, grid=(1,))
    print(json.dumps(sorted(set(user_calls))))
    """
)


def test_recorded_spec_replays_to_the_same_entries(tmp_path: Path) -> None:
    import tomllib

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "pw_others.py").write_text(OTHERS)
    prog = tmp_path / "prog.py"
    prog.write_text(RECORD_PROGRAM)
    spec = tmp_path / "recorded.toml"
    store_a = tmp_path / "store-a"
    env = _env(tmp_path, None, EXAMPLE_DIR, mods, KCACHE_DIR=str(store_a), KCACHE_RECORD=str(spec))
    # two programs at once on the same spec file (and store): appends are locked and deduplicated
    procs = [
        subprocess.Popen(
            [PY, str(prog), which], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for which in ("base", "extra")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    calls = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    for c in calls:  # both program hooks still ran, for every kernel
        assert (
            ["cache", "add_kernel"] in c and ["post", "matmul_kernel"] in c and ["post", "main_kernel"] in c
        )
    text = spec.read_text()
    data = tomllib.loads(text)
    recorded = [(e["kernel"], json.dumps(e["args"], sort_keys=True)) for e in data["triton"]]
    assert len(recorded) == len(set(recorded)) == 7  # 6 kernels/sets of "base" + 1 extra tuned set
    kinds = sorted(e["kernel"] for e in data["triton"])
    assert kinds == [
        "kernels:add_kernel",
        "kernels:matmul_kernel",
        "kernels:softmax_kernel",
        "pw_others:heur_kernel",
        "pw_others:scale_kernel",
        "pw_others:tuned_kernel",
        "pw_others:tuned_kernel",
    ]
    assert "main_kernel" in text and "__main__" in text  # said so, as a comment
    assert str(tmp_path) not in text and "/" not in "".join(e["kernel"] for e in data["triton"])
    scale = next(e for e in data["triton"] if e["kernel"] == "pw_others:scale_kernel")
    assert scale["args"]["out_ptr"] == {"tensor": "float32", "shape": [2112], "alignment": 4}
    assert scale["args"]["x_ptr"]["strides"] == [1, 64] and scale["args"]["big"] == 2**33
    assert scale["options"] == {"num_warps": 8}
    tuned = [e for e in data["triton"] if e["kernel"] == "pw_others:tuned_kernel"]
    assert all(set(e["args"]) == {"x_ptr", "y_ptr", "n"} for e in tuned)  # the autotuner's own arguments

    store_b = tmp_path / "store-b"
    s = _prewarm(spec, store_b, tmp_path, "--target", "cuda:90", paths=(EXAMPLE_DIR, mods))
    assert s["ok"] and s["totals"]["failed"] == 0
    a = {k: v for k, v in _triton_entries(store_a).items() if v != "main_kernel"}
    b = _triton_entries(store_b)
    assert a == b and len(a) >= 10


def test_triton_debug_is_applied_before_triton_is_imported(tmp_path: Path) -> None:
    """TRITON_DEBUG is read when Triton is imported (into the debug option, part of the key); two
    environments in one spec run in two processes."""
    add = (
        "[[triton]]\nkernel = 'kernels:add_kernel'\n{env}[triton.args]\n"
        "x_ptr = {{ tensor = 'float32', shape = [4096] }}\ny_ptr = {{ tensor = 'float32', shape = [4096] }}\n"
        "out_ptr = {{ tensor = 'float32', shape = [4096] }}\nn_elements = 4096\nBLOCK_SIZE = 1024\n"
    )
    spec = tmp_path / "debug.toml"
    spec.write_text(add.format(env="env = { TRITON_DEBUG = '1' }\n") + add.format(env=""))
    store = tmp_path / "store"
    s = _prewarm(spec, store, tmp_path, "--target", "cuda:90", paths=(EXAMPLE_DIR,))
    assert s["totals"]["kernel_compiles"] == 2 and len(s["env"]) == 2
    from kcache.store import Store

    st = Store.open(store, readonly=True)
    recs = [
        h.record for h in (st.read_any(i)[0] for i in st.iter_entry_ids()) if h and h.record.kind == "triton"
    ]
    assert sorted(r.components.get("option.debug") for r in recs) == [False, True]
    body = "import kernels\nx = meta((4096,))\nkernels.add_kernel.warmup(x, x, x, 4096, BLOCK_SIZE=1024, grid=(1,))\ncontrol = None\n"
    r = _program(body, tmp_path, store, EXAMPLE_DIR, TRITON_DEBUG="1")
    assert r["compiled"] == [] and r["store_hits"] == 1


def test_progress_bar_on_a_terminal(tmp_path: Path, example: dict[str, Any]) -> None:
    """The bar goes to stderr when it is a terminal (with --json it never does: checked by
    test_second_prewarm_is_all_cached). It is drawn at once (before the first result: a 22 s
    torch item showed nothing for 15 s), names the item under way with its seconds, and is erased
    at the end (it stayed on screen; issue 36). On a copy of the example's prewarmed store: every
    item is started and reported as in a cold run (the bar's code does not ask what an item
    cost), without compiling the seven kernels again."""
    shutil.copytree(example["store"], tmp_path / "store")
    rc, _out, term = _prewarm_on_a_terminal(tmp_path / "store", tmp_path)
    assert rc == 0 and b"6/6 ok " in term, term[-500:]
    text = term.decode("utf-8", "replace")
    draws = [d for d in text.split("\r") if d.strip()]
    assert "0/6" in draws[0] and "starting" in draws[0], draws[:3]
    running = [d for d in draws if d.startswith("[") and "triton[0]" in d and " s)" in d]
    assert running, draws  # the item under way, with its seconds so far
    assert text.endswith("\r") and not text.rsplit("\r", 2)[-2].strip(), repr(text[-300:])  # erased
