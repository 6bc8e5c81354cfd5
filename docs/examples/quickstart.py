"""kcache's first run: compile a real Triton kernel through kcache, twice, in two processes.

    KCACHE=1 python docs/examples/quickstart.py

No GPU is needed: the kernel is compiled for sm_90 (an H100/H200) with the ptxas inside the
Triton wheel. The first process compiles and stores it; the second finds it in the store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

CHILD = "KCACHE_QUICKSTART_CHILD"


def compile_once() -> None:
    t0 = time.perf_counter()
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import kcache

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    t1 = time.perf_counter()
    kernel = triton.compile(
        ASTSource(fn=add, signature=sig, constexprs={"BLOCK": 1024}), target=GPUTarget("cuda", 90, 32)
    )
    t2 = time.perf_counter()
    counts = kcache.active_store().counts.process_totals().get("triton", {}) if kcache.is_enabled() else {}
    how = (
        "hit (from kcache)"
        if counts.get("hits")
        else "compiled and stored"
        if counts.get("puts")
        else "compiled"
    )
    print(
        f"  {kernel.name}: {len(kernel.asm['cubin'])} byte cubin for sm_90, {how}: "
        f"compile call {1000 * (t2 - t1):.0f} ms, process total {1000 * (t2 - t0):.0f} ms"
    )


def main() -> int:
    if os.environ.get(CHILD):
        compile_once()
        return 0
    if os.environ.get("KCACHE", "") in ("", "0"):
        print("run it with KCACHE=1 to cache (KCACHE=1 python docs/examples/quickstart.py)")
    for i in (1, 2):
        print(f"process {i}:")
        rc = subprocess.call([sys.executable, __file__], env={**os.environ, CHILD: "1"})
        if rc:
            return rc
    print("now try: kcache stats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
