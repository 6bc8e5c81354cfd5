"""torch.compile under the switches and scopes a program may use (the transparency tests' child).

    python steps.py STEP:FN [STEP:FN ...]

Each step compiles one small function on the CPU (a graph of its own: each function is compiled
at most once per process, so Inductor's own folder never holds it already) under one condition,
checks the result against eager, and records the change of Inductor's, AOTAutograd's and
kcache's counters. Prints one JSON line: ``{"steps": [{"step", "fn", "ok", "error", "inductor",
"aot", "kcache"}, ...]}``.

Steps: ``default``; ``fx_off`` (``fx_graph_cache=False``); ``aot_off``
(``enable_autograd_cache=False``); ``force`` (``force_disable_caches=True``); ``strict``
(``strict_autograd_cache=True``); ``strict_fxremote_off`` (also ``fx_graph_remote_cache=False``,
as a program keeping FX graphs local would); ``fresh`` (inside ``fresh_cache()``, compiled twice:
the second time from the scope's own cache); ``cleared`` (after ``FxGraphCache.clear()`` and
``AOTAutogradCache.clear()``); ``standalone`` (``torch._inductor.standalone_compile`` of the
function's graph and ``save()`` of the artifact, twice). Two steps take no function:
``wakeup:-`` asks Inductor to wake its compile-worker pool (what it does at the first compile of
a process whose inputs are on a GPU), ``pool:-`` records whether that pool was started,
``tune_meta:-`` what Inductor tells its compile workers about the autotune remote cache (with
its defaults, with ``autotune_local_cache=False``, in a fresh scope).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import traceback
from typing import Any

import torch


def f1(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.sin() * b + 1).relu().sum(0)


def f2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.cos() - b).abs().mean(1)


def f3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.tanh(a) * b.exp()


def f4(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sigmoid().amax(0)


def f5(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a + 2 * b).square().cumsum(1)


def f6(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.where(a > b, a.log1p().abs(), b.neg())


def f7(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).clamp(min=0).softmax(1)


def f8(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.atan2(a, b.abs() + 1).prod(0)


FNS = {f.__name__: f for f in (f1, f2, f3, f4, f5, f6, f7, f8)}


def snapshot() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {
        "inductor": {k: v for k, v in counters["inductor"].items() if "fxgraph_cache" in k},
        "aot": {k: v for k, v in counters["aot_autograd"].items() if "autograd_cache" in k},
    }
    kcache = sys.modules.get("kcache")
    if kcache is not None and kcache.is_enabled():
        out["kcache"] = kcache.active_store().counts.process_totals()
    return out


def delta(before: Any, after: Any) -> Any:
    if isinstance(after, dict):
        got = {k: delta(before.get(k, 0 if not isinstance(v, dict) else {}), v) for k, v in after.items()}
        return {k: v for k, v in got.items() if v}
    return round(after - before, 6)


def reset() -> None:
    torch._dynamo.reset()
    torch._inductor.codecache.PyCodeCache.cache_clear(purge=True)


def compile_and_check(fn: Any, args: tuple[torch.Tensor, ...]) -> None:
    got = torch.compile(fn)(*args)
    if not torch.allclose(got, fn(*args), atol=1e-5, equal_nan=True):
        raise AssertionError("compiled result differs from eager")


def standalone(fn: Any, args: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    captured: list[Any] = []

    def backend(gm: Any, example: Any, **_: Any) -> Any:
        captured.append((gm, example))
        return gm

    torch.compile(fn, fullgraph=True, backend=backend)(*args)
    gm, example = captured[0]
    rounds = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as d:
            art = torch._inductor.standalone_compile(gm, example)
            art.save(path=os.path.join(d, "artifact.bin"))
            rounds.append(bool(art.is_saveable()) if hasattr(art, "is_saveable") else True)
    return {"saved": rounds}


def run_step(step: str, name: str) -> dict[str, Any]:
    import torch._inductor.async_compile as ac

    if step == "wakeup":  # (torch 2.8 has no wakeup: its pool starts at its first submit)
        wakeup = getattr(ac.AsyncCompile, "wakeup", None)
        if wakeup is not None:
            wakeup()
        return {"step": step, "fn": name, "ok": True}
    if step == "pool":
        return {"step": step, "fn": name, "ok": True, "pool_started": bool(ac._pool_set)}
    if step == "tune_meta":  # what the compile workers are told about the autotune remote cache
        from torch._inductor import config as ic
        from torch._inductor.runtime.autotune_cache import inductor_meta_from_config
        from torch._inductor.utils import fresh_cache

        def remote() -> Any:
            return inductor_meta_from_config()["autotune_remote_cache"]

        got = {"default": remote()}
        with ic.patch(autotune_local_cache=False):
            got["local_off"] = remote()
        with fresh_cache():
            got["fresh"] = remote()
        return {"step": step, "fn": name, "ok": True, "autotune_remote_cache": got}
    import torch._functorch.config as fc
    import torch._inductor.config as ic
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
    from torch._inductor.codecache import FxGraphCache
    from torch._inductor.utils import fresh_cache

    fn = FNS[name]
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    args = (torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g))
    patches: dict[str, Any] = {}
    if step == "fx_off":
        patches = {"fx_graph_cache": False}
    elif step == "force":
        patches = {"force_disable_caches": True}
    elif step == "strict_fxremote_off":
        patches = {"fx_graph_remote_cache": False}
    fpatches: dict[str, Any] = {}
    if step == "aot_off":
        fpatches = {"enable_autograd_cache": False}
    elif step.startswith("strict"):
        fpatches = {"strict_autograd_cache": True}
    reset()
    before = snapshot()
    res: dict[str, Any] = {"step": step, "fn": name, "ok": True, "error": None}
    try:
        with ic.patch(patches), fc.patch(fpatches):
            if step == "fresh":
                with fresh_cache():
                    torch._inductor.utils.clear_caches()  # as test harnesses do, before any lookup
                    compile_and_check(fn, args)
                    reset()
                    compile_and_check(fn, args)
            elif step == "cleared":
                FxGraphCache.clear()
                AOTAutogradCache.clear()
                compile_and_check(fn, args)
            elif step == "standalone":
                res.update(standalone(fn, args))
            else:
                compile_and_check(fn, args)
    except Exception as e:
        res["ok"] = False
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        res["traceback"] = traceback.format_exc()[-2000:]
    res.update(delta(before, snapshot()))
    return res


def main(argv: list[str]) -> int:
    steps = []
    for arg in argv:
        step, _, names = arg.partition(":")
        for name in names.split(","):
            steps.append(run_step(step, name))
    print(json.dumps({"steps": steps}))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main(sys.argv[1:]))
