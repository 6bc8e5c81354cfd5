"""A torch.compile process that counts what it starts and where its main thread waits (the
served-process tests' child, tests/test_inductor_served.py).

    python served.py OUT_JSON

Compiles a small model on the CPU (Inductor's C++ kernels) and calls it at two shapes, with
counters installed before torch is imported:

- ``spawns``: every process started (``subprocess``, ``multiprocessing``, ``os.fork``,
  ``os.posix_spawn``): the first argument and the torch/kcache function that asked;
- ``threads``: every thread started: its name and its target;
- ``waits``: every sleep or wait of the MAIN thread (``time.sleep``, ``Event.wait``,
  ``Condition.wait``, ``Thread.join``, ``Future.result``, ``Queue.get``, ``fcntl`` locks), with
  whether kcache's code was on the stack and where; counted through a profile function on the
  main thread alone (``sys.setprofile``), so other threads' sleeps are not mixed in;
- ``torch_sources_hashed``: calls of torch's ``build_code_hash`` (what ``torch_key()`` runs
  over every module file of torch);
- ``aot_debug_lines``: computations of the AOTAutograd key's debug lines (torch's
  ``debug_lines`` called for an ``AOTAutogradCachePickler``), which only a DEBUG log reads;
- ``aot_entries_walked``: kcache's readings of an AOTAutograd entry's pickle for the FX graphs
  it names (``kcache.inductor.graphs.fx_keys``);
- ``pool_started``: whether Inductor's compile-worker pool was started; Inductor asks for it at
  each graph's compile as it does when an input is on a GPU (:func:`wake_the_pool_as_on_a_gpu`);
- at exit: each function the interpreter calls once the script is done (``threading._shutdown``
  and every ``atexit`` handler), whose module, and the waits inside them.

With ``SERVED_AOT_DEBUG=1`` the AOTAutograd cache's logger is at DEBUG level (a reader of the
debug lines). With ``SERVED_COUNT_WAITS=0`` neither waits nor the exit are recorded: the profile
function that sees them runs at every Python call of the main thread, a third of a cold
process's CPU (10 s of 30 on a 2-core box), and the process that fills the store is not asked
about them.

What the script measured is written to OUT_JSON at its end; what happens at exit is appended to
OUT_JSON + ".exit" as it happens (one JSON line per handler or wait).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

OUT = sys.argv[1]
EXIT_LOG = OUT + ".exit"
MAIN = threading.main_thread()
spawns: list[dict] = []
threads: list[dict] = []
waits: list[dict] = []
exiting = [False]
_real_start_code = None


def _where() -> tuple[str, bool]:
    """The innermost torch or kcache function on the stack, and whether kcache's code is on it."""
    f = sys._getframe(2)
    first, kcache = "", False
    while f is not None:
        fn = f.f_code.co_filename.replace(os.sep, "/")
        if "/kcache/" in fn and "/tests/" not in fn:
            kcache = True
            first = first or f"kcache:{os.path.basename(fn)}:{f.f_code.co_name}"
        elif "/torch/" in fn and not first:
            first = f"torch:{os.path.basename(fn)}:{f.f_code.co_name}"
        f = f.f_back
    return first, kcache


def _note_spawn(what: str, argv: object) -> None:
    first = argv[0] if isinstance(argv, (list, tuple)) and argv else argv
    where, kc = _where()
    spawns.append(
        {
            "how": what,
            "argv0": os.path.basename(str(first)),
            "argv": str(argv)[:300],
            "where": where,
            "kcache": kc,
        }
    )


def _install_spawn_counters() -> None:
    import _posixsubprocess

    real_fork_exec = _posixsubprocess.fork_exec

    def fork_exec(args: object, *rest: object) -> object:
        _note_spawn("fork_exec", args)
        return real_fork_exec(args, *rest)

    _posixsubprocess.fork_exec = fork_exec
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        real = getattr(os, name, None)
        if real is None:
            continue

        def counted(*a: object, _real: object = real, _name: str = name, **k: object) -> object:
            _note_spawn(_name, a[:2] if a else ())
            return _real(*a, **k)  # type: ignore[operator]

        setattr(os, name, counted)

    global _real_start_code
    real_start = threading.Thread.start
    _real_start_code = real_start.__code__

    def start(self: threading.Thread) -> None:
        target = getattr(self, "_target", None)
        label = getattr(target, "__qualname__", None) or type(self).__qualname__
        mod = getattr(target, "__module__", None) or type(self).__module__
        threads.append({"name": self.name, "target": f"{mod}.{label}", "where": _where()[0]})
        real_start(self)

    threading.Thread.start = start  # type: ignore[method-assign]


def _install_wait_counter() -> None:
    import concurrent.futures
    import fcntl
    import queue

    # each wait, and what says it returns at once (a set event, a finished future, a dead
    # thread, a queue with an item): that is not a wait
    codes = {
        threading.Event.wait.__code__: ("Event.wait", lambda o: o.is_set()),
        threading.Condition.wait.__code__: ("Condition.wait", lambda o: False),
        threading.Thread.join.__code__: ("Thread.join", lambda o: not o.is_alive()),
        concurrent.futures.Future.result.__code__: ("Future.result", lambda o: o.done()),
        queue.Queue.get.__code__: ("Queue.get", lambda o: o.qsize() > 0),
    }
    cfuncs = {time.sleep: "time.sleep"}

    for name in ("flock", "lockf"):  # a file lock is a wait only when it blocks (no LOCK_NB)
        real = getattr(fcntl, name)

        def locked(fd: object, op: int, *a: object, _real: object = real, _name: str = name) -> object:
            if threading.current_thread() is not MAIN or op & fcntl.LOCK_NB or op == fcntl.LOCK_UN:
                return _real(fd, op, *a)  # type: ignore[operator]
            where, kc = _where()
            t0 = time.perf_counter()
            try:
                return _real(fd, op, *a)  # type: ignore[operator]
            finally:
                _done((f"fcntl.{_name}", t0, where, kc))

        setattr(fcntl, name, locked)
    started: dict[int, tuple[str, float, str, bool]] = {}
    handlers: dict[int, tuple[str, float]] = {}

    def prof(frame: object, event: str, arg: object) -> None:
        if event == "c_call":
            name = cfuncs.get(arg)  # type: ignore[call-overload]
            if name is not None:
                where, kc = _where()
                started[id(frame)] = (name, time.perf_counter(), where, kc)
        elif event in ("c_return", "c_exception"):
            if cfuncs.get(arg) is not None:  # type: ignore[call-overload]
                _done(started.pop(id(frame), None))
        elif event == "call":
            code = frame.f_code  # type: ignore[attr-defined]
            known = codes.get(code)
            name = None
            if known is not None and not _in_thread_start(frame):
                try:
                    name = None if known[1](frame.f_locals.get("self")) else known[0]  # type: ignore[attr-defined]
                except Exception:  # not the object expected: counted as a wait
                    name = known[0]
            if name is not None:
                where, kc = _where()
                started[id(frame)] = (name, time.perf_counter(), where, kc)
            elif exiting[0] and frame.f_back is None:  # type: ignore[attr-defined]
                handlers[id(frame)] = (f"{code.co_filename}:{code.co_name}", time.perf_counter())
        elif event == "return":
            _done(started.pop(id(frame), None))
            h = handlers.pop(id(frame), None)
            if h is not None:
                _exit_line({"handler": h[0], "s": round(time.perf_counter() - h[1], 4)})

    def _in_thread_start(frame: object) -> bool:
        """A wait inside ``Thread.start`` (for the new thread to run): a thread start, counted
        in ``threads``, not a wait for work."""
        f = getattr(frame, "f_back", None)
        for _ in range(3):
            if f is None:
                return False
            if f.f_code is _real_start_code:
                return True
            f = f.f_back
        return False

    def _done(w: tuple[str, float, str, bool] | None) -> None:
        if w is None:
            return
        rec = {"wait": w[0], "s": round(time.perf_counter() - w[1], 4), "where": w[2], "kcache": w[3]}
        if exiting[0]:
            _exit_line(rec)
        else:
            waits.append(rec)

    sys.setprofile(prof)  # this thread (the main thread) only


_open = open  # the interpreter's late teardown clears builtins


def _exit_line(rec: dict) -> None:
    try:
        with _open(EXIT_LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")
    except Exception:  # the interpreter is being torn down: what is left is not recorded
        pass


_install_spawn_counters()
if os.environ.get("SERVED_COUNT_WAITS", "1") == "1":
    _install_wait_counter()

import torch  # noqa: E402
import torch._inductor.codecache as _codecache  # noqa: E402

hashed: list[str] = []  # torch's hashing of its own sources (torch_key: every module file of torch)
_build_code_hash = _codecache.build_code_hash


def _counted_build_code_hash(*args: object, **kwargs: object) -> object:
    hashed.append(str(args[1]) if len(args) > 1 else "")
    return _build_code_hash(*args, **kwargs)


_codecache.build_code_hash = _counted_build_code_hash

# the AOTAutograd key's debug lines (a second pickling of the graph, attribute by attribute, that
# only a DEBUG log reads): counted in torch's own function, which the AOTAutograd pickler inherits;
# replaced before the module that defines that pickler loads, so every caller goes through it
assert "torch._functorch._aot_autograd.autograd_cache" not in sys.modules
debug_lines: list[str] = []
_debug_lines = _codecache.FxGraphCachePickler.debug_lines


def _counted_debug_lines(self: object, inp: object) -> list[str]:
    debug_lines.append(type(self).__name__)
    return _debug_lines(self, inp)


_codecache.FxGraphCachePickler.debug_lines = _counted_debug_lines
if os.environ.get("SERVED_AOT_DEBUG") == "1":  # a reader of them: the DEBUG level of their logger
    logging.getLogger("torch._functorch._aot_autograd.autograd_cache").setLevel(logging.DEBUG)

# kcache's readings of an AOTAutograd entry's pickle (JSON, base64, opcodes) for the FX graphs it
# names: done when the entry is kept; a served lookup reads the list kept beside it
walked: list[int] = []
try:
    import kcache.inductor.graphs as _graphs
except ImportError:  # no kcache: nothing of its to count
    _graphs = None
if _graphs is not None:
    _fx_keys = _graphs.fx_keys

    def _counted_fx_keys(data: bytes) -> list[str]:
        walked.append(len(data))
        return _fx_keys(data)

    _graphs.fx_keys = _counted_fx_keys


# torch's remote-cache reads, by cache class (an FX graph's envelope is decoded after each one:
# JSON and base64); kcache hands FX graphs to torch as files instead (kcache/inductor/handover.py)
import torch._inductor.remote_cache as _remote_cache  # noqa: E402

remote_gets: dict[str, int] = {}
_remote_get = _remote_cache.RemoteCache.get


def _counted_remote_get(self: object, key: str) -> object:
    name = type(self).__name__
    remote_gets[name] = remote_gets.get(name, 0) + 1
    return _remote_get(self, key)


_remote_cache.RemoteCache.get = _counted_remote_get


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.n = torch.nn.LayerNorm(64)
        self.b = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.b(torch.relu(self.n(self.a(x)))), -1)


def wake_the_pool_as_on_a_gpu() -> None:
    """Inductor wakes its compile-worker pool at the start of each graph's compile when an input
    is on a GPU (``compile_fx``: ``AsyncCompile.wakeup()``), before it looks the graph up. On
    the CPU it does not; so that a CPU process meets the same call, it is made here, where
    ``compile_fx`` would make it."""
    import torch._inductor.compile_fx as cfx

    own = cfx.compile_fx

    def compile_fx(*args: object, **kwargs: object) -> object:
        import torch._inductor.async_compile as ac

        wakeup = getattr(ac.AsyncCompile, "wakeup", None)  # (torch 2.8 has none: nothing to wake)
        if wakeup is not None:
            wakeup()
        return own(*args, **kwargs)

    cfx.compile_fx = compile_fx


def main() -> None:
    wake_the_pool_as_on_a_gpu()
    torch.manual_seed(0)
    model = Block().eval()
    compiled = torch.compile(model)
    ok = True
    calls = []
    for batch in (8, 16):
        x = torch.randn(batch, 32)
        t = time.perf_counter()
        with torch.no_grad():
            y = compiled(x)
        calls.append(round(time.perf_counter() - t, 3))
        ok = ok and bool(torch.allclose(y, model(x), atol=1e-5))
    import torch._inductor.async_compile as ac
    from torch._dynamo.utils import counters

    out = {
        "ok": ok,
        "first_calls_s": calls,
        "inductor": {k: v for k, v in counters["inductor"].items() if "cache" in k},
        "aot": {k: v for k, v in counters["aot_autograd"].items() if "autograd_cache" in k},
        "pool_started": bool(getattr(ac, "_pool_set", None)),
        "torch_sources_hashed": len(hashed),
        "aot_entries_walked": len(walked),
        "aot_debug_lines": debug_lines.count("AOTAutogradCachePickler"),
        "remote_gets": remote_gets,
        "spawns": spawns,
        "threads": threads,
        "waits": waits,
        "alive": [t.name for t in threading.enumerate()],
    }
    kcache = sys.modules.get("kcache")
    if kcache is not None and kcache.is_enabled():
        out["kcache"] = kcache.active_store().counts.process_totals()
    with open(OUT, "w") as f:
        json.dump(out, f)
    exiting[0] = True


main()
