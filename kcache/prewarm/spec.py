"""Prewarm specs: TOML files that name what to compile, and with which arguments.

A spec is data. Parsing (:func:`parse`) checks its structure and imports nothing;
:func:`kcache.prewarm.kernels.resolve` then imports the modules it names (a spec is exactly as
trusted as the code it names) and checks each name against what it finds there: a Triton
kernel's parameters, an autotuner's configs. Every problem is a :class:`SpecError` whose message
is one line naming the entry and the field. Expressions are :mod:`.expr`'s, values :mod:`.values`'.

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
nesting: :func:`.expr.eval_expr`); a table is a tensor (``tensor``, ``shape``, optional ``strides``,
``alignment``, ``fill``), ``{ none = true }`` or ``{ triton_dtype = "fp16" }``; an array is a tuple.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .expr import Expr
from .values import (
    IMPORT_PATH,
    TensorArg,
    describe,
    parse_env,
    parse_grid,
    parse_sizes,
    parse_value,
)

SPEC_VERSION = 1


class SpecError(ValueError):
    """A spec that cannot be used; the message is one line that names the entry and the field."""


class UsageError(SpecError):
    """The request cannot be served here (bad target, no GPU without --target): exit 2 too."""


# ----------------------------------------------------------------------------------- the model
@dataclass
class Entry:
    kind: str  # triton | nvfuser | callable | torch
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
    ref_field: str = ""  # the field that named ``ref`` (kernel, fusion, factory, call, model)

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
    """The spec file's text: a regular file of at most :data:`MAX_SPEC_BYTES`, through kcache's
    one checked open for files a user names (:mod:`kcache.userfile`: a FIFO or ``/dev/stdin`` on a
    pipe is refused, not waited on; ``/dev/zero`` is refused, not read until memory runs out)."""
    from ..userfile import UserFileError, read_text

    try:
        return read_text(path, limit=MAX_SPEC_BYTES, what="a prewarm spec")
    except UserFileError as e:
        raise SpecError(str(e)) from None


def loads_toml(text: str, source: str) -> dict[str, Any]:
    """The spec's TOML, its nesting bounded before it is parsed (tomllib recurses)."""
    from ..userfile import UserFileError, parse_toml

    try:
        return parse_toml(text, source, "a prewarm spec", SpecError)
    except UserFileError as e:
        raise SpecError(str(e)) from None


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
    env = parse_env(raw["env"], "env", err) if "env" in raw else None
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


#: torch.compile's keyword arguments a [[torch]] entry may give, and their types.
_COMPILE_KEYS: dict[str, tuple[type, ...]] = {
    "mode": (str,),
    "dynamic": (bool,),
    "fullgraph": (bool,),
    "backend": (str,),
    "options": (dict,),
}

#: An entry's error maker: ``err(where, message)`` -> a SpecError naming the spec and the field.
Err = Callable[[str, str], SpecError]


def _parse_entry(kind: str, i: int, t: Mapping[str, Any], err: Err) -> Entry:
    ek = ENTRY_KINDS[kind]
    return ek.parse(ek, i, t, err)


def _entry_head(ek: EntryKind, i: int, t: Mapping[str, Any], err: Err) -> tuple[str, str, str]:
    """(the field that names the entry's object, its import path, the entry's label), the
    entry's fields checked against what its kind takes."""
    ref_key = next((r for r in ek.refs if r in t), ek.refs[0])
    ref = t.get(ref_key)
    where0 = f"{ek.name}[{i}]"
    label = f"{where0} ({ref})" if isinstance(ref, str) else where0
    for k in t:
        if k not in ek.fields:
            raise err(f"{label} {k}", f"unknown field; expected {', '.join(sorted(ek.fields))}")
    if sum(r in t for r in ek.refs) > 1:
        raise err(f"{label} {ek.refs[-1]}", f"give either {' or '.join(ek.refs)}, not both")
    _check_import_path(ref, f"{label} {ref_key}", err)
    return ref_key, str(ref), label  # a str: checked just above


def _check_name(t: Mapping[str, Any], label: str, err: Err) -> None:
    name = t.get("name")
    if name is not None and not isinstance(name, str):
        raise err(f"{label} name", "must be a string")


def _check_import_path(v: Any, where: str, err: Err) -> None:
    if v is None:
        raise err(where, "missing field (an import path, module:name)")
    if not isinstance(v, str) or not IMPORT_PATH.match(v):
        raise err(where, f"expected an import path module:name, got {v!r}")


def _parse_call_entry(ek: EntryKind, i: int, t: Mapping[str, Any], err: Err) -> Entry:
    """A [[triton]], [[nvfuser]] or [[callable]] entry: an object called (or launched) with
    each argument set, under each ``sizes`` binding."""
    ref_key, ref, label = _entry_head(ek, i, t, err)
    _check_name(t, label, err)
    sizes = parse_sizes(t.get("sizes"), f"{label} sizes", err)
    symbols = set().union(*[set(s) for s in sizes]) if sizes else set()
    if "args" not in t:
        raise err(f"{label} args", "missing field")
    if ek.named_args:
        arg_sets = _parse_named_arg_sets(t["args"], label, err, symbols)
    else:
        arg_sets = _parse_positional_arg_sets(t["args"], label, err, symbols)
    kwargs: dict[str, Any] = {}
    if "kwargs" in t:
        if not isinstance(t["kwargs"], Mapping):
            raise err(f"{label} kwargs", "must be a table")
        kwargs = {k: parse_value(v, f"{label} kwargs.{k}", err, symbols) for k, v in t["kwargs"].items()}
    return Entry(
        kind=ek.name,
        index=i,
        ref=ref,
        arg_sets=arg_sets,
        kwargs=kwargs,
        sizes=sizes or [{}],
        options=_parse_options(t["options"], label, err) if "options" in t else {},
        grid=parse_grid(t["grid"], f"{label} grid", err) if "grid" in t else None,
        env=parse_env(t["env"], f"{label} env", err) if "env" in t else None,
        is_factory=(ref_key == "factory"),
        name=t.get("name"),
        ref_field=ref_key,
    )


def _parse_named_arg_sets(raw: Any, label: str, err: Err, symbols: set[str]) -> list[Any]:
    """A Triton kernel's arguments: a table (parameter -> value) or an array of such tables."""
    if isinstance(raw, Mapping):
        raw_sets = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(a, Mapping) for a in raw):
        raw_sets = raw
    else:
        raise err(f"{label} args", "must be a table (parameter -> value) or an array of such tables")
    out: list[Any] = []
    for si, aset in enumerate(raw_sets):
        w = f"{label} args" + (f"[{si}]" if len(raw_sets) > 1 else "")
        out.append({k: parse_value(v, f"{w}.{k}", err, symbols) for k, v in aset.items()})
    return out


def _parse_positional_arg_sets(raw: Any, label: str, err: Err, symbols: set[str]) -> list[Any]:
    """Positional arguments: an array, or an array of arrays (several sets)."""
    if not isinstance(raw, list):
        raise err(f"{label} args", "must be an array (positional arguments)")
    raw_sets = raw if raw and all(isinstance(a, list) for a in raw) else [raw]
    return [[parse_value(v, f"{label} args[{j}]", err, symbols) for j, v in enumerate(s)] for s in raw_sets]


def _parse_options(raw: Any, label: str, err: Err) -> dict[str, Any]:
    """Triton's compile options (checked against Triton's own list when the kernel is resolved)."""
    if not isinstance(raw, Mapping):
        raise err(f"{label} options", "must be a table (num_warps = 4, ...)")
    for k, v in raw.items():
        if isinstance(v, (dict, list)):
            raise err(f"{label} options.{k}", "must be a number, boolean or string")
    options = dict(raw)
    nw = options.get("num_warps")
    if nw is not None and (not isinstance(nw, int) or isinstance(nw, bool) or nw <= 0 or nw & (nw - 1)):
        raise err(f"{label} options.num_warps", f"must be a power of 2, got {nw!r}")
    return options


def _parse_torch_entry(ek: EntryKind, i: int, t: Mapping[str, Any], err: Err) -> Entry:
    """A [[torch]] entry: ``model`` (called once: the module or function torch.compile compiles),
    ``inputs`` (called with each ``sizes`` binding and ``device=``: the arguments), ``compile``
    (torch.compile's keyword arguments), ``device`` and ``backward``."""
    ref_key, ref, label = _entry_head(ek, i, t, err)
    _check_import_path(t.get("inputs"), f"{label} inputs", err)
    _check_name(t, label, err)
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
    env = parse_env(t["env"], f"{label} env", err) if "env" in t else None
    return Entry(
        kind=ek.name,
        index=i,
        ref=ref,
        arg_sets=[[]],
        sizes=parse_sizes(t.get("sizes"), f"{label} sizes", err) or [{}],
        env=env,
        is_factory=True,
        name=t.get("name"),
        inputs=t["inputs"],
        compile=dict(compile_kw),
        device=device,
        backward=backward,
        ref_field=ref_key,
    )


@dataclass(frozen=True)
class EntryKind:
    """A kind of spec entry (``[[name]]``): the fields that name its object (the first present
    wins; at most one may be given), every field it takes, and its parser. Resolving
    (:mod:`.kernels`) and running (:mod:`.executors`) have a table of their own, by name."""

    name: str
    refs: tuple[str, ...]
    fields: frozenset[str]
    parse: Callable[[EntryKind, int, Mapping[str, Any], Err], Entry] = _parse_call_entry
    named_args: bool = False


ENTRY_KINDS: dict[str, EntryKind] = {
    k.name: k
    for k in (
        EntryKind(
            "triton",
            ("kernel",),
            frozenset({"kernel", "args", "sizes", "options", "grid", "env", "name"}),
            named_args=True,
        ),
        EntryKind("nvfuser", ("fusion",), frozenset({"fusion", "args", "sizes", "env", "name"})),
        EntryKind(
            "callable",
            ("factory", "call"),
            frozenset({"factory", "call", "args", "kwargs", "sizes", "env", "name"}),
        ),
        EntryKind(
            "torch",
            ("model",),
            frozenset({"model", "inputs", "sizes", "compile", "device", "backward", "env", "name"}),
            parse=_parse_torch_entry,
        ),
    )
}
KINDS = tuple(ENTRY_KINDS)
