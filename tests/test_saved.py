"""``saved`` in ``kcache stats``: each hit credits the compile time its entry cost when it was
made, once.

- A Triton kernel's warm start is more than its compile: the libtriton digest, the tool versions
  (kcache's memos) were work the cold process did too; their time counts, once per use.
- Nested entries are credited once: a torch.compile graph's recorded time covers the kernels
  fetched to run it (tests/test_inductor_transparency.py shows it end to end); here, the rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcache import counters

PYTHON = sys.executable

PROGRAM = r"""
import json
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kcache

@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, 3.0 * tl.load(x + offs, mask=offs < n), mask=offs < n)

sig = {"x": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
triton.compile(ASTSource(fn=scale, signature=sig, constexprs={"BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
print(json.dumps(kcache.stats()["process"]))
"""


def test_a_warm_triton_process_credits_the_kernel_and_the_memos_once(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    prog = tmp_path / "scale.py"  # Triton reads a @jit function's source from its file
    prog.write_text(PROGRAM)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env.pop("PYTHONPATH", None)
    env.update(KCACHE="1", KCACHE_DIR=str(tmp_path / "store"), HOME=str(tmp_path / "home"))
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), XDG_CACHE_HOME=str(tmp_path / "xdg"))

    def run() -> dict[str, Any]:
        r = subprocess.run([PYTHON, str(prog)], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    cold = run()
    assert cold["triton"].get("puts", 0) >= 1 and not cold["triton"].get("saved_s")
    warm = run()
    r = subprocess.run(
        [PYTHON, "-m", "kcache", "inspect", "--limit", "0", "--json"], capture_output=True, text=True, env=env
    )
    compile_s: dict[str, float] = {}
    for e in json.loads(r.stdout):
        compile_s[e["kind"]] = compile_s.get(e["kind"], 0.0) + e["compile_s"]
    assert warm["triton"]["hits"] == 1
    assert warm["triton"]["saved_s"] == pytest.approx(compile_s["triton"], abs=1e-6)
    # the cold process hashed libtriton and asked ptxas its version: the warm one did not
    assert compile_s["triton-meta"] > 0, "memos record what they cost"
    assert warm["triton-meta"]["saved_s"] == pytest.approx(compile_s["triton-meta"], abs=1e-6)
    stats = json.loads(
        subprocess.run(
            [PYTHON, "-m", "kcache", "stats", "--json"], capture_output=True, text=True, env=env
        ).stdout
    )
    assert stats["saved_s"] == pytest.approx(compile_s["triton"] + compile_s["triton-meta"], abs=2e-3)


@pytest.fixture
def ledger(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(counters, "_worker", [False])
    counters.graph_lookup(None)
    yield counters
    counters.graph_lookup(None)


def test_kernels_under_a_served_graph_draw_on_its_time_first(ledger: Any) -> None:
    ledger.graph_lookup(5.0)  # a torch.compile graph served; it took 5 s to make
    assert ledger.credit("inductor-cpp", 3.0) == 0.0
    assert ledger.credit("triton", 3.0) == pytest.approx(1.0), "what exceeds the graph's time counts"
    assert ledger.credit("triton-autotune", 2.0) == 2.0, "tuning happens at run time, not in the compile"
    ledger.graph_lookup(None)  # the next graph missed: its kernels save real compile time
    assert ledger.credit("triton", 3.0) == 3.0


def test_compile_workers_credit_nothing_for_kernels(ledger: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(counters, "_worker", [True])
    assert ledger.credit("triton", 3.0) == 0.0 and ledger.credit("inductor-fx", 3.0) == 3.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, "x", None])
def test_a_recorded_time_that_is_not_a_time_credits_nothing(ledger: Any, bad: Any) -> None:
    assert ledger.credit("triton", bad) == 0.0
