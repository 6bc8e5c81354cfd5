"""Prewarm specs without compiling: parsing, expressions (and their limits), bad specs (exit 2,
one line, nothing changed), dry runs, the TOML writer of KCACHE_RECORD (round trips of generated
text and values), the store build check."""

from __future__ import annotations

import enum
import importlib
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kcache.prewarm import record as rec
from kcache.prewarm.expr import Expr, eval_expr
from kcache.prewarm.spec import SpecError, load
from kcache.prewarm.values import NoneArg, TensorArg, TritonDtypeArg

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: kcache reads specs with tomli there
    import tomli as tomllib  # type: ignore[no-redef]

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
    assert soft["in_ptr"].shape == [8, 1000] and soft["out_ptr"].shape == [8, 1000]
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


# Expressions that Python alone would compute for hours (9**9**9), or crash on (deep nesting).
# Names: N = 2**20, S = 9.
UNBOUNDED = [
    ("9**9**9", "9**9**9 is beyond the limit of 2**64 (an exponent of 387420489)"),
    ("2**10**10", "is beyond the limit of 2**64 (an exponent of 10000000000)"),
    ("S**S**S", "S**S**S is beyond the limit of 2**64"),
    ("max(N, 2) ** 1000", "is beyond the limit of 2**64 (an exponent of 1000)"),
    ("1<<10**9", "unsupported operator <<"),
    ("N >> 1", "unsupported operator >>"),
    ("99999999999 * 99999999999 * 99999999999", "99999999999 * 99999999999 is beyond the limit"),
    ("N*N*N*N*N", "N*N*N*N is beyond the limit of 2**64"),
    ("2**64 + 1", "2**64 + 1 is beyond the limit"),
    ("10.0 ** 400", "beyond the limit of 2**64"),
    ("1e400", "1e400 is not finite"),
    ("(-8) ** 0.5", "(-8) ** 0.5 is not a real number"),
    ("'ab' * 10**9", "unsupported syntax"),
    ("(1, 2) * 10**9", "unsupported syntax"),
    ("-" * 999 + "1", "nested too deeply (more than 64 levels)"),
    ("1" + "+1" * 499, "nested too deeply (more than 64 levels)"),
    ("max(" * 150 + "1" + ")" * 150, "nested too deeply (more than 64 levels)"),
    ("-" * 1_000_000 + "1", "expression too long (at most 1000 characters)"),
    ("1" + "+1" * 1_000_000, "expression too long (at most 1000 characters)"),
]

_EVAL_ALL = """
import json, sys, time
from kcache.prewarm.expr import eval_expr
out = []
for text in json.load(sys.stdin):
    t0 = time.perf_counter()
    try:
        out.append(["ok", repr(eval_expr(text, {"N": 2**20, "S": 9}))])
    except ValueError as e:
        out.append(["ValueError", str(e)])
    except BaseException as e:  # RecursionError, MemoryError: what the limits are for
        out.append([type(e).__name__, str(e)[:300]])
    out[-1].append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def test_unbounded_expressions_are_refused_at_once_naming_the_expression() -> None:
    # In a child with a timeout: without the limits 9**9**9 runs for hours (in C, deaf to
    # signals), and this test must fail then, not hang.
    p = subprocess.run(
        [sys.executable, "-c", _EVAL_ALL],
        input=json.dumps([text for text, _ in UNBOUNDED]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(p.stdout)
    for (text, needle), (kind, msg, seconds) in zip(UNBOUNDED, results, strict=True):
        assert kind == "ValueError", (text[:60], kind, msg)
        assert needle in msg and "\n" not in msg, (text[:60], msg)
        assert repr(text)[:40] in msg, (text[:60], msg)  # names the expression (shortened if long)
        assert len(msg) < 300, msg
        assert seconds < 1.0, (text[:60], seconds)


def test_expression_limits_are_exact_and_ordinary_expressions_work() -> None:
    from kcache.prewarm.expr import MAX_EXPR_DEPTH, MAX_EXPR_LEN, MAX_VALUE
    from kcache.prewarm.triton_aot import make_grid

    assert MAX_VALUE == 2**64 and MAX_EXPR_LEN == 1000 and MAX_EXPR_DEPTH == 64  # as documented
    assert eval_expr("2**64", {}) == 2**64 and eval_expr("-2**64", {}) == -(2**64)
    assert eval_expr("N * N", {"N": 2**32}) == 2**64
    for too_big in ("2**65", "2**64 + 1", "N * N + 1", "-N * N - 1", "2 * N * N"):
        with pytest.raises(ValueError, match="beyond the limit of 2"):
            eval_expr(too_big, {"N": 2**32})
    with pytest.raises(ValueError, match="N is beyond the limit"):  # a symbol's value too
        eval_expr("N - 1", {"N": 2**64 + 1})
    # the exponent is bounded only where the result grows with it
    assert eval_expr("1 ** (10**18)", {}) == 1 and eval_expr("(-1) ** (2**64)", {}) == 1
    assert eval_expr("0 ** (2**64)", {}) == 0 and eval_expr("2 ** -2", {}) == 0.25
    assert eval_expr("2 ** -(2**64)", {}) == 0.0
    # nesting: up to the limit, and parentheses alone do not nest
    deep = "1" + "+1" * (MAX_EXPR_DEPTH - 1)
    assert eval_expr(deep, {}) == MAX_EXPR_DEPTH
    with pytest.raises(ValueError, match="nested too deeply"):
        eval_expr(deep + "+1", {})
    assert eval_expr("(" * 150 + "N" + ")" * 150, {"N": 3}) == 3
    assert eval_expr(" " * 5 + "N" + " " * 5, {"N": 3}) == 3
    with pytest.raises(ValueError, match="too long"):
        eval_expr("N" + " + N" * 250, {"N": 3})
    # ordinary grids and shapes
    names = {"M": 1000, "N": 4096, "BLOCK_M": 128, "BLOCK_N": 64}
    assert eval_expr("cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N)", names) == 8 * 64
    assert eval_expr("next_power_of_2(M) // 2 + max(M, N) % 7 - abs(-3)", names) == 512 + 1 - 3
    assert eval_expr("N / 8 * 1.5", names) == 768.0
    assert make_grid([Expr("cdiv(N, BLOCK)"), 3], {"N": 100})({"BLOCK": 32}) == (4, 3)
    with pytest.raises(ValueError, match="N \\*\\* BLOCK is beyond the limit"):  # at launch, on a GPU
        make_grid([Expr("N ** BLOCK")], {"N": 100})({"BLOCK": 32})


def test_expression_limits_are_spec_errors_naming_entry_field_and_expression() -> None:
    head = "[[triton]]\nkernel = 'm:k'\n"
    # a constant is checked when the spec is read
    for field, value, needle in [
        ("grid", "['=9**9**9']", "triton[0] (m:k) grid[0]: 9**9**9 is beyond the limit of 2**64"),
        ("args", "{ x = '=1 << 3' }", "triton[0] (m:k) args.x: unsupported operator << in '1 << 3'"),
        ("args", "{ x = '=2**100' }", "triton[0] (m:k) args.x: 2**100 is beyond the limit of 2**64"),
        ("args", "{ x = '=1//0' }", "triton[0] (m:k) args.x: division by zero in '1//0'"),
        ("args", "{ x = '=" + "-" * 70 + "1' }", "args.x: expression nested too deeply"),
        ("args", "{ x = '=" + "1+" * 600 + "1' }", "args.x: expression too long"),
    ]:
        with pytest.raises(SpecError) as ei:
            load(f"{head}{field} = {value}\n" + ("args = {}\n" if field != "args" else ""))
        assert needle in str(ei.value) and "\n" not in str(ei.value), str(ei.value)
    # with symbols, when the items are expanded (with N = 1 at reading, N**N**N is 1)
    sp = load(
        f"{head}sizes = [{{ N = 3 }}, {{ N = 9 }}]\nargs = {{ x = {{ tensor = 'fp32', shape = ['=N**N**N'] }} }}\n"
    )
    with pytest.raises(SpecError) as ei:
        sp.items()
    assert "triton[0] (m:k): args with sizes[1]: N**N**N is beyond the limit of 2**64" in str(ei.value)
    sp = load(f"{head}sizes = [{{ N = 3 }}]\nargs = {{ x = {{ tensor = 'fp32', shape = ['=N**N**N'] }} }}\n")
    assert sp.items()[0].args["x"].shape == [3**27]  # within the limit: computed


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
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


@pytest.mark.parametrize("dry_run", [True, False])
def test_without_torch_prewarm_says_so_in_one_line_before_anything(tmp_path: Path, dry_run: bool) -> None:
    """The README's install has no torch: prewarm (a dry run too) stops at once with one line
    that names the entry and how to get a torch that leaves the installed Triton alone."""
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}
    hide = (
        "import sys; sys.modules['torch'] = None; from kcache.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    args = ["prewarm", str(EXAMPLE), "--dir", str(store), "--target", "cuda:90"]
    p = subprocess.run(
        [sys.executable, "-c", hide, *args, *(["--dry-run"] if dry_run else [])],
        capture_output=True, text=True, env=env, timeout=120, cwd=str(tmp_path),
    )  # fmt: skip
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and p.stdout == "", p.stderr
    line = lines[0]
    assert "triton[0] (kernels:add_kernel)" in line and "needs torch" in line, line
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in line, line
    from kcache import fingerprint

    assert f"Triton {fingerprint.current('triton_version')}" in line
    assert not store.exists()


def test_torch_advice_names_the_torch_that_pins_the_installed_triton() -> None:
    from kcache.prewarm.needs import torch_advice, torch_for_triton

    assert torch_for_triton("3.6.0") == "2.11" and torch_for_triton("3.7.1") == "2.13"
    assert torch_for_triton("3.4.0") == "2.8" and torch_for_triton("3.8.0") == "2.14"
    assert torch_for_triton("3.9.0") is None and torch_for_triton(None) is None
    assert "torch==2.11.*" in torch_advice("3.6.0") and "torch==" not in torch_advice("3.9.0")


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
            # tensors of a list: too long for one line, so tomli_w writes [[triton.args.sets]]
            "sets": [{"tensor": "float16", "shape": [8, 256]}, {"tensor": "int32", "shape": [1]}],
        },
    }
    text = rec.HEADER + "\n" + rec.entry_toml(entry, comment="hello") + "\n" + rec.entry_toml(entry)
    data = tomllib.loads(text)
    assert data["version"] == 1 and len(data["triton"]) == 2
    assert data["triton"][0] == data["triton"][1] == entry  # each sub-table went to its own entry
    assert text.count("[[triton]]\n") == 2 and "[[triton.args.sets]]" in text and "# hello\n" in text
    load(text)  # and it is a valid spec, structurally


# Text for the writer: any code point, with the awkward ones made frequent (hypothesis favours
# small code points): quotes, backslashes, control characters, DEL, line and paragraph
# separators, the BOM, characters beyond the Basic Multilingual Plane, and lone surrogates.
_AWKWARD = '"\\\x7f\n\r\t\b\f\x00\x1f\x0b\x1c\x85\xa0\u2028\u2029\ufeff\u200b\U0001f600\U000e0001\U0010ffff'
_CHAR = st.one_of(
    st.characters(exclude_categories=["Cs"]),
    st.characters(min_codepoint=0x10000),
    st.sampled_from(_AWKWARD),
)
TEXT = st.text(_CHAR, max_size=12)
# st.text() leaves surrogates out whatever its alphabet says: joined by hand
_LONE = st.characters(categories=["Cs"])
BAD_TEXT = st.tuples(TEXT, _LONE, TEXT).map("".join)
ANY_TEXT = st.one_of(TEXT, BAD_TEXT, st.lists(st.one_of(_CHAR, _LONE), max_size=12).map("".join))
_SURROGATE = re.compile("[\ud800-\udfff]")


def _values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.one_of(st.booleans(), st.integers(), st.floats(), text),
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
        max_leaves=12,
    )


SCALARS = st.one_of(st.booleans(), st.integers(), st.floats(), TEXT)
VALUES = _values(TEXT)  # what TOML can hold


def _has_surrogate(v: Any) -> bool:
    if isinstance(v, str):
        return _SURROGATE.search(v) is not None
    if isinstance(v, dict):
        return any(_has_surrogate(k) or _has_surrogate(x) for k, x in v.items())
    if isinstance(v, list):
        return any(_has_surrogate(x) for x in v)
    return False


def _same(read: Any, written: Any) -> bool:
    """Equal, of the same type (1 and 1.0 are another specialisation), NaN equal to NaN."""
    if type(read) is not type(written):
        return False
    if isinstance(written, float) and math.isnan(written):
        return math.isnan(read)
    if isinstance(written, dict):
        return read.keys() == written.keys() and all(_same(read[k], written[k]) for k in written)
    if isinstance(written, list):
        return len(read) == len(written) and all(_same(a, b) for a, b in zip(read, written))
    return bool(read == written)


def _printable(text: str) -> bool:
    """Nothing invisible in the file: every character printable but the line ends."""
    return text.replace("\n", "").isprintable()


@settings(max_examples=500, deadline=None)
@given(ANY_TEXT)
@example("BLOCK\n")  # a bare key but for the newline
@example("")
@example("\U0001f600")  # beyond the BMP: never a surrogate pair
@example("\x7f")  # DEL: not allowed as it is
@example("\t\x85\u2028\u202e\ufeff")  # tomli_w leaves these as they are: escaped after it
@example("\udcff")
def test_toml_strings_and_keys_round_trip_any_text(s: str) -> None:
    """As a value, as a key, and as a key in a table's header: read back exactly, or refused."""
    table = {"v": s, "t": {s: 1}, "h": {s: {"x": [s]}}}
    if _has_surrogate(s):  # not a Unicode scalar value: no TOML string holds it, so: refused
        with pytest.raises(ValueError, match="lone surrogate"):
            rec.toml_text(table)
        return
    written = rec.toml_text(table)
    assert _printable(written), written  # escaped: nothing invisible in the file
    assert not _SURROGATE.search(written) and "\\uD8" not in written.upper()  # no surrogate pairs
    assert tomllib.loads(written.encode("utf-8").decode("utf-8")) == table


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_toml_values_round_trip(v: Any) -> None:
    written = rec.toml_text({"v": v})
    read = tomllib.loads(written)["v"]
    assert _same(read, v), (read, v)
    assert _printable(written), written


@settings(max_examples=200, deadline=None)
@given(_values(ANY_TEXT), BAD_TEXT)
def test_toml_values_with_a_lone_surrogate_anywhere_are_refused(v: Any, bad: str) -> None:
    """tomli_w would write the surrogate as it is (a str no UTF-8 file can hold): refused, with
    the reason, before."""
    for holder in ([v, bad], {"k": [bad, v]}, {bad: v}, [{"a": v, "b": {"c": bad}}], (v, bad)):
        with pytest.raises(ValueError, match="lone surrogate"):
            rec.toml_text({"v": holder})
    if not _has_surrogate(v):
        rec.toml_text({"v": v})  # v alone is fine


class _Level(enum.IntEnum):
    HIGH = 3


class _Mode(int, enum.Enum):  # not an IntEnum: str() is "_Mode.FAST" on every Python
    FAST = 4


class _Name(str, enum.Enum):
    A = "a b"


class _Float64(float):
    """As numpy's float64: a float whose repr (and here str) is not a TOML number."""

    def __repr__(self) -> str:
        return f"np.float64({float.__repr__(self)})"

    __str__ = __repr__


def test_toml_writes_enums_and_number_subclasses_as_their_plain_values() -> None:
    """tomli_w writes an int or float as str(v): for these, text that is no TOML number (or, for
    an IntEnum on Python 3.10, its name). They are written as the int, float or str they are, and
    read back equal, as plain types; tuples as arrays; anything else, or a key that is no string,
    is refused."""
    v = {
        "level": _Level.HIGH,
        "mode": _Mode.FAST,
        "f": _Float64(1.5),
        "nan": _Float64("nan"),
        "inf": _Float64("-inf"),
        "name": _Name.A,
        _Name.A: (1, _Level.HIGH, (_Float64(0.25),)),
    }
    written = rec.toml_text({"v": v})
    assert "_Level" not in written and "_Mode" not in written and "np.float64" not in written
    read = tomllib.loads(written)["v"]
    want = {"level": 3, "mode": 4, "f": 1.5, "nan": math.nan, "inf": -math.inf, "name": "a b"}
    want["a b"] = [1, 3, [0.25]]
    assert _same(read, want), read
    entry = {"kernel": "m:k", "grid": (_Level.HIGH, 1), "options": {"num_warps": _Mode.FAST}, "args": v}
    got = tomllib.loads(rec.entry_toml(entry))["triton"][0]
    assert _same(got, {"kernel": "m:k", "grid": [3, 1], "options": {"num_warps": 4}, "args": want}), got
    for bad in ({"v": {1: 2}}, {"v": None}, {"v": b"x"}, {"v": [object()]}):
        with pytest.raises(TypeError, match="cannot write"):
            rec.toml_text(bad)


ENTRIES = st.fixed_dictionaries(
    {"kernel": TEXT, "args": st.dictionaries(TEXT, VALUES, max_size=4)},
    optional={
        "grid": st.lists(st.one_of(st.integers(0, 2**31), TEXT), min_size=1, max_size=3),
        "options": st.dictionaries(TEXT, SCALARS, min_size=1, max_size=3),
        "env": st.dictionaries(TEXT, TEXT, min_size=1, max_size=3),
    },
)


@settings(max_examples=200, deadline=None)
@given(ENTRIES, ANY_TEXT)
def test_toml_entries_round_trip_with_any_comment(entry: dict[str, Any], comment: str) -> None:
    """As the recorder writes them: a header, then tables appended one by one, each with a comment
    (which may say anything, a lone surrogate too: never a broken file)."""
    text = rec.HEADER + "\n" + rec.entry_toml(entry, comment=comment) + "\n" + rec.entry_toml(entry)
    text += "\n" + rec.toml_comment(comment) + "\n"
    data = tomllib.loads(text)
    assert data["version"] == 1 and len(data["triton"]) == 2
    for read in data["triton"]:
        assert _same(read, entry), (read, entry)
    assert text.encode("utf-8")  # no lone surrogate even in a comment: the file is UTF-8
    assert _printable(text), text
    for field in ("kernel", "env"):  # and an entry holding one is refused whole
        with pytest.raises(ValueError, match="lone surrogate"):
            rec.entry_toml({**entry, field: "\udcff" if field == "kernel" else {"X": "\udcff"}})


def test_recorder_writes_odd_strings_and_says_why_it_cannot(
    mod_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recorder's own path, from the hook to the file: a constexpr string with quotes, control
    characters and an emoji is recorded and reads back; a lone surrogate (an undecodable byte in
    the environment) cannot be, and the file says so in a comment, still a valid spec."""
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(mod_dir))
    monkeypatch.delitem(sys.modules, "pwmod", raising=False)
    kernel = importlib.import_module("pwmod").k
    path = tmp_path / "recorded.toml"
    recorder = rec.Recorder(str(path))
    env: dict[str, str] = {}
    monkeypatch.setattr(rec, "_env_now", lambda: dict(env))

    def run(self: Any, bound_args: dict[str, Any], key: str) -> None:
        # stands for JITFunction.run: the recorder reads its frame (self, bound_args), as the hooks
        # do when Triton calls them from there
        kw = {"fn": SimpleNamespace(jit_function=self), "key": key}
        recorder.capture(kw)
        recorder.commit(kw)

    odd = 'a "b" \\ \x7f\x00\n\U0001f600\u2028'
    run(kernel, {"x_ptr": 3, "n": 64, "BLOCK": odd}, "k1")
    env["TRITON_DEFAULT_FP_FUSION"] = "\udcff"
    run(kernel, {"x_ptr": 3, "n": 64, "BLOCK": "plain"}, "k2")
    run(kernel, {"x_ptr": 3, "n": 64, "BLOCK": "\ud83d"}, "k3")
    assert (recorder.recorded, recorder.skipped) == (1, 2)
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    assert data["triton"] == [{"kernel": "pwmod:k", "args": {"x_ptr": 3, "n": 64, "BLOCK": odd}}]
    why = [ln for ln in text.splitlines() if "not recorded" in ln]
    assert len(why) == 2 and "pwmod:k" in why[0] and "U+DCFF" in why[0] and "\\uDCFF" not in text
    assert "argument BLOCK is a string with a lone surrogate (U+D83D" in why[1]


def test_record_and_runner_do_not_import_each_other() -> None:
    code = (
        "import sys\n"
        "import kcache.prewarm.record\n"
        "assert 'kcache.prewarm.runner' not in sys.modules, 'record imported runner'\n"
        "for m in [m for m in sys.modules if m.startswith('kcache.prewarm.')]: del sys.modules[m]\n"
        "import kcache.prewarm.runner\n"
        "assert 'kcache.prewarm.record' not in sys.modules, 'runner imported record'\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    # record also imports runner's names lazily, inside functions: no mention of it at all
    for mod, other in (("record", "runner"), ("runner", "record")):
        source = (REPO / "kcache" / "prewarm" / f"{mod}.py").read_text()
        assert not re.search(rf"from \.{other} import|import kcache\.prewarm\.{other}", source), mod
    assert not hasattr(rec, "active_recorder")


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


def test_protect_puts_records_protection_not_a_future_mtime(tmp_path: Path) -> None:
    """A protected put says in its record until when it is kept from eviction; its record's
    mtime (its last use) is its creation, not a date a week ahead (which `inspect` showed)."""
    import time

    from kcache.prewarm.meta import protect_puts
    from kcache.store import Store

    store = Store.open(tmp_path / "store")
    try:
        undo = protect_puts(store, 7 * 86400)
        hit = store.put("test-kind", "k1", {"a.bin": b"x"})
        undo()
        plain = store.put("test-kind", "k2", {"a.bin": b"y"})
        now = time.time()
        rec_mtime = os.stat(os.path.join(store.entry_dir(hit.record.id), "__kcache__.rec")).st_mtime
        assert rec_mtime < now + 60
        assert hit.record.protect_until > now + 6 * 86400
        assert store.read_record(hit.record.id)[0].protect_until == hit.record.protect_until
        assert plain.record.protect_until == 0.0 and "protect_until" not in plain.record.to_dict()
        store.flush(force=True)
        row = store.index().row(hit.record.id)
        assert row is not None and row.last_used < now + 60
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
    from kcache.prewarm.expr import eval_expr

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
    from kcache.prewarm.kernels import resolve

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
