"""A spec's values: how they are parsed (each function takes ``err(where, message)``, which makes
the one-line error naming the entry and the field) and what they are once parsed: tensors (dtype,
shape, strides, alignment, fill), ``None``, Triton dtypes, expressions (:mod:`.expr`); and the
dtype tables they are checked against."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .expr import FUNCS, Expr, ExprSyntaxError, eval_expr, parse_expr

#: An error maker: ``err(where, message)`` -> the exception to raise (a SpecError naming the spec).
Err = Callable[[str, str], Exception]

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
_SYMBOL = re.compile(r"^[A-Za-z_]\w*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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


@dataclass(frozen=True)
class NoneArg:
    def describe(self) -> str:
        return "None"


@dataclass(frozen=True)
class TritonDtypeArg:
    name: str

    def describe(self) -> str:
        return f"tl.{self.name}"


def dtype_name(text: Any) -> str | None:
    """The canonical (torch) name of a dtype string (``fp16``, ``torch.float16``...), or None."""
    if not isinstance(text, str):
        return None
    t = text.strip().lower()
    t = t.removeprefix("torch.")
    return _DTYPE_ALIAS.get(t)


def describe(v: Any) -> str:
    if hasattr(v, "describe"):
        return v.describe()
    if isinstance(v, (list, tuple)):
        return "(" + ",".join(describe(x) for x in v) + ")"
    return repr(v) if isinstance(v, str) else str(v)


def parse_sizes(v: Any, where: str, err: Err) -> list[dict[str, Any]]:
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


def check_expr(text: str, where: str, err: Err, symbols: set[str] | None) -> Expr:
    body = text[1:] if text.startswith("=") else text
    try:
        tree = parse_expr(body)
    except ExprSyntaxError as e:
        raise err(where, str(e)) from None
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(FUNCS)
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


def parse_dim(v: Any, where: str, err: Err, symbols: set[str] | None) -> Any:
    if isinstance(v, bool):
        raise err(where, f"must be an integer or an expression, got {v!r}")
    if isinstance(v, int):
        if v < 0:
            raise err(where, f"must not be negative, got {v}")
        return v
    if isinstance(v, str):
        return check_expr(v, where, err, symbols)
    raise err(where, f"must be an integer or an expression string, got {v!r}")


def parse_value(v: Any, where: str, err: Err, symbols: set[str]) -> Any:
    if isinstance(v, bool) or isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        return check_expr(v, where, err, symbols) if v.startswith("=") else v
    if isinstance(v, list):
        return [parse_value(x, f"{where}[{j}]", err, symbols) for j, x in enumerate(v)]
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
            shape = [parse_dim(s, f"{where}.shape[{j}]", err, symbols) for j, s in enumerate(shape)]
            strides = None
            if "strides" in v:
                st = v["strides"]
                if not isinstance(st, list) or len(st) != len(shape):
                    raise err(f"{where}.strides", f"must be a list of {len(shape)} strides, got {st!r}")
                strides = [parse_dim(s, f"{where}.strides[{j}]", err, symbols) for j, s in enumerate(st)]
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


def parse_grid(v: Any, where: str, err: Err) -> Any:
    if isinstance(v, str):
        if not IMPORT_PATH.match(v):
            raise err(where, f"expected a list of sizes or an import path module:function, got {v!r}")
        return v
    if not isinstance(v, list) or not 1 <= len(v) <= 3:
        raise err(where, f"must be a list of 1 to 3 sizes or expressions, got {v!r}")
    # grid expressions may name any argument or constexpr (checked when launched)
    return [parse_dim(x, f"{where}[{j}]", err, None) for j, x in enumerate(v)]


def parse_env(v: Any, where: str, err: Err) -> dict[str, str]:
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
