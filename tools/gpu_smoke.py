"""A first look at kcache on the GPU machine: JIT launches through KCACHE=1 in fresh processes.

    python3 tools/gpu_smoke.py        (after tools/gpu_setup.sh)

Prints, per process, what kcache counted and whether results match torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import time, json, os
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter()
import triton, triton.language as tl
import kcache

@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b in (256, 512, 1024, 2048) for w in (4, 8)], key=["n"])
@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0, mask=m)

n = 1 << 20
x = torch.randn(n, device="cuda"); y = torch.randn(n, device="cuda"); o = torch.empty_like(x)
t1 = time.perf_counter()
add[(triton.cdiv(n, 1024),)](x, y, o, n, BLOCK=1024); torch.cuda.synchronize()
t2 = time.perf_counter()
ok_add = bool(torch.allclose(o, x + y))
scale[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, o, n); torch.cuda.synchronize()
t3 = time.perf_counter()
ok_scale = bool(torch.allclose(o, x * 2))
s = kcache.active_store()
print(json.dumps({"enabled": kcache.is_enabled(), "ok": ok_add and ok_scale,
  "import_torch_s": t_torch - t0, "add_first_s": t2 - t1, "autotune_first_s": t3 - t2,
  "counts": s.counts.process_totals() if s else None,
  "gpu": torch.cuda.get_device_name(), "triton": triton.__version__}))
"""


def main() -> int:
    d = tempfile.mkdtemp(prefix="kcache-smoke-")
    env = {
        **os.environ,
        "KCACHE": "1",
        "KCACHE_DIR": os.path.join(d, "store"),
        "TRITON_CACHE_DIR": os.path.join(d, "triton"),
    }
    script = os.path.join(d, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    results = []
    for i in range(2):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300)
        line = (p.stdout.strip().splitlines() or ["{}"])[-1]
        try:
            r = json.loads(line)
        except ValueError:
            r = {"error": p.stdout[-2000:] + p.stderr[-3000:]}
        r["process_s"] = time.perf_counter() - t
        r["stderr_tail"] = p.stderr[-800:]
        results.append(r)
        print(f"process {i + 1}: {json.dumps(r, indent=1)}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_smoke.json"), "w") as f:
            json.dump(results, f, indent=1)
    subprocess.run([sys.executable, "-m", "kcache", "stats", "--dir", env["KCACHE_DIR"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
