"""Chaos phase ``corrupt``: the store's files damaged (see tools/chaos.py's doc). Random damage
to random entries (:data:`CORRUPTIONS`: flipped bytes, truncations, deleted members, garbage or
foreign records, links) and to the index: each must be found by ``verify``, read as a miss with
one warning, and leave a store that caches again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos_base import (
    KINDS,
    RECORD_NAME,
    capture_warnings,
    check_hit,
    expand,
    expected,
    key_name,
    open_store,
    verify,
    warning_kinds,
)

CORRUPTIONS = (
    "flip_member",
    "flip_record",
    "truncate_member",
    "truncate_record",
    "extend_member",
    "delete_member",
    "delete_record",
    "garbage_record",
    "foreign_record",
    "symlink_member",
    "symlink_record",
    "symlink_entry",
    "empty_member",
)


def corrupt_entry(store: Any, kind: str, key: str, how: str, rng: random.Random, outside: str) -> bool:
    """Damage the committed entry of (kind, key) in the way named. False if nothing to damage."""
    d = store.entry_dir(store.entry_id(kind, key))
    rec = os.path.join(d, RECORD_NAME)
    members = sorted(expected(kind, key))
    nonempty = [m for m in members if expected(kind, key)[m]]
    if how in ("flip_member", "truncate_member") and not nonempty:
        how = "delete_member"
    m = rng.choice(nonempty or members)
    mp = os.path.join(d, m)
    if how == "flip_member":
        b = bytearray(Path(mp).read_bytes())
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        Path(mp).write_bytes(bytes(b))
    elif how == "flip_record":
        b = bytearray(Path(rec).read_bytes())
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        Path(rec).write_bytes(bytes(b))
    elif how == "truncate_member":
        b = Path(mp).read_bytes()
        Path(mp).write_bytes(b[: rng.randrange(len(b))])
    elif how == "truncate_record":
        b = Path(rec).read_bytes()
        Path(rec).write_bytes(b[: rng.randrange(len(b))])
    elif how == "extend_member":
        with open(mp, "ab") as f:
            f.write(b"\0")
    elif how == "delete_member":
        os.unlink(mp)
    elif how == "delete_record":
        os.unlink(rec)
    elif how == "garbage_record":
        Path(rec).write_bytes(rng.randbytes(rng.randrange(1, 300)))
    elif how == "foreign_record":
        # A valid record of another entry: right format, wrong entry.
        other = store.entry_dir(store.entry_id(kind, key + "-other"))
        if not os.path.isdir(other):
            store.put(kind, key + "-other", expected(kind, key))
        shutil.copyfile(os.path.join(other, RECORD_NAME), rec)
    elif how == "symlink_member":
        tgt = os.path.join(outside, f"copy-{uuid.uuid4().hex[:8]}-{m}")
        Path(tgt).write_bytes(expected(kind, key)[m])  # the right bytes, behind a symlink
        os.unlink(mp)
        os.symlink(tgt, mp)
    elif how == "symlink_record":
        tgt = os.path.join(outside, f"rec-{uuid.uuid4().hex[:8]}")
        shutil.copyfile(rec, tgt)
        os.unlink(rec)
        os.symlink(tgt, rec)
    elif how == "symlink_entry":
        tgt = os.path.join(outside, f"entry-{uuid.uuid4().hex[:8]}")
        shutil.copytree(d, tgt, symlinks=True)
        shutil.rmtree(d)
        os.symlink(tgt, d)
    elif how == "empty_member":
        Path(mp).write_bytes(b"")
        if not expected(kind, key)[m]:
            os.unlink(mp)  # it was empty already: deleting it is the damage
    else:
        raise ValueError(how)
    return True


def phase_corrupt(
    base: Path,
    trials: int,
    seed: int,
    log: Callable[[str], None],
    index_rounds: int = 1,
    rebuild_entries: int = 0,
) -> dict[str, Any]:
    """Damage entries at random and the index; each must be detected and never served."""
    from kcache import log as klog

    rng = random.Random(seed + 1)
    root = str(base / "corrupt-store")
    outside = str(base / "outside")
    os.makedirs(outside, exist_ok=True)
    res: Counter = Counter()
    failures: list[str] = []
    by_type: Counter = Counter()
    t0 = time.perf_counter()
    keys = max(16, trials // 4)
    store = open_store(root)
    cap = capture_warnings()
    round_no = 0
    done = 0
    while done < trials:
        round_no += 1
        # Fill, damage a batch of distinct entries, verify (must find each), read (each a miss
        # with one warning), verify --fix (clean).
        for kind in KINDS:
            for i in range(keys):
                store.put(kind, key_name(i), expected(kind, key_name(i)))
        store.flush(force=True)
        batch = []
        pool = [(k, key_name(i)) for k in KINDS for i in range(keys)]
        rng.shuffle(pool)
        for kind, key in pool[: min(12, trials - done)]:
            how = CORRUPTIONS[(done + len(batch)) % len(CORRUPTIONS)]
            corrupt_entry(store, kind, key, how, rng, outside)
            batch.append((kind, key, how))
        v = verify(root, fix=False)
        flagged = {
            p["id"]
            for p in v.get("problems", [])
            if p["type"] in ("corrupt_entry", "stray_path", "stray_file")
        }
        for kind, key, how in batch:
            ident = store.entry_id(kind, key)
            res["injected"] += 1
            res["entry_damage"] += 1
            by_type[how] += 1
            if ident in flagged:
                res["found_by_verify"] += 1
            else:
                failures.append(f"verify missed {how} on {ident[:12]}: {v.get('problems')}")
            klog._warned.clear()
            cap.messages.clear()
            hit = store.get(kind, key)
            if hit is not None:
                bad = check_hit(kind, key, hit)
                failures.append(
                    f"{how}: damaged entry served ({bad or 'exact bytes, but from a damaged entry'})"
                )
                if bad:
                    res["wrong"] += 1
                continue
            warns = warning_kinds(cap.messages)["corrupt"]
            if warns == 1:
                res["one_warning_on_read"] += 1
            elif how == "delete_record" and warns == 0:
                res["silent_miss_no_record"] += 1  # nothing left to call an entry: a plain miss
            else:
                failures.append(f"{how}: {warns} corruption warnings on read: {cap.messages}")
            cap.messages.clear()
            if store.get(kind, key) is not None or cap.messages:
                failures.append(f"{how}: second read not a quiet miss: {cap.messages}")
            hit = store.put(kind, key, expected(kind, key))
            if hit is None or check_hit(kind, key, hit) is not None:
                failures.append(f"{how}: could not cache again after the damage")
            else:
                res["cached_again"] += 1
        done += len(batch)
        # Damage again (without reading) and let verify --fix clean it. This process's own rows
        # and last-use times (the puts and reads above) are written first: its flush thread
        # writing them while verify --fix runs in another process is a race of two writers (the
        # flush checks that an entry exists, then inserts its row: verify --fix can remove the
        # entry between the two, leaving a row for no entry), not damage verify must repair.
        store.flush(force=True)
        for kind, key, how in batch[:4]:
            corrupt_entry(store, kind, key, how, rng, outside)
        f = verify(root, fix=True)
        a = verify(root, fix=False)
        res["verify_fix_runs"] += 1
        if not a.get("ok"):
            failures.append(f"verify --fix left {a.get('problems')}")
        res["worst_verify_fix_ms"] = max(res["worst_verify_fix_ms"], int(f["seconds"] * 1000))
        # The files the symlinks pointed at must still be there (never deleted through a link).
        for name in os.listdir(outside):
            if not os.path.exists(os.path.join(outside, name)):
                failures.append(f"a file outside the store was removed: {name}")
    # The index: garbage over its database, then deleted; a hit works meanwhile, caching goes on.
    store.close()
    idx_results: dict[str, Any] = {}
    kinds = ("garbage_db", "truncate_db", "delete_db_file", "delete_index", "garbage_wal")
    for how in [h for _ in range(index_rounds) for h in kinds]:
        store = open_store(root)
        store.put("chaos", "probe-before", expected("chaos", "probe-before"))
        store.close()
        db = os.path.join(root, "index", "kcache.sqlite")
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(db + suffix)
        t_rec = time.perf_counter()
        if how == "garbage_db":
            Path(db).write_bytes(rng.randbytes(8192))
        elif how == "delete_db_file":
            os.unlink(db)
        elif how == "garbage_wal":
            Path(db + "-wal").write_bytes(rng.randbytes(8192))
        elif how == "truncate_db":
            with open(db, "r+b") as fh:
                fh.truncate(1024 + rng.randrange(2048))
        else:
            shutil.rmtree(os.path.join(root, "index"))
        klog._warned.clear()
        cap.messages.clear()
        res["injected"] += 1
        res["index_damage"] += 1
        by_type[how] += 1
        store = open_store(root)
        hit = store.get("chaos", "probe-before")
        served_while_broken = hit is not None and check_hit("chaos", "probe-before", hit) is None
        new = store.put("chaos", f"probe-after-{how}", expected("chaos", f"probe-after-{how}"))
        store.flush(force=True)
        hit2 = store.get("chaos", f"probe-after-{how}")
        stats_ok = True
        try:
            from kcache.maintenance.stats import store_stats

            store_stats(store)
        except Exception:
            stats_ok = False
        store.close()
        t_recovered = time.perf_counter() - t_rec
        v = verify(root, fix=True)
        a = verify(root, fix=False)
        prev = idx_results.get(how)
        idx_results[how] = {
            "times": (prev["times"] + 1) if prev else 1,
            "hit_while_broken": served_while_broken and (prev is None or prev["hit_while_broken"]),
            "put_then_hit_after": new is not None and hit2 is not None,
            "stats_after": stats_ok,
            "warnings": len(cap.messages),
            "recovery_ms": max(round(t_recovered * 1000, 1), prev["recovery_ms"] if prev else 0),
            "verify_fix_ms": max(round(v["seconds"] * 1000, 1), prev["verify_fix_ms"] if prev else 0),
            "clean_after_fix": bool(a.get("ok")) and (prev is None or prev["clean_after_fix"]),
        }
        if not (served_while_broken and idx_results[how]["put_then_hit_after"] and a.get("ok")):
            failures.append(f"index {how}: {idx_results[how]}")
        if len(cap.messages) > 1:
            failures.append(f"index {how}: {len(cap.messages)} warnings: {cap.messages}")
    logging.getLogger("kcache").removeHandler(cap)
    rebuild: dict[str, Any] = {}
    if rebuild_entries:
        # Recovery at scale: the index of a store of many entries deleted, then verify --fix.
        big = str(base / "rebuild-store")
        st = open_store(big)
        for i in range(rebuild_entries):
            st.put("chaos", f"rebuild/{i}", {"k.cubin": expand(i.to_bytes(4, "big"), 2048), "k.json": b"{}"})
        st.close()
        shutil.rmtree(os.path.join(big, "index"))
        v = verify(big, fix=True)
        a = verify(big, fix=False)
        rebuild = {
            "entries": rebuild_entries,
            "verify_fix_s": round(v["seconds"], 2),
            "verify_s": round(a["seconds"], 2),
            "clean_after_fix": bool(a.get("ok")),
            "indexed_after": a.get("entries"),
        }
        if not a.get("ok"):
            failures.append(f"rebuild at scale: {a.get('problems', [])[:3]}")
    out = {
        "seconds": round(time.perf_counter() - t0, 1),
        **res,
        "by_type": dict(by_type),
        "index": idx_results,
        "rebuild_at_scale": rebuild,
        "failures": failures,
    }
    log(f"corrupt: {dict(res)}")
    return out
