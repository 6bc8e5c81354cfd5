"""Compile a plan of test kernels in this (fresh) process and write what happened as JSON.

    python -m kernels.run --out RESULT.json [--specs add,row_sum|all] [--plan PLAN.json]
                          [--barrier FILE] [--child]

A plan is a list of items ``{"spec", "arch", "backend", "options", "env", "module_file", "label"}`` (or
``"option_change"`` / ``"env_change"`` naming one of :mod:`kernels.variations`, with ``"tmp"``);
each is compiled in turn (``env`` set around it). Per item the result has the cubin's sha256, Triton's own
verdict (the compilation listener's ``cache_hit``), kcache's counters for kind ``triton`` over
that compile (hits, misses, puts), the time and any error. ``--barrier FILE`` computes Triton's key,
writes ``FILE.ready.<pid>`` and waits for FILE to exist before compiling (processes started
together then compile together); ``--rotate N`` starts the plan at its N-th item; ``--child`` runs the same
plan again in a child process (inheriting this environment) and embeds its result.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402


def _triton_counts() -> dict[str, float]:
    import kcache

    store = kcache.active_store()
    if store is None:
        return {}
    return dict(store.counts.process_totals().get("triton", {}))


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("hits", "misses", "puts", "errors")}


class ProbeAbort(Exception):
    """Raised by a probe at the first file Triton stores after its lookup (the compile stops)."""


class _Probe:
    """For a plan item with ``"probe": true``: the lookup happens as in any compile (Triton's
    real key, kcache's manager, its counters), then the compile is stopped at the first file it
    would store. Checks many keys quickly, and leaves settings that make compiles slow or verbose
    (LLVM debug output, IR dumps) no chance to run."""

    def __enter__(self) -> None:
        from kcache.triton.manager import KcacheCacheManager

        self._cls = KcacheCacheManager
        self._put = KcacheCacheManager.put

        def put(mgr: Any, data: Any, filename: str, binary: bool = True) -> str:
            raise ProbeAbort(filename)

        KcacheCacheManager.put = put  # type: ignore[method-assign]

    def __exit__(self, *exc: Any) -> None:
        self._cls.put = self._put  # type: ignore[method-assign]


def run_plan(
    plan: list[dict[str, Any]], barrier: str | None = None, key_first: bool = False, passes: int = 1
) -> dict[str, Any]:
    import triton
    from triton import knobs

    from .specs import SPECS, compile_spec
    from .variations import env_value, option_value

    t_import = time.perf_counter() - T0
    verdicts: list[bool] = []

    def listener(*, src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        verdicts.append(bool(cache_hit))

    knobs.compilation.listener = listener
    t_key = None
    if key_first:  # Triton's key before the timed loop (the benchmarks report it on its own)
        from .compat import triton_key_module

        cache_mod = triton_key_module()

        t = time.perf_counter()
        cache_mod.triton_key()
        t_key = time.perf_counter() - t
    if barrier:
        # Everything before the first lookup is done (Triton's key too), then: ready, and wait.
        from .compat import triton_key_module

        cache_mod = triton_key_module()

        cache_mod.triton_key()
        with open(f"{barrier}.ready.{os.getpid()}", "w"):
            pass
        while not os.path.exists(barrier):
            time.sleep(0.002)
    t_go = time.perf_counter()
    results = []
    t_first = None
    for item in plan:
        spec = SPECS[item["spec"]]
        env = {k: str(v) for k, v in (item.get("env") or {}).items()}
        options = dict(item.get("options") or {})
        if item.get("env_change"):
            env[item["env_change"]] = env_value(item["env_change"], item["tmp"])
        if item.get("option_change"):
            options[item["option_change"]] = option_value(item["option_change"], item["tmp"])
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        before = _triton_counts()
        n_verdicts = len(verdicts)
        t = time.perf_counter()
        out: dict[str, Any] = {"label": item.get("label") or item["spec"], "spec": item["spec"]}
        probe = _Probe() if item.get("probe") else None
        try:
            if probe is not None:
                probe.__enter__()
            k = compile_spec(
                spec,
                arch=item.get("arch", 90),
                backend=item.get("backend", "cuda"),
                options=options,
                module_file=item.get("module_file"),
            )
            binary = k.asm["hsaco"] if "hsaco" in k.asm else k.asm["cubin"]
            out["cubin_sha256"] = hashlib.sha256(binary).hexdigest()
            if item.get("save_ttir"):
                with open(item["save_ttir"], "w") as f:
                    f.write(k.asm["ttir"])
            out["key"] = k.hash
            out["error"] = None
        except ProbeAbort:
            out["cubin_sha256"] = None
            out["error"] = None
            out["probed"] = True
        except Exception as e:
            out["cubin_sha256"] = None
            out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            if probe is not None:
                probe.__exit__()
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        out["seconds"] = time.perf_counter() - t
        out["t_done_wall"] = time.time()
        if t_first is None:
            t_first = time.perf_counter() - T0
        out["cache_hit"] = verdicts[n_verdicts] if len(verdicts) > n_verdicts else None
        out["kcache"] = _delta(before, _triton_counts())
        results.append(out)
    t_all = time.perf_counter() - t_go
    go_wall = time.time() - (time.perf_counter() - t_go)
    pass_times = [t_all]
    for _ in range(passes - 1):  # the same plan again in this process: the steady hit path
        t = time.perf_counter()
        for item in plan:
            compile_spec(SPECS[item["spec"]], arch=item.get("arch", 90), backend=item.get("backend", "cuda"))
        pass_times.append(time.perf_counter() - t)
    return {
        "pass_times": pass_times,
        "t_import_triton": t_import,
        "t_first": t_first,
        "t_key": t_key,
        "t_compile_all": t_all,
        "t_go_wall": go_wall,
        "results": results,
        "triton_version": triton.__version__,
    }


def _state() -> dict[str, Any]:
    from triton import knobs

    import kcache

    try:
        from kcache.triton import keymemo

        memo = keymemo.installed()
    except Exception:
        memo = False
    try:
        manager = knobs.cache.manager_class
    except Exception as e:  # a bad TRITON_CACHE_MANAGER
        manager = f"error: {e}"
    stats = kcache.stats() if kcache.is_enabled() else {"process": {}}
    return {
        "kcache_enabled": kcache.is_enabled(),
        "manager_class": getattr(manager, "__module__", "")
        + ":"
        + getattr(manager, "__name__", str(manager)),
        "env_TRITON_CACHE_MANAGER": os.environ.get("TRITON_CACHE_MANAGER"),
        "autotune_cache": bool(getattr(knobs.autotuning, "cache", False)),
        "triton_key_memo": memo,
        "process": stats.get("process", {}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--specs", default=None, help="comma-separated spec names, or 'all'")
    p.add_argument("--plan", default=None, help="a JSON file with a list of plan items")
    p.add_argument("--barrier", default=None)
    p.add_argument("--child", action="store_true")
    p.add_argument("--key-first", action="store_true", help="compute Triton's key before the timed loop")
    p.add_argument("--passes", type=int, default=1, help="compile the plan this many times (timed each)")
    p.add_argument("--rotate", type=int, default=0, help="start the plan at this item (then wrap)")
    a = p.parse_args(argv)
    from .specs import SPECS

    plan: list[dict[str, Any]] = []
    if a.plan:
        with open(a.plan) as f:
            plan = json.load(f)
    if a.specs:
        names = list(SPECS) if a.specs == "all" else a.specs.split(",")
        plan += [{"spec": n} for n in names]
    if plan and a.rotate:
        r = a.rotate % len(plan)
        plan = plan[r:] + plan[:r]
    result = run_plan(plan, a.barrier, a.key_first, a.passes)
    result.update(_state())
    if a.child:
        child_out = a.out + ".child.json"
        cmd = [sys.executable, "-m", "kernels.run", "--out", child_out]
        if a.plan:
            cmd += ["--plan", a.plan]
        if a.specs:
            cmd += ["--specs", a.specs]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        result["child_rc"] = proc.returncode
        result["child_stderr"] = proc.stderr[-2000:]
        if proc.returncode == 0:
            with open(child_out) as f:
                result["child"] = json.load(f)
    result["t_total"] = time.perf_counter() - T0
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
