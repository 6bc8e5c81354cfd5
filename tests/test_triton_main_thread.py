"""What kcache makes the program's own thread wait for, and which threads it starts (issue 33).

A child process counts, before kcache or Triton is imported, every call that can wait made in its
main thread: ``time.sleep``, ``Thread.join``, ``Event.wait``, ``Condition.wait`` and a blocking
``fcntl.flock``, each with the file of the frame that called it; kcache's own are those called from
kcache's code (``Thread.start`` waits for the new thread to begin: that is the threading module's,
counted with the threads started). And every thread started, with who started it. Counts, not
times:

- a served compile: kcache makes the main thread wait on nothing, and starts two threads, the
  gluon pre-import (``kcache-triton-warmup``) and, in a process whose table of descriptors holds
  64, the store's flush thread, which grows it (docs/triton.md says which threads exist and why);
- ``TRITON_ALWAYS_COMPILE=1``: no pre-import thread (every kernel compiles in the program's
  thread, which imports gluon itself) and no wait: the quickstart waited 5 s for it in every
  process; and the stats count the compile as a miss, not a hit;
- a compile racing the pre-import (the compiler imports gluon from the middle of its code
  generator, gluon imports the code generator): the program's thread waits for the pre-import
  before it takes the code generator's import lock, never while holding it (it waited the bounded
  5 s for a thread that was waiting for it).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

from fresh_process import BARE_PARENT  # noqa: E402
from kernels.harness import PYTHON, clean_env  # noqa: E402

COUNTING = textwrap.dedent(
    """
    import fcntl, json, os, sys, threading, time
    MAIN = threading.main_thread()
    WAITS, STARTS, JOINS = [], [], []
    JOINING = threading.Event()  # the program's thread has begun a join (the race test's cue)
    def caller():
        return sys._getframe(2).f_code.co_filename
    def wrap(owner, name, blocking=lambda a, k: True):
        orig = getattr(owner, name)
        def w(*a, **k):
            if threading.current_thread() is MAIN and blocking(a, k):
                WAITS.append([f"{getattr(owner, '__name__', owner)}.{name}", caller()])
            return orig(*a, **k)
        setattr(owner, name, w)
    wrap(time, "sleep")
    wrap(threading.Event, "wait")
    wrap(threading.Condition, "wait")
    wrap(fcntl, "flock", lambda a, k: not a[1] & (fcntl.LOCK_NB | fcntl.LOCK_UN))
    _join = threading.Thread.join
    def join(self, timeout=None):
        if threading.current_thread() is MAIN:
            WAITS.append(["Thread.join", caller()])
            JOINING.set()
            _join(self, timeout)
            JOINS.append({"thread": self.name, "alive_after": self.is_alive()})
            return None
        return _join(self, timeout)
    threading.Thread.join = join
    _start = threading.Thread.start
    def start(self):
        STARTS.append([self.name, sys._getframe(1).f_code.co_filename])
        return _start(self)
    threading.Thread.start = start
    def kcaches(path):
        return os.sep + "kcache" + os.sep in path
    def report(extra):
        out = {"kcache_waits": [w for w in WAITS if kcaches(w[1]) and not w[1].endswith("threading.py")],
               "joins": JOINS, "threads": [s[0] for s in STARTS if kcaches(s[1]) or s[0].startswith("kcache-")]}
        out.update(extra)
        print(json.dumps(out))
    """
)

PROGRAM = COUNTING + textwrap.dedent(
    """
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    verdicts = []
    knobs.compilation.listener = lambda **kw: verdicts.append(kw["cache_hit"])
    sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    triton.compile(ASTSource(fn=add, signature=sig, constexprs={"BLOCK": 1024}), target=GPUTarget("cuda", 90, 32))
    import kcache
    stats = kcache.stats()["process"].get("triton", {}) if kcache.is_enabled() else {}
    report({"triton_hit": verdicts, "stats": {n: stats.get(n, 0) for n in ("hits", "misses", "puts")}})
    """
)


def _run(env: dict[str, str], tmp: Path, program: str = PROGRAM) -> dict[str, Any]:
    """``program`` as ``tmp/program.py`` (@triton.jit reads its source from a file; one path for
    the processes that share a store, so that they share its kernel)."""
    script = tmp / "program.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(program)
    # through a bare parent: the child's table of descriptors holds 64, as a program started by
    # a launcher without high descriptors open has (which decides kcache's threads: below)
    argv = [PYTHON, "-c", BARE_PARENT, PYTHON, "-W", "ignore", str(script)]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("main-thread")
    store = tmp / "store"
    first = _run(clean_env(tmp / "first", kcache_dir=store), tmp)
    assert first["stats"]["puts"] == 1, first
    return {"tmp": tmp, "store": store, "first": first}


def test_a_served_compile_waits_on_nothing_of_kcaches(warm: dict[str, Any], tmp_path: Path) -> None:
    got = _run(clean_env(tmp_path, kcache_dir=warm["store"]), warm["tmp"])
    assert got["triton_hit"] == [True] and got["stats"]["hits"] == 1, got
    assert got["kcache_waits"] == [], got  # no sleep, join, wait or blocking lock from kcache
    assert got["joins"] == [], got
    # the gluon pre-import, and the flush thread that grows the process's table of descriptors
    # (64: the hit took private links, and asked for room to hold later hits' folders), documented
    assert got["threads"] == ["kcache-triton-warmup", "kcache-flush"], got


def test_always_compile_costs_no_wait_and_counts_as_a_compile(warm: dict[str, Any], tmp_path: Path) -> None:
    plain = _run(clean_env(tmp_path / "plain", TRITON_ALWAYS_COMPILE="1"), warm["tmp"])
    got = _run(clean_env(tmp_path / "k", kcache_dir=warm["store"], TRITON_ALWAYS_COMPILE="1"), warm["tmp"])
    assert got["triton_hit"] == plain["triton_hit"] == [False], got  # Triton compiled, as without kcache
    # no pre-import thread to race the compile, nothing waited for beyond what Triton alone does
    assert got["threads"] == [] and got["joins"] == plain["joins"] == [], got
    assert got["kcache_waits"] == [], got
    # Triton compiled: a miss (the identical entry is already stored: no new put), never a hit
    assert got["stats"]["hits"] == 0 and got["stats"]["misses"] == 1, got


RACE = COUNTING + textwrap.dedent(
    """
    HELD = []
    import importlib.machinery
    class SlowLoader:  # runs the real module's code only once the program's thread waits for
        # the pre-import: however long the program takes to get to its compile (a loaded box), the
        # compile meets the pre-import still inside gluon's package, holding that module's lock
        # (as a slow import does; a finder that waited would hold Python's global import lock,
        # which no real import holds for long, and stop every import of every thread)
        def __init__(self, real):
            self.real = real
        def create_module(self, spec):
            return self.real.create_module(spec)
        def exec_module(self, module):
            HELD.append(module.__name__)
            JOINING.wait(60)
            self.real.exec_module(module)
    class Slow:
        def find_spec(self, name, path=None, target=None):
            if threading.current_thread().name == "kcache-triton-warmup" and name == SLOW:
                spec = importlib.machinery.PathFinder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = SlowLoader(spec.loader)
                return spec
            return None
    sys.meta_path.insert(0, Slow())
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def add(x, out, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out + offs, tl.load(x + offs) + 1)

    deadline = time.monotonic() + 60  # until the pre-import is held inside gluon (the program's poll)
    while not HELD and time.monotonic() < deadline:
        time.sleep(0.005)
    triton.compile(ASTSource(fn=add, signature={"x": "*fp32", "out": "*fp32", "BLOCK": "constexpr"},
                             constexprs={"BLOCK": 128}), target=GPUTarget("cuda", 90, 32))
    report({'held': HELD})
    """
)


@pytest.mark.parametrize(
    "slow", ["triton.experimental.gluon.language._core", "triton.experimental.gluon._runtime"]
)
def test_a_compile_racing_the_pre_import_never_waits_it_out(tmp_path: Path, slow: str) -> None:
    pytest.importorskip("triton.experimental.gluon.language", reason="this Triton has no gluon")
    got = _run(clean_env(tmp_path, kcache_dir=tmp_path / "store"), tmp_path, f"SLOW = {slow!r}\n" + RACE)
    assert got["held"] and got["threads"][0] == "kcache-triton-warmup", got
    # The program's thread waited for the pre-import to end (it needs what it imports), and the
    # pre-import ended: it never stood waiting on a thread that waited on the program's thread.
    assert got["joins"] and all(not j["alive_after"] for j in got["joins"]), got
    assert all(w[0] == "Thread.join" for w in got["kcache_waits"]), got
