"""A kernel that does not compile (an undefined name): the compile raises after the lookup."""

import triton
import triton.language as tl


@triton.jit
def broken_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, undefined_value)  # noqa: F821
