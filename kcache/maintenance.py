"""Maintenance over a store: stats, inspect, clear, verify, explain and config, as plain data.

The command line (:mod:`kcache.cli`) only parses arguments and formats what these functions
return; tests and other tools can call them directly.

Reading never writes. :func:`open_store` with ``write=False`` opens the store read-only and gives
it a :class:`ReadOnlyIndex`: a SQLite connection that cannot write, checkpoint or create files
(diskcache's own ``Cache`` writes its settings table on every open). A missing store directory
reads as an empty store and is not created.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import os
import re
import shutil
import sqlite3
import stat
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .config import Settings
from .store import Record, Store, StoreError
from .store.index import Index
from .store.local import _is_corrupt_db
from .store.records import RECORD_NAME, CorruptRecord
from .store.safety import UnsafeStore, check_dir, fs_type, is_network_fs

_ID_RE = re.compile(r"^[0-9a-f]{40}$")
_SHARD_RE = re.compile(r"^[0-9a-f]{2}$")
_DB_NAME = "cache.db"  # diskcache's database file inside the index directory

#: How long a maintenance command waits for a busy index (a compile waits a quarter second).
WRITE_TIMEOUT_S = 10.0

#: explain ranks stored entries among this many most recently used of the kind.
EXPLAIN_SCAN = 20_000


class MaintenanceError(Exception):
    """A maintenance operation cannot be done (the message says why); the CLI exits 1."""


# ---------------------------------------------------------------------------------- opening
class _ReadSQL:
    """Stands in for ``diskcache.Cache`` inside :class:`Index`: only ``_sql`` and ``close``."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _sql(self, query: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        try:
            return self._conn.execute(query, tuple(args))
        except sqlite3.OperationalError as e:
            # An index made before kcache's own tables existed: nothing recorded there yet.
            if "no such table: kcache_" in str(e):
                return self._conn.execute("SELECT NULL WHERE 0")
            raise

    def close(self) -> None:
        self._conn.close()


_EMPTY_SCHEMA = (
    "CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, store_time REAL,"
    " expire_time REAL, access_time REAL, access_count INTEGER DEFAULT 0, tag BLOB,"
    " size INTEGER DEFAULT 0, mode INTEGER DEFAULT 0, filename TEXT, value BLOB)",
    "CREATE TABLE kcache_counters (kind TEXT, name TEXT, value REAL)",
    "CREATE TABLE kcache_misses (id INTEGER PRIMARY KEY, time REAL, kind TEXT, key TEXT, components BLOB)",
)


class ReadOnlyIndex(Index):
    """The store's index opened for reading only; the read methods of :class:`Index` work on it.

    It never creates, writes or checkpoints anything: with no ``-wal`` file present (no process
    has the index open) the database is opened ``immutable``, otherwise ``mode=ro`` (which then
    creates nothing, the files being there). A missing database reads as an empty index.
    """

    def __init__(self, directory: Path | None, timeout: float = 1.0) -> None:  # noqa: D107
        self.directory = directory  # type: ignore[assignment]
        db = directory / _DB_NAME if directory is not None else None
        if db is not None and db.is_file():
            wal = db.with_name(_DB_NAME + "-wal")
            self.immutable = not wal.exists()
            mode = "immutable=1" if self.immutable else "mode=ro"
            conn = sqlite3.connect(
                f"file:{quote(str(db))}?{mode}", uri=True, timeout=timeout, isolation_level=None
            )
            self.exists = True
        else:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            for stmt in _EMPTY_SCHEMA:
                conn.execute(stmt)
            self.exists = False
            self.immutable = False
        self.cache = _ReadSQL(conn)  # type: ignore[assignment]

    def close(self) -> None:
        self.cache.close()

    def quick_check(self) -> list[str]:
        """SQLite's own structural check: [] when the database is sound."""
        out = [str(r[0]) for r in self.cache._sql("PRAGMA quick_check").fetchall()]
        return [] if out == ["ok"] else out

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise StoreError("the index is open read-only")

    insert = remove = touch = clear_rows = add_counters = reset_counters = add_misses = _refuse


def open_store(settings: Settings, *, write: bool = False) -> Store:
    """The store at ``settings.dir``: read-only with a :class:`ReadOnlyIndex` unless ``write``.

    A missing directory is never created: it opens as an empty read-only store (there is nothing
    to read, and nothing for a writing command to change). Raises :class:`StoreError` when the
    directory cannot be used, and for ``write`` when the settings say read-only."""
    root = Path(settings.dir).absolute()
    if write and settings.readonly:
        raise StoreError(f"{root} is read-only (KCACHE_READONLY=1): nothing may be changed")
    if not root.exists():
        store = Store(root, max_size=settings.max_size, readonly=True, key_tag=settings.key_tag)
        store._index = ReadOnlyIndex(None)
        return store
    store = Store.open(
        root,
        max_size=settings.max_size,
        readonly=not write,
        key_tag=settings.key_tag,
        allow_insecure=settings.allow_insecure,
    )
    if write:
        store.index_timeout = WRITE_TIMEOUT_S
    else:
        store._index = ReadOnlyIndex(store.index_dir)
    return store


def close_store(store: Store) -> None:
    """Close ``store`` (flushing nothing a read-only one holds) and drop its exit hook."""
    store.close()
    with contextlib.suppress(Exception):
        atexit.unregister(store.close)


def _has_dir(store: Store) -> bool:
    return os.path.isdir(os.path.join(str(store.root), "entries"))


def _record_mtime(store: Store, ident: str) -> float | None:
    try:
        return os.lstat(os.path.join(store.entry_dir(ident), RECORD_NAME)).st_mtime
    except OSError:
        return None


def _read_record(store: Store, ident: str) -> tuple[Record | None, str | None]:
    """The entry's own record (not its members), or (None, why)."""
    path = os.path.join(store.entry_dir(ident), RECORD_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, e.strerror or str(e)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None, "record is not a regular file"
        data = os.read(fd, 1 << 21)
    finally:
        os.close(fd)
    try:
        rec = Record.decode(data)
    except CorruptRecord as e:
        return None, str(e)
    if rec.id != ident:
        return None, "record does not belong to this entry"
    return rec, None


# ---------------------------------------------------------------------------------- values
def jsonable(value: Any) -> Any:
    """A JSON-safe copy of a component or summary value (bytes as hex, tuples as lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    return str(value)


def entry_dict(
    rec: Record, *, last_used: float | None = None, hits: int | None = None, size: int | None = None
) -> dict[str, Any]:
    """What ``inspect`` lists for one entry."""
    return {
        "id": rec.id,
        "kind": rec.kind,
        "key": rec.key,
        "size": rec.size if size is None else size,
        "created": rec.created,
        "last_used": last_used,
        "hits": hits,
        "compile_s": rec.compile_s,
        "summary": jsonable(rec.summary),
    }


# ---------------------------------------------------------------------------------- stats
def stats(store: Store) -> dict[str, Any]:
    """``kcache stats``: :func:`kcache.report.store_stats` of the store's index."""
    from .report import store_stats

    out = store_stats(store)
    out["index"] = str(store.index_dir)
    return out


def zero_counters(store: Store) -> None:
    """Reset the hit/miss/put/eviction counters (not the entries, nor their per-entry hits)."""
    if store.readonly:  # a missing directory: nothing to reset
        return
    store.index().reset_counters()


# ---------------------------------------------------------------------------------- inspect
def list_entries(store: Store, *, kind: str | None = None, limit: int | None = 50) -> list[dict[str, Any]]:
    """Entries, most recently used first, from the index alone (no entry file is read)."""
    out = []
    for ident, at, hits, size, rec, err in store.index().rows(kind=kind, limit=limit or None):
        if rec is None:
            out.append(
                {
                    "id": ident,
                    "kind": None,
                    "key": None,
                    "size": size,
                    "created": None,
                    "last_used": at,
                    "hits": hits,
                    "summary": {},
                    "error": err,
                }
            )
        else:
            out.append(entry_dict(rec, last_used=at, hits=hits, size=size))
    return out


def _row_info(store: Store, ident: str) -> tuple[float | None, int | None]:
    # The index has no public per-id lookup of these columns; it is one indexed query.
    row = (
        store.index()
        .cache._sql("SELECT access_time, access_count FROM Cache WHERE key = ? AND raw = 1", (ident,))
        .fetchone()
    )
    return (row[0], row[1]) if row else (None, None)


def find_entries(
    store: Store, prefix: str, *, kind: str | None = None, limit: int | None = 50
) -> list[dict[str, Any]]:
    """Entries whose id starts with ``prefix`` (looked up on disk), else whose key does (through
    the index), each with its whole record, a check of its members and its path."""
    ids: list[str] = []
    p = prefix.lower()
    if re.fullmatch(r"[0-9a-f]{1,40}", p) and _has_dir(store):
        entries = os.path.join(str(store.root), "entries")
        with contextlib.suppress(OSError):
            shards = [s for s in sorted(os.listdir(entries)) if s.startswith(p[:2])]
            for s in shards:
                with contextlib.suppress(OSError):
                    ids += sorted(n for n in os.listdir(os.path.join(entries, s)) if n.startswith(p))
    recs: dict[str, Record | None] = {}
    problems: dict[str, str] = {}
    for ident in ids:
        rec, why = _read_record(store, ident)
        if rec is not None and kind and rec.kind != kind:
            continue
        recs[ident] = rec
        if why:
            problems[ident] = why
    if not recs:
        for ident, _at, _h, _s, rec, _err in store.index().rows(kind=kind):
            if rec is not None and rec.key.startswith(prefix):
                recs[ident] = rec
    out = []
    for ident, rec in list(recs.items())[: limit or None]:
        last, hits = _row_info(store, ident)
        if rec is None:
            out.append({"id": ident, "kind": None, "key": None, "status": problems.get(ident, "unreadable")})
            continue
        d = entry_dict(rec, last_used=last, hits=hits)
        _hit, why = store.read_any(ident)
        d["status"] = "ok" if why is None else why
        d["path"] = store.entry_dir(ident)
        d["schema"] = rec.schema
        d["components"] = jsonable(rec.components)
        d["files"] = [
            {
                "name": f.name,
                "size": f.size,
                "crc32": f.crc32,
                "sha256": f.sha256,
                "xxh3": getattr(f, "xxh3", None),
            }
            for f in rec.files
        ]
        out.append(d)
    return out


# ---------------------------------------------------------------------------------- clear
def version_components() -> tuple[str, ...]:
    """Components that describe libraries, by which an entry can be stale (never arch or GPU)."""
    from . import fingerprint

    return tuple(getattr(fingerprint, "VERSION_COMPONENTS", ("python_abi", "triton_version")))


def stale_reasons(
    components: dict[str, Any], current: Callable[[str], str | None], names: Iterable[str]
) -> list[dict[str, Any]]:
    """The library versions in ``components`` that differ from this machine's.

    Only components named in ``names`` count, and only when both the entry and this machine have
    a value: a component absent here (no nvFuser installed, no GPU) says nothing about the entry."""
    out = []
    for name in names:
        stored = components.get(name)
        if stored is None:
            continue
        now = current(name)
        if now is None or str(now) == str(stored):
            continue
        out.append({"name": name, "stored": jsonable(stored), "current": now})
    return out


@dataclass
class _Candidate:
    ident: str
    kind: str | None
    size: int
    last_used: float | None
    rec: Record | None
    on_disk: bool
    in_index: bool
    why: list[str] = field(default_factory=list)


def clear(
    store: Store,
    *,
    kind: str | None = None,
    older_than: float | None = None,
    stale: bool = False,
    everything: bool = False,
    dry_run: bool = False,
    current: Callable[[str], str | None] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """Remove the entries that match every selector given (``everything``: all of them).

    ``older_than`` (seconds) selects entries not used (nor created) for that long: the later of
    the index's last use and the record file's mtime, which a hit refreshes. ``stale`` selects
    entries whose library versions differ from this machine's (see :func:`stale_reasons`).
    Unreadable entries and rows go only with ``everything``. With ``dry_run`` nothing changes."""
    if not (kind or older_than is not None or stale or everything):
        raise ValueError("no selector: pass --kind, --older-than, --stale or --all")
    now = time.time() if now is None else now
    if stale and current is None:
        from . import fingerprint

        current = fingerprint.current
    names = version_components()
    idx = store.index()
    cands: dict[str, _Candidate] = {}
    bad_rows: list[str] = []
    # kind, size and last use are columns: a listing needs no record decoded (100,000 rows: ~0.3 s)
    for ident, tag, at, size in idx.cache._sql(
        "SELECT key, tag, access_time, size FROM Cache WHERE raw = 1 AND typeof(key) = 'text'"
    ).fetchall():
        if not _ID_RE.match(ident):  # never a path: a crafted row must not name a directory
            bad_rows.append(ident)
            continue
        cands[ident] = _Candidate(
            ident, tag if isinstance(tag, str) else None, size or 0, at, None, False, True
        )
    if stale:
        for ident, _at, _hits, _size, rec, _err in idx.rows():
            if rec is not None and rec.id == ident and ident in cands:
                cands[ident].rec = rec
    for ident in store.iter_entry_ids():
        c = cands.get(ident)
        if c is None:
            rec, _why = _read_record(store, ident) if _ID_RE.match(ident) else (None, "bad name")
            c = cands[ident] = _Candidate(
                ident, rec.kind if rec else None, rec.size if rec else 0, None, rec, True, False
            )
        c.on_disk = True
    chosen = []
    for c in cands.values():
        if c.kind is None:  # an entry directory without a readable record
            if everything and not (kind or older_than is not None or stale):
                c.why.append("unreadable")
                chosen.append(c)
            continue
        if kind and c.kind != kind:
            continue
        if older_than is not None:
            if c.on_disk and (c.last_used is None or now - c.last_used > older_than):
                # the index says old (or does not know): a hit since refreshed the record's mtime
                mt = _record_mtime(store, c.ident)
                if mt is not None:
                    c.last_used = mt if c.last_used is None else max(c.last_used, mt)
            last = c.last_used if c.last_used is not None else (c.rec.created if c.rec else None)
            if last is None or now - last <= older_than:
                continue
            c.why.append(f"unused for {(now - last) / 86400:.1f}d")
        if stale:
            assert current is not None
            diffs = stale_reasons(c.rec.components, current, names) if c.rec else []
            if not diffs:
                continue
            c.why.append("stale: " + ", ".join(f"{d['name']} {d['stored']} != {d['current']}" for d in diffs))
        chosen.append(c)
    removed = [
        {
            "id": c.ident,
            "kind": c.kind,
            "size": c.size,
            "last_used": c.last_used,
            "why": "; ".join(c.why) or (f"kind {kind}" if kind else "all"),
        }
        for c in chosen
    ]
    leftovers = 0
    if not dry_run and not store.readonly:
        on_disk = [c.ident for c in chosen if c.on_disk]
        rows_only = [c.ident for c in chosen if not c.on_disk and c.in_index]
        if on_disk:
            store.remove(on_disk)
        if rows_only:
            store.index().remove(rows_only)
        if everything and not (kind or older_than is not None or stale) and bad_rows:
            _delete_bad_rows(store.index(), bad_rows)
        leftovers = store.clean_tmp()
    return {
        "dry_run": dry_run,
        "count": len(removed),
        "bytes": sum(r["size"] for r in removed),
        "leftovers": leftovers,
        "entries": removed,
    }


def _delete_bad_rows(idx: Index, keys: Iterable[str]) -> None:
    """Delete rows kcache did not write: by key where the key is raw text, and every row whose
    key is not (``Index.remove`` matches raw text keys only, so those need their own statement)."""
    idx.remove(list(keys))
    with idx.cache.transact():
        idx.cache._sql("DELETE FROM Cache WHERE raw IS NOT 1 OR typeof(key) != 'text'")


# ---------------------------------------------------------------------------------- verify
def _problem(kind: str, ident: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "id": ident, "detail": detail, **extra}


def _read_index(store: Store) -> tuple[list[Any] | None, str | None]:
    """(every index row, None), or (None, why) when the database is corrupt. Read-only."""
    for attempt in range(2):
        idx = ReadOnlyIndex(store.index_dir)
        try:
            damage = idx.quick_check()
            if damage:
                raise sqlite3.DatabaseError("database disk image is malformed: " + "; ".join(damage[:3]))
            return list(idx.rows()), None
        except sqlite3.DatabaseError as e:
            if not _is_corrupt_db(e):
                raise MaintenanceError(f"cannot read the index at {store.index_dir}: {e}") from None
            if attempt or not idx.immutable:
                return None, f"{store.index_dir}: {e}"
            # read as immutable while a writer started: look again, through its WAL this time
            time.sleep(0.05)
        finally:
            idx.close()
    return None, "unreachable"  # pragma: no cover


def _check(
    store: Store, known_good: dict[str, Record] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Record], int]:
    """(problems, good records by id, entries checked). Reads only. Entries in ``known_good``
    (checked a moment ago) are not read again."""
    problems: list[dict[str, Any]] = []
    good: dict[str, Record] = {}
    checked = 0
    entries = os.path.join(str(store.root), "entries")
    try:
        shards = sorted(os.listdir(entries))
    except FileNotFoundError:
        shards = []
    for shard in shards:
        sp = os.path.join(entries, shard)
        if not _SHARD_RE.match(shard) or os.path.islink(sp) or not os.path.isdir(sp):
            problems.append(_problem("stray_path", shard, f"not an entry shard: {sp}", path=sp))
            continue
        try:
            names = sorted(os.listdir(sp))
        except OSError as e:
            problems.append(_problem("stray_path", shard, f"unreadable: {e.strerror}", path=sp))
            continue
        for name in names:
            ep = os.path.join(sp, name)
            if not _ID_RE.match(name) or name[:2] != shard or os.path.islink(ep) or not os.path.isdir(ep):
                problems.append(_problem("stray_path", name, f"not an entry directory: {ep}", path=ep))
                continue
            checked += 1
            rec = (known_good or {}).get(name)
            if rec is None:
                hit, why = store.read_any(name, full=True)
                if hit is None:
                    why = "no record file" if why == "missing" else why
                    problems.append(_problem("corrupt_entry", name, str(why)))
                    continue
                rec = hit.record
            good[name] = rec
            members = {f.name for f in rec.files} | {RECORD_NAME}
            try:
                extra = sorted(set(os.listdir(ep)) - members)
            except OSError:
                extra = []
            for x in extra:
                problems.append(
                    _problem(
                        "stray_file", name, f"{x} is not a member of the entry", path=os.path.join(ep, x)
                    )
                )
    rows, why = _read_index(store)
    if rows is None:
        problems.append(_problem("index_corrupt", "", str(why)))
        return problems, good, checked
    corrupt = {p["id"] for p in problems if p["type"] == "corrupt_entry"}
    seen = set()
    for ident, _at, _hits, size, rec, err in rows:
        if rec is None:
            problems.append(_problem("bad_row", ident, f"index row does not decode: {err}"))
            continue
        if rec.id != ident:
            problems.append(_problem("bad_row", ident, f"index row holds the record of {rec.id[:12]}"))
            continue
        seen.add(ident)
        g = good.get(ident)
        if g is None:
            what = "a corrupt entry" if ident in corrupt else "no entry"
            problems.append(_problem("dangling_row", ident, f"index row for {what}"))
        elif (g.kind, g.key, g.files, g.created) != (
            rec.kind,
            rec.key,
            rec.files,
            rec.created,
        ) or size != g.size:
            problems.append(_problem("mismatched_row", ident, "index row differs from the entry's record"))
    for ident in good:
        if ident not in seen:
            problems.append(_problem("unindexed_entry", ident, "entry is missing from the index"))
    return problems, good, checked


def _remove_path(store: Store, path: str) -> None:
    """Remove a stray file or directory inside the store without following links."""
    if os.path.islink(path) or not os.path.isdir(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    t = os.path.join(str(store.trash), f"stray.{uuid.uuid4().hex[:8]}")
    os.makedirs(str(store.trash), mode=0o700, exist_ok=True)
    os.rename(path, t)
    shutil.rmtree(t, ignore_errors=True)


def verify(store: Store, *, fix: bool = False) -> dict[str, Any]:
    """Check every entry (sha256 of every member), the index rows and stray files.

    With ``fix`` (the store opened for writing): remove corrupt entries, stray paths and bad or
    dangling rows, re-index good entries the index lacks, and rebuild an index whose database is
    corrupt from the entry directories (the old one is moved aside to ``index.corrupt``). The
    store is then checked again; ``ok`` says whether problems remain."""
    problems, good, checked = _check(store)
    fixed: list[dict[str, Any]] = []
    if fix and problems:
        if store.readonly:
            raise StoreError(f"{store.root} is read-only: nothing can be fixed")
        fixed = _fix(store, problems, good)
        remaining, _good, _checked = _check(store, known_good=good)
    else:
        remaining = problems
    if fix and not store.readonly:
        store.clean_tmp()
    return {
        "dir": str(store.root),
        "entries": checked,
        "good": len(good),
        "problems": problems,
        "fixed": fixed,
        "remaining": remaining,
        "ok": not remaining,
    }


def _fix(store: Store, problems: list[dict[str, Any]], good: dict[str, Record]) -> list[dict[str, Any]]:
    fixed: list[dict[str, Any]] = []
    by_type: dict[str, list[dict[str, Any]]] = {}
    for p in problems:
        by_type.setdefault(p["type"], []).append(p)

    for p in by_type.get("stray_path", []) + by_type.get("stray_file", []):
        with contextlib.suppress(OSError):
            _remove_path(store, p["path"])
            fixed.append(p)
    bad_entries = []
    for p in by_type.get("corrupt_entry", []):
        # Only remove what is still bad: a concurrent writer may have replaced it meanwhile.
        hit, _why = store.read_any(p["id"], full=True)
        if hit is None:
            bad_entries.append(p["id"])
            fixed.append(p)
        else:
            good[p["id"]] = hit.record
    if bad_entries:
        store._remove_dirs(bad_entries)

    if by_type.get("index_corrupt"):
        aside = store.index_dir.with_name(store.index_dir.name + ".corrupt")
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(store.index_dir, aside)
        idx = store.index()
        for chunk in _chunks(list(good.items())):
            with idx.cache.transact():
                for ident, rec in chunk:
                    idx.insert(rec, access_time=_record_mtime(store, ident))
        fixed += by_type["index_corrupt"]
        return fixed

    idx = store.index()
    rows_to_drop = [p["id"] for p in by_type.get("bad_row", [])]
    if rows_to_drop:
        _delete_bad_rows(idx, rows_to_drop)
        fixed += by_type["bad_row"]
    dangling = [p["id"] for p in by_type.get("dangling_row", [])] + bad_entries
    if dangling:
        idx.remove(dangling)
        fixed += by_type.get("dangling_row", [])
    for chunk in _chunks(by_type.get("mismatched_row", []) + by_type.get("unindexed_entry", [])):
        with idx.cache.transact():
            for p in chunk:
                rec = good.get(p["id"])
                if rec is None:
                    continue
                last = None
                if p["type"] == "mismatched_row":
                    last, _hits = _row_info(store, p["id"])
                    idx.remove([p["id"]])
                idx.insert(rec, access_time=last or _record_mtime(store, p["id"]))
                fixed.append(p)
    return fixed


def _chunks(items: list[Any], n: int = 500) -> Iterator[list[Any]]:
    """Index writes in batches: one transaction each, short enough not to stall other writers."""
    for i in range(0, len(items), n):
        yield items[i : i + n]


# ---------------------------------------------------------------------------------- explain
def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _diff(stored: dict[str, Any], wanted: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    equal = 0
    differ = []
    for name in sorted(set(stored) | set(wanted), key=str):
        a, b = stored.get(name), wanted.get(name)
        if name in stored and name in wanted and a == b:
            equal += 1
        else:
            differ.append({"name": str(name), "stored": jsonable(a), "wanted": jsonable(b)})
    return equal, differ


def explain(
    store: Store, *, kind: str | None = None, limit: int | None = 10, nearest: int = 3
) -> list[dict[str, Any]]:
    """The most recent misses (repeated keys once, with a count), each with the ``nearest`` stored
    entries of its kind, ranked by how many key components they share with the miss (ties: the
    most recently used), and the components that differ."""
    from .store.index import MAX_MISSES

    idx = store.index()
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for t, k, key, comps in idx.misses(limit=MAX_MISSES):
        if kind and k != kind:
            continue
        g = groups.get((k, key))
        if g is None:
            if limit and len(groups) >= limit:
                continue
            groups[(k, key)] = {"time": t, "kind": k, "key": key, "count": 1, "components": comps}
        else:
            g["count"] += 1
    scanned: dict[str, tuple[list[tuple[Record, float]], dict[tuple[str, Any], list[int]]]] = {}
    out = []
    for (k, key), g in groups.items():
        if k not in scanned:
            entries = [
                (rec, at)
                for _i, at, _h, _s, rec, _e in idx.rows(kind=k, limit=EXPLAIN_SCAN)
                if rec is not None and rec.kind == k
            ]
            # (component, value) -> entries having it, most recently used first
            postings: dict[tuple[str, Any], list[int]] = {}
            for i, (rec, _at) in enumerate(entries):
                for name, value in rec.components.items():
                    postings.setdefault((name, _hashable(value)), []).append(i)
            scanned[k] = (entries, postings)
        entries, postings = scanned[k]
        wanted = g["components"]
        shared: Counter[int] = Counter()
        for name, value in wanted.items():
            shared.update(postings.get((name, _hashable(value)), ()))
        # most shared components first, then most recently used (the lower index); one spare in
        # case the missed key itself is stored by now
        order = heapq.nsmallest(nearest + 1, shared, key=lambda i: (-shared[i], i))
        if len(order) < nearest + 1:
            order += [i for i in range(min(len(entries), 2 * nearest + 2)) if i not in shared]
        chosen = [entries[i] for i in order if entries[i][0].key != key][:nearest]
        ranked = [(*_diff(rec.components, wanted), rec, at) for rec, at in chosen]
        ident = store.entry_id(k, key)
        out.append(
            {
                "time": g["time"],
                "kind": k,
                "key": key,
                "count": g["count"],
                "stored_now": os.path.isdir(store.entry_dir(ident)),
                "components": jsonable(wanted),
                "nearest": [
                    {
                        "id": rec.id,
                        "key": rec.key,
                        "last_used": at,
                        "equal": equal,
                        "total": len(set(rec.components) | set(wanted)),
                        "summary": jsonable(rec.summary),
                        "differ": differ,
                    }
                    for equal, differ, rec, at in ranked
                ],
            }
        )
    return out


# ---------------------------------------------------------------------------------- config
def config_report(settings: Settings) -> dict[str, Any]:
    """Each effective setting with where it came from, and whether the store dir is usable."""
    from .config import ENV

    values = settings.as_dict()
    rows = [
        {"name": name, "env": var, "value": values.get(name), "source": settings.sources.get(name, "default")}
        for name, var in ENV.items()
    ]
    root = Path(settings.dir).absolute()
    store: dict[str, Any] = {"dir": str(root), "exists": root.exists()}
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    store["fs_type"] = fs_type(probe)
    store["network_fs"] = is_network_fs(probe)
    if root.is_dir():
        from .store.local import MARKER

        store["is_store"] = (root / MARKER).is_file()
        try:
            check_dir(root, readonly=settings.readonly, allow_insecure=settings.allow_insecure)
            store["safe"], store["safety"] = True, "ok"
        except (UnsafeStore, OSError) as e:
            store["safe"], store["safety"] = False, str(e)
    elif root.exists():
        store["is_store"], store["safe"], store["safety"] = False, False, f"{root} is not a directory"
    else:
        store["is_store"], store["safe"] = False, None
        store["safety"] = "does not exist yet (created 0700 on first write)"
    if store["network_fs"]:
        store["index"] = "node-local (SQLite locking is unsafe on network filesystems)"
    else:
        store["index"] = str(root / "index")
    return {"settings": rows, "problems": list(settings.problems), "store": store}
