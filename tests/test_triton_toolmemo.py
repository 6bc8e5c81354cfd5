"""The ``--version`` memo for Triton's CUDA tools: exact output, served across processes,
asked again when the binary changes, and nothing else intercepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Triton is a dependency of kcache on Linux (pyproject.toml) and CI installs it (.ci/run): these
# tests skip only where Triton does not exist (other platforms), never in CI.
pytest.importorskip("triton")

import kcache  # noqa: E402
from kcache.triton.toolmemo import _MemoSubprocess  # noqa: E402


@pytest.fixture
def enabled(tmp_path: Path):
    assert kcache.enable(dir=tmp_path / "store", triton=False)
    yield kcache.active_store()
    kcache.disable()


def _tool(path: Path, text: str) -> Path:
    path.write_text(f"#!/bin/sh\necho '{text}' \"$@\" >> {path}.calls\necho '{text}'\n")
    path.chmod(0o755)
    return path


def test_same_output_memoised_and_refreshed_when_the_binary_changes(enabled, tmp_path: Path) -> None:
    tool = _tool(tmp_path / "ptxas", "release 12.8, V12.8.93")
    proxy = _MemoSubprocess(subprocess)
    first = proxy.check_output([str(tool), "--version"])
    assert first == subprocess.check_output([str(tool), "--version"])
    calls = (tmp_path / "ptxas.calls").read_text().count("\n")
    assert proxy.check_output([str(tool), "--version"]) == first
    assert (tmp_path / "ptxas.calls").read_text().count("\n") == calls  # served from the store
    _tool(tool, "release 13.0, V13.0.1")
    os.utime(tool, ns=(1, 2))  # a replaced binary: other mtime/ctime
    assert proxy.check_output([str(tool), "--version"]) == b"release 13.0, V13.0.1\n"


def _runs(tool: Path) -> int:
    """How many times the tool has run (each run appends a line)."""
    calls = Path(f"{tool}.calls")
    return calls.read_text().count("\n") if calls.exists() else 0


def test_other_calls_pass_through(enabled, tmp_path: Path) -> None:
    """Every call but ``check_output([path, "--version"], stderr=...)`` runs the tool each time,
    even when its answer is one the memo would keep; and an answer without ``release X.Y`` is
    never served from the memo. (Each call is made twice and the tool's runs are counted: a
    memo that answered the second would leave the count alone.)"""
    tool = _tool(tmp_path / "tool", "release 12.8, V12.8.93")
    proxy = _MemoSubprocess(subprocess)
    for args, rest, kwargs in [
        ([str(tool), "--help"], (), {}),
        ([str(tool), "--version", "--verbose"], (), {}),
        ([str(tool), "--version"], (), {"text": True}),
        ([str(tool), "--version"], (), {"cwd": str(tmp_path)}),
        ([str(tool), "--version"], (-1,), {}),  # a positional argument (bufsize)
        (f"{tool} --version", (), {"shell": True}),
    ]:
        for _ in range(2):
            n = _runs(tool)
            out = proxy.check_output(args, *rest, **kwargs)
            assert out in (b"release 12.8, V12.8.93\n", "release 12.8, V12.8.93\n"), (args, kwargs)
            assert _runs(tool) == n + 1, f"{args} {rest} {kwargs} was answered without running the tool"
    # the contrast: the memoised form runs the tool once
    n = _runs(tool)
    assert proxy.check_output([str(tool), "--version"]) == proxy.check_output([str(tool), "--version"])
    assert _runs(tool) == n + 1
    odd = _tool(tmp_path / "odd", "x")  # not a CUDA tool's answer: asked every time
    for _ in range(2):
        n = _runs(odd)
        assert proxy.check_output([str(odd), "--version"], stderr=subprocess.STDOUT) == b"x\n"
        assert _runs(odd) == n + 1
    with pytest.raises(FileNotFoundError):
        proxy.check_output([str(tmp_path / "missing"), "--version"])
    assert proxy.PIPE is subprocess.PIPE


CHILD = textwrap.dedent(
    """
    import json, subprocess
    calls = []
    real = subprocess.check_output
    def counting(args, *a, **k):
        calls.append(list(args))
        return real(args, *a, **k)
    subprocess.check_output = counting
    import triton
    from triton import knobs
    from triton.backends.nvidia import compiler
    v = compiler.get_ptxas_version(90)
    tool = knobs.nvidia.ptxas
    print(json.dumps({"version": v, "tool": tool.version, "spawned": sum(c[-1] == "--version" for c in calls)}))
    """
)


def test_second_process_spawns_no_ptxas(tmp_path: Path) -> None:
    env = {**os.environ, "KCACHE": "1", "KCACHE_DIR": str(tmp_path / "store")}
    env.pop("TRITON_CACHE_MANAGER", None)
    runs = []
    for _ in range(2):
        p = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120
        )
        assert p.returncode == 0, p.stderr
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0]["version"] == runs[1]["version"] and runs[0]["tool"] == runs[1]["tool"]
    assert runs[0]["spawned"] >= 1
    assert runs[1]["spawned"] == 0
    plain = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={k: v for k, v in env.items() if k != "KCACHE"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(plain.stdout.strip().splitlines()[-1])["version"] == runs[1]["version"]
