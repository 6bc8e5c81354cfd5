#!/usr/bin/env python3
"""Triton through kcache on the GPU machine: first results, autotuning and torch.compile.

    PYTHONPATH=<repo>:<diskcache site> python3 tools/gpu_triton_check.py [--warm-repeats 3]

Everything measured runs in fresh processes (this file, ``--worker ...``), each with a timeout;
a failure is reported in the table and the JSON, never raised.

(a) Four kernels: vector add, fused softmax, layer norm, and a matmul under ``@triton.autotune``
    with 8 configs, each checked against torch. Conditions, each its own cache folder:
    ``triton cold`` / ``triton warm`` (Triton's own cache, ``TRITON_CACHE_AUTOTUNING=1`` so that
    it keeps autotune results too) and ``kcache cold`` / ``kcache warm`` (``KCACHE=1``; Triton's
    folder fresh and empty every time). Per process: each kernel's first call (call and
    synchronize), the time to the first result from the process's start (spawn), from before
    ``import torch`` and from after it; the autotuner's benchmark calls (``Autotuner._bench``
    wrapped and counted); compiles (Triton's compilation listener); and, at the end, what Triton's
    own ``triton_key()`` costs there (computed afresh). Warm conditions: the median of
    ``--warm-repeats`` processes.
(b) A small ``torch.compile``d function (pointwise and reductions: Triton kernels), with
    ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` fresh for every process, in two variants:
    Inductor's defaults (FX graph cache on) and ``TORCHINDUCTOR_FX_GRAPH_CACHE=0``. Two processes
    per variant on one store; counted: kcache entries of kind ``triton`` before and after each
    process (read from the store's files), and Triton's compile verdicts in every process,
    Inductor's compile workers included (a listener writes them to files: forked workers end
    with ``os._exit`` and never flush counters).

Targets: kcache warm no slower than Triton warm for every kernel; time to the first kernel after
``import torch`` shorter than Triton warm's by at least 80% of the ``triton_key`` cost measured
in the same run; the autotuned matmul's warm first call under 1% of its cold one; in the warm
kcache process the autotuner benchmarks nothing; the second torch.compile process compiles no
Triton kernel.

kcache is turned on in the worker processes by its ``.pth`` hook when it is installed, otherwise
by a ``sitecustomize`` shim put on ``PYTHONPATH`` (Inductor passes ``sys.path`` on to its
workers). Prints a compact table at the end; writes everything to ``$OUT/gpu_triton.json`` when
``OUT`` is set. Without a GPU it says so (``no GPU``), compiles the four kernels for ``cuda:90``
in the four conditions to check the flow, skips launches, autotuning and Inductor, and exits 0.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()  # a worker's clock starts here, before torch is imported

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
KERNELS = ["vector_add", "softmax", "layer_norm", "matmul_autotuned"]
PROC_TIMEOUT_S = 180  # one process at most this long, and never past HARD_LIMIT_S
BUDGET_S = 190  # start no new measurement after this
HARD_LIMIT_S = 235  # the whole run stays under ~4 minutes

_WORKER = __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "--worker"
_KERNEL_WORKER = _WORKER and sys.argv[2] == "kernels"

# ----------------------------------------------------------------------------------------------
# The kernels (defined only in kernel workers: the orchestrator imports neither torch nor triton)
# ----------------------------------------------------------------------------------------------
if _KERNEL_WORKER:
    import torch

    T_TORCH = time.perf_counter()
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask
        )

    @triton.jit
    def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)

    @triton.jit
    def layer_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        xc = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask)
        b = tl.load(b_ptr + cols, mask=mask)
        tl.store(y_ptr + row * stride + cols, (xc * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)

    MM_CONFIGS = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in (
            (64, 64, 32, 4, 3),
            (64, 128, 32, 4, 3),
            (128, 64, 32, 4, 3),
            (128, 128, 32, 8, 3),
            (64, 64, 64, 4, 4),
            (128, 128, 64, 8, 3),
            (64, 256, 32, 8, 3),
            (128, 256, 64, 8, 3),
        )
    ]

    @triton.autotune(configs=MM_CONFIGS, key=["M", "N", "K"])
    @triton.jit
    def matmul_kernel(
        a_ptr,
        b_ptr,
        c_ptr,
        M,
        N,
        K,
        stride_am,
        stride_ak,
        stride_bk,
        stride_bn,
        stride_cm,
        stride_cn,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# ----------------------------------------------------------------------------------------------
# Workers
# ----------------------------------------------------------------------------------------------
def _counts() -> dict[str, Any]:
    try:
        import kcache

        if not kcache.is_enabled():
            return {"enabled": False}
        return {"enabled": True, **kcache.stats()["process"]}
    except Exception as e:
        return {"error": repr(e)}


def _own_triton_key_cost() -> float:
    """What Triton's own triton_key() costs here, computed afresh (the memo bypassed)."""
    import importlib

    cache_mod = importlib.import_module("triton.runtime.cache")
    if not hasattr(cache_mod, "triton_key"):  # Triton 3.4
        cache_mod = importlib.import_module("triton.compiler.compiler")
    own: Any = None
    if "kcache" in sys.modules:  # the memo runs inside Triton's function: kcache gives Triton's own
        from kcache.triton import keymemo

        if keymemo.installed():
            own = keymemo.own_key
    if own is None:
        own = getattr(cache_mod.triton_key, "__wrapped__", cache_mod.triton_key)
    t = time.perf_counter()
    own()
    return time.perf_counter() - t


def kernel_worker(out_path: str, gpu: bool) -> None:
    from triton import knobs

    verdicts: list[bool] = []

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        verdicts.append(bool(cache_hit))

    knobs.compilation.listener = listener
    from triton.runtime.autotuner import Autotuner

    benches = [0]
    real_bench = Autotuner._bench

    def counting_bench(self: Any, *args: Any, **kwargs: Any) -> Any:
        benches[0] += 1
        return real_bench(self, *args, **kwargs)

    Autotuner._bench = counting_bench  # type: ignore[method-assign]
    spawn_t = float(os.environ.get("KC_SPAWN_T", "nan"))
    out: dict[str, Any] = {"gpu": gpu, "t_torch_import": T_TORCH - T0, "kernels": {}}
    first_done = None
    if gpu:
        dev = "cuda"
        x = torch.randn(1 << 20, device=dev)
        y = torch.randn(1 << 20, device=dev)
        s_in = torch.randn(4096, 1000, device=dev)
        ln_x = torch.randn(4096, 1024, device=dev, dtype=torch.float16)
        ln_w = torch.randn(1024, device=dev, dtype=torch.float16)
        ln_b = torch.randn(1024, device=dev, dtype=torch.float16)
        a = torch.randn(1024, 1024, device=dev, dtype=torch.float16)
        b = torch.randn(1024, 1024, device=dev, dtype=torch.float16)
        torch.cuda.synchronize()

        def vector_add() -> tuple[Any, Any]:
            o = torch.empty_like(x)
            add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, o, x.numel(), BLOCK=1024)
            return o, x + y

        def softmax() -> tuple[Any, Any]:
            o = torch.empty_like(s_in)
            softmax_kernel[(s_in.shape[0],)](
                o,
                s_in,
                s_in.stride(0),
                o.stride(0),
                s_in.shape[1],
                BLOCK=triton.next_power_of_2(s_in.shape[1]),
            )
            return o, torch.softmax(s_in, dim=-1)

        def layer_norm() -> tuple[Any, Any]:
            o = torch.empty_like(ln_x)
            layer_norm_kernel[(ln_x.shape[0],)](
                ln_x, o, ln_w, ln_b, ln_x.stride(0), ln_x.shape[1], 1e-5, BLOCK=1024
            )
            ref = torch.nn.functional.layer_norm(ln_x.float(), (1024,), ln_w.float(), ln_b.float(), 1e-5)
            return o.float(), ref

        def matmul_autotuned() -> tuple[Any, Any]:
            c = torch.empty(1024, 1024, device=dev, dtype=torch.float16)

            def grid(meta: dict[str, Any]) -> tuple[int, int]:
                return (triton.cdiv(1024, meta["BLOCK_M"]), triton.cdiv(1024, meta["BLOCK_N"]))

            matmul_kernel[grid](a, b, c, 1024, 1024, 1024, *a.stride(), *b.stride(), *c.stride())
            return c.float(), (a.float() @ b.float())

        tol = {"vector_add": 1e-6, "softmax": 1e-5, "layer_norm": 2e-2, "matmul_autotuned": 5e-2}
        for name, fn in (
            ("vector_add", vector_add),
            ("softmax", softmax),
            ("layer_norm", layer_norm),
            ("matmul_autotuned", matmul_autotuned),
        ):
            n_before, b_before = len(verdicts), benches[0]
            t = time.perf_counter()
            try:
                got, ref = fn()
                torch.cuda.synchronize()
                dt = time.perf_counter() - t
                err = float((got - ref).abs().max() / (ref.abs().max() + 1e-6))
                rec = {"first_call_s": dt, "rel_err": err, "ok": err <= tol[name], "error": None}
            except Exception as e:
                rec = {"first_call_s": None, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            if first_done is None:
                first_done = time.perf_counter()
                out["spawn_to_first_s"] = time.time() - spawn_t
                out["start_to_first_s"] = first_done - T0
                out["torch_to_first_s"] = first_done - T_TORCH
            rec["compiled"] = sum(1 for v in verdicts[n_before:] if not v)
            rec["cache_hits"] = sum(1 for v in verdicts[n_before:] if v)
            rec["bench_calls"] = benches[0] - b_before
            out["kernels"][name] = rec
        try:
            out["matmul_best_config"] = str(matmul_kernel.best_config)
        except Exception:
            pass
    else:  # no GPU: compile the same kernels for cuda:90 (Triton's AOT path), launch nothing
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        target = GPUTarget("cuda", 90, 32)
        div = [["tt.divisibility", 16]]
        cfg = MM_CONFIGS[0]
        jobs = {
            "vector_add": (add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024}, {}),
            "softmax": (softmax_kernel, {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_stride": "i32", "out_stride": "i32", "n_cols": "i32", "BLOCK": "constexpr"}, {"BLOCK": 1024}, {}),
            "layer_norm": (layer_norm_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "w_ptr": "*fp16", "b_ptr": "*fp16", "stride": "i32", "n_cols": "i32", "eps": "fp32", "BLOCK": "constexpr"}, {"BLOCK": 1024}, {}),
            "matmul_autotuned": (
                matmul_kernel.fn,
                {**{n: "*fp16" for n in ("a_ptr", "b_ptr", "c_ptr")}, **{n: "i32" for n in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")}, **{n: "constexpr" for n in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}},
                dict(cfg.kwargs),
                {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
            ),
        }  # fmt: skip
        for name, (fn, sig, consts, opts) in jobs.items():
            n_before = len(verdicts)
            t = time.perf_counter()
            try:
                attrs = {(0,): div, (1,): div, (2,): div}
                triton.compile(ASTSource(fn, sig, consts, attrs), target=target, options=opts or None)
                rec = {"first_call_s": time.perf_counter() - t, "ok": True, "error": None}
            except Exception as e:
                rec = {"first_call_s": None, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            if first_done is None:
                first_done = time.perf_counter()
                out["spawn_to_first_s"] = time.time() - spawn_t
                out["start_to_first_s"] = first_done - T0
                out["torch_to_first_s"] = first_done - T_TORCH
            rec["compiled"] = sum(1 for v in verdicts[n_before:] if not v)
            rec["cache_hits"] = sum(1 for v in verdicts[n_before:] if v)
            rec["bench_calls"] = 0
            out["kernels"][name] = rec
    out["compiled_total"] = sum(1 for v in verdicts if not v)
    out["kcache"] = _counts()
    out["triton_key_cost_s"] = _own_triton_key_cost()
    Path(out_path).write_text(json.dumps(out))


def inductor_worker(out_path: str) -> None:
    t0 = time.perf_counter()
    import torch

    t_torch = time.perf_counter()

    def f(x: Any, w: Any) -> Any:
        y = torch.nn.functional.gelu(x * w + 1.0)
        return (
            torch.softmax(y, dim=-1)
            + y.sum(dim=0, keepdim=True) * 1e-3
            + torch.rsqrt(y.var(dim=-1, keepdim=True) + 1e-5)
        )

    x = torch.randn(2048, 1024, device="cuda")
    w = torch.randn(1024, device="cuda")
    out: dict[str, Any] = {"t_torch_import": t_torch - t0}
    t = time.perf_counter()
    try:
        got = torch.compile(f)(x, w)
        torch.cuda.synchronize()
        out["first_call_s"] = time.perf_counter() - t
        ref = f(x, w)
        out["rel_err"] = float((got - ref).abs().max() / ref.abs().max())
        out["ok"] = out["rel_err"] < 1e-3
        out["error"] = None
    except Exception as e:
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {str(e)[:500]}"
    out["kcache_main_process"] = _counts()
    Path(out_path).write_text(json.dumps(out))


# ----------------------------------------------------------------------------------------------
# The orchestrator
# ----------------------------------------------------------------------------------------------
SHIM = '''"""kcache's GPU check: turn kcache on here (its .pth hook when not installed), and write Triton's
compile verdicts to files when asked (forked compile workers end with os._exit: no counters)."""
import os

if os.environ.get("KCACHE", "") not in ("", "0"):
    try:
        import kcache

        if not kcache.is_enabled():
            kcache._enable_from_env()
    except Exception as e:
        import sys

        print(f"kcache shim: {e!r}", file=sys.stderr)

if os.environ.get("KCACHE_GPU_CHECK_EVENTS"):
    try:
        from kcache._imports import when_imported

        def _attach(_mod):
            from triton import knobs

            folder = os.environ["KCACHE_GPU_CHECK_EVENTS"]
            prev = knobs.compilation.listener

            def listener(**kw):
                with open(os.path.join(folder, f"{os.getpid()}.events"), "a") as f:
                    f.write(("hit " if kw.get("cache_hit") else "compiled ") + str(getattr(kw.get("src"), "name", "?")) + "\\n")
                if prev is not None:
                    prev(**kw)

            knobs.compilation.listener = listener

        when_imported("triton", _attach)
    except Exception as e:
        import sys

        print(f"kcache shim (events): {e!r}", file=sys.stderr)
'''


def pth_installed() -> bool:
    """Is kcache's .pth hook in a site folder of this interpreter (a real install)?"""
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    return any(os.path.exists(os.path.join(d, "kcache.pth")) for d in dirs)


def gpu_present() -> tuple[bool, str]:
    try:
        sys.path.insert(0, str(REPO))
        from kcache import fingerprint

        cap = fingerprint.capability()
        if cap is not None:
            return True, f"{fingerprint.current('gpu_name')} (sm_{cap[0]}{cap[1]})"
    except Exception as e:
        return False, f"no CUDA driver ({e!r})"
    return False, "no CUDA GPU found"


class Runner:
    def __init__(self, root: Path, shim_dir: Path, started: float) -> None:
        self.root = root
        self.shim_dir = shim_dir
        self.started = started
        self.failures: list[str] = []

    def base_env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_", "TORCHINDUCTOR_"))
        }
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.shim_dir), str(REPO), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
        env["TRITON_HOME"] = str(self.root / "triton-home")
        env["PYTHONWARNINGS"] = "ignore"
        env.update(extra)
        return env

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > BUDGET_S

    def run(self, label: str, args: list[str], env: dict[str, str]) -> dict[str, Any] | None:
        out = self.root / f"{label}.json"
        env = dict(env, KC_SPAWN_T=repr(time.time()))
        t = time.perf_counter()
        timeout = max(20.0, min(PROC_TIMEOUT_S, HARD_LIMIT_S - (time.monotonic() - self.started)))
        try:
            proc = subprocess.run(
                [sys.executable, str(HERE), "--worker", *args, str(out)],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            self.failures.append(f"{label}: timed out after {timeout:.0f}s")
            return None
        wall = time.perf_counter() - t
        if proc.returncode != 0 or not out.exists():
            self.failures.append(f"{label}: exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
            return None
        r = json.loads(out.read_text())
        r["process_wall_s"] = wall
        r["stderr_tail"] = proc.stderr[-1500:]
        return r


def store_triton_entries(store: Path) -> int:
    """Entries of kind ``triton`` in a store, read from its entry files (not from its index)."""
    from kcache.store.records import RECORD_NAME, Record

    n = 0
    root = store / "entries"
    if root.is_dir():
        for rec in root.glob(f"*/*/{RECORD_NAME}"):
            try:
                if Record.decode(rec.read_bytes()).kind == "triton":
                    n += 1
            except Exception:
                pass
    return n


def read_events(folder: Path) -> dict[str, Any]:
    per_pid: dict[str, dict[str, int]] = {}
    for f in folder.glob("*.events"):
        c = {"hit": 0, "compiled": 0}
        for line in f.read_text().splitlines():
            word = line.split(" ", 1)[0]
            if word in c:
                c[word] += 1
        per_pid[f.stem] = c
    return {
        "processes": len(per_pid),
        "hits": sum(c["hit"] for c in per_pid.values()),
        "compiled": sum(c["compiled"] for c in per_pid.values()),
        "per_process": per_pid,
    }


def median_of(runs: list[dict[str, Any]], getter: Any) -> float | None:
    vals = []
    for r in runs:
        try:
            v = getter(r)
        except (KeyError, TypeError):
            v = None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--warm-repeats", type=int, default=3)
    ap.add_argument("--skip-inductor", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders")
    a = ap.parse_args()
    started = time.monotonic()
    gpu, gpu_desc = gpu_present()
    root = Path(tempfile.mkdtemp(prefix="kcache-gpu-triton-"))
    shim = root / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    activation = "kcache.pth (installed)" if pth_installed() else "sitecustomize shim on PYTHONPATH"
    report: dict[str, Any] = {
        "gpu": gpu,
        "device": gpu_desc,
        "activation": activation,
        "python": sys.version.split()[0],
    }
    print(f"device: {gpu_desc}; kcache turned on by: {activation}", flush=True)
    if not gpu:
        print(
            "no GPU: launches, autotuning and torch.compile are skipped; compiling for cuda:90 instead",
            flush=True,
        )
    runner = Runner(root, shim, started)
    mode = "gpu" if gpu else "cpu"
    reps = max(1, a.warm_repeats if gpu else 1)

    # (a) four kernels, four conditions ------------------------------------------------------------
    tdir, kdir = root / "triton-cache", root / "kcache-store"
    conds: dict[str, list[dict[str, Any]]] = {
        c: [] for c in ("triton cold", "triton warm", "kcache cold", "kcache warm")
    }

    def env_for(cond: str, i: int) -> dict[str, str]:
        if cond.startswith("triton"):
            return runner.base_env(TRITON_CACHE_DIR=str(tdir), TRITON_CACHE_AUTOTUNING="1")
        return runner.base_env(
            KCACHE="1", KCACHE_DIR=str(kdir), TRITON_CACHE_DIR=str(root / f"tc-{cond[7:]}-{i}")
        )

    for cond in ("triton cold", "kcache cold"):
        r = runner.run(cond.replace(" ", "-"), ["kernels", mode], env_for(cond, 0))
        if r is not None:
            conds[cond].append(r)
    for i in range(reps):
        if runner.over_budget():
            runner.failures.append(f"time budget: warm repeats stopped at {i}")
            break
        for cond in ("triton warm", "kcache warm"):
            r = runner.run(f"{cond.replace(' ', '-')}-{i}", ["kernels", mode], env_for(cond, i))
            if r is not None:
                conds[cond].append(r)
    report["kernels"] = conds

    summary: dict[str, dict[str, Any]] = {}
    for cond, runs in conds.items():
        s: dict[str, Any] = {"runs": len(runs)}
        for k in KERNELS:
            s[k] = median_of(runs, lambda r, k=k: r["kernels"][k]["first_call_s"])
            s[f"{k}_ok"] = all(r["kernels"][k]["ok"] for r in runs) if runs else None
        s["spawn_to_first_s"] = median_of(runs, lambda r: r["spawn_to_first_s"])
        s["start_to_first_s"] = median_of(runs, lambda r: r["start_to_first_s"])
        s["torch_to_first_s"] = median_of(runs, lambda r: r["torch_to_first_s"])
        s["triton_key_cost_s"] = median_of(runs, lambda r: r["triton_key_cost_s"])
        s["bench_calls"] = max((r["kernels"]["matmul_autotuned"]["bench_calls"] for r in runs), default=None)
        s["compiled"] = max((r["compiled_total"] for r in runs), default=None)
        summary[cond] = s
    report["summary"] = summary

    # (b) torch.compile ------------------------------------------------------------------------------
    inductor: dict[str, Any] = {}
    if gpu and not a.skip_inductor:
        for variant, extra in (
            ("fx-graph-cache on (default)", {}),
            ("fx-graph-cache off", {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}),
        ):
            store = root / f"ind-store-{len(inductor)}"
            v: dict[str, Any] = {"processes": []}
            for p in (1, 2):
                if runner.over_budget():
                    runner.failures.append(f"time budget: inductor {variant} process {p} not run")
                    break
                events = root / f"ind-events-{len(inductor)}-{p}"
                events.mkdir()
                env = runner.base_env(
                    KCACHE="1",
                    KCACHE_DIR=str(store),
                    TRITON_CACHE_DIR=str(root / f"ind-tc-{len(inductor)}-{p}"),
                    TORCHINDUCTOR_CACHE_DIR=str(root / f"ind-ic-{len(inductor)}-{p}"),
                    TORCHINDUCTOR_COMPILE_THREADS="4",
                    KCACHE_GPU_CHECK_EVENTS=str(events),
                    **extra,
                )
                before = store_triton_entries(store)
                r = runner.run(f"inductor-{len(inductor)}-{p}", ["inductor"], env) or {"ok": False}
                r["triton_entries_before"] = before
                r["triton_entries_after"] = store_triton_entries(store)
                r["events"] = read_events(events)
                v["processes"].append(r)
            inductor[variant] = v
    report["inductor"] = inductor

    # targets -----------------------------------------------------------------------------------------
    targets: dict[str, Any] = {}
    kw, tw, kc = summary["kcache warm"], summary["triton warm"], summary["kcache cold"]
    if gpu and kw["runs"] and tw["runs"]:
        for k in KERNELS:
            if kw[k] is not None and tw[k] is not None:
                targets[f"kcache warm <= Triton warm: {k}"] = kw[k] <= tw[k]
        key_cost = median_of(conds["triton warm"] + conds["triton cold"], lambda r: r["triton_key_cost_s"])
        report["triton_key_cost_s"] = key_cost
        if key_cost is not None and kw["torch_to_first_s"] is not None and tw["torch_to_first_s"] is not None:
            gain = tw["torch_to_first_s"] - kw["torch_to_first_s"]
            report["first_result_gain_s"] = gain
            targets["first kernel after import torch: gain >= 80% of triton_key"] = gain >= 0.8 * key_cost
        if kc["runs"] and kc["matmul_autotuned"] and kw["matmul_autotuned"] is not None:
            report["matmul_warm_over_cold"] = kw["matmul_autotuned"] / kc["matmul_autotuned"]
            targets["autotuned matmul warm < 1% of cold"] = report["matmul_warm_over_cold"] < 0.01
        targets["warm kcache: autotuner benchmarks nothing"] = kw["bench_calls"] == 0
        targets["warm kcache: nothing compiled"] = kw["compiled"] == 0
        targets["results match torch"] = all(
            summary[c][f"{k}_ok"] in (True, None) for c in summary for k in KERNELS
        )
        for variant, v in inductor.items():
            ps = v["processes"]
            if len(ps) == 2:
                landed = ps[0]["triton_entries_after"] - ps[0]["triton_entries_before"]
                second_new = ps[1]["triton_entries_after"] - ps[1]["triton_entries_before"]
                v["landed"], v["second_new_entries"] = landed, second_new
                targets[
                    f"torch.compile ({variant}): kernels land in kcache and the next process compiles none"
                ] = (
                    landed > 0
                    and second_new == 0
                    and ps[1]["events"]["compiled"] == 0
                    and bool(ps[1].get("ok"))
                )
    elif not gpu:
        targets["cpu flow: kernels compile and the warm kcache process compiles nothing"] = (
            bool(kw["runs"]) and kw["compiled"] == 0
        )
    report["targets"] = targets
    report["failures"] = runner.failures
    report["elapsed_s"] = time.monotonic() - started

    # table -------------------------------------------------------------------------------------------
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f}"

    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    cols = ["triton cold", "triton warm", "kcache cold", "kcache warm"]
    how = f"median of {reps} warm processes" if gpu else "no GPU: compile only"
    print(f"\nfirst call per kernel, ms ({how})")
    print(f"{'':<22}" + "".join(f"{c:>13}" for c in cols) + f"{'kc/tr warm':>12}")
    for k in KERNELS:
        ratio = "-"
        if summary["kcache warm"][k] and summary["triton warm"][k]:
            ratio = f"{summary['kcache warm'][k] / summary['triton warm'][k]:.2f}x"
        print(f"{k:<22}" + "".join(f"{ms(summary[c][k]):>13}" for c in cols) + f"{ratio:>12}")
    for label, field in (
        ("first result, spawn s", "spawn_to_first_s"),
        ("  from before torch s", "start_to_first_s"),
        ("  after import torch s", "torch_to_first_s"),
        ("triton_key() own, s", "triton_key_cost_s"),
    ):
        print(f"{label:<22}" + "".join(f"{sec(summary[c][field]):>13}" for c in cols))
    print(
        f"{'autotune benchmarks':<22}"
        + "".join(
            f"{summary[c]['bench_calls'] if summary[c]['bench_calls'] is not None else '-':>13}" for c in cols
        )
    )
    print(
        f"{'compiles (listener)':<22}"
        + "".join(
            f"{summary[c]['compiled'] if summary[c]['compiled'] is not None else '-':>13}" for c in cols
        )
    )
    if inductor:
        print("\ntorch.compile (fresh Inductor and Triton folders per process; one kcache store per variant)")
        for variant, v in inductor.items():
            for i, p in enumerate(v["processes"], 1):
                ev = p.get("events", {})
                print(
                    f"  {variant:<28} process {i}: triton entries {p['triton_entries_before']}->{p['triton_entries_after']}"
                    f"  Triton verdicts hit {ev.get('hits', '-')} compiled {ev.get('compiled', '-')}"
                    f" in {ev.get('processes', '-')} processes  first call {sec(p.get('first_call_s'))}s  ok {p.get('ok')}"
                )
    print("\ntargets:")
    for t, ok in targets.items():
        print(f"  {'met   ' if ok else 'MISSED'} {t}")
    if "first_result_gain_s" in report:
        print(
            f"  (first kernel after import torch: kcache warm gains {report['first_result_gain_s'] * 1000:.0f} ms; "
            f"triton_key costs {report['triton_key_cost_s'] * 1000:.0f} ms here)"
        )
    for f in runner.failures:
        print(f"  FAILURE: {f}")
    print(f"elapsed {report['elapsed_s']:.0f}s")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "gpu_triton.json").write_text(json.dumps(report, indent=1, default=str))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"kept {root}")
    return 0


if __name__ == "__main__":
    if _WORKER:
        try:
            if sys.argv[2] == "kernels":
                kernel_worker(sys.argv[4], sys.argv[3] == "gpu")
            else:
                inductor_worker(sys.argv[3])
        except Exception as e:  # reported by the orchestrator (exit code and stderr)
            import traceback

            traceback.print_exc()
            print(f"worker failed: {e!r}", file=sys.stderr)
            sys.exit(1)
        sys.exit(0)
    sys.exit(main())
