"""What a spec names, imported and checked: each entry's object (a Triton kernel, a fusion, a
model, a callable) resolved by its import path, its fields checked against what is found there
(a Triton kernel's parameters, an autotuner's configs, Triton's compile options), and the Triton
introspection prewarm shares (the chain of wrappers around a kernel, its arguments in order).

The arrow runs one way: this module knows the spec (:mod:`.spec`), the spec knows nothing of
it. Importing a spec's modules runs their code: a spec is exactly as trusted as the code it names.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .env import EXTRA_ENV, env_vars_function
from .spec import Entry, Spec, SpecError


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
        where = f"{spec.source}: {e.label} {e.ref_field}"
        e.obj = _import_ref(e.ref, where)
        RESOLVERS[e.kind](spec, e, where)


def _import_program(ref: str, why: Callable[[Exception], str]) -> Any:
    """:func:`import_object` of something the spec names, in the program's own modules: whatever
    their code raises becomes one :class:`SpecError` line, ``why(error)``."""
    try:
        return import_object(ref)
    except SpecError:
        raise
    except Exception as ex:  # broad: the program's modules run their own code, whatever it raises
        raise SpecError(why(ex)) from None


def _import_ref(ref: str, where: str) -> Any:
    mod_name = ref.partition(":")[0]

    def why(ex: Exception) -> str:
        if isinstance(ex, ModuleNotFoundError):
            return f"{where}: cannot import module {ex.name or mod_name!r} (not found on sys.path)"
        if isinstance(ex, AttributeError):
            return f"{where}: module {mod_name!r} has no {ref.partition(':')[2]!r}"
        return f"{where}: importing {mod_name!r} failed: {type(ex).__name__}: {ex}"

    return _import_program(ref, why)


def _resolve_triton(spec: Spec, e: Entry, where: str) -> None:
    _check_triton(spec, e, e.obj, where)
    if isinstance(e.grid, str):
        g = _import_program(
            e.grid, lambda ex: f"{spec.source}: {e.label} grid: cannot import {e.grid!r}: {ex}"
        )
        if not callable(g):
            raise SpecError(f"{spec.source}: {e.label} grid: {e.grid} is not callable")


def _resolve_nvfuser(spec: Spec, e: Entry, where: str) -> None:
    from ..nvfuser import FusionCache

    if isinstance(e.obj, FusionCache):
        e.what = "fusion-cache"
    elif callable(e.obj):
        e.what = "fusion-builder"
    else:
        raise SpecError(
            f"{where}: {e.ref} is a {type(e.obj).__name__}, not a FusionCache or a builder function"
        )


def _resolve_torch(spec: Spec, e: Entry, where: str) -> None:
    if not callable(e.obj):
        raise SpecError(f"{where}: {e.ref} is a {type(e.obj).__name__}, not callable")
    e.inputs_obj = _import_program(
        e.inputs or "", lambda ex: f"{spec.source}: {e.label} inputs: cannot import {e.inputs!r}: {ex}"
    )
    if not callable(e.inputs_obj):
        raise SpecError(f"{spec.source}: {e.label} inputs: {e.inputs} is not callable")
    e.what = "torch.compile"


def _resolve_callable(spec: Spec, e: Entry, where: str) -> None:
    if not callable(e.obj):
        raise SpecError(f"{where}: {e.ref} is a {type(e.obj).__name__}, not callable")
    e.what = "factory" if e.is_factory else "callable"


#: Each kind of entry's check of the object it names (see spec.ENTRY_KINDS for its fields).
RESOLVERS: dict[str, Callable[[Spec, Entry, str], None]] = {
    "triton": _resolve_triton,
    "nvfuser": _resolve_nvfuser,
    "torch": _resolve_torch,
    "callable": _resolve_callable,
}


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
    except ImportError:  # pragma: no cover - triton missing
        return False
    return isinstance(obj, JITFunction)


def _check_triton(spec: Spec, e: Entry, obj: Any, where: str) -> None:
    try:
        from triton.runtime.autotuner import Autotuner, Heuristics
        from triton.runtime.jit import JITFunction, KernelInterface
    except ImportError as ex:  # (the kernel's own module, imported already, imports Triton)
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
    except (ImportError, AttributeError):  # a Triton without the CUDA backend: the options every
        # Triton has then
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


def check_env_names(spec: Spec) -> None:
    """Every variable of an env table must be one Triton counts as cache-invalidating (probed)."""
    groups = [(f"{spec.source}: env", spec.env)] + [
        (f"{spec.source}: {e.label} env", e.env) for e in spec.entries if e.env is not None
    ]
    names = {k for _, env in groups if env for k in env}
    if not names:
        return
    get_cache_invalidating_env_vars = env_vars_function()
    if get_cache_invalidating_env_vars is None:
        return  # no Triton: nothing to check against
    saved = {k: os.environ.get(k) for k in names}
    bad: set[str] = set()
    try:
        for k in names - set(EXTRA_ENV):
            os.environ[k] = "1"
            if k not in get_cache_invalidating_env_vars():
                bad.add(k)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for where, env in groups:
        for k in env or {}:
            if k in bad:
                raise SpecError(
                    f"{where}.{k}: not one of Triton's cache-invalidating variables (env lists only "
                    "those; set other variables in the environment of the prewarm)"
                )
