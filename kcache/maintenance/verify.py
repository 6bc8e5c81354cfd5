"""``kcache verify [--fix]``: every entry against its checksums, the index against the entries,
and each entry against what its library accepts (the checks its integration declares, e.g. a
Triton group's metadata against this Triton's loader: handed in, see :func:`verify`).

With ``--fix`` (the store opened for writing): corrupt entries, stray paths and bad or dangling
rows are removed, good entries the index lacks are added, and an index whose database is corrupt
is rebuilt from the entry folders. Everything is removed through the store's pinned folders,
following no link.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..store import Record, StoreError
from ..store.api import Admin
from ..store.errors import EXPECTED
from ..store.index import is_corrupt_db
from .common import MaintenanceError


def _problem(kind: str, ident: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "id": ident, "detail": detail, **extra}


def _read_index(store: Admin) -> tuple[list[Any] | None, str | None]:
    """(every index row, None), or (None, why) when the database is corrupt. Read-only."""
    for attempt in range(2):
        try:
            idx = store.index_readonly()
        except EXPECTED as e:  # a corrupt database is reported, anything else raised as the command's
            if not is_corrupt_db(e):
                raise MaintenanceError(f"cannot read the index at {store.index_dir}: {e}") from None
            return None, f"{store.index_dir}: {e}"
        try:
            damage = idx.quick_check()
            if damage:
                raise sqlite3.DatabaseError("database disk image is malformed: " + "; ".join(damage[:3]))
            return list(idx.rows()), None
        except sqlite3.DatabaseError as e:
            if not is_corrupt_db(e):
                raise MaintenanceError(f"cannot read the index at {store.index_dir}: {e}") from None
            if attempt or not idx.immutable:
                return None, f"{store.index_dir}: {e}"
            # read as immutable while a writer started: look again, through its WAL this time
            time.sleep(0.05)
        finally:
            idx.close()
    return None, "unreachable"  # pragma: no cover


def _check(
    store: Admin,
    known_good: dict[str, Record] | None = None,
    progress: Callable[[int], None] | None = None,
    jobs: int = 1,
    checks: Mapping[str, Callable[[Any], str | None]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Record], int]:
    """(problems, good records by id, entries checked). Reads only, ``jobs`` entries at a time.
    Entries in ``known_good`` (checked a moment ago) are not read again."""
    from .readers import ordered_map

    problems: list[dict[str, Any]] = []
    good: dict[str, Record] = {}
    checked = 0
    known = known_good or {}
    entries: list[tuple[str, str]] = []
    for shard, name, why in store.scan():
        if why is not None:
            where = f"entries/{shard}/{name}" if name else f"entries/{shard}"
            problems.append(_problem("stray_path", name or shard, f"{why}: {where}", shard=shard, name=name))
        else:
            entries.append((shard, name))

    def one(item: tuple[str, str]) -> tuple[str, str, Record | None, str | None, str, list[str]]:
        shard, name = item
        rec = known.get(name)
        if rec is None:
            hit, problem = store.read_any(name, full=True)
            if hit is None:
                return shard, name, None, "no record file" if problem == "missing" else str(problem), "", []
            rec = hit.record
            unusable = _unusable(hit, checks)
            if unusable:
                return shard, name, None, unusable, "bad_metadata", []
        return shard, name, rec, None, "", list(store.entry_extras(name, rec))

    for shard, name, rec, problem, ptype, extras in ordered_map(one, entries, jobs):
        checked += 1
        if progress is not None:
            progress(1)
        if rec is None:
            problems.append(_problem(ptype or "corrupt_entry", name, str(problem)))
            continue
        good[name] = rec
        for x in extras:
            problems.append(
                _problem(
                    "stray_file", name, f"{x} is not a member of the entry", shard=shard, name=name, member=x
                )
            )
    rows, why = _read_index(store)
    if rows is None:
        problems.append(_problem("index_corrupt", "", str(why)))
        return problems, good, checked
    corrupt = {p["id"] for p in problems if p["type"] in ("corrupt_entry", "bad_metadata")}
    seen = set()
    for row in rows:
        rec = row.record
        if rec is None:
            problems.append(_problem("bad_row", row.id, f"index row does not decode: {row.error}"))
            continue
        seen.add(row.id)
        g = good.get(row.id)
        if g is None:
            what = "a bad entry" if row.id in corrupt else "no entry"
            problems.append(_problem("dangling_row", row.id, f"index row for {what}"))
        elif (g.kind, g.key, g.files, g.created) != (
            rec.kind,
            rec.key,
            rec.files,
            rec.created,
        ) or row.size != g.size:
            problems.append(_problem("mismatched_row", row.id, "index row differs from the entry's record"))
    for ident in good:
        if ident not in seen:
            problems.append(_problem("unindexed_entry", ident, "entry is missing from the index"))
    return problems, good, checked


def _unusable(hit: Any, checks: Mapping[str, Callable[[Any], str | None]] | None) -> str | None:
    """Why the library could not use this verified entry (its integration's check), or None."""
    check = (checks or {}).get(hit.record.kind)
    return check(hit) if check is not None else None


def verify(
    store: Admin,
    *,
    fix: bool = False,
    progress: Callable[[int], None] | None = None,
    jobs: int | None = None,
    checks: Mapping[str, Callable[[Any], str | None]] | None = None,
) -> dict[str, Any]:
    """Check every entry (sha256 of every member; with ``checks``, kind -> ``check(hit)``, what
    the integrations say of their own entries: why the library could not use one, or None; see
    :func:`kcache.integrations.entry_checks`), the index rows and stray files.

    With ``fix`` (the store opened for writing): remove corrupt entries, groups Triton could not
    load, stray paths and bad or dangling rows, re-index good entries the index lacks, and
    rebuild an index whose database is corrupt from the entry folders. The store is then checked again; ``ok`` says whether
    problems remain."""
    if fix and store.readonly:
        raise StoreError(f"{store.root} is read-only: nothing can be fixed")
    leftovers = store.clean_tmp() if fix else 0  # first: on a full disk, that frees space
    from .readers import default_jobs

    jobs = default_jobs() if jobs is None else max(1, jobs)
    problems, good, checked = _check(store, progress=progress, jobs=jobs, checks=checks)
    fixed: list[dict[str, Any]] = []
    index_problem = None
    if fix and problems:
        fixed, index_problem = _fix(store, problems, good, checks)
        remaining, _good, _checked = _check(store, known_good=good, jobs=jobs, checks=checks)
    else:
        remaining = problems
    return {
        "dir": str(store.root),
        "entries": checked,
        "good": len(good),
        "problems": problems,
        "fixed": fixed,
        "remaining": remaining,
        "leftovers": leftovers,
        "index_problem": index_problem,
        "ok": not remaining,
    }


def _fix(
    store: Admin,
    problems: list[dict[str, Any]],
    good: dict[str, Record],
    checks: Mapping[str, Callable[[Any], str | None]] | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """Fix what can be fixed: files first (they free space), then the index. Returns what was
    fixed, and why the index could not be (a full disk, a lock held elsewhere), or None."""
    fixed: list[dict[str, Any]] = []
    by_type: dict[str, list[dict[str, Any]]] = {}
    for p in problems:
        by_type.setdefault(p["type"], []).append(p)

    for p in by_type.get("stray_path", []) + by_type.get("stray_file", []):
        if store.remove_stray(p["shard"], p.get("name", ""), p.get("member", "")):
            fixed.append(p)
    bad_entries = []
    for p in by_type.get("corrupt_entry", []) + by_type.get("bad_metadata", []):
        # Only remove what is still bad: a concurrent writer may have replaced it meanwhile.
        hit, _why = store.read_any(p["id"], full=True)
        if hit is None or _unusable(hit, checks):
            bad_entries.append(p["id"])
            fixed.append(p)
        else:
            good[p["id"]] = hit.record
    if bad_entries:
        store.remove(bad_entries, index=False)
    try:
        fixed += _fix_index(store, by_type, good, bad_entries)
    except sqlite3.Error as e:
        return fixed, f"{type(e).__name__}: {e}"
    return fixed, None


def _fix_index(
    store: Admin, by_type: dict[str, list[dict[str, Any]]], good: dict[str, Record], bad_entries: list[str]
) -> list[dict[str, Any]]:
    fixed: list[dict[str, Any]] = []
    if by_type.get("index_corrupt"):
        store.rebuild_index()
        return list(by_type["index_corrupt"])
    idx = store.index()
    if by_type.get("bad_row"):
        idx.remove_bad_rows()
        idx.remove([p["id"] for p in by_type["bad_row"]])
        fixed += by_type["bad_row"]
    dangling = [p["id"] for p in by_type.get("dangling_row", [])] + bad_entries
    if dangling:
        idx.remove(dangling)
        fixed += by_type.get("dangling_row", [])
    for chunk in _chunks(by_type.get("mismatched_row", []) + by_type.get("unindexed_entry", [])):
        with idx.transaction():
            for p in chunk:
                rec = good.get(p["id"])
                if rec is None:
                    continue
                row = idx.row(p["id"]) if p["type"] == "mismatched_row" else None
                idx.insert(
                    rec,
                    last_used=(row.last_used if row else None) or store.record_mtime(p["id"]),
                    hits=row.hits if row else 0,
                )
                fixed.append(p)
    return fixed


def _chunks(items: list[Any], n: int = 500) -> Iterator[list[Any]]:
    """Index writes in batches: one transaction each, short enough not to stall other writers."""
    for i in range(0, len(items), n):
        yield items[i : i + n]
