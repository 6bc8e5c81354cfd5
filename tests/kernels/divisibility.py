"""Integer arguments specialised by divisibility (``tt.divisibility`` 16 on strides)."""

import triton
import triton.language as tl


@triton.jit
def copy_rows_kernel(src_ptr, dst_ptr, src_stride, dst_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(src_ptr + row * src_stride + cols, mask=mask)
    tl.store(dst_ptr + row * dst_stride + cols, x, mask=mask)
