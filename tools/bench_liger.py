#!/usr/bin/env python3
"""A Triton-only program's first calls: kcache's warm store against Triton's own warm cache.

    python3 tools/bench_liger.py [--budget S] [--pairs N] [--device cuda|cpu] [--out FILE]

The program is liger-kernel-like: seven Triton kernels of the kinds a training step's fused
layers use, three of them under ``@triton.autotune``: RMSNorm, SwiGLU, a cross-entropy loss over
a 32,000-word vocabulary (online softmax), rotary embeddings, and autotuned LayerNorm, GeGLU and
an fp16 matmul (``tl.dot``). Every process is fresh; its clock starts before ``import torch``:

- ``triton-cold`` / ``kcache-cold``: one each, to fill Triton's folder / kcache's store;
- then ``--pairs`` pairs (order alternating): ``triton-warm``, Triton alone on the folder the cold
  run filled (``TRITON_CACHE_AUTOTUNING=1``: Triton keeps its autotune results too), and
  ``kcache-warm``, ``KCACHE=1`` on the store with a NEW empty Triton folder (a new node, a new
  container: only kcache's store carries over).

Per process: each kernel's first call (launch and synchronize; on ``--device cpu`` the JIT's
``warmup``, which compiles without launching, through kcache's stand-in driver for ``sm_90``),
their sum (``first calls``, the figure of the target), the time from ``import torch`` to the last
first result, the whole process (spawn to exit), Triton's compile verdicts, the autotuner's
benchmark runs, and on the GPU each output's largest difference from torch.

Target (issue 33): ``kcache-warm`` first calls at most 0.3x ``triton-warm`` (the median of each
over the pairs). Writes ``$OUT/bench_liger.json`` (or ``--out``) and prints the ratio.

On the GPU machine: ``bash tools/gpu_setup.sh && python3 tools/bench_liger.py --budget 240``
(kcache installed there by the set-up, so that ``KCACHE=1`` loads it as it does for users).
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # a child's clock starts here, before torch

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
_CHILD = __name__ == "__main__" and "--child" in sys.argv

if _CHILD:
    import torch

    T_TORCH = time.perf_counter()
    import triton
    import triton.language as tl

    @triton.jit
    def rms_norm_fwd(Y, X, W, RSTD, stride, n_cols, eps, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        tl.store(RSTD + row, rstd)
        tl.store(Y + row * stride + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)

    @triton.jit
    def swiglu_fwd(A, B, C, stride, n_cols, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        a = tl.load(A + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(C + row * stride + cols, (a * tl.sigmoid(a) * b).to(C.dtype.element_ty), mask=mask)

    @triton.jit
    def cross_entropy_fwd(X, Y, LOSS, stride, n_cols, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0)
        label = tl.load(Y + row)
        m = float("-inf")
        d = 0.0
        for off in range(0, n_cols, BLOCK_SIZE):
            cols = off + tl.arange(0, BLOCK_SIZE)
            x = tl.load(X + row * stride + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        x_label = tl.load(X + row * stride + label).to(tl.float32)
        tl.store(LOSS + row, tl.log(d) + m - x_label)

    @triton.jit
    def rope_fwd(Q, COS, SIN, row_stride, n_heads, HEAD_DIM: tl.constexpr):
        row = tl.program_id(0)
        half: tl.constexpr = HEAD_DIM // 2
        offs = tl.arange(0, half)
        cos = tl.load(COS + row * half + offs).to(tl.float32)
        sin = tl.load(SIN + row * half + offs).to(tl.float32)
        for h in range(n_heads):
            base = Q + row * row_stride + h * HEAD_DIM
            x1 = tl.load(base + offs).to(tl.float32)
            x2 = tl.load(base + half + offs).to(tl.float32)
            tl.store(base + offs, (x1 * cos - x2 * sin).to(Q.dtype.element_ty))
            tl.store(base + half + offs, (x2 * cos + x1 * sin).to(Q.dtype.element_ty))

    WARPS = [triton.Config({}, num_warps=w) for w in (4, 8, 16)]

    @triton.autotune(configs=WARPS, key=["n_cols"])
    @triton.jit
    def layer_norm_fwd(Y, X, W, B, stride, n_cols, eps, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + row * stride + cols, (xc * rstd * w + b).to(Y.dtype.element_ty), mask=mask)

    @triton.autotune(configs=WARPS[:2], key=["n_cols"])
    @triton.jit
    def geglu_fwd(A, B, C, stride, n_cols, BLOCK_SIZE: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        a = tl.load(A + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(B + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        z = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        gelu = 0.5 * a * (2.0 * tl.sigmoid(2.0 * z))  # 0.5 a (1 + tanh z)
        tl.store(C + row * stride + cols, (gelu * b).to(C.dtype.element_ty), mask=mask)

    MM = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for m, n, k, w, s in ((64, 64, 32, 4, 3), (128, 128, 32, 8, 3))
    ]

    @triton.autotune(configs=MM, key=["M", "N", "K"])
    @triton.jit
    def matmul(A, B, C, M, N, K, sam, sak, sbk, sbn, scm, scn,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = A + offs_m[:, None] * sam + offs_k[None, :] * sak
        b_ptrs = B + offs_k[:, None] * sbk + offs_n[None, :] * sbn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * sak
            b_ptrs += BLOCK_K * sbk
        c_ptrs = C + offs_m[:, None] * scm + offs_n[None, :] * scn
        tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


ROWS, COLS, VOCAB, TOKENS, HEADS, HEAD_DIM, MNK = 2048, 4096, 32000, 2048, 16, 128, 1024


def _calls(dev: str) -> list[tuple[str, Any, Any]]:
    """(name, call, check): each kernel's first call with its inputs, and a check against torch
    (GPU only) that gives the largest difference."""
    f16, f32 = torch.float16, torch.float32
    meta = dev == "meta"

    def t(*shape: int, dtype: Any = f16) -> Any:
        return (
            torch.empty(shape, dtype=dtype, device=dev)
            if meta
            else torch.randn(shape, dtype=dtype, device=dev)
        )

    x, w, b = t(ROWS, COLS), t(COLS), t(COLS)
    y, y2, rstd = t(ROWS, COLS), t(ROWS, COLS), t(ROWS, dtype=f32)
    a, g, c, c2 = t(ROWS, COLS), t(ROWS, COLS), t(ROWS, COLS), t(ROWS, COLS)
    logits, loss = t(TOKENS, VOCAB, dtype=f32), t(TOKENS, dtype=f32)
    labels = (torch.empty if meta else torch.randint)(*((TOKENS,) if meta else (0, VOCAB, (TOKENS,))),
                                                      dtype=torch.int64, device=dev)  # fmt: skip
    q, cos, sin = t(TOKENS, HEADS * HEAD_DIM), t(TOKENS, HEAD_DIM // 2), t(TOKENS, HEAD_DIM // 2)
    q0 = None if meta else q.clone()
    ma, mb, mc = t(MNK, MNK), t(MNK, MNK), t(MNK, MNK)
    blk = triton.next_power_of_2(COLS)

    def go(kernel: Any, grid: Any, *args: Any, **kw: Any) -> Any:
        if meta:
            return lambda: kernel.warmup(*args, grid=grid, **kw)
        return lambda: kernel[grid](*args, **kw)

    def err(got: Any, want: Any) -> float:
        return float((got.float() - want.float()).abs().max())

    def rope_ref() -> Any:
        qq = q0.view(TOKENS, HEADS, HEAD_DIM).float()
        x1, x2 = qq[..., : HEAD_DIM // 2], qq[..., HEAD_DIM // 2 :]
        cc, ss = cos.float()[:, None, :], sin.float()[:, None, :]
        return torch.cat([x1 * cc - x2 * ss, x2 * cc + x1 * ss], dim=-1).view(TOKENS, -1)

    def gelu(v: Any) -> Any:
        return torch.nn.functional.gelu(v.float(), approximate="tanh")

    return [
        ("rms_norm", go(rms_norm_fwd, (ROWS,), y, x, w, rstd, COLS, COLS, 1e-6, BLOCK_SIZE=blk),
         lambda: err(y, (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()))),
        ("swiglu", go(swiglu_fwd, (ROWS,), a, g, c, COLS, COLS, BLOCK_SIZE=blk),
         lambda: err(c, torch.nn.functional.silu(a.float()) * g.float())),
        ("cross_entropy", go(cross_entropy_fwd, (TOKENS,), logits, labels, loss, VOCAB, VOCAB, BLOCK_SIZE=4096),
         lambda: err(loss, torch.nn.functional.cross_entropy(logits, labels, reduction="none"))),
        ("rope", go(rope_fwd, (TOKENS,), q, cos, sin, HEADS * HEAD_DIM, HEADS, HEAD_DIM=HEAD_DIM),
         lambda: err(q, rope_ref())),
        ("layer_norm_autotuned", go(layer_norm_fwd, (ROWS,), y2, x, w, b, COLS, COLS, 1e-5, BLOCK_SIZE=blk),
         lambda: err(y2, torch.nn.functional.layer_norm(x.float(), (COLS,), w.float(), b.float(), 1e-5))),
        ("geglu_autotuned", go(geglu_fwd, (ROWS,), a, g, c2, COLS, COLS, BLOCK_SIZE=blk),
         lambda: err(c2, gelu(a) * g.float())),
        ("matmul_autotuned",
         go(matmul, lambda m: (triton.cdiv(MNK, m["BLOCK_M"]), triton.cdiv(MNK, m["BLOCK_N"])),
            ma, mb, mc, MNK, MNK, MNK, MNK, 1, MNK, 1, MNK, 1),
         lambda: err(mc, ma.float() @ mb.float())),
    ]  # fmt: skip


def child(device: str) -> dict[str, Any]:
    from triton import knobs
    from triton.runtime.autotuner import Autotuner

    verdicts: list[bool] = []
    knobs.compilation.listener = lambda **kw: verdicts.append(bool(kw["cache_hit"]))
    benches = [0]
    real_bench = Autotuner._bench

    def counting_bench(self: Any, *args: Any, **kwargs: Any) -> Any:
        benches[0] += 1
        return real_bench(self, *args, **kwargs)

    Autotuner._bench = counting_bench  # type: ignore[method-assign]
    if device == "cpu":  # no GPU: the JIT compiles for sm_90 through a stand-in driver, no launch
        from kcache.prewarm.triton_aot import install_stand_in

        install_stand_in(90, host_code=bool(shutil.which("gcc") or shutil.which("clang")))
    dev = "meta" if device == "cpu" else "cuda"
    calls = _calls(dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    first: dict[str, float] = {}
    # Python's garbage collector runs where the allocations happen to cross its thresholds: a full
    # collection of the heap import torch leaves (~0.2 s on the CPU box) lands in one kernel's
    # first call, a different one per condition. Counted apart, so that it can be told from work.
    gc_ms = [0.0]
    gc_t = [0.0]

    def gc_clock(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_t[0] = time.perf_counter()
        else:
            gc_ms[0] += 1e3 * (time.perf_counter() - gc_t[0])

    import gc

    gc.callbacks.append(gc_clock)
    for name, call, _check in calls:
        sync()
        t = time.perf_counter()
        call()
        sync()
        first[name] = round(1e3 * (time.perf_counter() - t), 2)
    gc.callbacks.remove(gc_clock)
    out: dict[str, Any] = {
        "first_ms": first,
        "first_total_ms": round(sum(first.values()), 2),
        "gc_ms_in_first_calls": round(gc_ms[0], 1),
        "since_torch_ms": round(1e3 * (time.perf_counter() - T_TORCH), 1),
        "import_torch_ms": round(1e3 * (T_TORCH - T0), 1),
        "compiles": verdicts.count(False),
        "cache_hits": verdicts.count(True),
        "autotune_benchmarks": benches[0],
    }
    if dev == "cuda":
        out["max_abs_err"] = {name: round(check(), 5) for name, _call, check in calls}
    kc = sys.modules.get("kcache")
    if kc is not None and kc.is_enabled():
        out["kcache"] = {k: {n: v for n, v in d.items() if n in ("hits", "misses", "puts")}
                         for k, d in kc.stats()["process"].items() if k.startswith("triton")}  # fmt: skip
    return out


# ------------------------------------------------------------------------------ the parent
def run(name: str, env: dict[str, str], device: str, timeout: float) -> dict[str, Any]:
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, str(HERE), "--child", "--device", device], env=env,
                           capture_output=True, text=True, timeout=max(timeout, 30.0))  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"name": name, "error": "timed out"}
    wall = time.perf_counter() - t
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"name": name, "error": f"rc={p.returncode}: {p.stderr[-1500:]}"}
    res = json.loads(lines[-1])
    if env.get("KCACHE") == "1" and "kcache" not in res:
        res["error"] = "KCACHE=1 but kcache did not load in the child (bash tools/gpu_setup.sh first)"
    return {"name": name, "process_s": round(wall, 3), **res}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for everything")
    ap.add_argument("--pairs", type=int, default=5, help="warm pairs at most (the budget may cut them)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if there is one")
    ap.add_argument("--out", default=None, help="default $OUT/bench_liger.json (else none)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.device)))
        return 0
    device = args.device
    if device is None:
        probe = "import torch; print(torch.cuda.is_available())"
        got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
        device = "cuda" if got == "True" else "cpu"
    deadline = time.monotonic() + args.budget
    work = Path(tempfile.mkdtemp(prefix="bench-liger-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO), base.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    def env(name: str, kcache: bool) -> dict[str, str]:
        e = dict(base, HOME=str(work / name / "home"))
        if kcache:  # a new Triton folder every time: only kcache's store carries over
            e.update(KCACHE="1", KCACHE_DIR=str(work / "store"), TRITON_CACHE_DIR=str(work / name / "triton"))
        else:  # Triton's own folder, filled by triton-cold; its autotune results kept too
            e.update(TRITON_CACHE_DIR=str(work / "triton-own"), TRITON_CACHE_AUTOTUNING="1")
        return e

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": device,
        "python": sys.version.split()[0],
        "runs": [],
    }
    try:
        import triton

        result["triton"] = triton.__version__
        import torch as _torch

        result["torch"] = _torch.__version__
        if device == "cuda":
            result["gpu"] = _torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001 - reported, the children say more
        result["versions_error"] = repr(e)
    left = lambda: deadline - time.monotonic()  # noqa: E731
    for name, k in (("triton-cold", False), ("kcache-cold", True)):
        result["runs"].append(run(name, env(name, k), device, left()))
    for i in range(args.pairs):
        if left() < 20:
            break
        order = [("triton-warm", False), ("kcache-warm", True)]
        for name, k in order if i % 2 == 0 else order[::-1]:
            result["runs"].append(run(f"{name}#{i}", env(f"{name}{i}", k), device, left()))
    summarize(result)
    text = json.dumps(result, indent=1).replace(str(work), "<work>").replace(str(REPO), "<repo>")
    out = (
        Path(args.out)
        if args.out
        else (Path(os.environ["OUT"]) / "bench_liger.json" if os.environ.get("OUT") else None)
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def summarize(result: dict[str, Any]) -> None:
    def med(cond: str, field: str) -> float | None:
        vals = [r[field] for r in result["runs"] if r["name"].startswith(cond + "#") and field in r]
        return round(statistics.median(vals), 3) if vals else None

    s: dict[str, Any] = {}
    for field in ("first_total_ms", "gc_ms_in_first_calls", "since_torch_ms", "process_s"):
        t, k = med("triton-warm", field), med("kcache-warm", field)
        s[field] = {"triton_warm": t, "kcache_warm": k, "ratio": round(k / t, 3) if t and k else None}
    s["pairs"] = len([r for r in result["runs"] if r["name"].startswith("kcache-warm#") and "error" not in r])
    result["summary"] = s
    for r in result["runs"]:
        status = r.get("error") or (
            f"first calls {r['first_total_ms']:.0f} ms (gc {r['gc_ms_in_first_calls']:.0f}), process {r['process_s']:.2f} s, "
            f"compiles {r['compiles']}, autotune benchmarks {r['autotune_benchmarks']}"
        )
        print(f"{r['name']:>16}: {status}")
    f = s["first_total_ms"]
    print(f"first calls, median of {s['pairs']} pairs: kcache warm {f['kcache_warm']} ms / Triton warm "
          f"{f['triton_warm']} ms = {f['ratio']}x (target <= 0.3x); whole process "
          f"{s['process_s']['ratio']}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
