"""Crashes (issue 10, point 1): processes killed with SIGKILL while they write records, files,
groups and index rows. Afterwards every read is a correct hit or a miss, never wrong bytes; no
acknowledged entry is lost; ``kcache verify --fix`` leaves a clean store.

The chaos tool's workers put entries whose bytes are a function of their key, so whatever is
served can be checked. ``tools/chaos.py --full`` runs 250 trials; CI runs the same code smaller.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import PYTHON, base_env, compile_in_child, kenv, no_traceback, run_py, warning_lines


def test_random_kills_ci(tmp_path: Path, chaos: Any) -> None:
    """24 trials: half killed after a random delay, half at a random write-side event (a rename,
    a mkdir, half of a file write, an SQLite statement...); every 4th with two writers on a store
    under a tiny size bound (eviction running). Beside a busy loop and an fsync-heavy writer, working
    while the workers write: CI's box is loaded, and the timing of the workers' flush threads
    decides where kills land.

    Seed 11 (and seed 10 under load in CI once) failed with one acknowledged entry "lost": the
    journal of acknowledged puts was written through the kill points, so a kill cut a journal
    line in half, and the next trial's first line (a removal started) ran into it. The test's own
    record, not the store, lost it (see test_every_write_point_of_the_first_operations)."""
    r = chaos.phase_crash(tmp_path, 24, seed=10, log=lambda m: None, load=1)
    assert r["failures"] == []
    assert r["trials"] == 24 and r["kills"] >= 24 and r["load_processes"] == 2
    assert r["load_windows"] == 24, r  # the load worked beside every trial's workers
    assert r["kills_at_write_point"] >= 10, r  # the point kills landed inside writes
    assert r["read_wrong"] == 0 and r["read_acked_lost"] == 0 and r["torn_entries_visible"] == 0
    assert r["read_present_missed"] == 0 and r["read_failed_open"] == 0, r
    assert r["read_hits"] > 0  # the workers did commit entries between the kills
    for name in ("main", "evict"):
        assert r[f"verify_{name}"]["clean_after_fix"], r[f"verify_{name}"]
        assert r[f"final_read_{name}"]["wrong"] == 0


def test_every_write_point_of_the_first_operations(tmp_path: Path, chaos: Any) -> None:
    """Deterministic: the same worker (same seed) killed at its 1st, 2nd, ... 40th write-side
    event, each run continuing on the store the previous one left. Every step of the first puts
    (member writes, record write, the rename into place, the index transaction) is a kill point."""
    root = str(tmp_path / "store")
    journal = str(tmp_path / "journal.txt")
    kill_log = str(tmp_path / "kills.txt")
    scratch = str(tmp_path / "scratch")
    os.makedirs(scratch)
    chaos.open_store(root).close()
    for n in range(1, 41):
        p = chaos._spawn_worker(
            root,
            1234,
            keys=6,
            max_size=1 << 40,
            mix="crash",
            journal=journal,
            kill_at=n,
            kill_log=kill_log,
            warm=True,
            scratch=scratch,
        )
        assert chaos._wait_ready(p)
        try:
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        err = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
        assert p.returncode == -signal.SIGKILL, err
        assert "Traceback" not in err, err
        _n, problems = chaos.scan_entries(root)
        assert problems == [], (n, problems)
        rb = chaos.read_back(root, 6, chaos.journal_state(journal))
        assert rb["wrong"] == 0 and rb["acked_lost"] == 0 and rb["present_missed"] == 0, (n, dict(rb))
        # The journal (the record of what was acknowledged) is never cut by a kill: every line
        # whole. Its writes were kill points before, and a torn line swallowed the next one.
        text = Path(journal).read_text() if os.path.exists(journal) else ""
        assert text == "" or text.endswith("\n"), (n, text[-80:])
        for line in text.splitlines():
            op, kind, key = line.split(" ")
            assert op in ("A", "R") and kind in chaos.KINDS and key.startswith("chaos/key-"), (n, line)
    kinds = set(Path(kill_log).read_text().split())
    assert {"mkdir", "write", "rename", "sql"} <= kinds, kinds
    v = chaos.verify(root, fix=True)
    after = chaos.verify(root, fix=False)
    assert after["ok"] and not after["problems"], (v, after)
    assert os.listdir(os.path.join(root, "tmp")) == []


@pytest.mark.slow
def test_triton_compiles_killed_midway(tmp_path: Path, chaos: Any, reference_kernels: dict) -> None:
    """Real Triton compiles through KCACHE=1, killed at random moments (while groups are being
    staged and committed); a fresh process then gets exactly the kernels Triton alone builds."""
    store = tmp_path / "store"
    specs = chaos.kernel_specs(6)
    env = kenv(tmp_path, store)
    code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("kcache_chaos", {str(chaos.HERE)!r})
chaos = importlib.util.module_from_spec(spec); spec.loader.exec_module(chaos)
import triton
print("READY", flush=True)
for s in {[list(s) for s in specs]!r}:
    chaos.compile_kernel(tuple(s))
"""
    import random

    rng = random.Random(7)
    for _ in range(6):
        p = subprocess.Popen(
            [PYTHON, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert p.stdout.readline().strip() == "READY"
        time.sleep(rng.uniform(0.0, 1.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        assert "Traceback" not in p.stderr.read()
        p.stderr.close()
    out, r = compile_in_child(specs, env)
    assert out["enabled"] and len(out["kernels"]) == len(specs)
    for name, digest in out["kernels"].items():
        assert digest == reference_kernels[name], name
    assert warning_lines(r.stderr) == []
    v = chaos.verify(store, fix=True)
    assert chaos.verify(store, fix=False)["ok"], v


def test_dead_lock_holder_does_not_block_the_next_compile(tmp_path: Path) -> None:
    """A process that missed on a kernel holds its single-flight lock while compiling; killed
    there, the lock goes with it (flock): the next process takes the lock itself, it does not wait
    out the bound (120 s; 10 s here), which would end without the lock and with a warning. What it
    got is checked, not how long it took (machines are shared)."""
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    holder = """
import sys, time, triton
from kcache.triton.manager import KcacheCacheManager
m = KcacheCacheManager("K" * 52)
assert m.get_group("k.json") is None  # a miss: this process now holds the kernel's lock
print("LOCKED", flush=True)
time.sleep(600)
"""
    p = subprocess.Popen(
        [PYTHON, "-c", holder], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "LOCKED", p.stderr.read()
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()
    r = run_py(
        """
import json, triton
import kcache.triton.manager as mm
import kcache.store.cache as sc
sc.LOCK_TIMEOUT_S = 10.0
m = mm.KcacheCacheManager("K" * 52)
assert m.get_group("k.json") is None
print(json.dumps({"locked": m._flight is not None and m._flight.held}))
""",
        env,
    )
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"locked": True}, r.stderr
    assert warning_lines(r.stderr) == []


def test_hung_lock_holder_is_waited_for_a_bounded_time(tmp_path: Path) -> None:
    """A live holder that never finishes: the next process waits at most LOCK_TIMEOUT_S (120 s;
    2 s here), warns once and compiles itself. Checked without an upper bound on time (machines
    are shared): the one wait is given LOCK_TIMEOUT_S and ends without the lock, and it did last
    that long (a lower bound, which a slow machine cannot break)."""
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    holder = """
import time, triton
from kcache.triton.manager import KcacheCacheManager
m = KcacheCacheManager("H" * 52)
assert m.get_group("h.json") is None
print("LOCKED", flush=True)
time.sleep(600)
"""
    p = subprocess.Popen(
        [PYTHON, "-c", holder], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout.readline().strip() == "LOCKED"
        r = run_py(
            """
import time, json, triton
import kcache.store.locks as locks
import kcache.triton.manager as mm
import kcache.store.cache as sc
sc.LOCK_TIMEOUT_S = 2.0
acquires = []
real = locks.Lock.acquire
def acquire(self, timeout, poll=None):
    got = real(self, timeout, poll)
    acquires.append([timeout, got])
    return got
locks.Lock.acquire = acquire
t = time.monotonic()
m = mm.KcacheCacheManager("H" * 52)
assert m.get_group("h.json") is None
waited = time.monotonic() - t
print(json.dumps({"waited": waited, "acquires": acquires, "locked": m._flight is not None and m._flight.held}))
""",
            env,
        )
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
        p.stderr.close()
    no_traceback(r)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["acquires"] == [[2.0, False]] and not out["locked"], out  # one wait, bounded, no lock
    assert out["waited"] >= 2.0, out  # it did wait for the holder
    lines = warning_lines(r.stderr)
    assert len(lines) == 1 and "compiling the same kernel" in lines[0], r.stderr


def test_kill_during_verify_fix(tmp_path: Path, chaos: Any) -> None:
    """`kcache verify --fix` killed while it repairs: a later run still repairs, nothing wrong is
    served."""
    root = tmp_path / "store"
    st = chaos.open_store(root)
    for i in range(40):
        for kind in chaos.KINDS:
            st.put(kind, chaos.key_name(i), chaos.expected(kind, chaos.key_name(i)))
    st.close()
    # Damage: the index deleted (verify --fix rebuilds it) and a few entries broken.
    import random
    import shutil

    rng = random.Random(3)
    shutil.rmtree(root / "index")
    st = chaos.open_store(root)
    for i in range(6):
        chaos.corrupt_entry(st, "chaos", chaos.key_name(i), chaos.CORRUPTIONS[i], rng, str(tmp_path))
    st.close()
    env = base_env(tmp_path)
    for delay in (0.05, 0.15, 0.3):
        p = subprocess.Popen(
            [PYTHON, "-m", "kcache", "verify", "--fix", "--dir", str(root)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        assert "Traceback" not in p.stderr.read()
        p.stderr.close()
    assert chaos.verify(root, fix=True)["rc"] in (0, 1)
    after = chaos.verify(root, fix=False)
    assert after["ok"], after
    rb = chaos.read_back(str(root), 40, None)
    assert rb["wrong"] == 0 and rb["hits"] >= 2 * 40 - 6
    r = run_py("import kcache, json; print(json.dumps(kcache.stats()['entries']))", kenv(tmp_path, root))
    assert int(r.stdout.strip()) == rb["hits"], r.stderr
