"""Chaos phase ``triton``: real Triton compiles through ``KCACHE=1`` in several processes sharing
kernels (see tools/chaos.py's doc), and the compile worker other phases use
(``tools/chaos.py triton-worker``: tools/chaos_redis.py's rounds).

Real compiles need no GPU: ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import random
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos_base import (
    CHAOS,
    capture_warnings,
    env_without_kcache,
    verify,
)

# ----------------------------------------------------------------------------------- triton

tl: Any = None  # triton.language, bound in the Triton worker only


def _k_add(x, y, o, n, BLOCK: tl.constexpr):  # noqa: ANN001
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)


def _k_scale(x, o, n, s, BLOCK: tl.constexpr):  # noqa: ANN001
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) * s, mask=m)


def _k_rowsum(x, o, stride, BLOCK: tl.constexpr):  # noqa: ANN001
    r = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    tl.store(o + r, tl.sum(tl.load(x + r * stride + c), axis=0))


KERNELS = {
    "add": (_k_add, {"x": "*{t}", "y": "*{t}", "o": "*{t}", "n": "i32", "BLOCK": "constexpr"}),
    "scale": (_k_scale, {"x": "*{t}", "o": "*{t}", "n": "i32", "s": "fp32", "BLOCK": "constexpr"}),
    "rowsum": (_k_rowsum, {"x": "*{t}", "o": "*{t}", "stride": "i32", "BLOCK": "constexpr"}),
}


def kernel_specs(n: int) -> list[tuple[str, str, int, int]]:
    """(kernel, dtype, BLOCK, arch) for the first n kernels of a fixed list."""
    out = []
    for block in (64, 128, 256, 512):
        for name in KERNELS:
            for t in ("fp32", "fp16"):
                out.append((name, t, block, 90))
    return out[:n]


def compile_kernel(spec: tuple[str, str, int, int], arch: int | None = None) -> Any:
    """Compile one kernel of :data:`KERNELS` for ``cuda:<arch>`` (no GPU needed)."""
    global tl
    import triton.language as _tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tl = _tl
    name, t, block, a = spec
    signature = {k: v.format(t=t) for k, v in KERNELS[name][1].items()}
    src = ASTSource(_jitted(name), signature, {"BLOCK": block})
    return triton_compile(src, GPUTarget("cuda", arch or a, 32))


@functools.cache
def _jitted(name: str) -> Any:
    import triton

    return triton.jit(KERNELS[name][0])


def triton_compile(src: Any, target: Any) -> Any:
    import triton

    return triton.compile(src, target=target)


def kernel_digest(k: Any) -> dict[str, str]:
    """sha256 of every artifact of a compiled kernel (its asm dict) and its metadata hash."""
    out = {
        ext: hashlib.sha256(v if isinstance(v, bytes) else str(v).encode()).hexdigest()
        for ext, v in k.asm.items()
    }
    out["hash"] = k.hash
    return out


def triton_worker_main(a: argparse.Namespace) -> int:
    specs = kernel_specs(a.kernels)
    rng = random.Random(a.seed)
    rng.shuffle(specs)
    cap = capture_warnings()
    res: dict[str, Any] = {"kernels": {}, "errors": [], "seconds": {}}
    import triton  # noqa: F401  (the KCACHE hook attaches here)

    import kcache

    res["enabled"] = kcache.is_enabled()
    for rnd in range(a.rounds):
        for spec in specs:
            t0 = time.perf_counter()
            try:
                k = compile_kernel(tuple(spec))
                d = kernel_digest(k)
            except Exception:
                res["errors"].append(traceback.format_exc(limit=8))
                continue
            name = "/".join(map(str, spec))
            prev = res["kernels"].get(name)
            if prev is not None and prev != d:
                res["errors"].append(f"{name}: round {rnd} differs from round 0")
            res["kernels"][name] = d
            res["seconds"][f"{rnd}:{name}"] = time.perf_counter() - t0
    store = kcache.active_store()
    if store is not None:
        store.flush(force=True)
        res["process_counts"] = {k: v for k, v in store.counts.process_totals().items()}
    res["warnings"] = cap.messages
    with open(a.out, "w") as f:
        json.dump(res, f)
    return 0


def phase_triton(
    base: Path, procs: int, kernels: int, seed: int, log: Callable[[str], None]
) -> dict[str, Any]:
    root = str(base / "triton-store")
    t0 = time.perf_counter()
    failures: list[str] = []
    home = str(base / "triton-home")
    os.makedirs(home, exist_ok=True)

    def spawn(i: int, kc: bool, out: str, rounds: int) -> subprocess.Popen:
        env = env_without_kcache(
            HOME=home,
            TRITON_CACHE_DIR=str(base / (f"triton-plain-{i}" if not kc else "triton-unused")),
            PYTHONHASHSEED="0",
        )
        if kc:
            env.update(KCACHE="1", KCACHE_DIR=root)
        args = [
            sys.executable,
            str(CHAOS),
            "triton-worker",
            "--kernels",
            str(kernels),
            "--seed",
            str(seed + i),
        ]
        args += ["--out", out, "--rounds", str(rounds)]
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    # Reference: the same kernels compiled by Triton alone (its own file cache, fresh).
    ref_out = str(base / "triton-ref.json")
    ref = spawn(-1, False, ref_out, 1)
    _, err = ref.communicate(timeout=1800)
    if ref.returncode != 0:
        failures.append(f"reference compile failed: {err[-2000:]}")
        return {"failures": failures}
    reference = json.loads(Path(ref_out).read_text())["kernels"]
    t_ref = time.perf_counter() - t0
    t1 = time.perf_counter()
    ps, outs = [], []
    for i in range(procs):
        out = str(base / f"triton-{i}.json")
        outs.append(out)
        ps.append(spawn(i, True, out, 2))
    results = []
    for p in ps:
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0 or "Traceback" in err:
            failures.append(f"triton worker exited {p.returncode}: {err[-3000:]}")
        if "kcache: WARNING" in err:
            failures.append(f"warning in a triton worker: {err[-1500:]}")
    for out in outs:
        try:
            results.append(json.loads(Path(out).read_text()))
        except (OSError, ValueError) as e:
            failures.append(f"no result: {e}")
    run_s = time.perf_counter() - t1
    mismatches = 0
    hits = misses = 0
    for r in results:
        if not r.get("enabled"):
            failures.append("kcache was not enabled in a worker")
        failures += r["errors"][:3]
        for name, d in r["kernels"].items():
            if d != reference.get(name):
                mismatches += 1
                failures.append(f"{name}: differs from the reference compile")
        c = r.get("process_counts", {}).get("triton", {})
        hits += int(c.get("hits", 0))
        misses += int(c.get("misses", 0))
    entries = 0
    with contextlib.suppress(FileNotFoundError):
        for shard in os.listdir(os.path.join(root, "entries")):
            entries += len(os.listdir(os.path.join(root, "entries", shard)))
    v = verify(root, fix=False)
    if not v.get("ok"):
        failures.append(f"verify after triton run: {v.get('problems')}")
    res = {
        "processes": procs,
        "kernels": kernels,
        "compiles": procs * kernels * 2,
        "reference_seconds": round(t_ref, 1),
        "seconds": round(run_s, 1),
        "kernel_mismatches": mismatches,
        "triton_group_hits": hits,
        "triton_group_misses": misses,
        "entries": entries,
        "verify_ok": bool(v.get("ok")),
        "failures": failures,
    }
    log(f"triton: {json.dumps({k: v for k, v in res.items() if k != 'failures'})}")
    return res
