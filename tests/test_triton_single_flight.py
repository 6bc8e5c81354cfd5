"""Single flight across processes: processes that miss on the same kernels at once compile each
kernel once in all (counted: kcache's puts and Triton's own compile verdicts), and a process that
dies holding a kernel's lock does not hold the others up."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

# Triton is a dependency of kcache on Linux (pyproject.toml) and CI installs it (.ci/run): these
# tests skip only where Triton does not exist (other platforms), never in CI.
pytest.importorskip("triton")

from kernels.harness import (  # noqa: E402
    PYTHON,
    clean_env,
    entries_by_kind,
    release_barrier,
    start_kernels,
)

KERNELS = "add,row_sum,matmul_64x64x32"


@pytest.mark.parametrize("rotate", [False, True], ids=["same-order", "rotated"])
def test_four_cold_processes_compile_each_kernel_once(tmp_path: Path, rotate: bool) -> None:
    store = tmp_path / "store"
    env = clean_env(tmp_path, kcache_dir=store)
    barrier = tmp_path / "go"
    procs = [
        start_kernels(env, tmp_path / f"p{i}.json", specs=KERNELS, barrier=barrier, rotate=i if rotate else 0)
        for i in range(4)
    ]
    release_barrier(barrier, procs)
    for p in procs:
        p.wait(timeout=300)
        assert p.returncode == 0, p.stderr.read() if p.stderr else ""
    results = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in range(4)]
    n = len(KERNELS.split(","))
    puts = sum(r["process"].get("triton", {}).get("puts", 0) for r in results)
    compiled = sum(x["cache_hit"] is False for r in results for x in r["results"])
    assert puts == n, f"{puts} compiles stored for {n} kernels"
    assert compiled == n, f"Triton compiled {compiled} times for {n} kernels"
    for r in results:
        assert [x["error"] for x in r["results"]] == [None] * n
        assert r["process"]["triton"].get("hits", 0) + r["process"]["triton"].get("puts", 0) == n
    cubins = {(x["label"], x["cubin_sha256"]) for r in results for x in r["results"]}
    assert len(cubins) == n  # every process got the same binary for each kernel
    assert entries_by_kind(store)["triton"] == n


def test_a_process_killed_while_holding_a_kernel_lock_does_not_block_the_others(tmp_path: Path) -> None:
    """Three processes miss on a kernel whose lock a live process holds: they wait (none compiles
    it), and once the holder is killed exactly one of them compiles it and the others get it from
    the store, without waiting out the lock's bound (it would say so in a warning). Checked by
    what each process did, not by how long it took."""
    store = tmp_path / "store"
    env = clean_env(tmp_path, kcache_dir=store)
    flag = tmp_path / "holding"
    barrier = tmp_path / "go"
    holder = subprocess.Popen(
        [PYTHON, "-m", "kernels.holder", "add", str(flag)], env=env, stderr=subprocess.PIPE, text=True
    )
    waiters: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 120  # a hang guard only
        while not flag.exists():
            assert holder.poll() is None, holder.stderr.read() if holder.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # Started together (Triton's key computed, then a barrier): all look the kernel up at once.
        waiters = [
            start_kernels(env, tmp_path / f"w{i}.json", specs="add,row_sum", barrier=barrier)
            for i in range(3)
        ]
        release_barrier(barrier, waiters)
        time.sleep(2.0)  # time to reach the lock; they wait on it for up to LOCK_TIMEOUT_S (120 s)
        assert all(w.poll() is None for w in waiters), "the others did not wait for the lock holder"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    errs = []
    for w in waiters:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
        errs.append(err)
    # The holder's lock went with it: nobody waited out the lock's bound (which warns, then compiles).
    assert not [e for e in errs if "compiling the same kernel" in e], errs
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(3)]
    add = [r["results"][0] for r in results]
    assert all(a["label"] == "add" and a["error"] is None for a in add)
    # one of them compiled it (Triton's own verdict), the others got it from the store
    assert sorted(a["cache_hit"] for a in add) == [False, True, True], add
    assert sorted(a["kcache"]["hits"] for a in add) == [0, 1, 1], add
    assert sum(a["kcache"]["puts"] for a in add) == 1
    assert len({a["cubin_sha256"] for a in add}) == 1
    assert sum(r["process"]["triton"].get("puts", 0) for r in results) == 2
