"""Helpers for the Triton tests: clean environments, running :mod:`kernels.run` in fresh
processes, and reading a store's entries. Imported by tests (``tests/`` is on ``sys.path``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

# The least metadata Triton 3.4-3.9's loader and CUDA launcher take for an sm_90 kernel (kcache
# serves no group without it): a group's ``<name>.json`` in tests that build groups by hand.
MIN_META: dict[str, Any] = {
    "name": "k",
    "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
    "num_warps": 4,
    "num_ctas": 1,
    "shared": 0,
    "global_scratch_size": 0,
    "global_scratch_align": 1,
    "profile_scratch_size": 0,
    "profile_scratch_align": 1,
    "launch_cooperative_grid": False,
    "launch_pdl": False,
    "warp_size": 32,
    "cluster_dims": [1, 1, 1],  # Triton 3.4 and 3.5's pack_metadata read it
}

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO = TESTS_DIR.parent
PYTHON = sys.executable


def clean_env(tmp: Path, *, kcache_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """os.environ without KCACHE_* (but KCACHE_STRICT) / TRITON_* settings, HOME and caches inside ``tmp``, ``tests/``
    on PYTHONPATH, and kcache on (``KCACHE=1``) when ``kcache_dir`` is given."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env["HOME"] = str(tmp / "home")
    env["XDG_CACHE_HOME"] = str(tmp / "xdg")
    env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
    env["PYTHONPATH"] = str(TESTS_DIR)
    env["PYTHONWARNINGS"] = "ignore"
    if kcache_dir is not None:
        env["KCACHE"] = "1"
        env["KCACHE_DIR"] = str(kcache_dir)
    env.update(extra)
    return env


def run_kernels(
    env: dict[str, str],
    out: Path,
    *,
    specs: str | None = None,
    plan: list[dict[str, Any]] | None = None,
    child: bool = False,
    barrier: Path | None = None,
    timeout: float = 300,
    check: bool = True,
) -> dict[str, Any]:
    """Run ``python -m kernels.run`` in a fresh process; its JSON result (with its stderr)."""
    cmd = [PYTHON, "-m", "kernels.run", "--out", str(out)]
    if specs:
        cmd += ["--specs", specs]
    if plan is not None:
        pf = out.with_suffix(".plan.json")
        pf.write_text(json.dumps(plan))
        cmd += ["--plan", str(pf)]
    if child:
        cmd.append("--child")
    if barrier is not None:
        cmd += ["--barrier", str(barrier)]
    proc = subprocess.run(cmd, env=env, cwd=str(out.parent), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"kernels.run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text()) if out.exists() else {}
    result["stderr"] = proc.stderr
    result["rc"] = proc.returncode
    return result


def start_kernels(
    env: dict[str, str], out: Path, *, specs: str, barrier: Path | None = None, rotate: int = 0
) -> subprocess.Popen:
    """Start ``python -m kernels.run`` without waiting (single-flight tests)."""
    cmd = [PYTHON, "-m", "kernels.run", "--out", str(out), "--specs", specs, "--rotate", str(rotate)]
    if barrier is not None:
        cmd += ["--barrier", str(barrier)]
    return subprocess.Popen(
        cmd, env=env, cwd=str(out.parent), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def by_label(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["label"]: r for r in result["results"]}


def entries_by_kind(store_dir: Path) -> Counter[str]:
    """How many committed entries of each kind the store at ``store_dir`` holds (read from disk)."""
    from kcache.store.records import RECORD_NAME, Record

    kinds: Counter[str] = Counter()
    root = store_dir / "entries"
    if not root.is_dir():
        return kinds
    for shard in root.iterdir():
        for entry in shard.iterdir():
            rec = entry / RECORD_NAME
            if rec.is_file():
                kinds[Record.decode(rec.read_bytes()).kind] += 1
    return kinds


def entries_of_kind(store_dir: Path, kind: str) -> list[tuple[Path, Any]]:
    """(entry directory, record) of every entry of ``kind``."""
    from kcache.store.records import RECORD_NAME, Record

    out = []
    root = store_dir / "entries"
    for shard in sorted(root.iterdir()) if root.is_dir() else []:
        for entry in sorted(shard.iterdir()):
            rec_path = entry / RECORD_NAME
            if rec_path.is_file():
                rec = Record.decode(rec_path.read_bytes())
                if rec.kind == kind:
                    out.append((entry, rec))
    return out


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def release_barrier(barrier: Path, procs: list[subprocess.Popen], timeout: float = 300) -> None:
    """Wait until every process is ready (``<barrier>.ready.<pid>``), then let them all go."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        ready = {p.pid for p in procs if Path(f"{barrier}.ready.{p.pid}").exists()}
        if len(ready) == len(procs):
            break
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            err = dead[0].stderr.read() if dead[0].stderr else ""
            raise AssertionError(f"a process exited before the barrier: {err[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError("processes did not get ready in time")
        time.sleep(0.01)
    barrier.touch()
