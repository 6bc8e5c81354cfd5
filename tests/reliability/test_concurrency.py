"""Concurrency (issue 10, point 3): several processes on one store doing puts, hits, groups,
removals, eviction under a tiny size bound, verify and stats; and real Triton compiles in several
processes sharing kernels. No error reaches the caller, no wrong bytes, verify clean after.

``tools/chaos.py --full`` runs 8 processes x 2,000 operations and 8 Triton processes x 12
kernels; these are the CI sizes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from .conftest import PYTHON, base_env, warning_lines


def test_mixed_operations_ci(tmp_path: Path, chaos: Any) -> None:
    """4 processes x 300 operations, 384 KiB bound, 1 s grace period (eviction really runs)."""
    r = chaos.phase_concurrency(tmp_path, 4, 300, seed=12, log=lambda m: None)
    assert r["failures"] == [], r["failures"][:5]
    assert r["errors_to_caller"] == 0
    assert r["wrong_bytes"] == 0
    assert r["verified_hits"] > 100 and r["puts_acked"] > 100
    assert r["warnings"].get("corrupt", 0) == 0  # no false alarm from entries removed mid-read
    assert r["clean_after_fix"]
    assert r["bytes_after_final_eviction"] <= r["max_size"]
    # A hit whose files a concurrent *explicit* removal took is the remover's doing; eviction must
    # not do it to an entry hit within the grace period (shortened here to 1 s: reported, and
    # documented in docs/reliability.md with the full run's figures).
    assert sum(r["vanished_by_cause"].values()) == r["vanished_after_hit"]


def test_triton_processes_share_kernels_ci(tmp_path: Path, chaos: Any) -> None:
    """4 processes compile the same 3 kernels twice each, in random orders, with KCACHE=1: every
    process gets byte-identical kernels, equal to Triton's own compile; each kernel is compiled
    once (single flight), the rest are hits."""
    r = chaos.phase_triton(tmp_path, 4, 3, seed=13, log=lambda m: None)
    assert r["failures"] == []
    assert r["kernel_mismatches"] == 0
    assert r["triton_group_misses"] + r["triton_group_hits"] == 4 * 3 * 2
    assert r["triton_group_misses"] <= 3 + 1  # one compile per kernel (a lock timeout could add one)
    assert r["verify_ok"]


def test_many_processes_create_one_store_at_once(tmp_path: Path) -> None:
    """The ranks of a job start together on a store that does not exist yet: all of them get it,
    none warns."""
    store = tmp_path / "fresh" / "store"
    code = """
import json, kcache
ok = kcache.enable(triton=False, nvfuser=False)
st = kcache.active_store()
h = st.put("chaos", "k", {"a.bin": b"x" * 100}) if ok else None
print(json.dumps([ok, h is not None]))
"""
    env = base_env(tmp_path, KCACHE_DIR=str(store))
    procs = [
        subprocess.Popen(
            [PYTHON, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert "Traceback" not in err, err
        assert json.loads(out) == [True, True], err
        assert warning_lines(err) == [], err


def test_verify_fix_while_writers_run_never_removes_a_good_entry(tmp_path: Path, chaos: Any) -> None:
    """`kcache verify --fix` run while two processes put and read: every entry a writer was
    handed back (acknowledged) is still there and exact afterwards, and the store verifies clean.
    (What verify reports while writers run may include their in-between states: a row not yet
    written, an entry not yet indexed; it must never take a complete entry for a corrupt one.)"""
    root = str(tmp_path / "store")
    journal = str(tmp_path / "journal.txt")
    chaos.open_store(root).close()
    ps = [
        chaos._spawn_worker(
            root,
            500 + w,
            keys=32,
            max_size=1 << 40,
            mix="writers",
            ops=300,
            journal=journal,
            scratch=str(tmp_path / "s"),
        )
        for w in range(2)
    ]
    for p in ps:
        assert chaos._wait_ready(p)
    reported = []
    for _ in range(3):
        v = chaos.verify(root, fix=True)
        reported += [p["type"] for p in v.get("problems", [])]
    for p in ps:
        _out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "Traceback" not in err, err
    rb = chaos.read_back(root, 32, chaos.journal_state(journal))
    assert rb["wrong"] == 0 and rb["acked_lost"] == 0, (dict(rb), reported)
    after = chaos.verify(root, fix=True)
    assert chaos.verify(root, fix=False)["ok"], after
