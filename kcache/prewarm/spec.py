"""Prewarm specs: TOML files that name what to compile, and with which arguments.

A spec is data. Parsing (:func:`parse`) checks its structure and imports nothing; :func:`resolve`
then imports the modules it names (a spec is exactly as trusted as the code it names) and checks
each name against what it finds there: a Triton kernel's parameters, an autotuner's configs. Every
problem is a :class:`SpecError` whose message is one line naming the entry and the field.

The schema (documented in ``docs/prewarm.md``)::

    version = 1                              # optional; 1 is the only version
    [env]                                    # Triton's cache-invalidating variables
    TRITON_DEFAULT_FP_FUSION = "0"

    [[triton]]                               # a @triton.jit / @triton.autotune / @triton.heuristics kernel
    kernel = "package.module:name"
    sizes = [{ N = 1024 }, { N = 4096 }]     # optional: one argument set per binding
    options = { num_warps = 4 }              # compile options (not for autotuned kernels)
    grid = ["=cdiv(N, BLOCK)"]               # optional: launch grid on a GPU (ints, expressions) or "mod:fn"
    env = { ... }                            # optional: this entry's environment instead of [env]
    [triton.args]                            # parameter name -> value (or args = [ {...}, {...} ])
    x = { tensor = "float32", shape = ["=N"] }
    n = "=N"
    BLOCK = 1024

    [[nvfuser]]                              # on a GPU only
    fusion = "module:name"                   # a kcache.nvfuser.FusionCache, or build(descriptors)
    args = [{ tensor = "float32", shape = [1024, 4096] }]

    [[callable]]                             # on a GPU only: anything that compiles when called
    factory = "module:make_model"            # returns the callable (or call = "module:fn")
    args = [{ tensor = "float16", shape = [8, 256] }]

Values: integers, floats, booleans and strings are themselves; a string starting with ``=`` is an
expression over the ``sizes`` symbols (``+ - * / // % **``, ``cdiv``, ``min``, ``max``, ``abs``,
``next_power_of_2``; every value within +-2**64, at most 1000 characters and 64 levels of
nesting: :func:`eval_expr`); a table is a tensor (``tensor``, ``shape``, optional ``strides``,
``alignment``, ``fill``), ``{ none = true }`` or ``{ triton_dtype = "fp16" }``; an array is a tuple.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPEC_VERSION = 1
KINDS = ("triton", "nvfuser", "callable", "torch")

#: canonical dtype names (torch's) and their accepted aliases
DTYPES: dict[str, tuple[str, ...]] = {
    "float16": ("fp16", "half", "f16"),
    "bfloat16": ("bf16",),
    "float32": ("fp32", "float", "f32"),
    "float64": ("fp64", "double", "f64"),
    "int8": ("i8",),
    "int16": ("i16", "short"),
    "int32": ("i32", "int"),
    "int64": ("i64", "long"),
    "uint8": ("u8",),
    "uint16": ("u16",),
    "uint32": ("u32",),
    "uint64": ("u64",),
    "bool": ("i1",),
    "float8_e4m3fn": ("fp8e4nv",),
    "float8_e5m2": ("fp8e5",),
    "float8_e4m3fnuz": ("fp8e4b8",),
    "float8_e5m2fnuz": ("fp8e5b16",),
}
_DTYPE_ALIAS = {alias: name for name, aliases in DTYPES.items() for alias in (name, *aliases)}
ITEMSIZE = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}
FILLS = ("randn", "rand", "zeros", "ones", "arange", "empty")
TRITON_DTYPES = (
    "fp16",
    "bf16",
    "fp32",
    "fp64",
    "int1",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float8e4nv",
    "float8e5",
    "float8e4b15",
    "float8e4b8",
    "float8e5b16",
)
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_SYMBOL = re.compile(r"^[A-Za-z_]\w*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line that names the entry and the field."""


class UsageError(SpecError):
    """The request cannot be served here (bad target, no GPU without --target): exit 2 too."""


# --------------------------------------------------------------------------------------- values
@dataclass(frozen=True)
class Expr:
    """An integer (or float) expression over the ``sizes`` symbols, e.g. ``cdiv(N, 128) * 2``."""

    text: str

    def eval(self, names: Mapping[str, Any]) -> Any:
        return eval_expr(self.text, names)


@dataclass
class TensorArg:
    dtype: str
    shape: list[Any]  # ints, or Expr before expansion
    strides: list[Any] | None = None
    alignment: int = 16
    fill: str | None = None

    def describe(self) -> str:
        shape = ",".join(str(s) for s in self.shape)
        extra = "" if self.strides is None else f" strides {list(self.strides)}"
        if self.alignment % 16:
            extra += f" align {self.alignment}"
        return f"{self.dtype}[{shape}]{extra}"

    def to_toml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tensor": self.dtype, "shape": list(self.shape)}
        if self.strides is not None:
            out["strides"] = list(self.strides)
        if self.alignment != 16:
            out["alignment"] = self.alignment
        if self.fill is not None:
            out["fill"] = self.fill
        return out


@dataclass(frozen=True)
class NoneArg:
    def describe(self) -> str:
        return "None"


@dataclass(frozen=True)
class TritonDtypeArg:
    name: str

    def describe(self) -> str:
        return f"tl.{self.name}"


def cdiv(a: Any, b: Any) -> Any:
    return -(-a // b)


def next_power_of_2(n: Any) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


_FUNCS: dict[str, Any] = {
    "cdiv": cdiv,
    "min": min,
    "max": max,
    "abs": abs,
    "next_power_of_2": next_power_of_2,
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Div: lambda a, b: a / b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,  # not called: eval_expr's power() checks the size first
}
_OP_TEXT = {
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}

# Limits of expressions: a spec is data, and evaluating it must take microseconds whatever it
# says. Python's integers are unbounded: 9**9**9 alone would compute for hours and take 1 GB.
#: Every value, operand or result, constant or symbol: |value| <= 2**64 (a float also finite).
#: Sizes, strides and grids are far below; 2**64 leaves room for any 64-bit argument.
MAX_VALUE = 2**64
#: Characters of an expression (the parser itself runs out of stack on very long ones).
MAX_EXPR_LEN = 1000
#: Nesting of an expression's operations (``1+1+...+1`` nests once per ``+``).
MAX_EXPR_DEPTH = 64


class ExprSyntaxError(ValueError):
    """An expression that is wrong whatever the values of its symbols: not an expression, a
    construct the evaluator does not know, too long or nested too deeply."""


def _quoted(text: str) -> str:
    """An expression as error messages name it: quoted, and shortened (the limit is 1000)."""
    text = text.strip()
    return repr(text) if len(text) <= 80 else repr(text[:60]) + f"... ({len(text)} characters)"


def parse_expr(text: str) -> ast.Expression:
    """Parse an expression, within :data:`MAX_EXPR_LEN` and :data:`MAX_EXPR_DEPTH`. Raises
    :class:`ExprSyntaxError`."""
    body = text.strip()
    if len(body) > MAX_EXPR_LEN:
        raise ExprSyntaxError(f"expression too long (at most {MAX_EXPR_LEN} characters): {_quoted(text)}")
    try:
        tree = ast.parse(body, mode="eval")
    except SyntaxError as e:
        raise ExprSyntaxError(f"not an expression: {_quoted(text)} ({e.msg})") from None
    except (RecursionError, MemoryError):  # the parser's own stack; not reached within the length
        raise ExprSyntaxError(f"expression nested too deeply: {_quoted(text)}") from None
    # Depth first, without recursion: the evaluator recurses, and must not meet Python's limit.
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_EXPR_DEPTH:
            raise ExprSyntaxError(
                f"expression nested too deeply (more than {MAX_EXPR_DEPTH} levels): {_quoted(text)}"
            )
        stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
    return tree


def eval_expr(text: str, names: Mapping[str, Any]) -> Any:
    """Evaluate a small arithmetic expression safely: numbers, the names in ``names`` (numbers),
    ``+ - * / // % **``, unary ``-``/``+`` and the functions of ``_FUNCS``; no attribute access, no
    other call, no strings or sequences. Bounded (:data:`MAX_VALUE`, :data:`MAX_EXPR_LEN`,
    :data:`MAX_EXPR_DEPTH`): a power is refused before it is computed when its result would be
    beyond the limit. Raises ValueError (:class:`ExprSyntaxError` when no values can help) with a
    message that names the expression."""
    tree = parse_expr(text)
    body, q = text.strip(), _quoted(text)

    def seg(node: ast.AST) -> str:  # the part of the expression that went wrong, as written
        part = ast.get_source_segment(body, node) or ast.unparse(node)
        return part if len(part) <= 60 else part[:57] + "..."

    def bounded(v: Any, node: ast.AST) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            # (-8) ** 0.5 is a complex number
            raise ValueError(f"{seg(node)} is not a real number in {q}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{seg(node)} is not finite in {q}")
        if abs(v) > MAX_VALUE:
            raise ValueError(f"{seg(node)} is beyond the limit of 2**64 in {q}")
        return v

    def power(a: Any, b: Any, node: ast.AST) -> Any:
        # |a| >= 2 and b > 64 is at least 2**65: refused before Python computes it. Below that,
        # a bounded base to at most the 64th power is a few thousand bits: computed, then checked.
        if isinstance(a, int) and isinstance(b, int) and b > 64 and abs(a) >= 2:
            raise ValueError(f"{seg(node)} is beyond the limit of 2**64 (an exponent of {b}) in {q}")
        return a**b

    def ev(node: ast.AST) -> Any:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)
        ):
            return bounded(node.value, node)
        if isinstance(node, ast.Name):
            if node.id in names:
                v = names[node.id]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ValueError(f"{node.id} is not a number in {q}")
                return bounded(v, node)
            raise ValueError(f"unknown name {node.id!r} in {q} (known: {', '.join(sorted(names)) or 'none'})")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                return bounded(power(a, b, node), node)
            return bounded(_BINOPS[type(node.op)](a, b), node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
        ):
            return bounded(_FUNCS[node.func.id](*[ev(a) for a in node.args]), node)
        if isinstance(node, (ast.BinOp, ast.UnaryOp)) and type(node.op) in _OP_TEXT:
            raise ExprSyntaxError(
                f"unsupported operator {_OP_TEXT[type(node.op)]} in {q} (operators: + - * / // % **)"
            )
        raise ExprSyntaxError(f"unsupported syntax in {q}: {ast.dump(node)[:60]}")

    try:
        return ev(tree.body)
    except ZeroDivisionError:
        raise ValueError(f"division by zero in {q}") from None
    except OverflowError:  # float arithmetic: 10.0 ** 400
        raise ValueError(f"a value beyond the limit of 2**64 in {q}") from None
    except TypeError as e:  # a function's arguments: min(), cdiv(1)
        raise ValueError(f"{e} in {q}") from None


def dtype_name(text: Any) -> str | None:
    """The canonical (torch) name of a dtype string (``fp16``, ``torch.float16``...), or None."""
    if not isinstance(text, str):
        return None
    t = text.strip().lower()
    t = t.removeprefix("torch.")
    return _DTYPE_ALIAS.get(t)


# ----------------------------------------------------------------------------------- the model
@dataclass
class Entry:
    kind: str  # triton | nvfuser | callable
    index: int
    ref: str  # module:name of the kernel, fusion, factory or callable
    arg_sets: list[Any]  # for triton: dicts name -> value; otherwise lists (positional)
    kwargs: dict[str, Any] = field(default_factory=dict)  # callable only
    sizes: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    options: dict[str, Any] = field(default_factory=dict)
    grid: Any = None  # list of ints/Expr, or "module:fn"
    env: dict[str, str] | None = None
    is_factory: bool = False  # callable: ref is a factory
    name: str | None = None
    # torch only: the inputs function, torch.compile's keyword arguments, the device, backward
    inputs: str | None = None
    compile: dict[str, Any] = field(default_factory=dict)
    device: str = "cuda"
    backward: bool = False
    inputs_obj: Any = None
    # filled by resolve()
    obj: Any = None
    what: str = ""  # jit | autotune | heuristics | fusion-cache | fusion-builder | callable

    @property
    def label(self) -> str:
        return f"{self.kind}[{self.index}] ({self.name or self.ref})"


@dataclass
class Item:
    """One argument set of one entry, with every expression evaluated: a unit of work."""

    id: int
    entry: Entry
    args: Any  # dict (triton) or list
    kwargs: dict[str, Any]
    symbols: dict[str, Any]
    env: dict[str, str]

    @property
    def label(self) -> str:
        if self.symbols:
            detail = " ".join(f"{k}={v}" for k, v in self.symbols.items())
        else:
            vals = self.args.items() if isinstance(self.args, dict) else enumerate(self.args)
            detail = " ".join(f"{k}={describe(v)}" for k, v in vals)
            if len(detail) > 80:
                detail = detail[:77] + "..."
        return f"{self.entry.label} ({detail})" if detail else self.entry.label


@dataclass
class Spec:
    source: str
    version: int
    env: dict[str, str] | None
    entries: list[Entry]
    base_dir: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def items(self) -> list[Item]:
        """Every (entry, argument set, sizes binding), expressions evaluated, numbered from 0."""
        out: list[Item] = []
        for e in self.entries:
            env = dict(e.env if e.env is not None else (self.env or {}))
            for si, sym in enumerate(e.sizes):
                for ai, aset in enumerate(e.arg_sets):
                    where = f"{e.label}: args" + (f"[{ai}]" if len(e.arg_sets) > 1 else "")
                    if len(e.sizes) > 1 or sym:
                        where += f" with sizes[{si}]"
                    args = _concrete(aset, sym, self.source, where)
                    kwargs = _concrete(e.kwargs, sym, self.source, f"{e.label}: kwargs")
                    out.append(Item(len(out), e, args, kwargs, dict(sym), env))
        return out


def describe(v: Any) -> str:
    if hasattr(v, "describe"):
        return v.describe()
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(describe(x) for x in v) + ")"
    return repr(v) if isinstance(v, str) else str(v)


def _concrete(v: Any, sym: Mapping[str, Any], source: str, where: str) -> Any:
    try:
        return _subst(v, sym)
    except ValueError as e:
        raise SpecError(f"{source}: {where}: {e}") from None


def _subst(v: Any, sym: Mapping[str, Any]) -> Any:
    if isinstance(v, Expr):
        return v.eval(sym)
    if isinstance(v, TensorArg):
        shape = [int(_subst(s, sym)) for s in v.shape]
        strides = None if v.strides is None else [int(_subst(s, sym)) for s in v.strides]
        if any(s < 0 for s in shape):
            raise ValueError(f"negative size in shape {shape}")
        return TensorArg(v.dtype, shape, strides, v.alignment, v.fill)
    if isinstance(v, dict):
        return {k: _subst(x, sym) for k, x in v.items()}
    if isinstance(v, list):
        return [_subst(x, sym) for x in v]
    return v


# ------------------------------------------------------------------------------------- loading
def load(spec: Any, *, source: str | None = None) -> Spec:
    """A :class:`Spec` from a path, TOML text (``str`` containing a newline), a mapping, or a Spec."""
    if isinstance(spec, Spec):
        return spec
    base_dir = None
    if isinstance(spec, Mapping):
        raw = copy.deepcopy(dict(spec))
        source = source or "<spec>"
    elif isinstance(spec, (str, os.PathLike)) and (
        "\n" not in str(spec) and not str(spec).lstrip().startswith("[")
    ):
        path = Path(spec)
        source = source or str(spec)
        text = _read_spec_file(str(path), source)
        raw = loads_toml(text, source)
        base_dir = str(path.resolve().parent)
    elif isinstance(spec, str):
        source = source or "<spec>"
        raw = loads_toml(spec, source)
    else:
        raise SpecError(f"a spec is a path, TOML text or a mapping, not {type(spec).__name__}")
    out = parse(raw, source)
    out.base_dir = base_dir
    return out


MAX_SPEC_BYTES = 16 << 20  # a spec is text a person or a recording wrote: a few KiB


def _read_spec_file(path: str, source: str) -> str:
    """The spec file's text: a regular file of at most :data:`MAX_SPEC_BYTES`, opened as ``kcache
    import`` opens its input (a FIFO is refused, not waited on; ``/dev/zero`` is refused, not
    read until memory runs out)."""
    from ..store.fs import UnsafePath, open_input

    try:
        fd = open_input(path, MAX_SPEC_BYTES)
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_SPEC_BYTES + 1)  # a file that grows meanwhile: still bounded
        if len(data) > MAX_SPEC_BYTES:
            raise UnsafePath(f"{path} is larger than {MAX_SPEC_BYTES} bytes")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise SpecError(f"{source}: no such file") from None
    except UnsafePath as e:
        raise SpecError(f"{source}: not read: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{source}: cannot read: {e}") from None


def loads_toml(text: str, source: str) -> dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found,no-redef]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{source}: malformed TOML: {e}") from None


def parse(raw: Mapping[str, Any], source: str = "<spec>") -> Spec:
    """Check a spec's structure (nothing is imported). Raises :class:`SpecError`."""

    def err(where: str, msg: str) -> SpecError:
        return SpecError(f"{source}: {where}: {msg}")

    if not isinstance(raw, Mapping):
        raise err("spec", "must be a table")
    for k in raw:
        if k not in ("version", "env", *KINDS):
            hint = " (did you mean [[triton]]?)" if k in ("kernel", "kernels") else ""
            raise err(k, f"unknown top-level key; expected version, env, {', '.join(KINDS)}{hint}")
    version = raw.get("version", SPEC_VERSION)
    if version != SPEC_VERSION or isinstance(version, bool):
        raise err("version", f"unsupported spec version {version!r} (this kcache reads {SPEC_VERSION})")
    env = _parse_env(raw["env"], "env", err) if "env" in raw else None
    entries: list[Entry] = []
    for kind in KINDS:
        tables = raw.get(kind, [])
        if isinstance(tables, Mapping):
            raise err(kind, f"must be an array of tables: write [[{kind}]], not [{kind}]")
        if not isinstance(tables, list):
            raise err(kind, f"must be an array of tables ([[{kind}]])")
        for i, t in enumerate(tables):
            if not isinstance(t, Mapping):
                raise err(f"{kind}[{i}]", "must be a table")
            entries.append(_parse_entry(kind, i, t, err))
    if not entries:
        raise err(
            "spec", "names nothing to prepare (no [[triton]], [[nvfuser]], [[callable]] or [[torch]] entry)"
        )
    return Spec(source, int(version), env, entries, raw=copy.deepcopy(dict(raw)))


_ENTRY_KEYS = {
    "triton": {"kernel", "args", "sizes", "options", "grid", "env", "name"},
    "nvfuser": {"fusion", "args", "sizes", "env", "name"},
    "callable": {"factory", "call", "args", "kwargs", "sizes", "env", "name"},
    "torch": {"model", "inputs", "sizes", "compile", "device", "backward", "env", "name"},
}
#: torch.compile's keyword arguments a [[torch]] entry may give, and their types.
_COMPILE_KEYS: dict[str, tuple[type, ...]] = {
    "mode": (str,),
    "dynamic": (bool,),
    "fullgraph": (bool,),
    "backend": (str,),
    "options": (dict,),
}


def _parse_entry(kind: str, i: int, t: Mapping[str, Any], err: Any) -> Entry:
    if kind == "torch":
        return _parse_torch_entry(i, t, err)
    ref_key = {"triton": "kernel", "nvfuser": "fusion", "callable": "factory"}[kind]
    where0 = f"{kind}[{i}]"
    if kind == "callable" and "call" in t and "factory" not in t:
        ref_key = "call"
    ref = t.get(ref_key)
    label = f"{where0} ({ref})" if isinstance(ref, str) else where0
    for k in t:
        if k not in _ENTRY_KEYS[kind]:
            raise err(f"{label} {k}", f"unknown field; expected {', '.join(sorted(_ENTRY_KEYS[kind]))}")
    if kind == "callable" and "call" in t and "factory" in t:
        raise err(f"{label} call", "give either factory or call, not both")
    if ref is None:
        raise err(f"{label} {ref_key}", "missing field (an import path, module:name)")
    if not isinstance(ref, str) or not _IMPORT_PATH.match(ref):
        raise err(f"{label} {ref_key}", f"expected an import path module:name, got {ref!r}")
    name = t.get("name")
    if name is not None and not isinstance(name, str):
        raise err(f"{label} name", "must be a string")
    sizes = _parse_sizes(t.get("sizes"), f"{label} sizes", err)
    symbols = set().union(*[set(s) for s in sizes]) if sizes else set()
    if "args" not in t:
        raise err(f"{label} args", "missing field")
    raw_args = t["args"]
    if kind == "triton":
        if isinstance(raw_args, Mapping):
            raw_sets = [raw_args]
        elif isinstance(raw_args, list) and raw_args and all(isinstance(a, Mapping) for a in raw_args):
            raw_sets = raw_args
        else:
            raise err(f"{label} args", "must be a table (parameter -> value) or an array of such tables")
        arg_sets: list[Any] = []
        for si, aset in enumerate(raw_sets):
            w = f"{label} args" + (f"[{si}]" if len(raw_sets) > 1 else "")
            arg_sets.append({k: _parse_value(v, f"{w}.{k}", err, symbols) for k, v in aset.items()})
    else:
        if not isinstance(raw_args, list):
            raise err(f"{label} args", "must be an array (positional arguments)")
        if raw_args and all(isinstance(a, list) for a in raw_args):
            raw_sets = raw_args  # several positional sets
        else:
            raw_sets = [raw_args]
        arg_sets = [
            [_parse_value(v, f"{label} args[{j}]", err, symbols) for j, v in enumerate(s)] for s in raw_sets
        ]
    kwargs: dict[str, Any] = {}
    if "kwargs" in t:
        if not isinstance(t["kwargs"], Mapping):
            raise err(f"{label} kwargs", "must be a table")
        kwargs = {k: _parse_value(v, f"{label} kwargs.{k}", err, symbols) for k, v in t["kwargs"].items()}
    options: dict[str, Any] = {}
    if "options" in t:
        if not isinstance(t["options"], Mapping):
            raise err(f"{label} options", "must be a table (num_warps = 4, ...)")
        for k, v in t["options"].items():
            if isinstance(v, (dict, list)):
                raise err(f"{label} options.{k}", "must be a number, boolean or string")
        options = dict(t["options"])
        nw = options.get("num_warps")
        if nw is not None and (not isinstance(nw, int) or isinstance(nw, bool) or nw <= 0 or nw & (nw - 1)):
            raise err(f"{label} options.num_warps", f"must be a power of 2, got {nw!r}")
    grid = None
    if "grid" in t:
        grid = _parse_grid(t["grid"], f"{label} grid", err)
    env = _parse_env(t["env"], f"{label} env", err) if "env" in t else None
    return Entry(
        kind=kind,
        index=i,
        ref=ref,
        arg_sets=arg_sets,
        kwargs=kwargs,
        sizes=sizes or [{}],
        options=options,
        grid=grid,
        env=env,
        is_factory=(ref_key == "factory"),
        name=name,
    )


def _parse_torch_entry(i: int, t: Mapping[str, Any], err: Any) -> Entry:
    """A [[torch]] entry: ``model`` (called once: the module or function torch.compile compiles),
    ``inputs`` (called with each ``sizes`` binding and ``device=``: the arguments), ``compile``
    (torch.compile's keyword arguments), ``device`` and ``backward``."""
    ref = t.get("model")
    where0 = f"torch[{i}]"
    label = f"{where0} ({ref})" if isinstance(ref, str) else where0
    for k in t:
        if k not in _ENTRY_KEYS["torch"]:
            raise err(f"{label} {k}", f"unknown field; expected {', '.join(sorted(_ENTRY_KEYS['torch']))}")
    for key in ("model", "inputs"):
        v = t.get(key)
        if v is None:
            raise err(f"{label} {key}", "missing field (an import path, module:name)")
        if not isinstance(v, str) or not _IMPORT_PATH.match(v):
            raise err(f"{label} {key}", f"expected an import path module:name, got {v!r}")
    name = t.get("name")
    if name is not None and not isinstance(name, str):
        raise err(f"{label} name", "must be a string")
    compile_kw = t.get("compile", {})
    if not isinstance(compile_kw, Mapping):
        raise err(f"{label} compile", "must be a table of torch.compile arguments (mode, dynamic, ...)")
    for k, v in compile_kw.items():
        if k not in _COMPILE_KEYS:
            raise err(
                f"{label} compile.{k}", f"unknown argument; expected {', '.join(sorted(_COMPILE_KEYS))}"
            )
        if not isinstance(v, _COMPILE_KEYS[k]) or (k == "mode" and isinstance(v, bool)):
            raise err(f"{label} compile.{k}", f"must be a {_COMPILE_KEYS[k][0].__name__}, got {v!r}")
    device = t.get("device", "cuda")
    if device not in ("cuda", "cpu"):
        raise err(f"{label} device", f"must be cuda or cpu, got {device!r}")
    backward = t.get("backward", False)
    if not isinstance(backward, bool):
        raise err(f"{label} backward", "must be true or false")
    env = _parse_env(t["env"], f"{label} env", err) if "env" in t else None
    return Entry(
        kind="torch",
        index=i,
        ref=ref,
        arg_sets=[[]],
        sizes=_parse_sizes(t.get("sizes"), f"{label} sizes", err) or [{}],
        env=env,
        is_factory=True,
        name=name,
        inputs=t["inputs"],
        compile=dict(compile_kw),
        device=device,
        backward=backward,
    )


def _parse_sizes(v: Any, where: str, err: Any) -> list[dict[str, Any]]:
    if v is None:
        return []
    if isinstance(v, Mapping):
        v = [v]
    if not isinstance(v, list) or not v:
        raise err(where, "must be an array of tables of sizes, e.g. [{ M = 1, N = 64 }, { M = 8, N = 256 }]")
    out = []
    for j, b in enumerate(v):
        if not isinstance(b, Mapping) or not b:
            raise err(f"{where}[{j}]", "must be a table of symbol = integer")
        for k, x in b.items():
            if not _SYMBOL.match(k):
                raise err(f"{where}[{j}].{k}", "not a valid symbol name")
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise err(f"{where}[{j}].{k}", f"must be a number, got {x!r}")
        out.append(dict(b))
    return out


def _check_expr(text: str, where: str, err: Any, symbols: set[str] | None) -> Expr:
    body = text[1:] if text.startswith("=") else text
    try:
        tree = parse_expr(body)
    except ExprSyntaxError as e:
        raise err(where, str(e)) from None
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(_FUNCS)
    if symbols is not None:
        for name in sorted(used):
            if name not in symbols:
                known = ", ".join(sorted(symbols)) or "none: add sizes = [{...}]"
                raise err(where, f"unknown symbol {name!r} in {text!r} (sizes define: {known})")
    try:  # with dummy values: what is wrong whatever the values are
        eval_expr(body, {s: 1 for s in (symbols or set())} if symbols is not None else _AnyNames())
    except ExprSyntaxError as e:
        raise err(where, str(e)) from None
    except ValueError as e:
        if not used:  # a constant (9**9**9, 1//0): wrong now, wrong when expanded
            raise err(where, str(e)) from None
    return Expr(body)


class _AnyNames(dict):
    def __contains__(self, k: object) -> bool:
        return True

    def __getitem__(self, k: Any) -> int:
        return 1


def _parse_dim(v: Any, where: str, err: Any, symbols: set[str] | None) -> Any:
    if isinstance(v, bool):
        raise err(where, f"must be an integer or an expression, got {v!r}")
    if isinstance(v, int):
        if v < 0:
            raise err(where, f"must not be negative, got {v}")
        return v
    if isinstance(v, str):
        return _check_expr(v, where, err, symbols)
    raise err(where, f"must be an integer or an expression string, got {v!r}")


def _parse_value(v: Any, where: str, err: Any, symbols: set[str]) -> Any:
    if isinstance(v, bool) or isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        return _check_expr(v, where, err, symbols) if v.startswith("=") else v
    if isinstance(v, list):
        return [_parse_value(x, f"{where}[{j}]", err, symbols) for j, x in enumerate(v)]
    if isinstance(v, Mapping):
        if "tensor" in v:
            allowed = {"tensor", "shape", "strides", "alignment", "fill"}
            for k in v:
                if k not in allowed:
                    raise err(f"{where}.{k}", f"unknown tensor field; expected {', '.join(sorted(allowed))}")
            dt = dtype_name(v["tensor"])
            if dt is None:
                raise err(f"{where}.tensor", f"unknown dtype {v['tensor']!r} (known: {', '.join(DTYPES)})")
            if "shape" not in v:
                raise err(f"{where}.shape", "missing field (a list of sizes)")
            shape = v["shape"]
            if not isinstance(shape, list):
                raise err(f"{where}.shape", f"must be a list of sizes, got {shape!r}")
            shape = [_parse_dim(s, f"{where}.shape[{j}]", err, symbols) for j, s in enumerate(shape)]
            strides = None
            if "strides" in v:
                st = v["strides"]
                if not isinstance(st, list) or len(st) != len(shape):
                    raise err(f"{where}.strides", f"must be a list of {len(shape)} strides, got {st!r}")
                strides = [_parse_dim(s, f"{where}.strides[{j}]", err, symbols) for j, s in enumerate(st)]
            align = v.get("alignment", 16)
            if isinstance(align, bool) or not isinstance(align, int) or align <= 0:
                raise err(f"{where}.alignment", f"must be a positive number of bytes, got {align!r}")
            if align % 16 and align % ITEMSIZE[dt]:
                raise err(
                    f"{where}.alignment",
                    f"{align} bytes is not a multiple of the element size of {dt} ({ITEMSIZE[dt]})",
                )
            fill = v.get("fill")
            if fill is not None and fill not in FILLS:
                raise err(f"{where}.fill", f"unknown fill {fill!r} (known: {', '.join(FILLS)})")
            return TensorArg(dt, shape, strides, align, fill)
        if set(v) == {"none"}:
            if v["none"] is not True:
                raise err(f"{where}.none", "must be true")
            return NoneArg()
        if set(v) == {"triton_dtype"}:
            name = v["triton_dtype"]
            if name not in TRITON_DTYPES:
                raise err(
                    f"{where}.triton_dtype",
                    f"unknown Triton dtype {name!r} (known: {', '.join(TRITON_DTYPES)})",
                )
            return TritonDtypeArg(name)
        if "shape" in v or "dtype" in v:
            raise err(f"{where}.tensor", 'missing field (a tensor is { tensor = "float16", shape = [...] })')
        raise err(
            where,
            "a table value must be a tensor ({ tensor = ..., shape = [...] }), { none = true } "
            "or { triton_dtype = ... }",
        )
    raise err(where, f"unsupported value {v!r}")


def _parse_grid(v: Any, where: str, err: Any) -> Any:
    if isinstance(v, str):
        if not _IMPORT_PATH.match(v):
            raise err(where, f"expected a list of sizes or an import path module:function, got {v!r}")
        return v
    if not isinstance(v, list) or not 1 <= len(v) <= 3:
        raise err(where, f"must be a list of 1 to 3 sizes or expressions, got {v!r}")
    # grid expressions may name any argument or constexpr (checked when launched)
    return [_parse_dim(x, f"{where}[{j}]", err, None) for j, x in enumerate(v)]


def _parse_env(v: Any, where: str, err: Any) -> dict[str, str]:
    if not isinstance(v, Mapping):
        raise err(where, 'must be a table of VARIABLE = "value"')
    out = {}
    for k, x in v.items():
        if not _ENV_NAME.match(k):
            raise err(f"{where}.{k}", "not a valid environment variable name")
        if isinstance(x, bool):
            x = "1" if x else "0"
        if not isinstance(x, (str, int)):
            raise err(f"{where}.{k}", f"must be a string, got {x!r}")
        out[k] = str(x)
    return out


# ------------------------------------------------------------------------------------ resolving
def import_object(ref: str) -> Any:
    """``module.sub:attr.attr`` -> the object. Raises ImportError / AttributeError."""
    mod_name, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def add_sys_path(dirs: Sequence[str]) -> None:
    for d in reversed([d for d in dirs if d]):
        if d not in sys.path:
            sys.path.insert(0, d)


def resolve(spec: Spec, *, extra_paths: Sequence[str] = ()) -> None:
    """Import what each entry names and check its fields against it. Raises :class:`SpecError`."""
    add_sys_path([*(extra_paths or ()), *([spec.base_dir] if spec.base_dir else []), os.getcwd()])
    for e in spec.entries:
        field_name = {"triton": "kernel", "nvfuser": "fusion", "torch": "model"}.get(
            e.kind, "factory" if e.is_factory else "call"
        )
        where = f"{spec.source}: {e.label} {field_name}"
        mod_name = e.ref.partition(":")[0]
        try:
            obj = import_object(e.ref)
        except ModuleNotFoundError as ex:
            missing = ex.name or mod_name
            raise SpecError(f"{where}: cannot import module {missing!r} (not found on sys.path)") from None
        except AttributeError:
            raise SpecError(f"{where}: module {mod_name!r} has no {e.ref.partition(':')[2]!r}") from None
        except SpecError:
            raise
        except Exception as ex:
            raise SpecError(f"{where}: importing {mod_name!r} failed: {type(ex).__name__}: {ex}") from None
        e.obj = obj
        if e.kind == "triton":
            _check_triton(spec, e, obj, where)
        elif e.kind == "nvfuser":
            from ..nvfuser import FusionCache

            if isinstance(obj, FusionCache):
                e.what = "fusion-cache"
            elif callable(obj):
                e.what = "fusion-builder"
            else:
                raise SpecError(
                    f"{where}: {e.ref} is a {type(obj).__name__}, not a FusionCache or a builder function"
                )
        elif e.kind == "torch":
            if not callable(obj):
                raise SpecError(f"{where}: {e.ref} is a {type(obj).__name__}, not callable")
            try:
                e.inputs_obj = import_object(e.inputs or "")
            except Exception as ex:
                raise SpecError(
                    f"{spec.source}: {e.label} inputs: cannot import {e.inputs!r}: {ex}"
                ) from None
            if not callable(e.inputs_obj):
                raise SpecError(f"{spec.source}: {e.label} inputs: {e.inputs} is not callable")
            e.what = "torch.compile"
        else:
            if not callable(obj):
                raise SpecError(f"{where}: {e.ref} is a {type(obj).__name__}, not callable")
            e.what = "factory" if e.is_factory else "callable"
        if e.kind == "triton" and isinstance(e.grid, str):
            try:
                g = import_object(e.grid)
            except Exception as ex:
                raise SpecError(f"{spec.source}: {e.label} grid: cannot import {e.grid!r}: {ex}") from None
            if not callable(g):
                raise SpecError(f"{spec.source}: {e.label} grid: {e.grid} is not callable")


def kernel_chain(obj: Any) -> list[Any]:
    """[outer, ..., JITFunction] through Autotuner/Heuristics wrappers (``.fn``)."""
    chain = [obj]
    seen = {id(obj)}
    while hasattr(chain[-1], "fn") and not _is_jit(chain[-1]):
        nxt = chain[-1].fn
        if id(nxt) in seen:
            break
        seen.add(id(nxt))
        chain.append(nxt)
    return chain


def _is_jit(obj: Any) -> bool:
    try:
        from triton.runtime.jit import JITFunction
    except Exception:  # pragma: no cover - triton missing
        return False
    return isinstance(obj, JITFunction)


def _check_triton(spec: Spec, e: Entry, obj: Any, where: str) -> None:
    try:
        from triton.runtime.autotuner import Autotuner, Heuristics
        from triton.runtime.jit import JITFunction, KernelInterface
    except Exception as ex:
        raise SpecError(f"{where}: Triton is not importable here ({ex})") from None
    if not isinstance(obj, KernelInterface):
        raise SpecError(
            f"{where}: {e.ref} is a {type(obj).__name__}, not a Triton kernel (@triton.jit or @triton.autotune)"
        )
    chain = kernel_chain(obj)
    jit = chain[-1]
    if not isinstance(jit, JITFunction):
        raise SpecError(f"{where}: {e.ref} does not wrap a @triton.jit function")
    autotuners = [c for c in chain if isinstance(c, Autotuner)]
    e.what = "autotune" if autotuners else ("heuristics" if isinstance(obj, Heuristics) else "jit")
    provided: set[str] = set()
    for c in chain:
        if isinstance(c, Autotuner):
            for cfg in c.configs:
                provided |= set(cfg.kwargs)
        if isinstance(c, Heuristics):
            provided |= set(c.values)
    params = list(inspect.signature(jit.fn).parameters.values())
    names = [p.name for p in params]
    lw = f"{spec.source}: {e.label}"
    if autotuners and e.options:
        k = next(iter(e.options))
        raise SpecError(f"{lw} options.{k}: an autotuned kernel takes its options from its configs")
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        known_opts = set(CUDAOptions.__dataclass_fields__)
    except Exception:
        known_opts = {"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "debug"}
    for k in e.options:
        if k not in known_opts or k in ("arch", "backend_name", "extern_libs", "warp_size"):
            raise SpecError(
                f"{lw} options.{k}: not a Triton compile option (known: num_warps, num_stages, "
                "num_ctas, maxnreg, enable_fp_fusion, launch_cooperative_grid, launch_pdl, debug, ...)"
            )
        if k in names:
            raise SpecError(f"{lw} options.{k}: is a parameter of the kernel: put it in args")
    for si, aset in enumerate(e.arg_sets):
        w = f"{lw} args" + (f"[{si}]" if len(e.arg_sets) > 1 else "")
        for k in aset:
            if k not in names:
                raise SpecError(
                    f"{w}.{k}: {jit.fn.__name__} has no parameter {k!r} (it has: {', '.join(names)})"
                )
            if k in provided:
                raise SpecError(f"{w}.{k}: set by the autotuner's configs or heuristics; leave it out")
        for p in params:
            if p.name not in aset and p.name not in provided and p.default is inspect.Parameter.empty:
                raise SpecError(
                    f"{w}.{p.name}: missing field (a parameter of {jit.fn.__name__} without default)"
                )


def order_args(obj: Any, args: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Split named arguments into a positional prefix (in the kernel's parameter order) and the rest,
    as a program calls ``kernel[grid](a, b, n, BLOCK=...)``: autotuners see positional args in nargs."""
    jit = kernel_chain(obj)[-1]
    names = list(inspect.signature(jit.fn).parameters)
    pos: list[Any] = []
    rest = dict(args)
    for n in names:
        if n in rest:
            pos.append(rest.pop(n))
        else:
            break
    return pos, rest
