"""A served process does not trace the graph Dynamo throws away at a float restart (issue 33).

With ``dynamic=True`` Dynamo makes float inputs symbols; AOTAutograd's tensorify pass cannot
keep some of them (here LayerNorm's ``eps``), raises ``TensorifyScalarRestartAnalysis``, and
Dynamo traces again with them specialised. Every process pays that thrown-away trace, Inductor's
own warm folder too (BERT-base on an H100: 6.4-7.2 s of a 10 s first call). kcache keeps the
outcome under the thrown-away graph's AOTAutograd key (kind ``inductor-restart``) and raises the
restart itself at the next process's miss of that key, before the trace.

What is counted (``tests/torch_compile/restart.py``): how often the tensorify pass ran (it runs
on the traced graph), torch's counters and the output's bits, against a process without kcache
on Inductor's own warm folder.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _watched_pass() -> bool:
    """Whether the installed torch has the pass where kcache sees its restart: graph_compile's
    ``_apply_tensorify_python_scalars`` (torch 2.10 and later; in 2.8 and 2.9 nothing is kept and
    torch restarts as always). Read in its source, not imported: every xdist worker collects this
    file, and importing torch's AOTAutograd modules here would load 14 of kcache's trigger modules
    into each of them (an in-process ``kcache.enable()`` in another file would then patch torch)."""
    spec = importlib.util.find_spec("torch")  # the top package's spec: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        return False
    for root in spec.submodule_search_locations:
        source = Path(root) / "_functorch" / "_aot_autograd" / "graph_compile.py"
        if source.is_file() and "def _apply_tensorify_python_scalars(" in source.read_text(errors="replace"):
            return True
    return False


if not _watched_pass():
    pytest.skip(
        "no torch, or a torch whose tensorify pass kcache does not watch (2.8, 2.9)", allow_module_level=True
    )

from kcache.inductor import restarts  # noqa: E402
from kcache.inductor.declare import INDUCTOR_RESTART  # noqa: E402

CHILD = Path(__file__).parent / "torch_compile" / "restart.py"
#: floats the program's restart specialises: more than 64 (BERT-base has 65), the bound a record
#: had when the H100 kept nothing for BERT-base (session 20)
FLOATS = 70
REPO = Path(__file__).resolve().parents[1]


def run(
    base: Path,
    folder: str,
    *,
    kcache: bool,
    fresh: bool = False,
    reset: bool = False,
    threads: int = 1,
    registered: bool = False,
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_"))}
    env.pop("PYTHONPATH", None)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(base / folder),
        OMP_NUM_THREADS="1",  # in the FX key: the same in every child
        # one compile thread: no pool of compile workers to start (not in Inductor's keys)
        TORCHINDUCTOR_COMPILE_THREADS=str(threads),
        # Inductor's CPU vector-ISA probes (a g++ build and a Python each, in every process without
        # their answers stored: the cold ones and the one without kcache; 8 s of the file's 60 s
        # of CPU) are not the subject here: torch is told the answer they give. (In the FX key:
        # in every child.)
        TORCHINDUCTOR_VEC_ISA_OK="1",
    )
    if kcache:
        env.update(KCACHE="1", KCACHE_DIR=str(base / "store"), KCACHE_STRICT="1")
    out = base / f"out-{folder}-{len(list(base.glob('out-*')))}.json"
    args = [
        sys.executable,
        str(CHILD),
        str(out),
        *(["--fresh"] if fresh else []),
        *(["--reset"] if reset else []),
        *(["--registered"] if registered else []),
        *("--floats", str(FLOATS)),
    ]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-4000:]
    assert "kcache: WARNING" not in r.stderr, r.stderr[-2000:]  # a hostile record is a quiet miss
    got = json.loads(out.read_text())
    got["stderr"] = r.stderr
    return got


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch", reason="torch.compile tests need torch (CI installs it)")
    base = tmp_path_factory.mktemp("restarts")
    got = {
        "kcache-cold": run(base, "cold", kcache=True),
        # Inductor's own warm folder, the one the kcache process filled (a process without kcache
        # computes the same keys: see the test below); then torch._dynamo.reset() and the call again
        "plain-warm": run(base, "cold", kcache=False, reset=True),
        # a new node: only the store carries over; torch asks for its pool of compile workers
        # (Dynamo's registered backend; two compile threads: a 2-core box gets none)
        "served": run(base, "new", kcache=True, reset=True, threads=2, registered=True),
    }
    got["base"] = base
    # the program restarts in every process without kcache, Inductor's warm folder too
    # (twice in the warm run: once per start, torch forgets its names at the reset)
    assert got["kcache-cold"]["passes"] == 2 and got["plain-warm"]["passes"] == 2, got["plain-warm"]
    assert len(got["plain-warm"]["names"]) == FLOATS
    return got


def test_a_served_process_does_not_trace_the_graph_torch_throws_away(runs: dict[str, Any]) -> None:
    served, warm = runs["served"], runs["plain-warm"]
    assert served["passes"] == 0  # was 2: each start's first attempt traced, then dropped
    assert served["names"] == warm["names"]
    # after torch._dynamo.reset() torch restarts again, and kcache serves it again (it raises
    # a key once only until torch forgets its names): 1 hit without the TensorifyState.clear hook
    assert served["kcache"][INDUCTOR_RESTART]["hits"] == 2
    # 70 names: none was kept with a bound of 64 (BERT-base's 65 floats on the H100)
    assert runs["kcache-cold"]["kcache"][INDUCTOR_RESTART]["puts"] == 1


def test_a_served_restart_starts_no_compile_worker(runs: dict[str, Any]) -> None:
    """The thrown-away attempt's AOTAutograd lookup misses (torch counts it), but kcache answers
    it with the kept restart: nothing is compiled for it, so it does not start Inductor's pool of
    compile workers (a new Python each, and their shutdown at exit; was: started at that miss,
    in every served process of BERT-base with ``dynamic=True`` on the H200)."""
    served = runs["served"]
    assert served["kcache"][INDUCTOR_RESTART]["hits"] == 2  # the misses were the restarts'
    assert served["pool_held"], "torch asked for its pool (maybe_warm_pool) and kcache held it"
    assert served["pool_started"] is False, "Inductor's compile-worker pool was started"


def test_the_served_process_is_the_plain_warm_one_to_torch(runs: dict[str, Any]) -> None:
    """The same counters (the thrown-away attempt's AOTAutograd miss is counted by torch before
    kcache raises) and the same output, bit for bit."""
    served, warm = runs["served"], runs["plain-warm"]
    # torch counts its writing of a remote cache's FX hit into its folder: any remote cache's
    served["counters"]["inductor"].pop("fxgraph_lookup_write_file", None)
    assert served["counters"] == warm["counters"]
    assert served["counters"]["aot_autograd"].get("autograd_cache_miss") == 2
    assert served["counters"]["aot_autograd"].get("autograd_cache_hit") == 2
    assert served["output"] == warm["output"] == runs["kcache-cold"]["output"]


def test_a_process_without_kcache_is_served_from_the_folder_a_kcache_process_filled(
    runs: dict[str, Any],
) -> None:
    """kcache leaves functorch's AOTAutograd remote switch unset (it answers torch's decision
    instead): torch hashes that switch into the AOTAutograd key, and setting it gave a process
    with kcache other keys than one without, so Inductor's own folder was not shared between them
    (was: every AOTAutograd lookup of the plain warm run, which reads the folder the kcache cold
    run filled, missed)."""
    warm = runs["plain-warm"]["counters"]["aot_autograd"]
    assert warm.get("autograd_cache_hit") == 2 and warm.get("autograd_cache_miss") == 2, warm
    assert runs["plain-warm"]["output"] == runs["kcache-cold"]["output"]


def test_a_fresh_cache_scope_gets_no_restart_from_the_store(runs: dict[str, Any]) -> None:
    """Inside torch's ``fresh_cache()`` kcache is off: torch traces and restarts as without it."""
    got = run(runs["base"], "kc-fresh", kcache=True, fresh=True)
    assert got["passes"] == 2 and got["names"] == runs["plain-warm"]["names"]
    assert not got["kcache"].get(INDUCTOR_RESTART, {}).get("hits")
    assert got["output"] == runs["plain-warm"]["output"]


def _rewrite(store_dir: Path, data: bytes) -> int:
    """Replace every restart record of the store by ``data`` (as a shared tier could serve it)."""
    from kcache.store import Store

    s = Store.open(store_dir)
    try:
        keys = s.keys(INDUCTOR_RESTART)
        for key in keys:
            s.replace(INDUCTOR_RESTART, key, {restarts.MEMBER: data})
        return len(keys)
    finally:
        s.close()


@pytest.mark.parametrize(
    "data",
    [
        b'{"reading":1,"names":["__import__(\'os\')"]}',  # not a float symbol's name
        b'{"reading":1,"names":' + json.dumps([f"zf{i}" for i in range(4097)]).encode() + b"}",  # too many
        b'{"reading":1,"names":[]}',  # nothing
        b'{"reading":1,"names":"zf0"}',  # not a list
        b'{"reading":2,"names":["zf0"]}',  # another kcache's format
        b"[" * 5000,  # not JSON (nested past the parser's depth)
        b'{"reading":1,"names":["zf0"]}' + b" " * 65536,  # over 64 KiB
    ],
    ids=["not-a-name", "too-many", "empty", "not-a-list", "other-reading", "deep", "oversized"],
)
def test_a_record_that_is_not_names_is_not_read(data: bytes) -> None:
    assert restarts.decode(data) is None
    assert restarts.decode(restarts.encode({"zf0"})) == ["zf0"]


def test_a_record_naming_other_floats_costs_one_attempt_not_a_loop(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """A record that names floats this graph does not have (a wrong or hostile one): kcache
    raises once, torch's own pass then restarts as it would, and the result is the plain one.
    (A record that is not names at all is never read: above.)"""
    shutil.copytree(runs["base"] / "store", tmp_path / "store")
    assert _rewrite(tmp_path / "store", restarts.encode({"zf999"})) == 1
    got = run(tmp_path, "new", kcache=True)
    assert got["passes"] == 1 and set(got["names"]) == {*runs["plain-warm"]["names"], "zf999"}
    assert got["output"] == runs["plain-warm"]["output"]


def test_verify_finds_a_record_that_is_not_names(runs: dict[str, Any], tmp_path: Path) -> None:
    shutil.copytree(runs["base"] / "store", tmp_path / "store")

    def verify(*more: str) -> tuple[int, dict[str, Any]]:
        r = subprocess.run(
            [sys.executable, "-m", "kcache", "verify", "--json", "--dir", str(tmp_path / "store"), *more],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        return r.returncode, json.loads(r.stdout)

    rc, out = verify()
    assert rc == 0 and out["ok"] is True, out  # what kcache kept is sound
    assert _rewrite(tmp_path / "store", b'{"reading":1,"names":["x"]}') == 1
    rc, out = verify()
    assert rc == 1, out
    assert any("float symbol" in p["detail"] for p in out["problems"]), out
