"""The fail-open boundary (kcache/boundary.py): a bug inside kcache, met where Triton calls it, is
one warning, an ``errors`` count and a compile without kcache; under ``KCACHE_STRICT=1`` it
raises (the test suite runs strict, so a swallowed bug fails a test)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kcache import boundary, counters

PY = sys.executable

# A real Triton compile (sm_90 cubin, no GPU needed) in a process with kcache on, after a bug is
# planted in one of the composed cache's methods (or a function of the triton_key memo): it
# raises a plain RuntimeError, as a bug would.
KERNEL = textwrap.dedent(
    """
    import json, sys

    import kcache
    from kcache import counters
    from kcache.store.cache import TieredCache

    from kcache.triton import components, keymemo

    def bug(*args, **kwargs):
        raise RuntimeError("planted bug")

    # a method of the composed cache, or keymemo.<fn>, or components.<fn>
    owner, _, name = sys.argv[1].rpartition(".")
    setattr({"keymemo": keymemo, "components": components}.get(owner, TieredCache), name, bug)

    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource


    @triton.jit
    def scale_add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0 + tl.load(y + offs, mask=m), mask=m)


    sig = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    sizes = []
    for block in (64, 128):
        k = triton.compile(ASTSource(fn=scale_add, signature=sig, constexprs={"BLOCK": block}),
                           target=GPUTarget("cuda", 90, 32))
        sizes.append(len(k.asm["cubin"]))
    assert kcache.active_store() is not None
    print(json.dumps({"cubins": sizes, "errors": counters.process_totals().get("kcache", {}).get("errors", 0)}))
    """
)


def _run(tmp: Path, method: str, strict: str) -> subprocess.CompletedProcess[str]:
    script = tmp / "kern.py"
    script.write_text(KERNEL)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"), PYTHONWARNINGS="ignore")
    env.update(KCACHE="1", KCACHE_DIR=str(tmp / "store"), KCACHE_STRICT=strict)
    env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
    env.pop("PYTHONPATH", None)
    return subprocess.run([PY, str(script), method], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("method", ["single_flight", "put"])
def test_a_bug_at_the_triton_edge_is_one_warning_and_a_compile(tmp_path: Path, method: str) -> None:
    pytest.importorskip("triton")
    p = _run(tmp_path, method, strict="0")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out["cubins"]) == 2 and all(n > 0 for n in out["cubins"])  # compiled all the same
    # Both kernels met the bug and each time was counted (with put, the tool-version memo's
    # puts too); warned once per edge, not once per kernel.
    assert out["errors"] >= 2
    warnings = [line for line in p.stderr.splitlines() if line.startswith("kcache: WARNING")]
    assert 1 <= len(warnings) < out["errors"], p.stderr[-3000:]
    assert len(warnings) == 1 or method == "put"  # the group's lookup: one edge, one warning
    for w in warnings:
        assert "RuntimeError: planted bug" in w and "compiling without kcache" in w, w


@pytest.mark.parametrize("method", ["single_flight", "put"])
def test_a_bug_at_the_triton_edge_raises_when_strict(tmp_path: Path, method: str) -> None:
    pytest.importorskip("triton")
    p = _run(tmp_path, method, strict="1")
    assert p.returncode != 0
    assert "RuntimeError: planted bug" in p.stderr, p.stderr[-3000:]
    assert "kcache: WARNING" not in p.stderr


# ------------------------------------------------------------------------------ torch's hooks
# A real torch.compile on the CPU (Inductor's C++ kernel, its vector-ISA probe, its cache
# decisions) in a process with kcache on, after a bug is planted in kcache's own code inside some
# of the hooks torch calls: the ISA probe's memo, what -march=native means here, and the rule
# behind torch's "use the remote FX cache?" decision.
TORCH_HOOKS = {
    "vecisa.memo_key": "kcache's memo of Inductor's CPU vector-ISA probes",
    "hostflags.memo_key": "kcache's memo of what -march=native means here",
    "policy.remote_allowed": "kcache's rules for when torch's caches may be served",
}
TORCH_PROGRAM = textwrap.dedent(
    """
    import json, sys

    import kcache
    from kcache import counters
    from kcache.inductor import hostflags, policy, vecisa

    for spot in sys.argv[1].split(","):
        def bug(*args, spot=spot, **kwargs):
            raise RuntimeError(f"planted bug in {spot}")

        module, name = spot.split(".")
        setattr({"hostflags": hostflags, "policy": policy, "vecisa": vecisa}[module], name, bug)

    import torch


    def f(x):
        return torch.relu(x) * 2.0 + 1.0


    x = torch.randn(64)
    y = torch.compile(f)(x)
    assert kcache.is_enabled()
    errors = counters.process_totals().get("kcache", {}).get("errors", 0)
    print(json.dumps({"same": bool(torch.allclose(y, f(x))), "errors": errors}))
    """
)


def _run_torch(
    tmp: Path, spots: list[str], strict: str, program: str = TORCH_PROGRAM
) -> subprocess.CompletedProcess[str]:
    script = tmp / "program.py"
    script.write_text(program)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_"))}
    env.pop("PYTHONPATH", None)
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"), PYTHONWARNINGS="ignore")
    env.update(KCACHE="1", KCACHE_DIR=str(tmp / "store"), KCACHE_STRICT=strict)
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), TRITON_CACHE_DIR=str(tmp / "triton-cache"))
    env.update(OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")  # no compile pool to start
    return subprocess.run(
        [PY, str(script), ",".join(spots)], capture_output=True, text=True, env=env, timeout=600
    )


def _torch_spots() -> list[str]:
    pytest.importorskip("torch")
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("Inductor builds with -march=native on x86 only (the host-target memo's case)")
    return list(TORCH_HOOKS)


def test_bugs_in_torchs_hooks_are_one_warning_each_and_a_compile(tmp_path: Path) -> None:
    spots = _torch_spots()
    p = _run_torch(tmp_path, spots, strict="0")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["same"]  # compiled (and right) all the same
    warnings = [line for line in p.stderr.splitlines() if line.startswith("kcache: WARNING")]
    for spot in spots:  # each hook met its bug, and said so once
        mine = [w for w in warnings if f"planted bug in {spot}" in w]
        assert len(mine) == 1, p.stderr[-3000:]
        assert mine[0].startswith(f"kcache: WARNING: {TORCH_HOOKS[spot]} failed (RuntimeError"), mine
    assert out["errors"] >= len(spots)


# Strict, each hook's bug in turn, in one process (one torch import, not three): every hook's
# function is replaced before torch is imported, as above, by one that raises while its spot is
# armed and is kcache's own otherwise; the spots are armed one at a time, each for the compile of
# a function of its own, and what each compile raised to the program is reported. kcache keeps
# what -march=native means for the process once asked (the ISA probes' own build asks it first):
# forgotten before each spot (hostflags.forget_answers), so that the armed memo is asked again.
TORCH_STRICT_PROGRAM = textwrap.dedent(
    """
    import json, sys, traceback

    import kcache
    from kcache.inductor import hostflags, policy, vecisa

    armed = []
    spots = sys.argv[1].split(",")
    for spot in spots:
        module, name = spot.split(".")
        owner = {"hostflags": hostflags, "policy": policy, "vecisa": vecisa}[module]

        def planted(*args, spot=spot, own=getattr(owner, name), **kwargs):
            if spot in armed:
                raise RuntimeError(f"planted bug in {spot}")
            return own(*args, **kwargs)

        setattr(owner, name, planted)

    import torch


    def f0(x):
        return torch.relu(x) * 2.0 + 1.0


    def f1(x):
        return torch.sigmoid(x) * 3.0 - 1.0


    def f2(x):
        return torch.tanh(x) + x * 0.5


    x = torch.randn(64)
    raised = {}
    for spot, f in zip(spots, (f0, f1, f2)):
        hostflags.forget_answers()
        armed[:] = [spot]
        try:
            torch.compile(f)(x)
            raised[spot] = None
        except Exception as e:  # what the program gets: torch's error, the bug in its chain
            raised[spot] = "".join(traceback.format_exception(e))
    armed.clear()
    assert kcache.is_enabled()
    print(json.dumps({"raised": raised}))
    """
)


@pytest.fixture(scope="module")
def torch_strict(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    spots = _torch_spots()
    return _run_torch(
        tmp_path_factory.mktemp("torch-strict"), spots, strict="1", program=TORCH_STRICT_PROGRAM
    )


@pytest.mark.parametrize("spot", list(TORCH_HOOKS))
def test_a_bug_in_torchs_hooks_raises_when_strict(
    torch_strict: subprocess.CompletedProcess[str], spot: str
) -> None:
    p = torch_strict
    assert p.returncode == 0, p.stderr[-3000:]  # the program caught what each compile raised
    raised = json.loads(p.stdout.strip().splitlines()[-1])["raised"][spot]
    assert raised is not None, f"the bug in {spot} was swallowed: the compile went on"
    assert f"RuntimeError: planted bug in {spot}" in raised, raised[-3000:]
    assert not [
        line for line in p.stderr.splitlines() if line.startswith("kcache: WARNING") and "planted" in line
    ]


# The triton_key memo: Triton asks for its key at every compile; a bug in the memo (planted in
# libtriton_digest, kcache's own) leaves Triton's own triton_key to answer.
def test_a_bug_in_the_triton_key_memo_is_a_warning_and_a_compile(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    p = _run(tmp_path, "keymemo.libtriton_digest", strict="0")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out["cubins"]) == 2 and all(n > 0 for n in out["cubins"])
    warnings = [line for line in p.stderr.splitlines() if line.startswith("kcache: WARNING")]
    assert warnings == [
        "kcache: WARNING: kcache's memo of triton_key failed (RuntimeError: planted bug); compiling without kcache"
    ], p.stderr[-3000:]
    assert out["errors"] == 1  # Triton keeps the key for the process: asked once


def test_a_bug_in_the_triton_key_memo_raises_when_strict(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    p = _run(tmp_path, "keymemo.libtriton_digest", strict="1")
    assert p.returncode != 0
    assert "RuntimeError: planted bug" in p.stderr, p.stderr[-3000:]
    assert "kcache: WARNING" not in p.stderr


# What kcache installs in Triton when Triton is imported (here the key component capture, which
# checks the Triton it finds): a bug there is one warning and the cache still works.
def test_a_bug_installing_into_triton_is_a_warning_and_caching_goes_on(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    p = _run(tmp_path, "components.install_component_capture", strict="0")
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out["cubins"]) == 2 and all(n > 0 for n in out["cubins"])
    warnings = [line for line in p.stderr.splitlines() if line.startswith("kcache: WARNING")]
    assert warnings == [
        "kcache: WARNING: installing kcache's key component capture failed (RuntimeError: planted bug); "
        "Triton and kcache work without it"
    ], p.stderr[-3000:]
    assert out["errors"] == 1
    assert len(list((tmp_path / "store" / "entries").rglob("__kcache__.rec"))) >= 2  # cached all the same


def test_a_bug_installing_into_triton_raises_when_strict(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    p = _run(tmp_path, "components.install_component_capture", strict="1")
    assert p.returncode != 0
    assert "RuntimeError: planted bug" in p.stderr, p.stderr[-3000:]
    assert "kcache: WARNING" not in p.stderr


# ------------------------------------------------------------------------------ the helpers
def test_fail_open_returns_the_fallback_and_counts(monkeypatch: pytest.MonkeyPatch, kcache_warnings) -> None:
    monkeypatch.setenv("KCACHE_STRICT", "0")
    before = counters.process_totals().get("kcache", {}).get("errors", 0)

    @boundary.fail_open("test-edge", "the test's edge", fallback=lambda x: x * 2)
    def edge(x: int) -> int:
        raise KeyError("bug")

    assert edge(3) == 6 and edge(4) == 8
    assert counters.process_totals()["kcache"]["errors"] == before + 2
    assert [m for m in kcache_warnings if "the test's edge failed" in m] == [
        "the test's edge failed (KeyError: 'bug'); compiling without kcache"
    ]


def test_guarded_swallows_unless_strict(monkeypatch: pytest.MonkeyPatch, kcache_warnings) -> None:
    monkeypatch.setenv("KCACHE_STRICT", "0")
    with boundary.guarded("test-block", "the test's block"):
        raise ValueError("bug")
    assert any("the test's block failed (ValueError: bug)" in m for m in kcache_warnings)
    monkeypatch.setenv("KCACHE_STRICT", "1")
    with pytest.raises(ValueError, match="bug"), boundary.guarded("test-block", "the test's block"):
        raise ValueError("bug")

    @boundary.fail_open("test-edge-2", "the test's edge")
    def edge() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        edge()


def test_a_guard_around_a_librarys_function_lets_a_strict_bug_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where kcache calls one of torch's functions broadly guarded (torch's own errors are not
    kcache's to report) and that function calls back into an edge of kcache's, a bug raised there
    under strict goes on (torch's warm-up calling kcache's wakeup, torch's autotune-cache read
    calling kcache's lookup)."""
    pytest.importorskip("torch")
    from kcache.inductor import torchcall

    monkeypatch.setenv("KCACHE_STRICT", "1")

    def torch_function() -> None:  # torch's, calling back into kcache, and wrapping what it meets
        try:
            with boundary.guarded("test-callback", "the test's callback"):
                raise KeyError("bug")
        except KeyError as e:
            raise RuntimeError("torch's wrapper") from e

    with pytest.raises(RuntimeError, match="torch's wrapper") as info:
        torchcall.own(torch_function)
    assert boundary.raised_strict(info.value)

    def torch_own_error() -> None:
        raise ValueError("torch's own")

    with pytest.raises(torchcall.TorchRaised):  # fails open, strict or not
        torchcall.own(torch_own_error)
    assert not boundary.raised_strict(ValueError("torch's own"))


# ------------------------------------------------------------------------------ what strict found
def test_the_suite_runs_strict() -> None:
    assert os.environ.get("KCACHE_STRICT") == "1"  # tests/conftest.py; children get it via clean_env


def test_inductor_uninstall_undoes_every_part() -> None:
    """kcache.disable() swallowed an AttributeError here (graphs had no uninstall): torch's
    backends, switches and compile-pool hooks were left kcache's."""
    pytest.importorskip("torch")
    from kcache import inductor
    from kcache.inductor import graphs, workers

    graphs.hold("pt2:fx-graph-v1::k:c1", b"held")
    undone = []
    real = workers.uninstall
    try:
        workers.uninstall = lambda: undone.append(True)  # the part after graphs in the order
        inductor.uninstall()
    finally:
        workers.uninstall = real
    assert undone == [True]
    assert graphs.take("pt2:fx-graph-v1::k:c1") is None
