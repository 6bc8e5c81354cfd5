#!/usr/bin/env python
"""Chaos runs against the kcache store: crashes, corruption, concurrency, faults, Triton.

    python tools/chaos.py            # the CI-sized run (about a minute on 2 cores)
    python tools/chaos.py --full     # the figures of docs/reliability.md
    python tools/chaos.py --only crash,corrupt --json out.json

Every entry written here has content that is a pure function of its (kind, key): member names,
sizes and bytes are expanded from sha256 of the key. Whatever the store serves can therefore be
checked byte for byte, by any process, at any time: a hit is either exactly right or it is
"wrong bytes", which must never happen.

Phases (each counts the faults it injected and what it saw), one module each beside this file, by
what it attacks; what they share (entries of known content, the store's checks) is chaos_base.py:

crash (chaos_kills.py; the worker it kills: chaos_worker.py)
    A worker process puts, groups, reads, removes, evicts and flushes random entries; the parent
    kills it with SIGKILL, either after a random delay or at the N-th write-side event (rename,
    mkdir, link, utime, unlink, a file write cut in half, an SQLite statement), chosen at random,
    so that kills land inside commits, index transactions and removals. After every trial the
    parent reads every key (a hit must be byte-exact), checks that every committed entry
    directory is complete, and that every put the worker acknowledged (``put`` returned a hit,
    and the worker logged it) is still there unless a removal of it was started. Every 4th trial
    runs two workers at once on a store with a tiny size bound (eviction on), one killed. At the
    end ``kcache verify --fix`` must leave a clean store. The workers write beside a busy loop and
    an fsync-heavy writer (a loaded box); an acknowledged entry that reads as a miss is counted as
    lost when its folder is gone, and as a present entry read as a miss (a lookup that failed
    open) when it is not: both are failures.
corrupt (chaos_damage.py)
    Random damage to random entries (flipped byte, truncation, deleted member, garbage or
    foreign record, member or record replaced by a symlink, extra file) and to the index
    (garbage over its database, index deleted): each must be found by ``verify``, read as a miss
    with one warning, and leave a store that caches again.
concurrency (chaos_kills.py)
    8 processes x 2,000 mixed operations (puts, hits, groups, removals, eviction under a tiny
    size bound, verify, stats) on one store: no exception reaches the caller, no wrong bytes,
    no false alarm, verify clean after.
triton (chaos_triton.py)
    Real Triton compiles (``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``,
    no GPU needed) through ``KCACHE=1`` in 8 processes sharing kernels: every process gets
    byte-identical kernels, equal to a compile without kcache.
faults (chaos_faults.py)
    A full disk (a 2 MiB tmpfs when root can mount one, else RLIMIT_FSIZE), and the index held
    under ``BEGIN EXCLUSIVE`` by another process: puts and hits never raise, never serve wrong
    bytes, and never wait longer than the bound (see docs/reliability.md).
links (chaos_links.py)
    The store's folders and files replaced by links to victim files, by
    this user and by a second one; a store swapped after it was opened; folders others can write;
    exports through planted names: no victim file changes, no planted launcher runs.
inputs (chaos_inputs.py)
    Poisoned machine-local answers in bundles and the shared tier, inputs
    that are FIFOs or devices, memory bombs, a process whose clock runs an hour ahead, a full disk.
hostile (chaos_redis.py)
    A hostile Redis against concurrent real compiles on several "machines",
    with and without ``KCACHE_SECRET``: planted locks, faked heartbeats, huge values, bad records,
    ``CLIENT PAUSE``, ``DEBUG SLEEP``, SIGSTOP, ``FLUSHALL`` storms, restarts, ``noeviction``, a
    link that trickles bytes, a worker SIGKILLed: 0 crashes, 0 wrong bytes, 0 stalls beyond the
    bound (kcache's own time in Redis calls and fruitless waits, per process).

Exit status: 0 when every invariant held, 1 otherwise (the report says which).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()  # this file: what child processes load, and spawn as workers
REPO = HERE.parents[1]
for _path in (str(REPO), str(HERE.parent)):  # kcache from this checkout; the phases beside this file
    if _path not in sys.path:
        sys.path.insert(0, _path)

# The phases, one module each by what it attacks; their names stay importable from here (the
# reliability tests and the child processes of every phase load this file and use them).
from chaos_base import (  # noqa: E402
    KINDS,
    RECORD_NAME,
    capture_warnings,
    check_hit,
    expected,
    key_name,
    open_store,
    quiet_kcache_logger,
    scan_entries,
    verify,
    warning_kinds,
)
from chaos_damage import CORRUPTIONS, corrupt_entry, phase_corrupt  # noqa: E402
from chaos_faults import FULL_DISK_CHILD, _grow_tmpfs, phase_faults  # noqa: E402
from chaos_kills import (  # noqa: E402
    _spawn_worker,
    _wait_ready,
    journal_state,
    machine_load,
    phase_concurrency,
    phase_crash,
    read_back,
)
from chaos_triton import (  # noqa: E402
    KERNELS,
    compile_kernel,
    kernel_digest,
    kernel_specs,
    phase_triton,
    triton_worker_main,
)
from chaos_worker import KillPoints, Worker, worker_main  # noqa: E402

__all__ = [
    "CORRUPTIONS",
    "FULL_DISK_CHILD",
    "HERE",
    "KERNELS",
    "KINDS",
    "RECORD_NAME",
    "REPO",
    "KillPoints",
    "Worker",
    "_grow_tmpfs",
    "_spawn_worker",
    "_wait_ready",
    "capture_warnings",
    "check_hit",
    "compile_kernel",
    "corrupt_entry",
    "expected",
    "journal_state",
    "kernel_digest",
    "kernel_specs",
    "key_name",
    "machine_load",
    "open_store",
    "phase_concurrency",
    "phase_corrupt",
    "phase_crash",
    "phase_faults",
    "phase_triton",
    "read_back",
    "scan_entries",
    "verify",
    "warning_kinds",
]

# REEXPORTS#

# ----------------------------------------------------------------------------------- main

SIZES = {
    # name: (crash trials, corruptions, conc procs, conc ops, triton procs, triton kernels, fault rounds)
    "ci": (24, 26, 4, 300, 4, 3, 1),
    "full": (250, 208, 8, 2000, 8, 12, 5),
}


def run(phases: list[str], size: str, seed: int, base: Path, log: Callable[[str], None]) -> dict[str, Any]:
    ct, cc, cp, co, tp, tk, fr = SIZES[size]
    report: dict[str, Any] = {
        "size": size,
        "seed": seed,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "phases": {},
    }
    t0 = time.perf_counter()
    for ph in phases:
        d = base / ph
        d.mkdir(parents=True, exist_ok=True)
        if ph == "crash":
            report["phases"][ph] = phase_crash(d, ct, seed, log, load=1)  # a loaded box, as CI is
        elif ph == "corrupt":
            full = size == "full"
            report["phases"][ph] = phase_corrupt(
                d, cc, seed, log, index_rounds=4 if full else 1, rebuild_entries=5000 if full else 0
            )
        elif ph == "concurrency":
            report["phases"][ph] = phase_concurrency(d, cp, co, seed, log)
        elif ph == "triton":
            report["phases"][ph] = phase_triton(d, tp, tk, seed, log)
        elif ph == "faults":
            report["phases"][ph] = phase_faults(d, fr, seed, log)
        elif ph == "links":  # issues 16 and 17: planted links, swapped folders, second user
            from chaos_links import phase_links

            report["phases"][ph] = phase_links(d, seed, log)
        elif ph == "inputs":  # issue 18: hostile bundles, memory bombs, clock skew, full disks
            from chaos_inputs import phase_inputs

            report["phases"][ph] = phase_inputs(d, seed, log)
        elif ph == "hostile":  # issue 24: a hostile or failing Redis under concurrent compiles
            from chaos_redis import phase_hostile

            report["phases"][ph] = phase_hostile(d, seed, log, size)
        else:
            raise SystemExit(f"unknown phase {ph!r}")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["summary"] = summarize(report)
    return report


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    p = report["phases"]
    cr, co, cc, tr, fa, ho = (
        p.get(k, {}) for k in ("crash", "corrupt", "concurrency", "triton", "faults", "hostile")
    )
    faults = {
        "sigkill_after_random_delay": cr.get("kills", 0) - cr.get("kills_at_write_point", 0),
        "sigkill_at_write_point": cr.get("kills_at_write_point", 0),
        "entry_damage": co.get("entry_damage", 0),
        "index_damage": co.get("index_damage", 0),
        "writes_into_full_disk": fa.get("full_disk", {}).get("puts_refused_full", 0),
        "operations_on_locked_index": fa.get("locked_index", {}).get("operations", 0),
        "hostile_redis_acts": sum(r.get("acts", 0) for r in ho.get("rounds", [])),
    }
    recovery = {
        "verify_fix_after_crashes_s": max(
            [cr.get(f"verify_{n}", {}).get("fix_seconds", 0.0) for n in ("main", "evict")]
        ),
        "verify_fix_after_concurrency_s": cc.get("verify_fix_seconds", 0.0),
        "verify_fix_after_damage_s": co.get("worst_verify_fix_ms", 0) / 1000,
        "index_rebuild_verify_fix_s": max(
            [v["verify_fix_ms"] / 1000 for v in co.get("index", {}).values()] or [0]
        ),
        "index_rebuild_5000_entries_s": co.get("rebuild_at_scale", {}).get("verify_fix_s", 0.0),
        "first_put_and_hit_with_broken_index_s": max(
            [v["recovery_ms"] / 1000 for v in co.get("index", {}).values()] or [0]
        ),
    }
    failures = sum(len(x.get("failures", [])) for x in p.values())
    crashed = [
        f for x in p.values() for f in x.get("failures", []) if "Traceback" in str(f) or "exited" in str(f)
    ]
    return {
        "crash_trials": cr.get("trials", 0),
        "faults_injected": sum(faults.values()),
        "faults": faults,
        "wrong_bytes_served": cr.get("read_wrong", 0)
        + co.get("wrong", 0)
        + cc.get("wrong_bytes", 0)
        + tr.get("kernel_mismatches", 0)
        + fa.get("full_disk", {}).get("wrong", 0)
        + fa.get("locked_index", {}).get("wrong_or_missed", 0)
        + ho.get("wrong_bytes", 0),
        "errors_to_caller": cc.get("errors_to_caller", 0)
        + fa.get("full_disk", {}).get("errors", 0)
        + fa.get("locked_index", {}).get("errors", 0)
        + len(crashed),
        "acked_entries_lost": cr.get("read_acked_lost", 0),
        "stalls_beyond_bound": ho.get("stalls", 0),
        "present_entries_read_as_miss": cr.get("read_present_missed", 0),
        "worst_recovery_s": round(max(recovery.values()), 3),
        "recovery": {k: round(v, 3) for k, v in recovery.items()},
        "failures": failures,
        "ok": failures == 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--dir", required=True)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--keys", type=int, default=48)
    w.add_argument("--max-size", type=int, default=1 << 40)
    w.add_argument("--mix", choices=("crash", "concurrent", "writers"), default="crash")
    w.add_argument("--journal")
    w.add_argument("--ops", type=int)
    w.add_argument("--kill-at", type=int, default=0)
    w.add_argument("--grace", type=float)
    w.add_argument("--kill-log")
    w.add_argument("--events")
    w.add_argument("--warm", action="store_true")
    w.add_argument("--out")
    w.add_argument("--scratch", required=True)
    tw = sub.add_parser("triton-worker")
    tw.add_argument("--kernels", type=int, default=4)
    tw.add_argument("--seed", type=int, default=0)
    tw.add_argument("--rounds", type=int, default=2)
    tw.add_argument("--out", required=True)
    ap.add_argument(
        "--full", action="store_true", help="the long run whose figures docs/reliability.md reports"
    )
    ap.add_argument(
        "--only",
        help="comma-separated phases: crash,corrupt,concurrency,triton,faults,links,inputs,hostile",
    )
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--dir", help="work directory (default: a fresh temporary one, removed after)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args(argv)
    if a.cmd == "worker":
        return worker_main(a)
    if a.cmd == "triton-worker":
        return triton_worker_main(a)
    phases = (
        a.only.split(",")
        if a.only
        else ["crash", "corrupt", "concurrency", "triton", "faults", "links", "inputs", "hostile"]
    )
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="kcache-chaos-"))
    base.mkdir(parents=True, exist_ok=True)

    quiet_kcache_logger()

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        report = run(phases, "full" if a.full else "ci", a.seed, base, log)
    finally:
        if not a.keep and not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(report, indent=2, default=str)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(json.dumps(report["summary"], indent=2))
    for ph, r in report["phases"].items():
        for f in r.get("failures", [])[:10]:
            print(f"FAIL {ph}: {str(f)[:3000]}", file=sys.stderr)
    return 0 if report["summary"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
