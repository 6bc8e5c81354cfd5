"""torch.compile through kcache on the GPU machine: per-shape first-call times in fresh processes.

    python3 tools/gpu_compile_check.py [--model bert|gpt2|tiny|fn] [--device cuda|cpu]
                                       [--plan main,cold,precompile,aot,bothwarm,autotune,
                                               reduce-overhead,max-autotune-no-cudagraphs,dynamic,
                                               default,bisect]
                                       [--mode MODE] [--dynamic] [--shapes N] [--pairs N]
                                       [--job-id ID] [--budget S] [--child-env K=V ...] [--log FILE]

A model (BERT-base or GPT-2 small from transformers' default configs, random weights, fp16, eval;
the small encoder of docs/examples/torch_compile on any machine; or ``fn``, a tiny pointwise
function of the token embeddings: the smallest torch.compile program) is torch.compile'd and called
at the shape sequence (1, 64), (8, 256), (8, 256), (1, 64), (8, 256), (8, 64) (the first N with
``--shapes``), one fresh process per condition, each with its own directories.

Plan ``main`` (in this order, so that a budget cut keeps the most useful runs):

- ``plain-cold``: no kcache, an empty ``TORCHINDUCTOR_CACHE_DIR``;
- ``kcache-cold``: ``KCACHE=1`` on an empty store, an empty Inductor folder (does kcache slow a
  cold compile?);
- ``kcache-warm-store``: ``KCACHE=1`` on that store, a NEW empty Inductor folder (a new node or
  replica: only kcache's store carries over) — the case issue 14 is about;
- ``plain-warm``: no kcache, the folder of ``plain-cold`` (Inductor's own warm cache);
- ``kcache-both-warm``: ``KCACHE=1`` and the folder of ``kcache-cold``;
- ``bundle``: the store exported (signed) and imported at another path, an empty Inductor folder;
- then ``kcache-warm-store``/``plain-warm`` pairs and ``plain-cold``/``kcache-cold`` pairs (each
  cold run on its own empty folder and store), alternately, up to three of each.

Plan ``precompile`` (Dynamo's caching precompile, where the torch has it; after ``main``):
``precompile-save`` runs with ``TORCH_CACHING_PRECOMPILE=1`` on a copy of main's store (an
empty store without ``main``) and calls
``torch.compiler.save_cache_artifacts()`` at the end, as a program using it does;
``precompile-kcache`` then starts with that store and a new empty Inductor folder, and
``precompile-torch`` (no kcache) with the save's own folder.

Plan ``aot`` (the floor: ``torch.compile(fullgraph=True).aot_compile`` and
``torch.compiler.load_compiled_function``, where they exist): ``aot-save`` compiles one static
function per distinct shape and saves it; ``aot-load`` loads the file of each shape at its first
call (load and call timed together) in a new process with an empty Inductor folder.

Plan ``bothwarm``: ``plain-warm`` against ``kcache-both-warm`` (the target that kcache must not
slow Inductor's own warm path), six pairs in alternating order, after the two cold runs they need.

Plan ``cold``: three ``plain-cold``/``kcache-cold`` pairs, each run on its own empty folder and
store, the order alternating.

Plan ``autotune`` (meant with ``--mode max-autotune``): cold and warm-store runs with kcache,
then cold and warm-folder runs without, one more warm pair, and kcache with both warm. The
counters show how often coordinate descent benchmarked a config (``coordesc_tuning_bench``):
torch 2.11 tunes again in warm processes (pytorch#172819), where kcache applies the cached winner.

Plans ``reduce-overhead``, ``max-autotune-no-cudagraphs``, ``dynamic`` and ``default`` (issue 27:
does kcache change what Inductor compiles, or slow it, in the other modes; what does a whole
process take?): ``mode="reduce-overhead"`` (CUDA graphs), ``mode="max-autotune-no-cudagraphs"``,
Inductor's default mode with ``dynamic=True``, and Inductor's default mode. Each: ``--cold-pairs`` (default ``--pairs``, 3) ``plain-cold``/``kcache-cold`` pairs,
each run on its own empty folder and store (the first pair first, the others last, so that a
budget cut drops those), and ``--pairs`` pairs of ``kcache-warm-store`` (the first kcache
cold run's store, a new empty Inductor folder) against ``plain-warm`` (the first plain cold run's
folder), the order alternating. The summary (``compare`` in the JSON) gives per condition the
median first call, the median of the six calls' sum and the median exec-to-exit time of the
process (``wall_s``: from the spawn to the exit, imports and the compile-worker pool's shutdown
included), the ratios kcache-warm-store / plain-warm, whether Inductor's own counters
(``async_compile_cache_hit/miss``, the FX graph and AOTAutograd cache counters, ...) are equal
with and without kcache (cold against cold, warm against warm), and whether every call's output
is bit-identical between the two (``out_sha``: sha256 of each call's output bytes). Each run also
lists, in order, its AOTAutograd and FX graph lookups and the kernels Inductor handed to
``async_compile.triton`` (``events``): ``compare`` names the kernels loaded a different number of
times with and without kcache (``events_differ_cold/warm``). A kernel tuned at its first run may
choose differently in two cold processes, with or without kcache, and then ``outputs_identical``
is false for both temperatures: ``warm_outputs_as_their_cold`` says whether each warm run gave
what the cold run that filled its cache chose. Two diagnostics beside the targets, per
condition: each call less Dynamo's tracing of the frame (``first_after_tracing_ms``,
``six_after_tracing_ms``, and their ratios in ``ratio_warm_after_tracing``: the part a cache
can change), and the cyclic collector's pauses in the calls (``first_gc_ms``, ``six_gc_ms``,
``first_full_gc``; per run, ``gc_per_call``).

Plan ``bisect`` (with ``--mode reduce-overhead``): plain and kcache cold runs, and kcache cold
runs with each remote cache kcache turns on kept off by the user's setting (kcache leaves a
switch the user set alone): which one changes Inductor's ``async_compile`` counters, its outputs,
and which kernels plain loads that kcache does not.

``--job-id`` sets ``TORCH_COMPILE_JOB_ID`` in every process, which turns on Dynamo's profile of
dynamic dimensions (PGO); without it (the default, as in issue 14's figures) there is none.

Each process: first-call time of every call (the call and a synchronize; imports, the model and
its inputs are made and Dynamo's and Inductor's modules imported before the clock starts; the
medians count the ``torch.compile(model)`` call itself with the first call, since caching
precompile loads its package there), Dynamo's own compile-time breakdown
(``compile_times``), a steady-state time per shape, the largest difference from eager, and
Inductor's and kcache's cache counters. Results are written after every process to
``$OUT/gpu_compile.json`` (or ``--out``): a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SEQUENCE = [(1, 64), (8, 256), (8, 256), (1, 64), (8, 256), (8, 64)]
SECRET = "gpu-compile-check"


# ------------------------------------------------------------------------------ the child
def build(model_name: str, device: str) -> tuple[Any, Any]:
    """(model, make_inputs(B, S) -> kwargs)."""
    import torch

    torch.manual_seed(0)
    if model_name in ("bert", "gpt2"):
        import transformers

        if model_name == "bert":
            model = transformers.BertModel(transformers.BertConfig())
        else:
            model = transformers.GPT2Model(transformers.GPT2Config())
        vocab = model.config.vocab_size
        dtype = torch.float16 if device == "cuda" else torch.float32
        model = model.eval().to(device=device, dtype=dtype)

        def make(b: int, s: int) -> dict[str, Any]:
            g = torch.Generator().manual_seed(b * 1000 + s)
            return {"input_ids": torch.randint(0, vocab, (b, s), generator=g).to(device)}

        return model, make
    if model_name == "fn":  # the smallest torch.compile program: a pointwise function
        dtype = torch.float16 if device == "cuda" else torch.float32
        table = torch.randn(1000, 64, generator=torch.Generator().manual_seed(0)).to(
            device=device, dtype=dtype
        )

        class Fn(torch.nn.Module):
            def forward(self, ids: Any) -> Any:
                x = table[ids]
                return (torch.sin(x) * 2 + 1).relu().sum(-1)

        def make_ids(b: int, s: int) -> dict[str, Any]:
            g = torch.Generator().manual_seed(b * 1000 + s)
            return {"ids": torch.randint(0, 1000, (b, s), generator=g).to(device)}

        return Fn(), make_ids
    sys.path.insert(0, str(REPO / "docs" / "examples" / "torch_compile"))
    from model import make_inputs, make_model

    model = make_model().to(device)
    return model, lambda b, s: {"ids": make_inputs(b, s, device=device)[0]}


def first_tensor(out: Any) -> Any:
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def call_model(m: Any, x: Any) -> Any:
    """What ``aot``'s functions compile: the model as an argument (no closure), one positional
    input (``input_ids`` for BERT and GPT-2, ``ids`` for the small encoder)."""
    out = m(x)
    return out[0] if isinstance(out, tuple) or hasattr(out, "last_hidden_state") else out


def trace_compile_events(steps: dict[str, list[float]]) -> list[str]:
    """What Inductor looked up and loaded, in order: AOTAutograd and FX graph lookups (key,
    hit or miss) and every kernel handed to ``async_compile.triton`` (name, and whether it was in
    Inductor's in-memory table: ``async_compile_cache_hit``). Tells which graph's kernels a run
    loads more often than another (issue 27: under reduce-overhead the counters differ). Each
    lookup's wall time goes into ``steps`` (``fx_lookup_ms``, ``aot_lookup_ms``: kcache's store
    against Inductor's files)."""
    events: list[str] = []
    try:
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
        from torch._inductor import async_compile
        from torch._inductor.codecache import FxGraphCache

        own_triton = async_compile.AsyncCompile.triton

        def triton(self: Any, kernel_name: str, source_code: str, *a: Any, **k: Any) -> Any:
            hit = async_compile.CompiledTritonKernels.get(source_code) is not None
            events.append(f"triton:{kernel_name}:{'mem' if hit else 'new'}")
            return own_triton(self, kernel_name, source_code, *a, **k)

        async_compile.AsyncCompile.triton = triton

        def wrap(cls: Any, name: str, tag: str) -> None:
            own = getattr(cls, name)

            def lookup(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    res = own(*a, **k)
                finally:
                    steps.setdefault(f"{tag}_lookup_ms", []).append(round(1e3 * (time.perf_counter() - t), 2))
                key = next((x for x in a if isinstance(x, str)), "?")
                found = res[0] if isinstance(res, tuple) else res
                events.append(f"{tag}:{key[:10]}:{'hit' if found is not None else 'miss'}")
                return res

            setattr(cls, name, staticmethod(lookup))

        wrap(FxGraphCache, "_lookup_graph", "fx")
        wrap(AOTAutogradCache, "_lookup", "aot")
    except Exception as e:  # noqa: BLE001 - a torch without these keeps the rest of the result
        events.append(f"not traced: {e!r}"[:200])
    return events


def watch_compile_pool(t0: float) -> dict[str, float]:
    """When Inductor's compile-worker pool was created and when it became ready (seconds from
    ``t0``): Inductor hands kernels to the workers at code generation only if the pool is ready
    then, so the race decides its ``async_compile`` counters (issue 27, reduce-overhead).

    Told by events, not by polling: a thread that woke every 5 ms until the pool was ready asked
    for the GIL about 200 times a second through the whole of a process whose pool never starts
    (kcache's served processes), and only until the pool was ready in Inductor's warm process
    (during its first call): unequal load on the two conditions' tracing. Here the module's set of
    pools records the pool's creation, and the ready future, submitted right after it, gets a
    callback (run by the pool's own thread)."""
    times: dict[str, float] = {}
    try:
        import torch._inductor.async_compile as ac
    except Exception:  # noqa: BLE001 - a torch without it: no times
        return times

    def stamp(what: str) -> None:
        times.setdefault(what, round(time.perf_counter() - t0, 3))

    def ready_callback() -> None:
        # use_process_pool() submits the ready job right after process_pool() returns; the pool
        # is created from the main thread, so look for the future from a short-lived thread.
        for _ in range(2000):
            fut = ac.AsyncCompile._ready_future
            if fut is not None:
                fut.add_done_callback(lambda _f: stamp("ready"))
                return
            time.sleep(0.001)

    base = type(ac._pool_set)

    class Recorded(base):  # type: ignore[misc, valid-type]
        def add(self, pool: Any) -> None:
            stamp("started")
            import threading

            threading.Thread(target=ready_callback, daemon=True).start()
            super().add(pool)

    try:
        recorded = Recorded(ac._pool_set)
    except TypeError:  # a set type that cannot be built from another: no times
        return times
    ac._pool_set = recorded  # process_pool() and shutdown look the module's name up when they run
    if recorded:  # a pool made before this was installed: started, its readiness not watched
        stamp("started")
    return times


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) each live thread of this process has used so far, by name
    (Linux): a background thread's Python work takes the GIL from the main thread's tracing."""
    import threading

    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[t.name] = round((int(fields[11]) + int(fields[12])) / tick, 2)
        except (OSError, ValueError, IndexError, TypeError):
            continue
    return out


def timed_driver(steps: dict[str, list[float]]) -> None:
    """The creation of Triton's driver (``cuda_utils``, loaded from Triton's folder or served)
    where it comes after this is installed, into ``steps`` with whether it ran inside
    ``AOTAutogradCache.inductor_load``. (On the H100 with torch 2.11 it never did: the driver was
    made before the first compile in both conditions, and ``driver_ms`` stayed absent.)"""
    try:
        import triton.runtime.driver as drv
    except Exception:  # noqa: BLE001 - no Triton: no driver
        return
    create = getattr(drv, "_create_driver", None)
    if create is None:
        return

    def created(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return create(*a, **k)
        finally:
            inside, f = 0.0, sys._getframe(1)
            while f is not None:
                if f.f_code.co_filename.endswith("aot_autograd_result.py"):
                    inside = 1.0
                    break
                f = f.f_back
            steps.setdefault("driver_ms", []).append(round(1e3 * (time.perf_counter() - t), 2))
            steps.setdefault("driver_in_inductor_load", []).append(inside)

    drv._create_driver = created


TIMERS = (
    "bytecode_tracing",
    "get_fake_value",
    "build_guards",
    "OutputGraph.call_user_compiler",
    "AOTAutogradCache.inductor_load",
    "PyCodeCache.load_by_key_path",
    "TritonBundler.read_and_emit",
    "create_aot_dispatcher_function",
    "compile_fx_inner",
)


def stamp_exit(which: str) -> None:
    """``CHILD_EXIT_STAMPS=FILE``: an atexit handler that appends ``which time`` to FILE, so that
    the parent can split the exit into atexit handlers and the interpreter's finalization."""
    path = os.environ.get("CHILD_EXIT_STAMPS")
    if path:
        import atexit

        def stamp() -> None:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{which} {time.time()}\n")

        atexit.register(stamp)


def bytecode_kept() -> bool:
    """Whether this Python writes .pyc files beside torch's sources (a normal install)."""
    if sys.dont_write_bytecode:
        return False
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        folder = os.path.join(os.path.dirname(spec.origin or ""), "__pycache__") if spec else ""
        return bool(folder) and os.access(
            folder if os.path.isdir(folder) else os.path.dirname(folder), os.W_OK
        )
    except (ImportError, ValueError):
        return False


def compile_pool_started() -> bool | None:
    """Whether Inductor started its pool of compile workers in this process."""
    try:
        import torch._inductor.async_compile as ac

        return bool(ac._pool_set)
    except Exception:  # noqa: BLE001 - a torch without this keeps the rest of the result
        return None


def profile_first() -> Any:
    """``CHILD_PROFILE=N``: the first call under cProfile (slower, for where the time goes)."""
    import cProfile

    return cProfile.Profile()


def profile_summary(prof: Any, n: int) -> dict[str, list[list[Any]]]:
    """The ``n`` functions with the most cumulative time (kcache's, torch's compile stack and
    Triton's), and the ``n`` with the most time of their own: [file:line(name), calls, cum s, own s]."""
    import pstats

    st = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_cc, calls, own, cum, _callers) in st.items():
        short = path.split("site-packages/")[-1] if "site-packages/" in path else path
        rows.append([f"{short}:{line}({name})", calls, round(cum, 4), round(own, 4)])
    keep = ("kcache", "_inductor", "_functorch", "_dynamo", "triton")
    cum = sorted((r for r in rows if any(k in r[0] for k in keep)), key=lambda r: -r[2])[:n]
    own = sorted(rows, key=lambda r: -r[3])[:n]
    return {"cumulative": cum, "own": own}


def watch_gc() -> dict[str, float]:
    """The cyclic collector's pauses in this process from now on, in a dict updated in place:
    ``s`` (seconds paused), ``full`` (generation-2 collections). A full collection of a process
    holding torch and a model walks every tracked object (0.2-0.6 s in session 23's profiles, put
    on whichever function allocated last), and whether one falls in a first call is luck: the
    figures say how much of a call's time was that luck."""
    import gc

    state = {"s": 0.0, "full": 0.0, "_t": 0.0}

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            state["_t"] = time.perf_counter()
            return
        state["s"] += time.perf_counter() - state["_t"]
        state["full"] += info.get("generation") == 2

    gc.callbacks.append(note)
    return state


def compile_breakdown() -> dict[str, float]:
    """Dynamo's own timers (``dynamo_timed``), summed over the process, in seconds."""
    try:
        from torch._dynamo.utils import compile_times

        names, values = compile_times(repr="csv", aggregate=True)
        return {str(n): round(float(v), 3) for n, v in zip(names, values)}
    except Exception as e:  # noqa: BLE001 - a torch without this keeps the rest of the result
        return {"error": repr(e)[:200]}


def tensor_bytes(t: Any) -> bytes:
    """A CPU tensor's bytes, also where torch was built without numpy (this box's CPU wheel)."""
    import torch

    raw = t.reshape(-1).view(torch.uint8)
    try:
        return raw.numpy().tobytes()
    except RuntimeError:  # "Numpy is not available"
        return bytes(raw.tolist())


def child(model_name: str, device: str, mode: str | None, shapes: int, aot: str | None,
          aot_dir: str | None, dynamic: bool = False) -> dict[str, Any]:  # fmt: skip
    # CHILD_PROFILE_WHOLE=FILE: this whole function (imports, the model, every call) under
    # cProfile, dumped to FILE (pstats) at the end; the first-call profile is not taken then
    whole = os.environ.get("CHILD_PROFILE_WHOLE")
    if whole:
        import cProfile

        prof_whole = cProfile.Profile()
        prof_whole.enable()
        try:
            return child_body(model_name, device, mode, shapes, aot, aot_dir, dynamic)
        finally:
            prof_whole.disable()
            prof_whole.dump_stats(whole)
    return child_body(model_name, device, mode, shapes, aot, aot_dir, dynamic)


def child_body(model_name: str, device: str, mode: str | None, shapes: int, aot: str | None,
               aot_dir: str | None, dynamic: bool = False) -> dict[str, Any]:  # fmt: skip
    # wall-clock times the parent turns into the process's start (spawn to here) and exit (the
    # result to the exit: atexit handlers, the compile-worker pool's shutdown)
    t_enter = time.time()
    stamp_exit("last")  # runs after every atexit handler registered later (torch's, kcache's)
    t_import = time.perf_counter()
    phases: dict[str, float] = {}  # the setup's parts, in seconds: where a condition's setup differs
    import torch

    phases["import_torch"] = time.perf_counter() - t_import
    model, make = build(model_name, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    phases["model"] = time.perf_counter() - t_import - sum(phases.values())
    sequence = SEQUENCE[:shapes]
    inputs = [make(b, s) for b, s in sequence]
    with torch.no_grad():
        eager = [first_tensor(model(**x)).float().cpu() for x in inputs]
    sync()
    phases["eager"] = time.perf_counter() - t_import - sum(phases.values())
    out: dict[str, Any] = {"setup_phases_s": phases, "triton_in_setup": "triton" in sys.modules}
    # Dynamo's and Inductor's own modules (2-3 s) are imported before the clock, in every condition
    # alike: the first torch.compile() would import them, and that cost is no cache's to save
    t = time.perf_counter()
    import torch._dynamo
    import torch._inductor.compile_fx  # noqa: F401

    out["import_compiler_ms"] = round(1e3 * (time.perf_counter() - t), 1)
    steps: dict[str, list[float]] = {}  # the load's steps that differ between the conditions
    events = trace_compile_events(steps)
    timed_driver(steps)
    pool_times = watch_compile_pool(t_import)
    files = {shape: Path(aot_dir or ".") / f"{shape[0]}x{shape[1]}.aot" for shape in sequence}
    if aot == "save":  # one static function per distinct shape, compiled ahead and saved
        compile_s = {}
        with torch.no_grad():
            for shape, x in zip(sequence, inputs):
                if files[shape].exists():
                    continue
                t = time.perf_counter()
                fn = torch.compile(call_model, fullgraph=True, dynamic=False).aot_compile(
                    ((model, next(iter(x.values()))), {})
                )
                fn.save_compiled_function(str(files[shape]))
                compile_s[f"{shape[0]}x{shape[1]}"] = round(time.perf_counter() - t, 2)
        return {"aot_compile_s": compile_s, "setup_s": round(time.perf_counter() - t_import, 2)}
    loaded: dict[tuple[int, int], Any] = {}

    def aot_call(shape: tuple[int, int], x: dict[str, Any]) -> Any:
        if shape not in loaded:
            with open(files[shape], "rb") as f:
                loaded[shape] = torch.compiler.load_compiled_function(f)
        return loaded[shape](model, next(iter(x.values())))

    t = time.perf_counter()
    if aot != "load":  # timed: with caching precompile, torch loads its package here, not at the call
        kwargs: dict[str, Any] = {"mode": mode} if mode else {}
        if dynamic:
            kwargs["dynamic"] = True
        compiled = torch.compile(model, **kwargs)
    out["wrap_ms"] = round(1e3 * (time.perf_counter() - t), 2)
    setup_s = time.perf_counter() - t_import
    phases["compiler_and_rest"] = setup_s - sum(phases.values())
    out["setup_phases_s"] = {k: round(v, 3) for k, v in phases.items()}
    first_ms, diffs, shas = [], [], []
    per_call: list[dict[str, float]] = []  # Dynamo's timers, call by call
    before: dict[str, float] = {}
    gc_state = watch_gc()
    gc_calls: list[dict[str, float]] = []  # the collector's pauses, call by call
    prof = (
        profile_first()
        if os.environ.get("CHILD_PROFILE") and not os.environ.get("CHILD_PROFILE_WHOLE")
        else None
    )
    with torch.no_grad():
        for shape, x, ref in zip(sequence, inputs, eager):
            sync()
            gc_before = dict(gc_state)
            t = time.perf_counter()
            if prof is not None and not first_ms:
                prof.enable()
            y = aot_call(shape, x) if aot == "load" else compiled(**x)
            sync()
            if prof is not None and not first_ms:
                prof.disable()
                out["profile_first_call"] = profile_summary(prof, int(os.environ["CHILD_PROFILE"]))
                if os.environ.get("CHILD_PROFILE_DUMP"):  # the whole pstats, callers included
                    prof.dump_stats(os.environ["CHILD_PROFILE_DUMP"])
            first_ms.append(round(1e3 * (time.perf_counter() - t), 2))
            gc_calls.append({k: round(gc_state[k] - gc_before[k], 3) for k in ("s", "full")})
            now = compile_breakdown()
            delta = {k: round(now.get(k, 0.0) - before.get(k, 0.0), 3) for k in TIMERS if k in now}
            per_call.append({k: v for k, v in delta.items() if v})
            before = now
            got = first_tensor(y).detach().cpu().contiguous()
            diffs.append(float((got.float() - ref).abs().max()))
            shas.append(hashlib.sha256(tensor_bytes(got)).hexdigest()[:16])
        steady = {}
        for b, s in dict.fromkeys(sequence):
            x = make(b, s)
            times = []
            for _ in range(10):
                sync()
                t = time.perf_counter()
                aot_call((b, s), x) if aot == "load" else compiled(**x)
                sync()
                times.append(1e3 * (time.perf_counter() - t))
            steady[f"{b}x{s}"] = round(statistics.median(times), 3)
    from torch._dynamo.utils import counters

    if os.environ.get("CHILD_SAVE_ARTIFACTS"):  # what a program using caching precompile calls
        t = time.perf_counter()
        torch.compiler.save_cache_artifacts()
        out["save_cache_artifacts_s"] = round(time.perf_counter() - t, 2)
    out.update({
        "setup_s": round(setup_s, 2),
        "first_ms": first_ms,
        "steady_ms": steady,
        "max_abs_diff": max(diffs),
        "abs_diff": [round(d, 6) for d in diffs],
        "out_sha": shas,  # bit-identity across runs with the same Inductor state
        "pool_started": compile_pool_started(),
        "events": events,
        "pool_s": pool_times,  # when the compile pool was started and became ready (from import torch)
        "compile_times_s": compile_breakdown(),
        "per_call_s": per_call,  # Dynamo's timers in each call (empty for a call that compiled nothing)
        "gc_per_call": gc_calls,  # the collector's pauses in each call (s) and its full collections
        "steps_ms": steps,
        "caching_precompile": bool(getattr(torch._dynamo.config, "caching_precompile", False)),
        "dynamo_cache": dict(counters["dynamo_cache"]),
        "inductor": {  # the caches' counters, plus how often coordinate descent benchmarked
            k: v
            for k, v in counters["inductor"].items()
            if ("cache" in k and not k.startswith("triton")) or "coordesc" in k or "static_autotuner" in k
        },
        "aot": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
        "unique_graphs": counters["stats"]["unique_graphs"],
    })  # fmt: skip
    kcache = sys.modules.get("kcache")
    if kcache is not None and kcache.is_enabled():
        proc = kcache.stats()["process"]
        out["kcache"] = {k: {n: round(v, 3) for n, v in d.items() if n in ("hits", "misses", "puts", "saved_s")}
                         for k, d in proc.items()}  # fmt: skip
    out["threads_alive"] = sorted(t.name for t in __import__("threading").enumerate())
    # whether this process imported Triton's gluon (its JIT's specializer does, at a first launch;
    # kcache's warm-up does in a thread): Inductor's launches may not need it
    out["gluon_imported"] = "triton.experimental.gluon" in sys.modules
    out["thread_cpu_s"] = thread_cpu()
    stamp_exit("first")  # runs before the atexit handlers registered earlier
    out["t_enter"], out["t_return"] = t_enter, time.time()
    return out


def trace_exit(path: str) -> None:
    """What the process does once its result is out (``exit_s``): every function the interpreter
    calls with no Python caller from here on in the main thread (``threading._shutdown``, each
    ``atexit`` handler, finalizers) and how long it took, one JSON line each in ``path``, as it
    returns (the interpreter is being torn down: nothing is kept in memory for later)."""
    import threading

    started: dict[int, tuple[str, float]] = {}
    opened = open  # builtins are cleared late in the teardown

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_back is None:
            code = frame.f_code
            started[id(frame)] = (f"{os.path.basename(code.co_filename)}:{code.co_name}", time.perf_counter())
        elif event == "return" and id(frame) in started:
            name, t0 = started.pop(id(frame))
            try:
                with opened(path, "a") as f:
                    f.write(json.dumps([name, round(time.perf_counter() - t0, 4)]) + "\n")
            except Exception:  # noqa: BLE001 - late in the teardown: what is left is not recorded
                pass

    if threading.current_thread() is threading.main_thread():
        sys.setprofile(prof)


def exit_handlers(path: Path) -> dict[str, Any]:
    """The child's exit as :func:`trace_exit` wrote it: the slowest handlers and their total."""
    try:
        rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    except (OSError, ValueError):
        return {}
    total: dict[str, float] = {}
    for name, s in rows:
        total[name] = total.get(name, 0.0) + float(s)
    top = sorted(total.items(), key=lambda kv: -kv[1])[:8]
    return {
        "exit_in_handlers_s": round(sum(total.values()), 3),
        "exit_handlers": [[n, round(v, 3)] for n, v in top],
    }


# ------------------------------------------------------------------------------ the parent
def scrub(text: str, work: Path) -> str:
    """The results are committed: no machine's paths in them (the work folder, this checkout, the
    interpreter's site folders)."""
    import site

    pairs = [(str(work), "<work>"), (str(REPO), "<repo>")]
    pairs += [(d, "<site>") for d in (*site.getsitepackages(), site.getusersitepackages())]
    for path, name in sorted(pairs, key=lambda p: -len(p[0])):
        text = text.replace(path, name)
    return text


class Check:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.deadline = time.monotonic() + args.budget
        self.later: list[Any] = []
        self.mode: str | None = None  # a plan's own mode (else --mode)
        self.dynamic = False
        self.result: dict[str, Any] = {"model": args.model, "device": args.device, "mode": args.mode,
                                       "plan": args.plan, "job_id": args.job_id,
                                       "sequence": SEQUENCE[: args.shapes], "runs": []}  # fmt: skip
        self.out = (
            Path(args.out)
            if args.out
            else (Path(os.environ["OUT"]) / "gpu_compile.json" if os.environ.get("OUT") else None)
        )

    def env(self, store: Path | None, inductor_dir: Path, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(
                ("KCACHE", "TORCHINDUCTOR", "TRITON_CACHE", "TORCH_COMPILE_JOB_ID", "TORCH_CACHING")
            )
        }
        env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
        env["TRITON_CACHE_DIR"] = str(inductor_dir / "triton")
        if self.args.job_id:  # Dynamo keeps its profile of dynamic dimensions (PGO) only with a job id
            env["TORCH_COMPILE_JOB_ID"] = self.args.job_id
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # Bytecode as an install has it: where Python cannot keep .pyc files beside the sources
        # (the GPU machine's image: every process compiled ~2,300 modules from source, 7.7-9 s of
        # each process, 0.2-0.5 s inside the first call), the children share a bytecode folder
        # that the first runs fill, in every condition alike.
        if not bytecode_kept():
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env.setdefault("PYTHONPYCACHEPREFIX", str(self.work / "pycache"))
        if store is not None:
            env.update(KCACHE="1", KCACHE_DIR=str(store))
        env.update(dict(kv.split("=", 1) for kv in self.args.child_env))
        env.update(extra)
        return env

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, env: dict[str, str], expect_s: float, *child_args: str) -> dict[str, Any] | None:
        if self.left() < expect_s:
            self.result["runs"].append({"name": name, "skipped": f"budget: {self.left():.0f} s left"})
            self.save()
            return None
        t = time.monotonic()
        cmd = [sys.executable, __file__, "--child", "--model", self.args.model, "--device", self.args.device,
               "--shapes", str(self.args.shapes), *child_args]  # fmt: skip
        mode = self.mode if self.mode is not None else self.args.mode
        if mode:
            cmd += ["--mode", mode]
        if self.dynamic or self.args.dynamic:
            cmd += ["--dynamic"]
        if self.args.profile and "warm" in name:  # (cold compiles under cProfile: minutes more)
            env = {**env, "CHILD_PROFILE": str(self.args.profile)}
        stderr = ""
        stamps = self.work / f"exit-{len(self.result['runs'])}.txt"
        env = {**env, "CHILD_EXIT_STAMPS": str(stamps)}
        exit_log = self.work / f"exit-{len(self.result['runs'])}-handlers.jsonl"
        if env.get("CHILD_PROFILE") or env.get("CHILD_PROFILE_WHOLE"):  # (a profile function: profiles only)
            env["CHILD_EXIT_LOG"] = str(exit_log)
        spawned = time.time()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(30.0, self.left()))
            stderr = p.stderr
            res = (
                json.loads(p.stdout.strip().splitlines()[-1])
                if p.returncode == 0
                else {"error": stderr[-3000:]}
            )
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            res = {"error": "timed out"}
        except (ValueError, IndexError):
            res = {"error": f"no result: {stderr[-3000:]}"}
        exited = time.time()
        res = {"name": name, "wall_s": round(time.monotonic() - t, 2), "mode": mode, "dynamic": self.dynamic or
               self.args.dynamic, **res}  # fmt: skip
        if "t_enter" in res:  # interpreter start (the .pth hooks) and exit (atexit, worker pools)
            res["start_s"] = round(res.pop("t_enter") - spawned, 3)
            t_return = res.pop("t_return")
            res["exit_s"] = round(exited - t_return, 3)
            try:  # atexit handlers (between the stamps), then the interpreter's own finalization
                marks = dict(line.split() for line in stamps.read_text().splitlines())
                # non-daemon threads are joined before the atexit handlers run
                res["exit_threads_s"] = round(float(marks["first"]) - t_return, 3)
                res["exit_atexit_s"] = round(float(marks["last"]) - float(marks["first"]), 3)
                res["exit_final_s"] = round(exited - float(marks["last"]), 3)
            except (OSError, KeyError, ValueError):
                pass
            res.update(exit_handlers(exit_log))  # which handlers: atexit's, the pool's shutdown, finalizers
        # a KCACHE=1 child in which kcache never loaded (not installed: the hook is the .pth an
        # install puts in site-packages) would be counted as a kcache run while it is plain
        not_loaded = env.get("KCACHE") == "1" and "error" not in res and "kcache" not in res
        if not_loaded:
            res["error"] = "KCACHE=1 but kcache did not load in the child (run bash tools/gpu_setup.sh first)"
        if self.args.log:  # every child's stderr, for TORCH_LOGS and KCACHE_LOG
            with open(self.args.log, "a", encoding="utf-8") as f:
                f.write(f"===== {name}\n{scrub(stderr, self.work)}\n")
        self.result["runs"].append(res)
        self.save()
        if not_loaded:
            raise SystemExit(f"gpu_compile_check: {name}: {res['error']}")  # every later run would be void
        shown = res.get("first_ms") or res.get("aot_compile_s") or res.get("error", "")[-300:]
        wrap = f"wrap {res['wrap_ms']} ms, " if res.get("wrap_ms", 0) > 50 else ""
        print(f"{name:22s} {res['wall_s']:6.1f} s  {wrap}first calls (ms): {shown}", flush=True)
        return res

    def save(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(scrub(json.dumps(self.result, indent=1), self.work))

    def kcache_cli(self, *args: str, env: dict[str, str]) -> dict[str, Any]:
        p = subprocess.run([sys.executable, "-m", "kcache", *args, "--json"], env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
        return json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-1000:]}

    def main(self) -> None:
        plans = self.args.plan.split(",")
        for plan in plans:
            getattr(self, f"plan_{plan.replace('-', '_')}")()
        for later in self.later:
            later()
        if "main" in plans or "precompile" in plans:
            self.result["stats"] = self.kcache_cli(
                "stats", env=self.env(self.work / "store", self.work / "x")
            )
        self.summarize()
        self.save()

    def plan_main(self) -> None:
        w = self.work
        store = w / "store"
        self.run("plain-cold", self.env(None, w / "ind-plain"), 20)
        self.run("kcache-cold", self.env(store, w / "ind-kcache"), 20)
        self.run("kcache-warm-store", self.env(store, w / "ind-fresh-1"), 10)
        self.run("plain-warm", self.env(None, w / "ind-plain"), 10)
        self.run("kcache-both-warm", self.env(store, w / "ind-kcache"), 10)
        if self.left() > 20:
            env = self.env(store, w / "x", KCACHE_SECRET=SECRET)
            bundle = w / "compile.kcb"
            exp = self.kcache_cli("export", str(bundle), env=env)
            imp = self.kcache_cli(
                "import", str(bundle), env={**env, "KCACHE_DIR": str(w / "other" / "store")}
            )
            self.result["bundle"] = {"export": {k: exp.get(k) for k in ("entries", "bytes", "by_kind", "signed")},
                                     "import": {k: imp.get(k) for k in ("imported", "skipped", "signed")}}  # fmt: skip
            self.run("bundle", self.env(w / "other" / "store", w / "ind-bundle"), 10)
        # the store is copied for the precompile plan before anything else writes to it
        if "precompile" in self.args.plan and store.is_dir():
            shutil.copytree(store, w / "store-precompile", symlinks=True)
        self.run("kcache-warm-store#2", self.env(store, w / "ind-fresh-2"), 15)
        self.run("plain-warm#2", self.env(None, w / "ind-plain"), 15)
        self.later.append(self.main_tail)  # after the other plans: they have fewer runs to lose

    def main_tail(self) -> None:
        w = self.work
        self.run("kcache-warm-store#3", self.env(w / "store", w / "ind-fresh-3"), 15)
        self.run("plain-warm#3", self.env(None, w / "ind-plain"), 15)
        for i in range(2, 4):
            self.cold_pair(str(i), plain_first=bool(i % 2), expect_s=70)

    def cold_pair(self, tag: str, plain_first: bool, expect_s: float) -> None:
        """``plain-cold#<tag>`` and ``kcache-cold#<tag>``, each on its own empty folder and store;
        callers alternate the order (the page cache favours the second of a pair)."""
        w = self.work
        pair = [("plain-cold", None), ("kcache-cold", w / f"store-{tag}")]
        for name, store in pair if plain_first else pair[::-1]:
            self.run(f"{name}#{tag}", self.env(store, w / f"ind-{name}-{tag}"), expect_s)

    def plan_precompile(self) -> None:
        w = self.work
        store = w / "store-precompile"
        pc = {"TORCH_CACHING_PRECOMPILE": "1"}
        if self.run("precompile-save", self.env(store, w / "ind-pc", CHILD_SAVE_ARTIFACTS="1", **pc), 30):
            self.run("precompile-kcache", self.env(store, w / "ind-pc-fresh-1", **pc), 10)
            self.run("precompile-torch", self.env(None, w / "ind-pc", **pc), 10)
            self.run("precompile-kcache#2", self.env(store, w / "ind-pc-fresh-2", **pc), 10)
            self.run("precompile-torch#2", self.env(None, w / "ind-pc", **pc), 10)

    def plan_aot(self) -> None:
        w = self.work
        files = w / "aot"
        files.mkdir(exist_ok=True)
        # the save compiles with a folder of its own: the floor is the load, not the compile
        if self.run(
            "aot-save", self.env(None, w / "ind-aot-save"), 30, "--aot", "save", "--aot-dir", str(files)
        ):
            self.run(
                "aot-load", self.env(None, w / "ind-aot-load"), 10, "--aot", "load", "--aot-dir", str(files)
            )
            # and with the save's own (warm) Inductor folder
            self.run("aot-load-warm", self.env(None, w / "ind-aot-save"), 10, "--aot", "load", "--aot-dir",
                     str(files))  # fmt: skip

    def plan_bothwarm(self) -> None:
        """Does kcache slow Inductor's own warm path? Both warm (kcache's store and the folder that
        kcache-cold filled) against Inductor's warm folder alone: six pairs, the order alternating."""
        w = self.work
        store = w / "store"
        if not (w / "ind-plain").exists():
            self.run("plain-cold", self.env(None, w / "ind-plain"), 20)
        if not (w / "ind-kcache").exists():
            self.run("kcache-cold", self.env(store, w / "ind-kcache"), 20)
        pair = [("plain-warm", None, w / "ind-plain"), ("kcache-both-warm", store, w / "ind-kcache")]
        for i in range(6):
            for name, st, ind in pair if i % 2 else pair[::-1]:
                self.run(f"{name}#p{i}", self.env(st, ind), 10)

    def plan_cold(self) -> None:
        """Does kcache slow a cold compile? Three pairs, the order alternating."""
        for i in range(3):
            self.cold_pair(f"c{i}", plain_first=i % 2 == 0, expect_s=60)

    def plan_autotune(self) -> None:
        """``--mode max-autotune`` cold and warm: kcache first, the same without kcache if time allows."""
        w = self.work
        store = w / "store-at"
        self.run("kcache-cold", self.env(store, w / "ind-at-kcache"), 30)
        self.run("kcache-warm-store", self.env(store, w / "ind-at-fresh-1"), 10)
        self.run("plain-cold", self.env(None, w / "ind-at-plain"), 60)
        self.run("plain-warm", self.env(None, w / "ind-at-plain"), 10)
        self.run("kcache-warm-store#2", self.env(store, w / "ind-at-fresh-2"), 10)
        self.run("plain-warm#2", self.env(None, w / "ind-at-plain"), 10)
        self.run("kcache-both-warm", self.env(store, w / "ind-at-kcache"), 10)

    def compare(self, tag: str, mode: str | None, dynamic: bool) -> None:
        """Cold pairs, then warm pairs (see the module doc), in ``mode``; the summary in
        ``result["compare"][tag]``."""
        w = self.work / tag
        self.mode, self.dynamic = mode, dynamic
        names = []
        cold_pairs = self.args.pairs if self.args.cold_pairs is None else max(1, self.args.cold_pairs)

        def cold(i: int) -> None:
            pair = [("plain-cold", None), ("kcache-cold", w / f"store-{i}")]
            for name, store in pair if i % 2 == 0 else pair[::-1]:
                names.append(f"{tag}:{name}#{i}")
                self.run(names[-1], self.env(store, w / f"ind-{name}-{i}"), 30)

        try:
            # The first cold pair makes what the warm pairs start from; the warm pairs (the
            # targets) come before the other cold pairs, so that a budget cut drops those first.
            cold(0)
            for i in range(self.args.pairs):
                pair = [
                    ("plain-warm", None, w / "ind-plain-cold-0"),
                    ("kcache-warm-store", w / "store-0", None),
                ]
                for name, store, folder in pair if i % 2 == 0 else pair[::-1]:
                    names.append(f"{tag}:{name}#{i}")
                    self.run(names[-1], self.env(store, folder or w / f"ind-fresh-{i}"), 10)
            if self.args.profile_dump:  # then one warm run of each with its first call profiled
                dump = Path(self.args.profile_dump)
                dump.mkdir(parents=True, exist_ok=True)
                for name, store, folder in (
                    ("kcache-warm-store", w / "store-0", None),
                    ("plain-warm", None, w / "ind-plain-cold-0"),
                ):
                    extra = {"CHILD_PROFILE": str(self.args.profile or 40),
                             "CHILD_PROFILE_DUMP": str(dump / f"{tag}-{name}.first.prof")}  # fmt: skip
                    self.run(
                        f"{tag}:{name}-profiled", self.env(store, folder or w / "ind-fresh-p", **extra), 10
                    )
            for i in range(1, cold_pairs):
                cold(i)
        finally:
            self.mode, self.dynamic = None, False
        self.result.setdefault("compare", {})[tag] = summarize_compare(
            [r for r in self.result["runs"] if r.get("name") in names]
        )
        print(json.dumps({tag: self.result["compare"][tag]}, indent=1))

    def plan_bisect(self) -> None:
        """Which of the remote caches kcache turns on changes what Inductor compiles (meant with
        ``--mode reduce-overhead``): cold runs with kcache, each with one of them kept off by the
        user's own setting (which kcache leaves alone), against plain and kcache cold runs. The
        switch whose absence gives plain's counters is the one."""
        w = self.work / "bisect"
        off = {
            "no-fx": {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0"},
            "no-aot": {"TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "0"},
            "no-autotune": {"TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "0"},
            "no-pgo": {"TORCH_DYNAMO_AUTOMATIC_DYNAMIC_REMOTE_PGO": "0"},
        }
        runs = [("plain-cold", None, {}), ("kcache-cold", w / "store", {})]
        runs += [(f"kcache-cold-{k}", w / f"store-{k}", v) for k, v in off.items()]
        got = {}
        for name, store, extra in runs:
            r = self.run(f"bisect:{name}", self.env(store, w / f"ind-{name}", **extra), 30)
            if r and not r.get("error"):
                got[name] = {
                    "async_compile": {
                        k: v for k, v in r.get("inductor", {}).items() if k.startswith("async_compile")
                    },
                    "out_sha": r.get("out_sha"),
                    "events": r.get("events", []),
                }
        plain = got.get("plain-cold")
        summary: dict[str, Any] = {}
        for name, g in got.items():
            summary[name] = {"async_compile": g["async_compile"]}
            if plain is not None and name != "plain-cold":
                summary[name]["same_as_plain"] = g["async_compile"] == plain["async_compile"]
                summary[name]["outputs_as_plain"] = g["out_sha"] == plain["out_sha"]
                extra_loads = [e for e in plain["events"] if e.startswith("triton:")]
                for e in g["events"]:
                    if e in extra_loads:
                        extra_loads.remove(e)
                summary[name]["loaded_by_plain_only"] = extra_loads
        self.result["bisect"] = summary
        print(json.dumps({"bisect": summary}, indent=1))

    def plan_reduce_overhead(self) -> None:
        """CUDA graphs (``mode="reduce-overhead"``)."""
        self.compare("reduce-overhead", "reduce-overhead", False)

    def plan_max_autotune_no_cudagraphs(self) -> None:
        self.compare("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs", False)

    def plan_profile(self) -> None:
        """Where a warm process's time goes, kcache's warm store against Inductor's warm folder
        (``--mode``, ``--dynamic`` as given): one cold run of each, then per condition a run with
        its first call under cProfile and a run with the whole child under cProfile, the pstats
        files written to ``--profile-dump`` (default: the work folder's ``prof``), and
        ``--pairs`` unprofiled pairs."""
        w = self.work / "profile"
        dump = Path(self.args.profile_dump or w / "prof")
        dump.mkdir(parents=True, exist_ok=True)
        conds = [("plain", None, w / "ind-plain-cold"), ("kcache", w / "store", None)]
        self.run("profile:plain-cold", self.env(None, w / "ind-plain-cold"), 30)
        self.run("profile:kcache-cold", self.env(w / "store", w / "ind-kcache-cold"), 30)
        n = 0
        for what in ("first", "whole"):
            for cond, store, folder in conds:
                n += 1
                var = "CHILD_PROFILE_DUMP" if what == "first" else "CHILD_PROFILE_WHOLE"
                extra = {
                    var: str(dump / f"{cond}-warm.{what}.prof"),
                    "CHILD_PROFILE": str(self.args.profile or 40),
                }
                self.run(
                    f"profile:{cond}-warm-{what}",
                    self.env(store, folder or w / f"ind-fresh-{n}", **extra),
                    15,
                )
        for i in range(self.args.pairs):
            for cond, store, folder in conds if i % 2 == 0 else conds[::-1]:
                n += 1
                name = "plain-warm" if cond == "plain" else "kcache-warm-store"
                self.run(f"profile:{name}#{i}", self.env(store, folder or w / f"ind-fresh-{n}"), 10)

    def plan_default(self) -> None:
        """Inductor's default mode: the whole-process figures (``wall_s``) of issue 27's point 3."""
        self.compare("default", None, False)

    def plan_dynamic(self) -> None:
        """Inductor's default mode, ``dynamic=True``."""
        self.compare("dynamic", None, True)

    def summarize(self) -> None:
        by: dict[str, list[list[float]]] = {}
        for r in self.result["runs"]:
            if r.get("first_ms"):  # torch.compile() itself counted with the first call (see wrap_ms)
                first = [r["first_ms"][0] + r.get("wrap_ms", 0.0), *r["first_ms"][1:]]
                by.setdefault(r["name"].split("#")[0], []).append(first)
        med = {k: [round(statistics.median(col), 1) for col in zip(*v)] for k, v in by.items()}
        self.result["median_first_ms"] = med
        if "kcache-warm-store" in med and "plain-warm" in med:
            self.result["ratio_kcache_store_to_inductor_warm"] = [
                round(a / b, 3) if b else None for a, b in zip(med["kcache-warm-store"], med["plain-warm"])
            ]
        for name in ("kcache-both-warm", "bundle", "precompile-kcache", "precompile-torch", "aot-load"):
            if name in med and "plain-warm" in med:
                self.result[f"ratio_{name}_to_inductor_warm"] = [
                    round(a / b, 3) if b else None for a, b in zip(med[name], med["plain-warm"])
                ]
        if "kcache-cold" in med and "plain-cold" in med:
            self.result["ratio_kcache_cold_to_plain_cold"] = [
                round(a / b, 3) if b else None for a, b in zip(med["kcache-cold"], med["plain-cold"])
            ]
        print(json.dumps({k: v for k, v in self.result.items() if k.startswith(("median", "ratio"))}))


def summarize_compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per condition, kcache / Inductor ratios, and whether Inductor's counters and the
    outputs are the same with and without kcache (cold against cold, warm against warm)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r.get("first_ms"):
            by.setdefault(r["name"].split(":", 1)[1].split("#")[0], []).append(r)

    def med(rs: list[dict[str, Any]], f: Any) -> float:
        return round(statistics.median(f(r) for r in rs), 2)

    out: dict[str, Any] = {
        "runs": {k: len(v) for k, v in by.items()},
        "errors": [r["name"] for r in runs if r.get("error")],
    }
    for name, rs in by.items():
        out[name] = {
            "first_ms": med(rs, lambda r: r["first_ms"][0] + r.get("wrap_ms", 0.0)),
            "six_calls_ms": med(rs, lambda r: sum(r["first_ms"]) + r.get("wrap_ms", 0.0)),
            "wall_s": med(rs, lambda r: r["wall_s"]),
            "pool_started": sorted({str(r.get("pool_started")) for r in rs}),
            # the rest of the process: everything before the first call, and the exit
            "setup_s": med(rs, lambda r: r.get("setup_s", 0.0)),
            "exit_s": med(rs, lambda r: r.get("exit_s", 0.0)),
        }
        # Diagnostics, not the targets: the first call (and the six) less Dynamo's tracing of the
        # frame (the same work in both conditions, and on a noisy host most of the spread), and
        # the collector's pauses inside them.
        if all(r.get("per_call_s") for r in rs):
            out[name]["first_after_tracing_ms"] = med(
                rs, lambda r: r["first_ms"][0] - 1e3 * r["per_call_s"][0].get("bytecode_tracing", 0.0)
            )
            out[name]["six_after_tracing_ms"] = med(
                rs,
                lambda r: (
                    sum(r["first_ms"]) - 1e3 * sum(c.get("bytecode_tracing", 0.0) for c in r["per_call_s"])
                ),
            )
            out[name]["first_tracing_ms"] = med(
                rs, lambda r: 1e3 * r["per_call_s"][0].get("bytecode_tracing", 0.0)
            )
        if all(r.get("gc_per_call") for r in rs):
            out[name]["first_gc_ms"] = med(rs, lambda r: 1e3 * r["gc_per_call"][0]["s"])
            out[name]["six_gc_ms"] = med(rs, lambda r: 1e3 * sum(c["s"] for c in r["gc_per_call"]))
            out[name]["first_full_gc"] = med(rs, lambda r: r["gc_per_call"][0]["full"])
        phases = [r["setup_phases_s"] for r in rs if r.get("setup_phases_s")]
        if phases:
            out[name]["setup_phases_s"] = {
                k: round(statistics.median(p.get(k, 0.0) for p in phases), 3) for k in phases[0]
            }
    if "kcache-warm-store" in out and "plain-warm" in out:
        a, b = out["kcache-warm-store"], out["plain-warm"]
        out["ratio_warm"] = {
            k: round(a[k] / b[k], 3) if b[k] else None for k in ("first_ms", "six_calls_ms", "wall_s")
        }
        out["ratio_warm_after_tracing"] = {  # a diagnostic: what a cache can change
            k: round(a[k] / b[k], 3) if b.get(k) and k in a else None
            for k in ("first_after_tracing_ms", "six_after_tracing_ms")
        }
    if "kcache-cold" in out and "plain-cold" in out:
        a, b = out["kcache-cold"], out["plain-cold"]
        out["ratio_cold"] = {
            k: round(a[k] / b[k], 3) if b[k] else None for k in ("first_ms", "six_calls_ms", "wall_s")
        }
    for temp in ("cold", "warm"):
        k_runs = by.get("kcache-cold" if temp == "cold" else "kcache-warm-store", [])
        p_runs = by.get(f"plain-{temp}", [])
        if not k_runs or not p_runs:
            continue

        def kinds(rs: list[dict[str, Any]], only: str = "") -> set[str]:
            return {json.dumps({k: v for k, v in r.get("inductor", {}).items() if k.startswith(only)},
                               sort_keys=True) for r in rs}  # fmt: skip

        # what Inductor compiled (async_compile_*), then every cache counter it keeps
        out[f"async_compile_equal_{temp}"] = kinds(k_runs, "async_compile") == kinds(p_runs, "async_compile")
        out[f"counters_equal_{temp}"] = kinds(k_runs) == kinds(p_runs)
        if kinds(k_runs) != kinds(p_runs):
            out[f"counters_{temp}"] = {"kcache": sorted(kinds(k_runs)), "plain": sorted(kinds(p_runs))}

        def loads(rs: list[dict[str, Any]]) -> dict[str, int]:
            seen: dict[str, int] = {}
            for e in rs[0].get("events", []):  # the first run of each: one process's order
                seen[e] = seen.get(e, 0) + 1
            return seen

        kl, pl = loads(k_runs), loads(p_runs)
        out[f"events_differ_{temp}"] = {
            e: {"kcache": kl.get(e, 0), "plain": pl.get(e, 0)}
            for e in sorted(set(kl) | set(pl))
            if kl.get(e, 0) != pl.get(e, 0) and not e.startswith(("fx:", "aot:"))
        }
        shas = {tuple(r.get("out_sha", ())) for r in k_runs} | {tuple(r.get("out_sha", ())) for r in p_runs}
        out[f"outputs_identical_{temp}"] = len(shas) == 1
        if temp == "warm":
            # A kernel tuned at its first run can choose differently in each cold process (with
            # and without kcache: reduce-overhead's (1, 64) on the H100, session 25); a warm run
            # must give what the cold run that filled its cache chose.
            out["warm_outputs_as_their_cold"] = all(
                {tuple(r.get("out_sha", ())) for r in by.get(warm, [])}
                <= {tuple(r.get("out_sha", ())) for r in by.get(cold, [])}
                for warm, cold in (("kcache-warm-store", "kcache-cold"), ("plain-warm", "plain-cold"))
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert", choices=("bert", "gpt2", "tiny", "fn"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--mode", default=None, help="torch.compile mode (default: Inductor's default)")
    ap.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True) in every run")
    ap.add_argument(
        "--pairs", type=int, default=3, help="alternating pairs per condition in the compare plans"
    )
    ap.add_argument(
        "--cold-pairs",
        type=int,
        default=None,
        help="cold pairs in the compare plans (default: --pairs; at least 1, run before the warm pairs' first)",
    )
    ap.add_argument(
        "--plan",
        default="main",
        help="comma-separated: main, cold, precompile, aot, bothwarm, autotune, reduce-overhead, "
        "max-autotune-no-cudagraphs, dynamic, default, bisect",
    )
    ap.add_argument("--job-id", default=None, help="TORCH_COMPILE_JOB_ID for every process (turns PGO on)")
    ap.add_argument("--shapes", type=int, default=len(SEQUENCE), help="the first N shapes of the sequence")
    ap.add_argument("--aot", choices=("save", "load"), help=argparse.SUPPRESS)
    ap.add_argument("--aot-dir", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for everything")
    ap.add_argument("--out", default=None, help="where the JSON goes (default $OUT/gpu_compile.json)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument(
        "--child-env",
        action="append",
        default=[],
        metavar="K=V",
        help="set in every child (repeatable), e.g. TORCH_LOGS=+inductor KCACHE_LOG=debug",
    )
    ap.add_argument("--log", default=None, help="append every child's stderr to this file")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="the warm runs' first call under cProfile: the N functions with the most time, in each run's result",
    )
    ap.add_argument("--profile-dump", default=None, metavar="DIR",
                    help="plan profile: where the pstats files go (default: the work folder); the compare "
                    "plans (default, reduce-overhead, dynamic, ...): one more warm run of each "
                    "condition with its first call profiled, dumped there")  # fmt: skip
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for plan in args.plan.split(","):
        if not hasattr(Check, f"plan_{plan.replace('-', '_')}"):
            ap.error(f"unknown plan {plan!r}")
    for kv in args.child_env:
        if "=" not in kv:
            ap.error(f"--child-env wants K=V, not {kv!r}")
    if args.child:
        print(
            json.dumps(
                child(args.model, args.device, args.mode, args.shapes, args.aot, args.aot_dir, args.dynamic)
            ),
            flush=True,
        )
        if os.environ.get("CHILD_EXIT_LOG"):
            trace_exit(os.environ["CHILD_EXIT_LOG"])
        return 0
    work = Path(tempfile.mkdtemp(prefix="kcache-gpu-compile-"))
    try:
        Check(args, work).main()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
