"""Prewarm specs without compiling: parsing, expressions, bad specs (exit 2, one line, nothing
changed), dry runs, the TOML writer of KCACHE_RECORD, the store build check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kcache.prewarm import record as rec
from kcache.prewarm.spec import Expr, NoneArg, SpecError, TensorArg, TritonDtypeArg, eval_expr, load

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "examples" / "prewarm" / "spec.toml"

KERNELS = textwrap.dedent(
    """
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    @triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
    @triton.jit
    def tuned(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    not_a_kernel = 42

    def plain_function():
        return 1
    """
)

GOOD = """
version = 1
[[triton]]
kernel = "pwmod:k"
[triton.args]
x_ptr = { tensor = "float32", shape = [64] }
n = 64
BLOCK = 64
"""


@pytest.fixture
def mod_dir(tmp_path: Path) -> Path:
    d = tmp_path / "mods"
    d.mkdir()
    (d / "pwmod.py").write_text(KERNELS)
    return d


# ------------------------------------------------------------------------------ parsing
def test_example_spec_parses_and_expands() -> None:
    sp = load(EXAMPLE)
    assert [e.ref for e in sp.entries] == [
        "kernels:add_kernel",
        "kernels:softmax_kernel",
        "kernels:matmul_kernel",
    ]
    items = sp.items()
    assert len(items) == 6
    add = items[0].args
    assert add["x_ptr"] == TensorArg("float32", [1048576])
    assert add["n_elements"] == 1048576
    soft = items[3].args  # R=8, C=1000
    assert soft["x_ptr" if "x_ptr" in soft else "in_ptr"].shape == [8, 1000]
    assert soft["BLOCK_SIZE"] == 1024
    assert sp.env == {}
    assert "C=1000" in items[3].label


def test_values_and_expressions() -> None:
    assert eval_expr("cdiv(N, 128) * 2 + next_power_of_2(M)", {"N": 300, "M": 5}) == 14
    assert eval_expr("max(N // 3, 7) % 4", {"N": 30}) == 2
    for bad in ("__import__('os')", "N.real", "[1]", "lambda: 1", "open('x')"):
        with pytest.raises(ValueError):
            eval_expr(bad, {"N": 1})
    sp = load(
        {
            "triton": [
                {
                    "kernel": "m:k",
                    "sizes": [{"N": 100}],
                    "args": {
                        "a": {"tensor": "fp16", "shape": ["=N", 8], "strides": [1, "=N"], "alignment": 4},
                        "b": {"none": True},
                        "c": {"triton_dtype": "fp16"},
                        "d": [1, "=N*2"],
                        "e": "relu",
                        "f": 1.5,
                        "g": True,
                    },
                }
            ]
        }
    )
    (it,) = sp.items()
    assert it.args["a"] == TensorArg("float16", [100, 8], [1, 100], 4)
    assert it.args["b"] == NoneArg()
    assert it.args["c"] == TritonDtypeArg("fp16")
    assert it.args["d"] == [1, 200]
    assert it.args["e"] == "relu" and it.args["f"] == 1.5 and it.args["g"] is True
    raw = sp.entries[0].arg_sets[0]
    assert isinstance(raw["a"].shape[0], Expr)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[[triton]]\nkernel = 'm:k'\n", "triton[0] (m:k) args: missing field"),
        ("[[triton]]\nargs = {}\n", "triton[0] kernel: missing field"),
        (
            "[[triton]]\nkernel = 'no-colon'\nargs = {}\n",
            "triton[0] (no-colon) kernel: expected an import path",
        ),
        (
            "[[triton]]\nkernel = 'm:k'\nargs = { x = { tensor = 'flaot16', shape = [1] } }\n",
            "args.x.tensor: unknown dtype 'flaot16'",
        ),
        ("[[triton]]\nkernel = 'm:k'\nargs = { x = { tensor = 'fp16' } }\n", "args.x.shape: missing field"),
        ("[[triton]]\nkernel = 'm:k'\nargs = { x = '=N' }\n", "args.x: unknown symbol 'N'"),
        ("[[triton]]\nkernel = 'm:k'\nargs = {}\nbogus = 1\n", "triton[0] (m:k) bogus: unknown field"),
        (
            "[[triton]]\nkernel = 'm:k'\nargs = {}\noptions = { num_warps = 3 }\n",
            "options.num_warps: must be a power of 2",
        ),
        ("[triton]\nkernel = 'm:k'\n", "triton: must be an array of tables"),
        ("version = 2\n[[triton]]\nkernel = 'm:k'\nargs = {}\n", "version: unsupported spec version 2"),
        (
            "[[triton]]\nkernel = 'm:k'\nargs = { x = { tensor = 'fp32', shape = [4], alignment = 2 } }\n",
            "args.x.alignment",
        ),
        ("[[triton]]\nkernel = 'm:k'\nargs = {}\ngrid = [1, 2, 3, 4]\n", "grid: must be a list of 1 to 3"),
        ("[env]\nX = { a = 1 }\n[[triton]]\nkernel = 'm:k'\nargs = {}\n", "env.X: must be a string"),
        ("[[triton]]\nkernel = 'm:k'\nargs = {\n", "malformed TOML"),
        ("x = 1\n", "x: unknown top-level key"),
        ("version = 1\n", "names nothing to prepare"),
    ],
)
def test_structural_errors_name_entry_and_field(text: str, needle: str) -> None:
    with pytest.raises(SpecError) as ei:
        load(text + "\n")
    msg = str(ei.value)
    assert needle in msg, msg
    assert "\n" not in msg


# ------------------------------------------------------------------------------ through the CLI
BAD_SPECS = {
    "unknown_module": (
        "[[triton]]\nkernel = 'no_such_module_xyz:k'\nargs = {}\n",
        "triton[0] (no_such_module_xyz:k) kernel: cannot import module 'no_such_module_xyz'",
    ),
    "not_a_kernel": (
        "[[triton]]\nkernel = 'pwmod:not_a_kernel'\nargs = {}\n",
        "triton[0] (pwmod:not_a_kernel) kernel: pwmod:not_a_kernel is a int, not a Triton kernel",
    ),
    "function_not_kernel": (
        "[[triton]]\nkernel = 'pwmod:plain_function'\nargs = {}\n",
        "is a function, not a Triton kernel",
    ),
    "missing_attr": ("[[triton]]\nkernel = 'pwmod:nope'\nargs = {}\n", "module 'pwmod' has no 'nope'"),
    "wrong_dtype": (
        GOOD.replace('"float32"', '"float33"'),
        "triton[0] (pwmod:k) args.x_ptr.tensor: unknown dtype 'float33'",
    ),
    "missing_param": (GOOD.replace("n = 64\n", ""), "triton[0] (pwmod:k) args.n: missing field"),
    "unknown_param": (GOOD.replace("n = 64\n", "n = 64\nm = 1\n"), "args.m: k has no parameter 'm'"),
    "config_param": (
        "[[triton]]\nkernel = 'pwmod:tuned'\n[triton.args]\nx_ptr = { tensor = 'fp32', shape = [4] }\nn = 4\nBLOCK = 4\n",
        "args.BLOCK: set by the autotuner's configs",
    ),
    "tuned_options": (
        "[[triton]]\nkernel = 'pwmod:tuned'\noptions = { num_warps = 4 }\n[triton.args]\nx_ptr = { tensor = 'fp32', shape = [4] }\nn = 4\n",
        "options.num_warps: an autotuned kernel takes its options from its configs",
    ),
    "bad_option": (
        GOOD.replace("[triton.args]", "options = { num_wraps = 4 }\n[triton.args]"),
        "options.num_wraps: not a Triton compile option",
    ),
    "bad_env": (
        "[env]\nHOME_SWEET_HOME = '1'\n" + GOOD,
        "env.HOME_SWEET_HOME: not one of Triton's cache-invalidating variables",
    ),
    "malformed": (GOOD + "\n[[triton\n", "malformed TOML"),
    "bad_target": (GOOD, "--target: not a target: 'rocm:90'"),
}


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from kcache.cli import main

    rc = main(["prewarm", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_specs_exit_2_one_line_nothing_changed(
    case: str, mod_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, needle = BAD_SPECS[case]
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    store = tmp_path / "store"
    extra = ["--target", "rocm:90"] if case == "bad_target" else ["--target", "cuda:90"]
    rc, out, err = _cli([str(spec), "--dir", str(store), "--path", str(mod_dir), *extra], capsys)
    assert rc == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]
    assert str(spec) in lines[0] or case == "bad_target"
    assert not store.exists()
    assert out == ""


def test_bad_spec_in_a_fresh_process(mod_dir: Path, tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(BAD_SPECS["wrong_dtype"][0])
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE")}
    env["PYTHONPATH"] = str(mod_dir)
    p = subprocess.run(
        [sys.executable, "-m", "kcache", "prewarm", str(spec), "--dir", str(store), "--target", "cuda:90"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 2
    err = [ln for ln in p.stderr.splitlines() if ln.strip() and "NumPy" not in ln and "_conversion" not in ln]
    assert len(err) == 1 and "args.x_ptr.tensor: unknown dtype 'float33'" in err[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not store.exists()


def test_dry_run_lists_and_writes_nothing(
    mod_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "ok.toml"
    spec.write_text(  # TRITON_DEBUG: not in Triton's list, in its key all the same (the debug option)
        "[env]\nTRITON_DEBUG = '1'\nTRITON_DEFAULT_FP_FUSION = '0'\n"
        + GOOD.replace("version = 1\n", "")
        + "\n[[triton]]\nkernel = 'pwmod:tuned'\nsizes = [{ N = 8 }, { N = 16 }]\n"
        "[triton.args]\nx_ptr = { tensor = 'fp32', shape = ['=N'] }\nn = '=N'\n"
    )
    store = tmp_path / "store"
    rc, out, err = _cli(
        [
            str(spec),
            "--dir",
            str(store),
            "--path",
            str(mod_dir),
            "--dry-run",
            "--json",
            "--target",
            "cuda:90",
        ],
        capsys,
    )
    assert rc == 0, err
    data = json.loads(out)
    assert data["mode"] == "dry-run" and data["totals"]["items"] == 3 and data["totals"]["planned"] == 3
    assert any("2 configs" in (i["reason"] or "") for i in data["items"])
    assert not store.exists()


def test_no_gpu_without_target_is_a_usage_error(
    mod_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    spec = tmp_path / "ok.toml"
    spec.write_text(GOOD)
    rc, _, err = _cli([str(spec), "--dir", str(tmp_path / "store"), "--path", str(mod_dir)], capsys)
    assert rc == 2 and "no GPU here: use --target" in err
    assert not (tmp_path / "store").exists()


# ------------------------------------------------------------------------------ recording pieces
def test_toml_writer_round_trips() -> None:
    import tomllib

    entry = {
        "kernel": "a.b:c",
        "grid": [4, 1],
        "options": {"num_warps": 8},
        "env": {"TRITON_DEFAULT_FP_FUSION": "false"},
        "args": {
            "x": {"tensor": "float16", "shape": [8, 256], "strides": [1, 8], "alignment": 4},
            "weird key": 1.5e-05,
            "s": 'a "quoted" \\ string\n',
            "t": [1, {"none": True}],
            "inf": float("inf"),
            "f": False,
        },
    }
    text = rec.HEADER + "\n" + rec.entry_toml(entry, comment="hello") + "\n" + rec.entry_toml(entry)
    data = tomllib.loads(text)
    assert data["version"] == 1 and len(data["triton"]) == 2
    assert data["triton"][0] == entry
    load(text)  # and it is a valid spec, structurally


def test_store_build_check_warns_once_for_another_build(tmp_path: Path, kcache_warnings: list[str]) -> None:
    pytest.importorskip("triton")
    from kcache.prewarm import meta
    from kcache.store import Store

    store = Store.open(tmp_path / "store")
    try:
        assert meta.check_store_build(store) is None  # never prewarmed
        other = {
            "python_abi": "cpython-399-x",
            "python": "3.99",
            "triton_version": "0.0",
            "libtriton_sha256": "0" * 64,
        }
        store.put(meta.KIND, meta.ANY_KEY, {"build.json": json.dumps(other).encode()})
        msg = meta.check_store_build(store)
        assert msg and "prewarmed with Python 3.99" in msg and "will not be found" in msg
        meta.check_store_build(store)
        assert sum("prewarmed with Python 3.99" in m for m in kcache_warnings) == 1
        # the same build recorded: no warning
        me = meta.current_build(compute=False)
        key = meta._build_key(me["python_abi"], me["triton_version"] or "", "any")
        store.put(meta.KIND, key, {"build.json": b"{}"})
        assert meta.check_store_build(store) is None
    finally:
        store.close()


def test_protect_puts_sets_future_mtime(tmp_path: Path) -> None:
    import time

    from kcache.prewarm.meta import protect_puts
    from kcache.store import Store

    store = Store.open(tmp_path / "store")
    try:
        undo = protect_puts(store, 7 * 86400)
        hit = store.put("test-kind", "k1", {"a.bin": b"x"})
        undo()
        plain = store.put("test-kind", "k2", {"a.bin": b"y"})
        rec_mtime = os.stat(os.path.join(hit.dir, "__kcache__.rec")).st_mtime
        assert rec_mtime > time.time() + 6 * 86400
        assert os.stat(os.path.join(plain.dir, "__kcache__.rec")).st_mtime < time.time() + 60
        assert "put" not in vars(store)
    finally:
        store.close()


def test_kcache_prewarm_is_callable_after_the_package_is_imported() -> None:
    import kcache
    import kcache.prewarm as pw

    assert callable(kcache.prewarm) and kcache.prewarm is pw
    assert callable(pw.prewarm)


def test_fit_grid_writes_an_autotuned_lambda_grid_as_expressions() -> None:
    triton = pytest.importorskip("triton")
    from kcache.prewarm.spec import eval_expr

    class Tuner:
        configs = [
            triton.Config({"BLOCK_M": 32, "BLOCK_N": 64}),
            triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}),
            triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}),
        ]

    given = {"a_ptr": object(), "M": 1000, "N": 256, "K": 64, "B": 4}

    def grid(meta: dict) -> tuple[int, int, int]:
        return (
            triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),
            1,
            meta["B"],
        )

    fitted = rec.fit_grid(grid, given, Tuner)
    assert fitted is not None and fitted[1:] == [1, 4]
    for cfg in Tuner.configs:
        names = {**{k: v for k, v in given.items() if isinstance(v, int)}, **cfg.kwargs}
        assert eval_expr(fitted[0].lstrip("="), names) == grid({**given, **cfg.kwargs})[0]
    assert rec.fit_grid(lambda meta: (meta["M"] ** 2 % 7 + meta["BLOCK_M"],), given, Tuner) is None


def test_generated_tensors_have_the_asked_layout_on_a_real_device() -> None:
    torch = pytest.importorskip("torch")
    from kcache.prewarm.triton_aot import make_tensor

    t = make_tensor(TensorArg("float16", [4, 8], [1, 4], alignment=4), "cpu")
    assert t.shape == (4, 8) and t.stride() == (1, 4) and t.dtype == torch.float16
    assert t.data_ptr() % 16 == 4
    assert make_tensor(TensorArg("float32", [3, 5]), "cpu").data_ptr() % 16 == 0
    z = make_tensor(TensorArg("int32", [7], fill="arange"), "cpu")
    assert z.tolist() == list(range(7))
    m = make_tensor(TensorArg("bfloat16", [2, 3], alignment=2), "meta")
    assert m.device.type == "meta" and m.data_ptr() == 2


def test_gpu_mode_launches_with_the_specs_grid_args_and_options(
    mod_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU path's plumbing, with the launch itself captured (this machine has no GPU)."""
    pytest.importorskip("triton")
    torch = pytest.importorskip("torch")
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    from kcache.prewarm import triton_aot
    from kcache.prewarm.spec import resolve

    calls: list[tuple[str, Any, tuple, dict]] = []

    def capture(kind: str) -> Any:
        def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            calls.append((kind, grid, args, kwargs))

        return run

    monkeypatch.setattr(JITFunction, "run", capture("jit"))
    monkeypatch.setattr(Autotuner, "run", capture("autotune"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    real = triton_aot.make_args
    monkeypatch.setattr(triton_aot, "make_args", lambda args, device: real(args, "cpu"))
    text = (
        "[[triton]]\nkernel = 'pwmod:k'\nsizes = [{ N = 100 }]\noptions = { num_warps = 2 }\n"
        "grid = ['=cdiv(N, BLOCK)', 3]\n[triton.args]\nx_ptr = { tensor = 'fp32', shape = ['=N'] }\n"
        "n = '=N'\nBLOCK = 32\n"
        "[[triton]]\nkernel = 'pwmod:tuned'\ngrid = ['=cdiv(n, BLOCK)']\n[triton.args]\n"
        "x_ptr = { tensor = 'fp32', shape = [64] }\nn = 64\n"
    )
    sp = load(text)
    resolve(sp, extra_paths=[str(mod_dir)])
    for it in sp.items():
        triton_aot.run_on_gpu(it.entry.obj, it.args, it.entry.options, it.entry.grid, it.symbols)
    (k1, g1, a1, kw1), (k2, g2, a2, kw2) = calls
    assert k1 == "jit" and kw1 == {"num_warps": 2} and a1[1:] == (100, 32) and a1[0].shape == (100,)
    assert g1({"n": 100, "BLOCK": 32}) == (4, 3)
    assert k2 == "autotune" and a2[1] == 64 and kw2 == {}
    assert g2({"n": 64, "BLOCK": 32}) == (2,) and g2({"n": 64, "BLOCK": 64}) == (1,)
