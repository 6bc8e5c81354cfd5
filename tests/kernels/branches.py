"""Constexpr-dependent branches: the activation is chosen at compile time."""

import triton
import triton.language as tl


@triton.jit
def activation_kernel(x_ptr, out_ptr, n_elements, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)
    if ACT == "relu":
        y = tl.maximum(x, 0.0)
    elif ACT == "sigmoid":
        y = 1.0 / (1.0 + tl.exp(-x))
    else:
        y = x
    tl.store(out_ptr + offs, y, mask=mask)
