"""Chaos phase ``faults``: a full disk and an index held locked (see tools/chaos.py's doc). The
disk is a 2 MiB tmpfs where root can mount one, else ``RLIMIT_FSIZE``; the index is held under
``BEGIN EXCLUSIVE`` by another process: puts and hits never raise, never serve wrong bytes, and
never wait longer than the bound (docs/reliability.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos_base import (
    CHAOS,
    KINDS,
    REPO,
    capture_warnings,
    check_hit,
    env_without_kcache,
    expected,
    key_name,
    open_store,
    verify,
)

# ----------------------------------------------------------------------------------- faults


def _tmpfs(path: str, size: str = "2m") -> bool:
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", path], capture_output=True
    )
    return r.returncode == 0


def _grow_tmpfs(path: str, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", path], capture_output=True, check=True)


def _umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True)


FULL_DISK_CHILD = r"""
import json, os, resource, signal, sys, time, logging
sys.path.insert(0, {repo!r})
sys.argv = ["chaos"]
import importlib.util
spec = importlib.util.spec_from_file_location("chaos", {here!r})
chaos = importlib.util.module_from_spec(spec); spec.loader.exec_module(chaos)
if {fsize}:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
cap = chaos.capture_warnings()
st = chaos.open_store({root!r})
res = dict(puts=0, none=0, hits=0, wrong=0, errors=[], worst_put_ms=0.0)
for i in range({n}):
    kind = chaos.KINDS[i % 2]; key = chaos.key_name(i)
    t = time.perf_counter()
    try:
        h = st.put(kind, key, chaos.expected(kind, key))
    except Exception as e:
        res["errors"].append(repr(e)); continue
    res["worst_put_ms"] = max(res["worst_put_ms"], (time.perf_counter() - t) * 1000)
    res["puts"] += 1
    if h is None:
        res["none"] += 1
    for j in range(0, i + 1, 7):
        k2, key2 = chaos.KINDS[j % 2], chaos.key_name(j)
        try:
            g = st.get(k2, key2)
        except Exception as e:
            res["errors"].append(repr(e)); continue
        if g is not None:
            bad = chaos.check_hit(k2, key2, g)
            if bad: res["wrong"] += 1
            else: res["hits"] += 1
st.close()
res["warnings"] = cap.messages
print(json.dumps(res))
"""


def phase_faults(base: Path, rounds: int, seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    failures: list[str] = []
    out: dict[str, Any] = {}
    # 1. Full disk: a 2 MiB tmpfs (root), else a 256 KiB RLIMIT_FSIZE.
    full: Counter = Counter()
    worst = 0.0
    how = None
    for r in range(rounds):
        mnt = str(base / f"full-{r}")
        mounted = _tmpfs(mnt)
        how = "tmpfs 2 MiB" if mounted else "RLIMIT_FSIZE 256 KiB"
        root = os.path.join(mnt, "store")
        code = FULL_DISK_CHILD.format(
            repo=str(REPO), here=str(CHAOS), fsize=0 if mounted else 256 * 1024, root=root, n=120
        )
        try:
            p = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=600,
                env=env_without_kcache(),
            )
            if p.returncode != 0 or "Traceback" in p.stderr:
                failures.append(f"full disk child: rc={p.returncode} {p.stderr[-2000:]}")
                continue
            res = json.loads(p.stdout.strip().splitlines()[-1])
            full["rounds"] += 1
            full["puts"] += res["puts"]
            full["puts_refused_full"] += res["none"]
            full["hits_checked"] += res["hits"]
            full["wrong"] += res["wrong"]
            full["errors"] += len(res["errors"])
            full["warnings"] += len(res["warnings"])
            worst = max(worst, res["worst_put_ms"])
            if res["errors"] or res["wrong"]:
                failures.append(f"full disk: {res}")
            if res["none"] == 0:
                failures.append("full disk: the disk never filled up")
            if len([w for w in res["warnings"] if "cannot write" in w]) > 2:
                failures.append(f"full disk: too many warnings: {res['warnings']}")
            # On the still-full disk, verify --fix must answer (it may be unable to rebuild an
            # index the full disk kept from being written); once the operator has made room, it
            # must leave a clean store.
            vv = verify(root, fix=True)
            if "error" in vv or vv.get("rc") not in (0, 1, None):
                failures.append(f"full disk: verify --fix on the full disk failed: {vv}")
            if mounted:
                _grow_tmpfs(mnt, "4m")
            vv = verify(root, fix=True)
            aa = verify(root, fix=False)
            if not aa.get("ok"):
                failures.append(
                    f"full disk: verify --fix did not clean up: {aa.get('problems')} / {vv.get('problems')}"
                )
        finally:
            if mounted:
                _umount(mnt)
    out["full_disk"] = {"how": how, **full, "worst_put_ms": round(worst, 1)}
    # 2. The index locked by another process (BEGIN EXCLUSIVE) for longer than any timeout.
    root = str(base / "locked-store")
    st = open_store(root)
    for i in range(8):
        st.put("chaos", key_name(i), expected("chaos", key_name(i)))
    st.close()
    db = os.path.join(root, "index", "kcache.sqlite")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3,sys,time\n"
            f"c=sqlite3.connect({db!r}, isolation_level=None)\n"
            "c.execute('BEGIN EXCLUSIVE')\nprint('LOCKED', flush=True)\ntime.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "LOCKED":
        failures.append("could not take the exclusive lock")
    lat: list[float] = []
    errors = wrong = 0
    cap = capture_warnings()
    from kcache import log as klog

    klog._warned.clear()
    try:
        t_open = time.perf_counter()
        st = open_store(root)
        lat.append(time.perf_counter() - t_open)
        for i in range(rounds * 20):
            kind, key = KINDS[i % 2], key_name(100 + i)
            t = time.perf_counter()
            try:
                h = st.put(kind, key, expected(kind, key))
                g = st.get("chaos", key_name(i % 8))
                st.flush()  # as a program does (at most once a second); forced flushes retry at once
            except Exception:
                errors += 1
                failures.append(traceback.format_exc(limit=5))
                continue
            lat.append(time.perf_counter() - t)
            time.sleep(0.06)  # spread over more than one back-off period (5 s)
            if h is None or check_hit(kind, key, h) or g is None or check_hit("chaos", key_name(i % 8), g):
                wrong += 1
        t = time.perf_counter()
        st.close()
        lat.append(time.perf_counter() - t)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        logging.getLogger("kcache").removeHandler(cap)
    out["locked_index"] = {
        "operations": len(lat),
        "worst_ms": round(max(lat) * 1000, 1),
        "p50_ms": round(sorted(lat)[len(lat) // 2] * 1000, 2),
        "seconds": round(sum(lat) + 0.06 * len(lat), 1),
        "waits_over_200ms": sum(x > 0.2 for x in lat),
        "errors": errors,
        "wrong_or_missed": wrong,
        "warnings": len(cap.messages),
    }
    if errors or wrong:
        failures.append(f"locked index: {out['locked_index']}")
    if len(cap.messages) > 1:
        failures.append(f"locked index: more than one warning: {cap.messages}")
    v = verify(root, fix=True)
    a = verify(root, fix=False)
    out["locked_index"]["verify_fix_ms_after"] = round(v["seconds"] * 1000, 1)
    if not a.get("ok"):
        failures.append(f"locked index: not clean after verify --fix: {a.get('problems')}")
    out["failures"] = failures
    log(f"faults: {json.dumps({k: v for k, v in out.items() if k != 'failures'})}")
    return out
