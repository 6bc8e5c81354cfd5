"""A served torch.compile process does nothing a cache could have done (issue 33, the CPU side).

One process compiles a small model on the CPU with ``KCACHE=1`` and fills a store; a second one,
on a new node as it were (its own ``TORCHINDUCTOR_CACHE_DIR`` and ``TMPDIR``, the same store),
is served every graph and kernel. Both run ``tests/torch_compile/served.py``, which counts every
process and thread started and every wait of the main thread, and a compiler shim first on
``PATH`` logs every run of ``g++``/``gcc``/``cc``/``c++``/``clang++``/``clang`` (torch finds its
``g++`` there: ``CXX`` is unset). What is counted, not timed:

- no reading of an AOTAutograd entry's pickle for the FX graphs it names (kept at the put);
- no debug lines of the AOTAutograd key where no log reads them;
- no compiler run in the served process (before: the compiler's ``--version`` and ``-v``, the
  precompiled header's preprocessing and compile, and every kernel built with it whenever the
  store was filled by a process without ``TORCHINDUCTOR_CACHE_DIR``);
- no process started at all (no compiler, no ``openssl``, no ISA probe, no compile worker);
- no thread of Inductor's compile pools (kcache's own two daemon threads only);
- no wait of the main thread in kcache's code, and none at exit (before: the pool's threads,
  started to write stored libraries, were joined at exit and waited for at each kernel's load);
- kcache's work at exit: the store's close and the integrations' counts, nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcache.inductor.declare import INDUCTOR_AOT, INDUCTOR_CPP, INDUCTOR_FX

PYTHON = sys.executable
SERVED = Path(__file__).parent / "torch_compile" / "served.py"
COMPILERS = ("g++", "gcc", "c++", "cc", "clang++", "clang")


def make_shim(folder: Path) -> Path:
    """A folder of compiler scripts that log each run to ``$COMPILER_LOG`` and run the real
    compiler. One folder for every child: the compiler's identity is in kcache's memo keys.
    The real compiler runs under its own name, found first on PATH: what it says of itself
    (``-v``: ``COLLECT_GCC=g++``, in the name of Inductor's precompiled header) is what it says
    to a process without the shim, so the session's precompiled header serves both."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in COMPILERS:
        real = shutil.which(name)
        if real is None:
            continue
        script = folder / name
        path = shlex.quote(os.path.dirname(real))
        script.write_text(
            f'#!/bin/sh\nprintf "%s\\n" "$*" >> "$COMPILER_LOG"\nPATH={path}:"$PATH" exec {name} "$@"\n'
        )
        script.chmod(0o755)
    return folder


def env_for(base: Path, tag: str, shim: Path, headers: Any = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_"))}
    # torch runs ``g++``: the shim's, first on PATH; and the parent's torch logging or tracing
    # would be a reader of what a served process must not compute (the AOTAutograd key's debug
    # lines): the children log as a plain process does
    for k in ("PYTHONPATH", "CC", "CXX", "TORCH_LOGS", "TORCH_TRACE", "TORCH_COMPILE_DEBUG"):
        env.pop(k, None)
    tmp = base / f"tmp-{tag}"
    tmp.mkdir(parents=True, exist_ok=True)
    if headers is not None:
        # The cold process reaches the session's precompiled headers (the compile command is
        # any process's: ``g++`` found on PATH), as a shared /tmp would give it; the served
        # process keeps an empty TMPDIR of its own, where a precompiled header would be built.
        headers.link(tmp)
    env.update(
        PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(base / "home"),
        XDG_CACHE_HOME=str(base / "xdg"),
        TMPDIR=str(tmp),
        TORCHINDUCTOR_CACHE_DIR=str(base / f"ind-{tag}"),
        OMP_NUM_THREADS="1",  # the FX key holds the thread count: the same in every child
        TORCHINDUCTOR_COMPILE_THREADS="2",  # a pool to start (a 2-core box gets none)
        KCACHE="1",
        KCACHE_DIR=str(base / "store"),
    )
    return env


def run_served(
    base: Path, tag: str, headers: Any = None, *, waits: bool = True, aot_debug: bool = False
) -> dict[str, Any]:
    log = base / f"compiler-{tag}.log"
    env = env_for(base, tag, base / "shim", headers)
    env["COMPILER_LOG"] = str(log)
    env["SERVED_COUNT_WAITS"] = "1" if waits else "0"
    env["SERVED_AOT_DEBUG"] = "1" if aot_debug else "0"
    out = base / f"out-{tag}.json"
    r = subprocess.run([PYTHON, str(SERVED), str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-4000:]
    got = json.loads(out.read_text())
    got["compiler_runs"] = log.read_text().splitlines() if log.exists() else []
    exit_log = Path(str(out) + ".exit")
    got["exit"] = [json.loads(ln) for ln in exit_log.read_text().splitlines()] if exit_log.exists() else []
    return got


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, inductor_headers: Any) -> dict[str, dict[str, Any]]:
    pytest.importorskip("torch", reason="torch.compile tests need torch (CI installs it)")
    if shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler (g++) for Inductor's CPU kernels")
    base = tmp_path_factory.mktemp("served")
    make_shim(base / "shim")  # once: its identity is in kcache's memo keys
    # the cold process's waits and exit are not asked about (its spawns, compiles and hashing
    # are): not recorded, a third of its CPU
    # (and its AOTAutograd logger is at DEBUG level: a reader of the key's debug lines)
    cold = run_served(base, "cold", inductor_headers, waits=False, aot_debug=True)
    served = run_served(base, "served")
    # what the tests below count is a served process's: check that it was one
    assert cold["ok"] and served["ok"]
    assert cold["compiler_runs"], "the shim saw the cold process's compiles (it is on torch's path)"
    assert served["inductor"].get("fxgraph_cache_hit") == 2 and not served["inductor"].get(
        "fxgraph_cache_miss"
    )
    assert served["aot"].get("autograd_cache_hit") == 2 and not served["aot"].get("autograd_cache_miss")
    assert kc(served, INDUCTOR_FX, "hits") == 2 and kc(served, INDUCTOR_AOT, "hits") == 2
    assert kc(served, INDUCTOR_CPP, "hits") >= 1 and not kc(served, INDUCTOR_CPP, "puts")
    return {"cold": cold, "served": served}


def kc(out: dict[str, Any], kind: str, what: str) -> float:
    return float(out.get("kcache", {}).get(kind, {}).get(what, 0))


def test_a_served_process_runs_no_compiler(runs: dict[str, dict[str, Any]]) -> None:
    """Every kernel stored: no compiler run, not even to ask the compiler its version, nor for
    Inductor's precompiled header (whose preprocessing, hash and compile ran in every process)."""
    assert runs["served"]["compiler_runs"] == [], runs["served"]["compiler_runs"]


def test_a_served_process_hashes_no_torch_source(runs: dict[str, dict[str, Any]]) -> None:
    """torch_key() (a hash of every module file of torch, in every process) comes from kcache's
    memo: torch's hashing runs in the process that made it, not in the served one."""
    assert runs["cold"]["torch_sources_hashed"] > 0, "the count sees torch's hashing"
    assert runs["served"]["torch_sources_hashed"] == 0


def test_a_served_process_reads_no_aot_entry_for_the_graphs_it_names(runs: dict[str, dict[str, Any]]) -> None:
    """Which FX graphs an AOTAutograd entry names is read from its pickle once, when the entry is
    kept, and stored beside it: a served lookup reads that list (before: every lookup decoded the
    entry's JSON and base64 and walked the pickle's opcodes, 14-16 ms of an AOTAutograd lookup on
    the H100 against 3 ms in Inductor's own folder)."""
    assert runs["cold"]["aot_entries_walked"] > 0, "the count sees kcache's reading"
    assert runs["served"]["aot_entries_walked"] == 0


def test_a_served_process_computes_no_aot_key_debug_lines(runs: dict[str, dict[str, Any]]) -> None:
    """The AOTAutograd key's debug lines (a second pickling of the graph, attribute by attribute,
    0.17 s of a served BERT-base first call on the H100 with torch 2.11) are computed only when a
    log reads them: torch 2.13 does that itself, torch 2.12 too, and kcache does it for torch 2.8-2.11
    (kcache/inductor/debuglines.py). The cold process's logger is at DEBUG level: there they are
    computed, with kcache as without."""
    assert runs["cold"]["aot_debug_lines"] >= 1, "the count sees torch's debug lines"
    assert runs["served"]["aot_debug_lines"] == 0


def test_a_served_process_decodes_no_fx_graph_envelope(runs: dict[str, dict[str, Any]]) -> None:
    """A kept FX graph is its pickle, handed to torch as a file that torch reads as it reads its
    own folder: no remote-cache read of an FX graph, whose JSON and base64 torch decodes after it
    (35 ms of a served BERT-base process on the H100 machine). The served graphs were hits (the
    fixture checks torch's and kcache's counts)."""
    assert runs["cold"]["remote_gets"].get("RemoteAOTAutogradCache"), "the count sees torch's reads"
    assert runs["served"]["remote_gets"].get("RemoteAOTAutogradCache") == 2
    assert not runs["served"]["remote_gets"].get("RemoteFxGraphCache"), runs["served"]["remote_gets"]


def test_a_served_process_starts_no_process_and_no_compile_worker(runs: dict[str, dict[str, Any]]) -> None:
    served = runs["served"]
    assert served["spawns"] == [], served["spawns"]  # no compiler, openssl, ISA probe or worker
    assert served["pool_started"] is False, "Inductor's compile-worker pool was started"
    # Inductor asked for its pool at the first compile (maybe_warm_pool: Triton is installed and
    # two compile threads are allowed): kcache held it, as nothing was to be compiled
    assert (
        any("compile_worker" in s["argv"] for s in runs["cold"]["spawns"]) or not runs["cold"]["pool_started"]
    )


def test_a_served_process_starts_no_compile_thread(runs: dict[str, dict[str, Any]]) -> None:
    """Inductor builds C++ kernels in a pool of threads; a stored kernel is written in place
    without it (before: the pool started to write each stored library, and the main thread
    waited for it at each kernel's load, and again at exit)."""
    started = runs["served"]["threads"]
    assert all(t["name"].startswith("kcache-") for t in started), started


def test_the_main_thread_of_a_served_process_never_waits_for_kcache(runs: dict[str, dict[str, Any]]) -> None:
    served = runs["served"]
    mine = [w for w in served["waits"] if w["where"].startswith("kcache:")]
    assert mine == [], mine
    assert not [w for w in served["waits"] if w["wait"] in ("Future.result", "Thread.join")], served["waits"]


def test_at_exit_a_served_process_waits_for_nothing(runs: dict[str, dict[str, Any]]) -> None:
    """From the script's end to the process's: no thread joined, nothing slept or waited for in
    kcache's code; kcache's own work is the store's close (one write of the batched last uses and
    counters) and the integrations' counts."""
    at_exit = runs["served"]["exit"]
    handlers = [e["handler"] for e in at_exit if "handler" in e]
    assert any(h.endswith("threading.py:_shutdown") for h in handlers), "the exit was observed"
    waits = [e for e in at_exit if "wait" in e]
    assert not [w for w in waits if w["wait"] == "Thread.join" or w["where"].startswith("kcache:")], waits
    ours = sorted({h.rsplit("/", 2)[-2] + "/" + h.rsplit("/", 1)[-1] for h in handlers if "/kcache/" in h})
    assert ours == [
        "kcache/__init__.py:_push_integration_counts",
        "store/cache.py:close",
        "store/disk.py:close",
    ], ours
