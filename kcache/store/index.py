"""The index: a catalogue of entries (records, sizes, last use), counters and recent misses.

It lives in diskcache (SQLite). It is NOT on the hit path: a hit reads the entry's own record
file, so a busy, locked or broken index costs a lookup nothing. The index serves ``stats``,
``inspect``, ``explain`` and eviction, and can always be rebuilt from the entry directories.

diskcache's defaults are wrong for this: it culls to 1 GiB on its own, may write on reads, waits
60 s on a busy database and unpickles any row whose ``mode`` says pickle. Here culling is off,
reads never write, every wait is bounded by ``timeout`` and :class:`RawOnlyDisk` accepts raw
bytes only, treating any other row as corruption.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import diskcache
import msgpack

from .records import CorruptRecord, Record


class CorruptIndex(Exception):
    """A row that kcache did not write: pickled, file-backed, or not a record."""


class RawOnlyDisk(diskcache.Disk):
    """A diskcache ``Disk`` that stores and returns raw values only and never touches files.

    diskcache's own Disk unpickles rows whose mode is MODE_PICKLE, and keys whose raw flag is 0,
    whatever the application stored: a crafted cache.db would run code on the next read. Here such
    rows raise :class:`CorruptIndex`. ``remove`` does nothing: kcache never lets diskcache own files,
    and a crafted ``filename`` column must not make it delete one.
    """

    def put(self, key: Any) -> tuple[Any, bool]:
        if not isinstance(key, str):
            raise TypeError("kcache index keys are str")
        return key, True

    def get(self, key: Any, raw: bool) -> Any:
        if not raw or not isinstance(key, str):
            raise CorruptIndex("index key is not raw text")
        return key

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> tuple:
        if isinstance(value, bytes) and not read:
            return 0, diskcache.core.MODE_RAW, None, sqlite3.Binary(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return 0, diskcache.core.MODE_RAW, None, value
        raise TypeError("kcache index values are bytes or int")

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        if mode != diskcache.core.MODE_RAW or filename is not None or read:
            raise CorruptIndex(f"index row with mode {mode} / file {filename!r}: not written by kcache")
        if isinstance(value, (bytes, int)) and not isinstance(value, bool):
            return value
        raise CorruptIndex("index row value of unexpected type")

    def filename(self, key: Any = diskcache.core.UNKNOWN, value: Any = diskcache.core.UNKNOWN) -> tuple:
        raise CorruptIndex("kcache never stores index values in files")

    def remove(self, file_path: str) -> None:  # never delete a path read from a row
        return None


SETTINGS = dict(
    size_limit=2**62,  # kcache evicts by KCACHE_MAX_SIZE; diskcache must never cull on its own
    cull_limit=0,
    eviction_policy="none",  # reads never write
    statistics=0,
    tag_index=0,
    disk_min_file_size=2**40,  # never a file-backed value
    sqlite_journal_mode="wal",
    sqlite_synchronous=1,
    sqlite_mmap_size=2**26,
)

_EXTRA_TABLES = (
    "CREATE TABLE IF NOT EXISTS kcache_counters ("
    " kind TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL DEFAULT 0, PRIMARY KEY (kind, name))",
    "CREATE TABLE IF NOT EXISTS kcache_misses ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL,"
    " components BLOB)",
    "CREATE INDEX IF NOT EXISTS Cache_access_time ON Cache (access_time)",
)

MAX_MISSES = 256


class _Cache(diskcache.Cache):
    """diskcache's Cache with its retries bounded by kcache's timeout.

    diskcache runs the statements of ``__init__`` and ``reset`` through ``_sql_retry``, which
    retries a locked database for 60 seconds each, whatever ``timeout`` says: opening the index
    while another process holds a write transaction would hold a compile up for minutes."""

    def __init__(self, directory: str, *, timeout: float, **kwargs: Any) -> None:
        self._kcache_retry_s = timeout
        super().__init__(directory, timeout=timeout, **kwargs)

    @property
    def _sql_retry(self) -> Any:
        sql = self._sql
        limit = self._kcache_retry_s

        def execute(statement: str, *args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            while True:
                try:
                    return sql(statement, *args, **kwargs)
                except sqlite3.OperationalError as exc:
                    if str(exc) != "database is locked" or time.monotonic() - start > limit:
                        raise
                    time.sleep(0.001)

        return execute


class Index:
    """diskcache-backed catalogue. Every method may raise; callers decide how to fail open."""

    def __init__(self, directory: Path, timeout: float = 0.25) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.cache = _Cache(str(directory), disk=RawOnlyDisk, timeout=timeout, **SETTINGS)
        # diskcache keeps settings in the database: a crafted or old one must not bring culling back.
        for k, v in SETTINGS.items():
            if getattr(self.cache, k, v) != v:
                self.cache.reset(k, v)
        sql = self.cache._sql
        for stmt in _EXTRA_TABLES:
            sql(stmt)

    def close(self) -> None:
        self.cache.close()

    # -- entries -----------------------------------------------------------------------------
    def insert(self, rec: Record, access_time: float | None = None) -> None:
        now = time.time()
        with self.cache.transact():
            self.cache.set(rec.id, rec.encode(), tag=rec.kind)
            self.cache._sql(
                "UPDATE Cache SET size = ?, access_time = ?, store_time = ? WHERE key = ? AND raw = 1",
                (rec.size, access_time if access_time is not None else now, rec.created, rec.id),
            )

    def remove(self, ids: Iterable[str]) -> int:
        n = 0
        with self.cache.transact():
            for i in ids:
                n += self.cache._sql("DELETE FROM Cache WHERE key = ? AND raw = 1", (i,)).rowcount
        return n

    def touch(self, touches: dict[str, tuple[float, int]]) -> list[str]:
        """Record last use and hit counts; returns ids the index does not know (to reconcile)."""
        unknown = []
        with self.cache.transact():
            for i, (t, hits) in touches.items():
                cur = self.cache._sql(
                    "UPDATE Cache SET access_time = ?, access_count = access_count + ? WHERE key = ? AND raw = 1",
                    (t, hits, i),
                )
                if cur.rowcount == 0:
                    unknown.append(i)
        return unknown

    def get_record(self, ident: str) -> Record | None:
        row = self.cache._sql(
            "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1", (ident,)
        ).fetchone()
        if row is None:
            return None
        return self._decode(*row)

    @staticmethod
    def _decode(mode: int, filename: Any, value: Any) -> Record:
        if mode != diskcache.core.MODE_RAW or filename is not None or not isinstance(value, bytes):
            raise CorruptIndex(f"index row with mode {mode} / file {filename!r}: not written by kcache")
        try:
            return Record.decode(bytes(value))
        except CorruptRecord as e:
            raise CorruptIndex(str(e)) from None

    def rows(
        self, *, kind: str | None = None, order: str = "access_time DESC", limit: int | None = None
    ) -> Iterator[tuple[str, float, int, int, Record | None, str | None]]:
        """(id, last_used, hits, size, record or None, error) for each row; bad rows are reported, not raised."""
        assert order in ("access_time DESC", "access_time ASC", "store_time DESC")
        q = "SELECT key, raw, access_time, access_count, size, mode, filename, value FROM Cache"
        args: list[Any] = []
        if kind:
            q += " WHERE tag = ?"
            args.append(kind)
        q += f" ORDER BY {order}"
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        for key, raw, at, ac, size, mode, filename, value in self.cache._sql(q, args).fetchall():
            if not raw or not isinstance(key, str):
                yield (repr(key), at or 0.0, ac or 0, size or 0, None, "index key is not raw text")
                continue
            try:
                yield key, at or 0.0, ac or 0, size or 0, self._decode(mode, filename, value), None
            except CorruptIndex as e:
                yield key, at or 0.0, ac or 0, size or 0, None, str(e)

    def oldest(self, limit: int, before: float) -> list[tuple[str, float, int]]:
        """(id, last_used, size) of the least recently used rows, oldest first."""
        return [
            (k, at, sz)
            for k, at, sz in self.cache._sql(
                "SELECT key, access_time, size FROM Cache WHERE raw = 1 AND access_time < ? "
                "ORDER BY access_time ASC LIMIT ?",
                (before, limit),
            ).fetchall()
        ]

    def totals(self) -> dict[str, tuple[int, int]]:
        """kind -> (entries, bytes)."""
        out = {}
        for tag, n, size in self.cache._sql(
            "SELECT tag, COUNT(*), SUM(size) FROM Cache GROUP BY tag"
        ).fetchall():
            out[str(tag)] = (int(n), int(size or 0))
        return out

    def total_bytes(self) -> int:
        (n,) = self.cache._sql("SELECT COALESCE(SUM(size), 0) FROM Cache").fetchone()
        return int(n)

    def ids(self) -> set[str]:
        return {k for (k,) in self.cache._sql("SELECT key FROM Cache WHERE raw = 1").fetchall()}

    def clear_rows(self) -> None:
        with self.cache.transact():
            self.cache._sql("DELETE FROM Cache")

    # -- counters and misses ----------------------------------------------------------------
    def add_counters(self, deltas: dict[tuple[str, str], float]) -> None:
        with self.cache.transact():
            for (kind, name), v in deltas.items():
                self.cache._sql(
                    "INSERT INTO kcache_counters (kind, name, value) VALUES (?, ?, ?) "
                    "ON CONFLICT (kind, name) DO UPDATE SET value = value + excluded.value",
                    (kind, name, v),
                )

    def counters(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind, name, v in self.cache._sql("SELECT kind, name, value FROM kcache_counters").fetchall():
            out.setdefault(kind, {})[name] = v
        return out

    def reset_counters(self) -> None:
        self.cache._sql("DELETE FROM kcache_counters")

    def add_misses(self, misses: list[tuple[float, str, str, dict[str, Any]]]) -> None:
        with self.cache.transact():
            for t, kind, key, comps in misses:
                self.cache._sql(
                    "INSERT INTO kcache_misses (time, kind, key, components) VALUES (?, ?, ?, ?)",
                    (t, kind, key, msgpack.packb(comps, use_bin_type=True, default=str)),
                )
            self.cache._sql(
                "DELETE FROM kcache_misses WHERE id <= (SELECT MAX(id) FROM kcache_misses) - ?", (MAX_MISSES,)
            )

    def misses(self, limit: int = 20) -> list[tuple[float, str, str, dict[str, Any]]]:
        out = []
        for t, kind, key, blob in self.cache._sql(
            "SELECT time, kind, key, components FROM kcache_misses ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall():
            try:
                comps = msgpack.unpackb(blob, raw=False) if blob else {}
                if not isinstance(comps, dict):
                    comps = {}
            except Exception:
                comps = {}
            out.append((t, kind, key, comps))
        return out
