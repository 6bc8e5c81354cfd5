"""What one kernel launch the ``KCACHE_RECORD`` recorder sees (:mod:`.record`) becomes in a
spec: its arguments' values (:func:`spec_value`), the name another process imports the kernel by
(:func:`import_name`), and its grid, when it can be written down (:func:`grid_value`, an
autotuned kernel's :func:`fit_grid`).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from .spectoml import SURROGATE, surrogate_text


class Unrecordable(Exception):
    """A value a spec cannot describe (the kernel is then written as a comment saying why)."""


def spec_value(v: Any) -> Any:
    """A runtime argument -> its spec value (a TOML-ready Python object). Raises Unrecordable."""
    if v is None:
        return {"none": True}
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        bad = SURROGATE.search(v)
        if bad is not None:
            raise Unrecordable(surrogate_text(bad.group()))
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if hasattr(v, "data_ptr") and hasattr(v, "dtype") and hasattr(v, "shape") and hasattr(v, "stride"):
        from .values import dtype_name

        name = dtype_name(str(v.dtype))
        if name is None:
            raise Unrecordable(f"a tensor of dtype {v.dtype}")
        out: dict[str, Any] = {"tensor": name, "shape": [int(s) for s in v.shape]}
        try:
            contiguous = bool(v.is_contiguous())
        except (RuntimeError, TypeError, AttributeError):  # torch's error, or a tensor-like of the
            contiguous = True  # program's with another method (else: the recording hook says)
        if not contiguous:
            out["strides"] = [int(s) for s in v.stride()]
        try:
            ptr = int(v.data_ptr())
        except (RuntimeError, TypeError, AttributeError):  # as above
            ptr = 0
        if ptr % 16:
            out["alignment"] = ptr & -ptr
        return out
    cls = type(v)
    mod = getattr(cls, "__module__", "")
    if mod.startswith("triton.language") and cls.__name__ == "constexpr":
        return spec_value(v.value)
    if mod.startswith("triton.language") and hasattr(v, "name") and cls.__name__.endswith("dtype"):
        return {"triton_dtype": str(v.name)}
    if isinstance(v, (list, tuple)):
        return [spec_value(x) for x in v]
    raise Unrecordable(f"a {cls.__name__}")


# ------------------------------------------------------------------------------ names
_name_memo: dict[int, tuple[Any, str | None, str | None]] = {}


def import_name(obj: Any, fn: Any) -> tuple[str | None, str | None]:
    """(``module:name`` by which another process can import ``obj``, or None; why not)."""
    hit = _name_memo.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1], hit[2]
    modname = getattr(fn, "__module__", None) or ""
    ref, why = None, None
    mod = sys.modules.get(modname)
    if modname == "__main__" or mod is None:
        why = f"{getattr(fn, '__name__', '?')} is defined in the main script (__main__), which another process cannot import"
    elif "<locals>" in getattr(fn, "__qualname__", ""):
        why = f"{fn.__qualname__} is defined inside a function"
    else:
        name = getattr(fn, "__name__", None)
        if name and getattr(mod, name, None) is obj:
            ref = f"{modname}:{name}"
        else:
            for k, v in list(vars(mod).items()):
                if v is obj:
                    ref = f"{modname}:{k}"
                    break
        if ref is None:
            why = f"{getattr(fn, '__name__', '?')} is not a module-level name of {modname}"
        elif not _importable(modname, mod):
            why = f"module {modname} was not imported from sys.path (loaded from a file path?)"
            ref = None
    _name_memo[id(obj)] = (obj, ref, why)
    return ref, why


def _importable(modname: str, mod: ModuleType) -> bool:
    spec = getattr(mod, "__spec__", None)
    if spec is None:
        return False
    top = modname.split(".")[0]
    if top in sys.builtin_module_names:
        return True
    try:
        found = importlib.machinery.PathFinder.find_spec(top, sys.path)
    except (ImportError, ValueError):  # a finder's refusal, or a module without __spec__
        found = None
    if found is None:
        return False
    if "." not in modname and spec.origin and found.origin:
        return os.path.realpath(spec.origin) == os.path.realpath(found.origin)
    return True


# ------------------------------------------------------------------------------ grids
def grid_value(grid: Any, bound: Mapping[str, Any] | None) -> Any:
    if grid is None:
        return None
    if isinstance(grid, (tuple, list)):
        return [int(g) for g in grid] if all(isinstance(g, int) for g in grid) else None
    if callable(grid):
        qn = getattr(grid, "__qualname__", "")
        mod = getattr(grid, "__module__", "")
        if qn and "<" not in qn and mod and mod != "__main__" and "." not in qn:
            if getattr(sys.modules.get(mod), qn, None) is grid:
                return f"{mod}:{qn}"
        if bound is not None:  # a plain kernel: the grid is fixed by its bound arguments
            try:
                g = grid(bound)
                if all(isinstance(x, int) for x in g):
                    return [int(x) for x in g]
            except Exception:  # broad: the program's grid function (any code)
                return None
    return None


def fit_grid(grid: Any, given: Mapping[str, Any], tuner: Any) -> list[Any] | None:
    """An autotuned kernel's grid is a function of the config (``lambda META: (cdiv(M,
    META["BLOCK_M"]), ...)``): find, per dimension, a constant or an expression over the integer
    arguments and the configs' constexprs (``cdiv(A, C)``, ``cdiv(A, C) * cdiv(A2, C2)``, ``A``)
    that gives the grid's value for EVERY config. None if no such expression fits."""
    from .expr import FUNCS

    configs = list(getattr(tuner, "configs", None) or [])
    if not configs:
        return None
    ints = {k: v for k, v in given.items() if isinstance(v, int) and not isinstance(v, bool)}
    try:
        metas = [{**given, **cfg.all_kwargs()} for cfg in configs]
        values = [tuple(int(x) for x in grid(m)) for m in metas]
    except Exception:  # broad: the program's configs and grid function (its own code)
        return None
    ndim = max(len(v) for v in values)
    if ndim > 3 or any(len(v) != ndim for v in values):
        return None
    ckeys = sorted(
        {k for m, cfg in zip(metas, configs) for k, v in cfg.kwargs.items() if isinstance(v, int) and v > 0}
    )
    cdiv = FUNCS["cdiv"]
    singles: list[tuple[str, Callable[..., Any]]]
    singles = [(f"cdiv({a}, {c})", lambda m, a=a, c=c: cdiv(m[a], m[c])) for a in ints for c in ckeys]
    singles += [(a, lambda m, a=a: m[a]) for a in ints]
    out: list[Any] = []
    for d in range(ndim):
        want = [v[d] for v in values]
        if len(set(want)) == 1:
            out.append(want[0])
            continue
        found = None
        for text, f in singles:
            if all(f(m) == w for m, w in zip(metas, want)):
                found = text
                break
        if found is None:
            for i, (t1, f1) in enumerate(singles):
                for t2, f2 in singles[i:]:
                    if all(f1(m) * f2(m) == w for m, w in zip(metas, want)):
                        found = f"{t1} * {t2}"
                        break
                if found:
                    break
        if found is None:
            return None
        out.append("=" + found)
    return out
