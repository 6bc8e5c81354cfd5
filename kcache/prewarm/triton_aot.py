"""Triton kernels compiled for a GPU that is not there, through the JIT's own binder.

Triton's key covers the kernel's attributes exactly as the JIT computes them from the arguments
(``tt.divisibility`` 16 on aligned pointers and on integers divisible by 16, an empty entry for
each specialised argument that is not, in the JIT's order). A copy of those rules drifts with
each Triton release; the JIT itself does not. So prewarm for a target runs the JIT: a stand-in
driver (a subclass of Triton's CUDA driver that loads no libcuda and answers device 0, stream 0
and ``GPUTarget("cuda", arch, 32)``) is made active with ``triton.runtime.driver.set_active``,
arguments are ``device="meta"`` tensors (no memory, but the shapes, strides, dtypes and data
pointer alignment of the real ones), and ``kernel.warmup(..., grid=(1,))`` compiles what a launch
on the GPU would.

Host code: Triton 3.6 builds a launcher shared object per kernel signature with gcc against
``libcuda.so.1`` (3.7+ has one generic launcher inside ``cuda_utils``). With a C compiler, a stub
``libcuda.so.1`` (every ``cu*`` symbol of Triton's ``cuda.h``, each returning an error) found
through ``TRITON_LIBCUDA_PATH`` is enough to build and load them, so those land in the store too
(:mod:`.stub_libcuda`: the same folder in every process, which Triton 3.9's key needs).

Everything here runs in a process dedicated to one target: the JIT caches the target per device.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .kernels import kernel_chain, order_args
from .stub_libcuda import stub_error, stub_libcuda
from .values import ITEMSIZE, NoneArg, TensorArg, TritonDtypeArg

_TARGET_RE = re.compile(r"^cuda:(?:sm_?)?(\d{2,3})a?$")


class NeedsGPU(RuntimeError):
    """Raised by the stand-in driver for what only a real GPU can do (benchmarks, launches)."""


def parse_target(text: str) -> int:
    """``cuda:90`` (also ``cuda:sm_90``, ``cuda:90a``) -> 90. Raises ValueError."""
    m = _TARGET_RE.match(str(text).strip().lower())
    if not m:
        raise ValueError(f"not a target: {text!r} (expected cuda:ARCH, e.g. cuda:80, cuda:90, cuda:100)")
    arch = int(m.group(1))
    if arch < 50:
        raise ValueError(f"{text!r}: Triton's CUDA backend needs compute capability 5.0 or newer")
    return arch


# ------------------------------------------------------------------------------ stand-in driver
class _NoUtils:
    def __init__(self, why: str) -> None:
        self._why = why

    def __getattr__(self, name: str) -> Any:
        raise NeedsGPU(f"the stand-in driver cannot {name}: {self._why}")


def _stand_in_class() -> type:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import driver as nvd

    class StandInCudaDriver(nvd.CudaDriver):
        """Triton's CUDA driver for a GPU that is not there: device 0, stream 0, one target."""

        def __init__(self, arch: int, utils: Any = None) -> None:  # no super(): no libcuda, no torch.cuda
            self.arch = int(arch)
            self.utils = utils if utils is not None else _NoUtils("there is no GPU")
            self.launcher_cls = nvd.CudaLauncher
            self.get_current_device = lambda: 0
            self.set_current_device = lambda device: None
            self.get_current_stream = lambda device=None: 0
            self.get_device_capability = lambda device=None: (self.arch // 10, self.arch % 10)

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", self.arch, 32)

        def get_active_torch_device(self) -> Any:
            import torch

            return torch.device("meta")

        def get_benchmarker(self) -> Any:
            def no_bench(*args: Any, **kwargs: Any) -> Any:
                raise NeedsGPU("autotune timings need the GPU")

            return no_bench

        def get_empty_cache_for_benchmark(self) -> Any:
            raise NeedsGPU("autotune timings need the GPU")

        def clear_cache(self, cache: Any) -> None:
            return None

        @staticmethod
        def is_active() -> bool:
            return False

    return StandInCudaDriver


@dataclass
class StandIn:
    """What :func:`install_stand_in` did: the driver, and how host code could be prepared."""

    driver: Any
    arch: int
    utils_ready: bool
    host_code_note: str | None  # why launchers cannot be built here (None: they can)
    previous: Any = None

    def uninstall(self) -> None:
        from triton.runtime.driver import driver as cfg

        if self.previous is not None:
            cfg.set_active(self.previous)
        else:
            cfg._active = None  # back to "the default, when first asked"


def install_stand_in(arch: int, *, host_code: bool = True) -> StandIn:
    """Make a stand-in CUDA driver for ``arch`` the active Triton driver in this process.

    With ``host_code`` and a C compiler, a stub libcuda is built and loaded, and Triton's
    ``cuda_utils`` module is built through the cache manager (it lands in the store as a
    ``triton-aux`` entry, as it would at the first launch on the GPU machine)."""
    from triton.runtime.driver import driver as cfg

    cls = _stand_in_class()
    utils = None
    note = None
    if host_code:
        d = stub_libcuda()
        if d is None:
            note = stub_error()
        else:
            os.environ["TRITON_LIBCUDA_PATH"] = d
            try:
                import triton.backends.nvidia.driver as nvd

                with contextlib.suppress(AttributeError):  # not lru_cache'd in this Triton
                    nvd.libcuda_dirs.cache_clear()
                    nvd.library_dirs.cache_clear()
                utils = nvd.CudaUtils()
            except (ImportError, OSError, RuntimeError, subprocess.SubprocessError) as e:  # Triton
                # builds its utilities with a C compiler (none, or it failed): told, not raised
                note = f"Triton's CUDA utilities could not be built here ({type(e).__name__}: {e})"
                utils = None
    else:
        note = "host code not requested"
    drv = cls(arch, utils)
    previous = cfg._active if getattr(cfg, "_active", None) is not None else None
    cfg.set_active(drv)
    return StandIn(drv, arch, utils is not None, note, previous)


# ------------------------------------------------------------------------------ arguments
def _torch_dtype(torch: Any, name: str) -> Any:
    dt = getattr(torch, name, None)
    if dt is None or not isinstance(dt, torch.dtype):
        raise ValueError(f"this torch has no dtype {name!r}")
    return dt


def contiguous_strides(shape: list[int]) -> list[int]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return list(reversed(strides))


def make_tensor(t: TensorArg, device: str, *, torch: Any = None) -> Any:
    """A tensor of ``t``'s dtype, shape and strides whose data pointer has ``t.alignment``.

    ``device="meta"``: no memory (the data pointer is the byte offset: 0 is aligned). On a GPU the
    contents are generated (``fill``; default random normal for floats, zeros otherwise)."""
    if torch is None:
        import torch as _torch

        torch = _torch
    dtype = _torch_dtype(torch, t.dtype)
    shape = [int(s) for s in t.shape]
    strides = [int(s) for s in (t.strides if t.strides is not None else contiguous_strides(shape))]
    offset = 0 if t.alignment % 16 == 0 else t.alignment // ITEMSIZE[t.dtype]
    if all(s > 0 for s in shape):
        need = offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))
    else:
        need = offset
    if device == "meta":
        base = torch.empty(need, dtype=dtype, device="meta")
    else:
        base = _filled(torch, need, dtype, device, t.fill)
    return base.as_strided(shape, strides, offset)


def _filled(torch: Any, n: int, dtype: Any, device: str, fill: str | None) -> Any:
    is_float = dtype.is_floating_point
    fill = fill or ("randn" if is_float else "zeros")
    if fill == "empty":
        return torch.empty(n, dtype=dtype, device=device)
    if fill == "zeros":
        return torch.zeros(n, dtype=dtype, device=device)
    if fill == "ones":
        return torch.ones(n, dtype=dtype, device=device)
    if fill == "arange":
        return torch.arange(n, device=device).to(dtype)
    if not is_float:
        return torch.randint(0, 2, (n,), device=device).to(dtype)
    src = torch.randn(n, device=device) if fill == "randn" else torch.rand(n, device=device)
    return src.to(dtype)


def make_value(v: Any, device: str, *, torch: Any = None) -> Any:
    """A spec value (after expansion) -> the Python object passed to the kernel."""
    if isinstance(v, TensorArg):
        return make_tensor(v, device, torch=torch)
    if isinstance(v, NoneArg):
        return None
    if isinstance(v, TritonDtypeArg):
        import triton.language as tl

        return getattr(tl, v.name)
    if isinstance(v, list):
        return tuple(make_value(x, device, torch=torch) for x in v)
    return v


def make_args(args: Mapping[str, Any], device: str) -> dict[str, Any]:
    import torch

    return {k: make_value(v, device, torch=torch) for k, v in args.items()}


# ------------------------------------------------------------------------------ counting
@dataclass
class CompileCount:
    compiled: int = 0
    hits: int = 0
    names: list[str] = field(default_factory=list)


@contextlib.contextmanager
def count_compiles() -> Iterator[CompileCount]:
    """Count ``triton.compile`` calls that compiled vs. came from the cache (Triton's compilation
    listener, chained to any listener the program set)."""
    from triton import knobs

    c = CompileCount()
    comp = getattr(knobs, "compilation", None)
    if comp is None or not hasattr(type(comp), "listener") and "listener" not in vars(comp):
        yield c
        return
    prev = comp.listener

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        if cache_hit:
            c.hits += 1
        else:
            c.compiled += 1
            c.names.append(str(getattr(src, "name", "?")))
        if prev is not None:
            prev(src=src, metadata=metadata, metadata_group=metadata_group, times=times, cache_hit=cache_hit)

    comp.listener = listener
    try:
        yield c
    finally:
        comp.listener = prev


# ------------------------------------------------------------------------------ warming
@dataclass
class TritonResult:
    kernels: list[Any] = field(default_factory=list)  # CompiledKernel objects
    configs: int = 0  # autotune configs compiled
    autotuned: bool = False
    notes: list[str] = field(default_factory=list)
    launchers_failed: str | None = None


def _autotuner(obj: Any) -> Any:
    from triton.runtime.autotuner import Autotuner

    for c in kernel_chain(obj):
        if isinstance(c, Autotuner):
            return c
    return None


def _prune(
    tuner: Any, nargs: dict[str, Any], kwargs: dict[str, Any], notes: list[str], gpu: bool = False
) -> list[Any]:
    """The configs the autotuner would time. On a GPU its own pruning; without one,
    ``early_config_prune`` where it runs on meta tensors, and no ``perf_model`` (it needs the GPU:
    every config it would choose from is compiled)."""
    if gpu:
        tuner.nargs = nargs
        try:
            return list(tuner.prune_configs(kwargs))
        finally:
            tuner.nargs = None
    configs = list(tuner.configs)
    if getattr(tuner, "early_config_prune", None):
        try:
            pruned = tuner.early_config_prune(configs, nargs, **kwargs)
            if pruned:
                configs = list(pruned)
        except Exception as e:  # broad: the program's prune function (any code)
            notes.append(
                f"early_config_prune failed without the GPU ({type(e).__name__}); compiled all configs"
            )
    if getattr(tuner, "perf_model", None):
        notes.append("perf_model pruning needs the GPU: compiled every config it would choose from")
    return configs


def warm_for_target(obj: Any, args: Mapping[str, Any], options: Mapping[str, Any]) -> TritonResult:
    """Compile ``obj`` (jit, heuristics or autotune) for the active stand-in driver: every config of
    an autotuner (after ``early_config_prune`` where it runs on meta tensors)."""
    res = TritonResult()
    values = make_args(args, "meta")
    pos, kw = order_args(obj, values)
    tuner = _autotuner(obj)
    if tuner is None:
        k = obj.warmup(*pos, **kw, **dict(options), grid=(1,))
        res.kernels.append(k)
        return res
    res.autotuned = True
    nargs = dict(zip(tuner.arg_names, pos))
    configs = _prune(tuner, nargs, dict(kw), res.notes)
    inner = tuner.fn
    for cfg in configs:
        k = inner.warmup(*pos, **kw, **cfg.all_kwargs(), grid=(1,))
        res.kernels.extend(k if isinstance(k, list) else [k])
        res.configs += 1
    res.notes.append(
        f"autotune timings need the GPU: {res.configs} configs compiled, the choice is made there"
    )
    return res


def build_launchers(kernels: list[Any]) -> str | None:
    """Build (through the cache manager) the host launcher of each compiled kernel; None or why not."""
    from triton.runtime.driver import driver as cfg

    drv = cfg.active
    for k in kernels:
        if k is None or not hasattr(k, "src"):
            continue
        try:
            drv.launcher_cls(k.src, k.metadata)
        except NeedsGPU as e:
            return str(e)
        except (ImportError, OSError, RuntimeError, subprocess.SubprocessError) as e:  # Triton's
            # launcher build (a C compiler that failed): told, not raised
            return f"launcher not built: {type(e).__name__}: {e}"
    return None


def make_grid(grid: Any, symbols: Mapping[str, Any]) -> Any:
    """The spec's grid as Triton takes it: a tuple, or a function of the launch's META dict."""
    from .expr import Expr
    from .kernels import import_object

    if grid is None:
        return (1,)
    if isinstance(grid, str):
        return import_object(grid)
    if all(isinstance(g, int) for g in grid):
        return tuple(grid)

    def fn(meta: Mapping[str, Any]) -> tuple[int, ...]:
        names = {k: v for k, v in meta.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        names.update(symbols)
        return tuple(int(g.eval(names)) if isinstance(g, Expr) else int(g) for g in grid)

    return fn


def run_on_gpu(
    obj: Any, args: Mapping[str, Any], options: Mapping[str, Any], grid: Any, symbols: Mapping[str, Any]
) -> TritonResult:
    """Launch ``obj`` on the GPU with generated tensors: compiles, autotunes (when a grid is given
    for an autotuned kernel; without one the configs are compiled and loaded, not timed)."""
    import torch

    res = TritonResult()
    values = make_args(args, "cuda")
    pos, kw = order_args(obj, values)
    tuner = _autotuner(obj)
    if tuner is not None:
        res.autotuned = True
        try:
            from triton import knobs

            if getattr(knobs.autotuning, "cache", False) and not tuner.cache_results:
                tuner.cache_results = True  # imported before kcache turned autotune caching on
        except (ImportError, AttributeError):  # a Triton without this knob (they vary)
            pass
        if grid is None:
            nargs = dict(zip(tuner.arg_names, pos))
            for cfg in _prune(tuner, nargs, dict(kw), res.notes, gpu=True):
                k = tuner.fn.warmup(*pos, **kw, **cfg.all_kwargs(), grid=(1,))
                res.kernels.append(k)
                res.configs += 1
                # broad: Triton's loader and the driver (no GPU: the kernel stays compiled, unloaded)
                with contextlib.suppress(Exception):
                    k._init_handles()
            res.notes.append(
                f"not autotuned: the entry has no grid ({res.configs} configs compiled and loaded)"
            )
            torch.cuda.synchronize()
            return res
    g = make_grid(grid, symbols)
    obj[g](*pos, **kw, **dict(options))
    torch.cuda.synchronize()
    if tuner is not None:
        res.configs = len(getattr(tuner, "configs_timings", None) or tuner.configs)
    return res
