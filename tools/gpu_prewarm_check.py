"""kcache prewarm on the GPU machine: stores built without the GPU, and first-call latency per shape.

    PYTHONPATH=<repo>:<diskcache site> python3 tools/gpu_prewarm_check.py

(a) A store prewarmed with ``kcache prewarm docs/examples/prewarm/spec.toml --target cuda:90`` in a
    process that does not see the GPU (``CUDA_VISIBLE_DEVICES=``): a fresh process with the GPU
    then launches the example kernels (add, softmax, the autotuned matmul) with zero compiles and
    zero launcher builds (counted: Triton's compile listener and the store's puts) and correct
    results (checked against torch). The matmul's autotune timings are taken there (they need the
    GPU); its configs come from the store.
(b) A small block built from autotuned Triton kernels (QK^T matmul with 8 configs, a row softmax
    over the sequence, a layer norm) through the shape sequence (1, 64), (8, 256), (8, 256),
    (1, 64), (8, 256), (8, 64), each condition in fresh processes with its own directories:
    no cache; Triton's own cache warm (binaries and autotune results from an identical earlier
    run); kcache warm after ``kcache prewarm`` on the GPU; and the steady state. Per-shape
    first-call latency (the call and a synchronize; imports, CUDA context and inputs are made
    before the clock starts). Targets: with kcache after prewarm, the first call at every shape
    under 50 ms and at least 100x faster than with no cache.

Prints a compact table; writes everything to ``$OUT/gpu_prewarm.json`` when ``OUT`` is set. Every
subprocess has a timeout. Without a GPU it does what it can (the --target prewarms, which check
the spec and the kernels compile for sm_90) and says so, exit 0.

This file is also the module the block's kernels live in (``gpu_prewarm_check:qk_kernel``...):
the prewarm spec and the measured processes import it by that name.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLE = REPO / "docs" / "examples" / "prewarm"
SEQUENCE = [(1, 64), (8, 256), (8, 256), (1, 64), (8, 256), (8, 64)]
HIDDEN = 64
TARGET_MS = 50.0
TARGET_SPEEDUP = 100.0

# ------------------------------------------------------------------------------ the block's kernels
QK_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in (
        (16, 16, 32, 1, 2),
        (32, 32, 32, 2, 2),
        (32, 64, 32, 4, 3),
        (64, 32, 32, 4, 3),
        (64, 64, 32, 4, 3),
        (64, 64, 64, 4, 2),
        (128, 64, 32, 8, 3),
        (64, 128, 32, 8, 3),
    )
]


@triton.autotune(configs=QK_CONFIGS, key=["S", "D"])
@triton.jit
def qk_kernel(
    q_ptr, k_ptr, o_ptr, S, D,
    stride_qb, stride_qs, stride_kb, stride_ks, stride_ob, stride_os, scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(D, BLOCK_K)):
        kk = k0 * BLOCK_K + rk
        q = tl.load(
            q_ptr + b * stride_qb + rm[:, None] * stride_qs + kk[None, :],
            mask=(rm[:, None] < S) & (kk[None, :] < D),
            other=0.0,
        )
        kt = tl.load(
            k_ptr + b * stride_kb + rn[None, :] * stride_ks + kk[:, None],
            mask=(rn[None, :] < S) & (kk[:, None] < D),
            other=0.0,
        )
        acc += tl.dot(q, kt)
    acc = acc * scale
    tl.store(
        o_ptr + b * stride_ob + rm[:, None] * stride_os + rn[None, :],
        acc.to(o_ptr.dtype.element_ty),
        mask=(rm[:, None] < S) & (rn[None, :] < S),
    )


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (1, 2, 4, 8)], key=["n_cols"])
@triton.jit
def softmax_rows(out_ptr, in_ptr, stride_in, stride_out, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * stride_in + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(
        out_ptr + row * stride_out + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask
    )


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (1, 2, 4)], key=["D"])
@triton.jit
def layernorm_rows(out_ptr, x_ptr, w_ptr, b_ptr, stride, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / D
    xc = tl.where(mask, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / D
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    bb = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = xc / tl.sqrt(var + eps) * w + bb
    tl.store(out_ptr + row * stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def block(x: Any, w: Any, b: Any) -> tuple[Any, Any]:
    """softmax(x x^T / sqrt(D)) over the sequence, and layer_norm(x): three autotuned kernels."""
    import torch

    B, S, D = x.shape
    scores = torch.empty((B, S, S), dtype=x.dtype, device=x.device)
    qk_kernel[lambda meta: (triton.cdiv(S, meta["BLOCK_M"]), triton.cdiv(S, meta["BLOCK_N"]), B)](
        x, x, scores, S, D, x.stride(0), x.stride(1), x.stride(0), x.stride(1),
        scores.stride(0), scores.stride(1), 1.0 / math.sqrt(D),
    )  # fmt: skip
    probs = torch.empty_like(scores)
    softmax_rows[(B * S,)](probs, scores, S, S, S, BLOCK=triton.next_power_of_2(S))
    y = torch.empty_like(x)
    layernorm_rows[(B * S,)](y, x, w, b, D, D, 1e-5, BLOCK=triton.next_power_of_2(D))
    return probs, y


def reference(x: Any, w: Any, b: Any) -> tuple[Any, Any]:
    import torch

    xf = x.float()
    s = xf @ xf.transpose(1, 2) / math.sqrt(x.shape[-1])
    return torch.softmax(s, dim=-1), torch.nn.functional.layer_norm(
        xf, (x.shape[-1],), w.float(), b.float(), 1e-5
    )


BLOCK_SPEC = """
# The block of tools/gpu_prewarm_check.py at the shapes of its sequence.
version = 1
[env]

[[triton]]
kernel = "gpu_prewarm_check:qk_kernel"
grid = ["=cdiv(S, BLOCK_M)", "=cdiv(S, BLOCK_N)", "=B"]
sizes = [{ B = 1, S = 64 }, { B = 8, S = 256 }, { B = 8, S = 64 }]
[triton.args]
q_ptr = { tensor = "float16", shape = ["=B", "=S", 64] }
k_ptr = { tensor = "float16", shape = ["=B", "=S", 64] }
o_ptr = { tensor = "float16", shape = ["=B", "=S", "=S"] }
S = "=S"
D = 64
stride_qb = "=S * 64"
stride_qs = 64
stride_kb = "=S * 64"
stride_ks = 64
stride_ob = "=S * S"
stride_os = "=S"
scale = 0.125

[[triton]]
kernel = "gpu_prewarm_check:softmax_rows"
grid = ["=B * S"]
sizes = [{ B = 1, S = 64 }, { B = 8, S = 256 }, { B = 8, S = 64 }]
[triton.args]
out_ptr = { tensor = "float16", shape = ["=B", "=S", "=S"] }
in_ptr = { tensor = "float16", shape = ["=B", "=S", "=S"] }
stride_in = "=S"
stride_out = "=S"
n_cols = "=S"
BLOCK = "=next_power_of_2(S)"

[[triton]]
kernel = "gpu_prewarm_check:layernorm_rows"
grid = ["=B * S"]
sizes = [{ B = 1, S = 64 }, { B = 8, S = 256 }, { B = 8, S = 64 }]
[triton.args]
out_ptr = { tensor = "float16", shape = ["=B", "=S", 64] }
x_ptr = { tensor = "float16", shape = ["=B", "=S", 64] }
w_ptr = { tensor = "float16", shape = [64] }
b_ptr = { tensor = "float16", shape = [64] }
stride = 64
D = 64
eps = 1e-05
BLOCK = 64
"""


# ------------------------------------------------------------------------------ child processes
def _counting() -> dict[str, Any]:
    """Count compiles (Triton's listener) and autotune benchmark runs in this process."""
    from triton import knobs
    from triton.runtime import autotuner

    c: dict[str, Any] = {"compiled": [], "cache_hits": 0, "bench_runs": 0}

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        if cache_hit:
            c["cache_hits"] += 1
        else:
            c["compiled"].append(str(getattr(src, "name", "?")))

    knobs.compilation.listener = listener
    orig = autotuner.Autotuner._bench

    def _bench(self: Any, *a: Any, **k: Any) -> Any:
        c["bench_runs"] += 1
        return orig(self, *a, **k)

    autotuner.Autotuner._bench = _bench
    return c


def _store_counts() -> dict[str, Any]:
    try:
        import kcache

        if not kcache.is_enabled():
            return {}
        return kcache.stats()["process"]
    except Exception as e:
        return {"error": str(e)}


def child_block(out: str) -> None:
    """One measured process of (b): the shape sequence, then the steady state and a check."""
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    c = _counting()
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.float16)
    b = torch.randn(HIDDEN, device="cuda", dtype=torch.float16)
    inputs = [torch.randn((bb, s, HIDDEN), device="cuda", dtype=torch.float16) for bb, s in SEQUENCE]
    torch.cuda.synchronize()
    first: list[float] = []
    profile = None
    for i, x in enumerate(inputs):
        prof = None
        if i == 0 and os.environ.get("GPU_PREWARM_PROFILE"):
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        block(x, w, b)
        torch.cuda.synchronize()
        first.append((time.perf_counter() - t0) * 1e3)
        if prof is not None:
            import io
            import pstats

            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
            profile = buf.getvalue()[-6000:]
    steady: dict[str, float] = {}
    ok = True
    for bb, s in dict.fromkeys(SEQUENCE):
        x = torch.randn((bb, s, HIDDEN), device="cuda", dtype=torch.float16)
        ts = []
        for _ in range(20):
            t0 = time.perf_counter()
            p, y = block(x, w, b)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        steady[f"{bb}x{s}"] = statistics.median(ts)
        rp, ry = reference(x, w, b)
        ok = ok and torch.allclose(p.float(), rp, atol=2e-2, rtol=2e-2)
        ok = ok and torch.allclose(y.float(), ry, atol=5e-2, rtol=5e-2)
    Path(out).write_text(
        json.dumps(
            {
                "first_ms": first,
                "steady_ms": steady,
                "correct": bool(ok),
                "compiled": c["compiled"],
                "cache_hits": c["cache_hits"],
                "bench_runs": c["bench_runs"],
                "store": _store_counts(),
                "profile_first_call": profile,
            }
        )
    )


def child_example(out: str) -> None:
    """(a): the example kernels on the GPU, from a store built without it; results checked."""
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    c = _counting()
    import kernels  # docs/examples/prewarm

    checks = {}
    for n in (1048576, 4194304):
        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        checks[f"add {n}"] = bool(torch.allclose(kernels.add(x, y), x + y))
    for cols in (64, 1000):
        x = torch.randn((8, cols), device="cuda", dtype=torch.float16)
        ref = torch.softmax(x.float(), dim=-1)
        checks[f"softmax 8x{cols}"] = bool(
            torch.allclose(kernels.softmax(x).float(), ref, atol=1e-3, rtol=1e-2)
        )
    for m, n, k in ((256, 256, 256), (512, 512, 128)):
        a = torch.randn((m, k), device="cuda", dtype=torch.float16)
        bm = torch.randn((k, n), device="cuda", dtype=torch.float16)
        ref = a.float() @ bm.float()
        checks[f"matmul {m}x{n}x{k}"] = bool(
            torch.allclose(kernels.matmul(a, bm).float(), ref, atol=0.5, rtol=2e-2)
        )
    torch.cuda.synchronize()
    Path(out).write_text(
        json.dumps(
            {
                "checks": checks,
                "compiled": c["compiled"],
                "cache_hits": c["cache_hits"],
                "bench_runs": c["bench_runs"],
                "store": _store_counts(),
            }
        )
    )


# ------------------------------------------------------------------------------ the driver
class Runner:
    def __init__(self, base: Path, env: dict[str, str], deadline: float) -> None:
        self.base = base
        self.env = env
        self.deadline = deadline
        self.log: list[dict[str, Any]] = []

    def run(
        self, name: str, cmd: list[str], env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        left = self.deadline - time.monotonic()
        timeout = max(10.0, min(timeout, left))
        t0 = time.monotonic()
        try:
            p = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(self.base)
            )
        except subprocess.TimeoutExpired as e:
            self.log.append({"step": name, "rc": "timeout", "seconds": round(time.monotonic() - t0, 1)})
            raise RuntimeError(f"{name}: timed out after {timeout:.0f} s") from e
        self.log.append({"step": name, "rc": p.returncode, "seconds": round(time.monotonic() - t0, 1)})
        if p.returncode not in (0,):
            tail = (p.stderr or "")[-2500:]
            raise RuntimeError(f"{name}: exit {p.returncode}\n{tail}")
        return p

    def child(
        self, name: str, func: str, env: dict[str, str], *, kcache_dir: Path | None, timeout: float
    ) -> dict:
        out = self.base / f"{name}.json"
        pre = f"import kcache; assert kcache.enable(dir={str(kcache_dir)!r}); " if kcache_dir else ""
        code = f"{pre}import gpu_prewarm_check as m; m.{func}({str(out)!r})"
        self.run(name, [sys.executable, "-c", code], env, timeout)
        return json.loads(out.read_text())

    def prewarm(
        self, name: str, spec: Path, store: Path, env: dict[str, str], *args: str, timeout: float
    ) -> dict:
        cmd = [
            sys.executable,
            "-m",
            "kcache",
            "prewarm",
            str(spec),
            "--dir",
            str(store),
            "--json",
            "--no-progress",
        ]
        p = self.run(name, cmd + list(args), env, timeout)
        return json.loads(p.stdout)


def base_env(paths: list[Path], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    pp = [str(p) for p in paths] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pp))
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=330.0, help="seconds for everything (default 330)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    t_start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="kcache-gpu-prewarm-"))
    r = Runner(work, {}, t_start + args.budget)
    paths = [REPO, HERE, EXAMPLE]
    result: dict[str, Any] = {"gpu": None, "python": sys.version.split()[0], "triton": triton.__version__}
    gpu = gpu_present()
    if gpu:
        import torch

        result["gpu"] = torch.cuda.get_device_name(0)
        result["torch"] = torch.__version__
    problems: list[str] = []
    try:
        # (a) --target cuda:90 with the GPU hidden, then the GPU process
        env_hidden = base_env(paths, CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(work / "tc-a"))
        store_a = work / "store-a"
        s = r.prewarm("a-prewarm-target", EXAMPLE / "spec.toml", store_a, env_hidden, "--target", "cuda:90",
                      timeout=240)  # fmt: skip
        a: dict[str, Any] = {"prewarm": {"totals": s["totals"], "seconds": s["seconds"], "host_code": s["host_code"],
                                          "not_prepared": s["not_prepared"]}}  # fmt: skip
        print(
            f"(a) prewarm --target cuda:90, GPU hidden: {s['totals']['kernel_compiles']} kernels compiled, "
            f"{s['totals']['launcher_builds']} launchers built, {s['totals']['failed']} failed, {s['seconds']:.1f} s"
        )
        if gpu:
            env_gpu = base_env(paths, TRITON_CACHE_DIR=str(work / "tc-a2"))
            g = r.child("a-gpu", "child_example", env_gpu, kcache_dir=store_a, timeout=180)
            st = g["store"]
            puts = {k: int(v.get("puts", 0)) for k, v in st.items() if isinstance(v, dict)}
            a["gpu_process"] = {**g, "puts": puts}
            ok = all(g["checks"].values())
            zero = not g["compiled"] and puts.get("triton", 0) == 0 and puts.get("triton-aux", 0) == 0
            print(
                f"    GPU process: {len(g['compiled'])} compiles, {puts.get('triton', 0)} kernel puts, "
                f"{puts.get('triton-aux', 0)} launcher builds, {g['cache_hits']} kernels from the store, "
                f"{g['bench_runs']} autotune timings (need the GPU), results {'ok' if ok else 'WRONG'}"
            )
            if not ok:
                problems.append(f"(a) wrong results: {g['checks']}")
            if not zero:
                problems.append(f"(a) the GPU process compiled: {g['compiled']} puts {puts}")
        result["a"] = a

        spec_b = work / "block.toml"
        spec_b.write_text(BLOCK_SPEC)
        if not gpu:
            s = r.prewarm("b-prewarm-target", spec_b, work / "store-b-cpu", env_hidden, "--target", "cuda:90",
                          timeout=240)  # fmt: skip
            result["b_cpu"] = {"totals": s["totals"], "seconds": s["seconds"]}
            print(
                f"(b) the block's spec prewarmed for cuda:90: {s['totals']['kernel_compiles']} kernels compiled, "
                f"{s['totals']['failed']} failed, {s['seconds']:.1f} s"
            )
            print(
                "no GPU here: launches and latencies (a: GPU process, b: the shape sequence) need the H200; done."
            )
            result["skipped"] = "no GPU"
            return _finish(result, r, work, args.keep, problems, ok_exit=True)

        # (b) first-call latency per shape, each condition in fresh processes and directories
        conds: dict[str, dict[str, Any]] = {}
        conds["no cache"] = r.child(
            "b-nocache", "child_block", base_env(paths, TRITON_CACHE_DIR=str(work / "tc-none")),
            kcache_dir=None, timeout=240,
        )  # fmt: skip
        env_tw = base_env(paths, TRITON_CACHE_DIR=str(work / "tc-warm"), TRITON_CACHE_AUTOTUNING="1")
        r.child("b-triton-populate", "child_block", env_tw, kcache_dir=None, timeout=240)
        conds["triton warm"] = r.child("b-triton-warm", "child_block", env_tw, kcache_dir=None, timeout=120)
        store_b = work / "store-b"
        env_k = base_env(paths, TRITON_CACHE_DIR=str(work / "tc-k"))
        s = r.prewarm("b-prewarm-gpu", spec_b, store_b, env_k, timeout=240)
        result["b_prewarm"] = {"totals": s["totals"], "seconds": s["seconds"], "failed": [
            i for i in s["items"] if i["status"] == "failed"]}  # fmt: skip
        conds["kcache prewarmed"] = r.child("b-kcache", "child_block", env_k, kcache_dir=store_b, timeout=120)
        result["b"] = conds
        shapes = [f"({bb}, {s})" for bb, s in SEQUENCE]
        print(
            f"(b) kcache prewarm on the GPU: {s['totals']['items']} items, {s['totals']['kernel_compiles']} compiles, "
            f"{s['totals']['autotune_results']} autotune results, {s['totals']['failed']} failed, {s['seconds']:.1f} s"
        )
        print("    first call per shape (ms), fresh process per condition:")
        cols = ["no cache", "triton warm", "kcache prewarmed"]
        print("    " + f"{'shape':<10}" + "".join(f"{c:>18}" for c in cols) + f"{'steady':>10}")
        k = conds["kcache prewarmed"]
        for i, shape in enumerate(shapes):
            row = "".join(f"{fmt_ms(conds[c]['first_ms'][i]):>18}" for c in cols)
            bb, ss = SEQUENCE[i]
            print(f"    {shape:<10}{row}{fmt_ms(k['steady_ms'][f'{bb}x{ss}']):>10}")
        worst = max(k["first_ms"])
        speedups = [n / max(kk, 1e-6) for n, kk in zip(conds["no cache"]["first_ms"], k["first_ms"])]
        new_shapes = [i for i, sh in enumerate(SEQUENCE) if sh not in SEQUENCE[:i]]
        min_speedup_new = min(speedups[i] for i in new_shapes)
        result["targets"] = {
            "kcache_worst_first_call_ms": worst,
            "under_50ms_every_shape": worst < TARGET_MS,
            "speedup_vs_no_cache_new_shapes_min": min_speedup_new,
            "speedup_vs_no_cache_each": speedups,
            "at_least_100x_new_shapes": min_speedup_new >= TARGET_SPEEDUP,
            "kcache_process_compiles": k["compiled"],
            "kcache_process_bench_runs": k["bench_runs"],
            "all_correct": all(c["correct"] for c in conds.values()),
        }
        print(
            f"    targets: kcache first call under {TARGET_MS:.0f} ms at every shape: "
            f"{'yes' if worst < TARGET_MS else 'NO'} (worst {worst:.1f} ms); at least {TARGET_SPEEDUP:.0f}x "
            f"faster than no cache at each new shape: {'yes' if min_speedup_new >= TARGET_SPEEDUP else 'NO'} "
            f"(min {min_speedup_new:.0f}x); kcache process: {len(k['compiled'])} compiles, "
            f"{k['bench_runs']} autotune timings; results {'ok' if result['targets']['all_correct'] else 'WRONG'}"
        )
        if worst >= TARGET_MS:
            problems.append(f"(b) kcache first call {worst:.1f} ms >= {TARGET_MS} ms")
            if r.deadline - time.monotonic() > 60:  # where the time goes (profiled, so slower)
                env_p = dict(env_k, GPU_PREWARM_PROFILE="1")
                prof = r.child("b-kcache-profiled", "child_block", env_p, kcache_dir=store_b, timeout=90)
                result["kcache_first_call_profile"] = prof.get("profile_first_call")
                print("    (a cProfile of the first kcache call is in the JSON: kcache_first_call_profile)")
        if min_speedup_new < TARGET_SPEEDUP:
            problems.append(f"(b) speedup {min_speedup_new:.0f}x < {TARGET_SPEEDUP}x")
        if not result["targets"]["all_correct"]:
            problems.append("(b) wrong results")
    except Exception as e:
        problems.append(str(e))
        print(f"error: {e}", file=sys.stderr)
    return _finish(result, r, work, args.keep, problems, ok_exit=False)


def _finish(
    result: dict[str, Any], r: Runner, work: Path, keep: bool, problems: list[str], ok_exit: bool
) -> int:
    result["steps"] = r.log
    result["problems"] = problems
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_prewarm.json").write_text(json.dumps(result, indent=1, default=str))
    if problems:
        print("problems:\n" + textwrap.indent("\n".join(problems), "  "))
    if keep:
        print(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if (ok_exit or not problems) else 1


if __name__ == "__main__":
    sys.exit(main())
