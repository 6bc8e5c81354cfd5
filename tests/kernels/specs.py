"""How each test kernel is compiled ahead of time, as ``triton.compile(ASTSource(...))`` takes it.

``attrs`` follow the JIT's rules: ``tt.divisibility`` 16 on pointers the JIT sees aligned and on
integers divisible by 16. Compiling needs no GPU: the target names the architecture.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

DIV16 = [["tt.divisibility", 16]]


def _div(*indices: int) -> dict[tuple[int, ...], list[list[Any]]]:
    return {(i,): DIV16 for i in indices}


@dataclass(frozen=True)
class Spec:
    name: str
    module: str
    fn: str
    signature: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)
    attrs: dict[tuple[int, ...], list[list[Any]]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


_PTR3 = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32"}
_MM_SIG = {
    "a_ptr": "*fp16",
    "b_ptr": "*fp16",
    "c_ptr": "*fp16",
    **{k: "i32" for k in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn")},
    **{k: "i32" for k in ("stride_cm", "stride_cn")},
    "BLOCK_M": "constexpr",
    "BLOCK_N": "constexpr",
    "BLOCK_K": "constexpr",
}


def _matmul(bm: int, bn: int, bk: int, num_warps: int, num_stages: int) -> Spec:
    return Spec(
        f"matmul_{bm}x{bn}x{bk}",
        "kernels.matmul",
        "matmul_kernel",
        _MM_SIG,
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
        # pointers aligned; M, N, K and the leading strides divisible by 16
        _div(0, 1, 2, 3, 4, 5, 6, 8, 10),
        {"num_warps": num_warps, "num_stages": num_stages},
    )


SPECS: dict[str, Spec] = {
    s.name: s
    for s in [
        Spec(
            "add",
            "kernels.elementwise",
            "add_kernel",
            {**_PTR3, "n_elements": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024},
            _div(0, 1, 2),
        ),
        Spec(
            "row_sum",
            "kernels.reduction",
            "row_sum_kernel",
            {
                "x_ptr": "*fp32",
                "out_ptr": "*fp32",
                "row_stride": "i32",
                "n_cols": "i32",
                "BLOCK": "constexpr",
            },
            {"BLOCK": 1024},
            _div(0, 1, 2),
        ),
        _matmul(64, 64, 32, 4, 3),
        _matmul(128, 64, 32, 4, 4),
        _matmul(64, 128, 64, 8, 3),
        Spec(
            "helper",
            "kernels.helper",
            "fused_kernel",
            {
                "x_ptr": "*fp32",
                "out_ptr": "*fp32",
                "scale": "fp32",
                "n_elements": "i32",
                "BLOCK": "constexpr",
            },
            {"BLOCK": 512},
            _div(0, 1),
        ),
        *(
            Spec(
                f"act_{act}",
                "kernels.branches",
                "activation_kernel",
                {
                    "x_ptr": "*fp32",
                    "out_ptr": "*fp32",
                    "n_elements": "i32",
                    "ACT": "constexpr",
                    "BLOCK": "constexpr",
                },
                {"ACT": act, "BLOCK": 256},
                _div(0, 1),
            )
            for act in ("relu", "sigmoid")
        ),
        *(
            Spec(
                f"copy_{tag}",
                "kernels.divisibility",
                "copy_rows_kernel",
                {
                    "src_ptr": "*fp16",
                    "dst_ptr": "*fp16",
                    "src_stride": "i32",
                    "dst_stride": "i32",
                    "n_cols": "i32",
                    "BLOCK": "constexpr",
                },
                {"BLOCK": 1024},
                _div(*idx),
            )
            for tag, idx in (("div16", (0, 1, 2, 3, 4)), ("nodiv", (0, 1)))
        ),
    ]
}

#: One of each kind of kernel (the set the benchmarks and the single-flight test use).
KINDS = ["add", "row_sum", "matmul_64x64x32", "helper", "act_relu", "copy_div16"]


def load_module(spec: Spec, module_file: str | None = None) -> ModuleType:
    """The spec's module, or (for edited copies) the same module loaded from ``module_file``."""
    if module_file is None:
        return importlib.import_module(spec.module)
    name = f"_kcache_test_copy_{abs(hash(module_file))}"
    if name in sys.modules:
        return sys.modules[name]
    mspec = importlib.util.spec_from_file_location(name, module_file)
    assert mspec is not None and mspec.loader is not None
    mod = importlib.util.module_from_spec(mspec)
    sys.modules[name] = mod
    mspec.loader.exec_module(mod)
    return mod


def compile_spec(
    spec: Spec,
    *,
    arch: int | str = 90,
    options: dict[str, Any] | None = None,
    module_file: str | None = None,
    backend: str = "cuda",
) -> Any:
    """``triton.compile`` of one spec for ``<backend>:<arch>`` (``cuda:90``, ``hip:gfx942``; no GPU
    needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(load_module(spec, module_file), spec.fn)
    src = ASTSource(fn, dict(spec.signature), dict(spec.constexprs), dict(spec.attrs))
    opts = {**spec.options, **(options or {})}
    target = GPUTarget(backend, arch, 64 if backend == "hip" else 32)
    return triton.compile(src, target=target, options=opts or None)
