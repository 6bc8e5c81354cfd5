"""A kernel that calls a ``@triton.jit`` helper (the tests edit the helper in a copy)."""

import triton
import triton.language as tl


@triton.jit
def scale_shift(x, scale):
    return x * scale + 1.0


@triton.jit
def fused_kernel(x_ptr, out_ptr, scale, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, scale_shift(x, scale), mask=mask)
