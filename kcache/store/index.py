"""The index: a catalogue of entries (record, kind, size, last use, hits), counters and recent misses.

It is NOT on the hit path: a hit reads the entry's own record file, so a busy, locked or broken
index costs a lookup nothing. It serves ``stats``, ``inspect``, ``explain`` and eviction, and can
always be rebuilt from the entry folders (``kcache verify --fix``, or on its own when it is new).

Why kcache owns this small SQLite schema (standard library ``sqlite3``) instead of using
diskcache: kcache needs rows ordered by last use, sizes summed by kind, counters and a miss log,
which diskcache's public interface does not offer (the first index reached into its private
``_sql`` 22 times, overrode its retry loop and copied its schema); and diskcache's ``Disk``
unpickles any row whose mode column says so, which a crafted database could use to run code.
Here there is nothing to unpickle: a record is msgpack with its own checksum, decoded and
validated as on a hit, and every other column is a plain number or text.

Every method may raise ``sqlite3.Error``; the store decides how to fail open. Waits are bounded
by ``timeout`` (SQLite's busy timeout): a locked index never holds a compile up for long.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from ..kinds import valid_id
from ..log import logger
from .records import DECODE_ERRORS, CorruptRecord, Record

DB_NAME = "kcache.sqlite"
SCHEMA = 1
MAX_MISSES = 256
#: ``meta`` names: when the counters were last written, and last zeroed (store clock, seconds).
COUNTERS_UPDATED = "counters_updated"
COUNTERS_ZEROED = "counters_zeroed"

_SCHEMA_SQL = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS entries ("
    " id TEXT PRIMARY KEY, kind TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL,"
    " last_used REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS entries_last_used ON entries (last_used)",
    "CREATE INDEX IF NOT EXISTS entries_kind ON entries (kind, last_used)",
    "CREATE TABLE IF NOT EXISTS counters ("
    " kind TEXT NOT NULL, name TEXT NOT NULL, value REAL NOT NULL DEFAULT 0, PRIMARY KEY (kind, name))",
    "CREATE TABLE IF NOT EXISTS misses ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL,"
    " components BLOB)",
)
_ORDERS = {
    "last_used DESC": "last_used DESC",
    "last_used ASC": "last_used ASC",
    "created DESC": "created DESC",
    "size DESC": "size DESC, last_used DESC",
    "hits DESC": "hits DESC, last_used DESC",
    # the names of the first index's columns, still used by callers
    "access_time DESC": "last_used DESC",
    "access_time ASC": "last_used ASC",
    "store_time DESC": "created DESC",
}


class CorruptIndex(Exception):
    """The database is not a kcache index (another program's tables, no schema row)."""


class IndexNotMade(CorruptIndex):
    """A database without any table: one another process is making at this moment (its creator
    holds the write lock between the file's creation and the tables' commit), or one a full disk
    left empty. Who reads it around (stats: the entry folders) treats it as corrupt; a listing
    that is best effort anyway (:meth:`Catalogue.keys`) lists nothing, without a warning."""


class IndexTooNew(Exception):
    """The index was made by a newer kcache (a higher schema): used read-only or not at all,
    never rewritten or deleted (processes of both versions may share one store)."""


class Row:
    """One entry as the index knows it; ``record`` is None (and ``error`` says why) for a row
    whose record does not decode or does not belong to its id."""

    __slots__ = ("id", "kind", "size", "created", "last_used", "hits", "record", "error")

    def __init__(
        self,
        id: str,
        kind: str,
        size: int,
        created: float,
        last_used: float,
        hits: int,
        record: Record | None,
        error: str | None,
    ) -> None:
        self.id, self.kind, self.size, self.created = id, kind, size, created
        self.last_used, self.hits, self.record, self.error = last_used, hits, record, error

    def __iter__(self) -> Iterator[Any]:  # (id, last_used, hits, size, record, error), as before
        return iter((self.id, self.last_used, self.hits, self.size, self.record, self.error))


def _decode_row(ident: Any, kind: Any, size: Any, created: Any, at: Any, hits: Any, blob: Any) -> Row:
    ident_s = ident if isinstance(ident, str) else repr(ident)
    kind_s = kind if isinstance(kind, str) else "?"
    num = lambda v, t: v if isinstance(v, t) and not isinstance(v, bool) else t(0)  # noqa: E731
    size_i, created_f, at_f, hits_i = num(size, int), num(created, float), num(at, float), num(hits, int)
    rec: Record | None = None
    err: str | None = None
    if not valid_id(ident):
        err = "index row id is not an entry id"
    elif not isinstance(blob, bytes):
        err = "index row holds no record"
    else:
        try:
            rec = Record.decode(blob)
            if rec.id != ident:
                err = f"index row holds the record of {rec.id[:12]}"
                rec = None
        except CorruptRecord as e:
            err = str(e)
    return Row(ident_s, kind_s, size_i, created_f, at_f, hits_i, rec, err)


class Index:
    """The catalogue in ``<folder>/kcache.sqlite``. Open with :meth:`open` (read-write, creates)
    or :meth:`open_readonly` (never creates, writes or checkpoints anything)."""

    def __init__(self, conn: sqlite3.Connection, path: str, *, readonly: bool, created: bool = False) -> None:
        self.conn, self.path, self.readonly = conn, path, readonly
        #: True when this open created the database: the store then fills it from the entries.
        self.created = created
        #: True when opened read-only as an immutable file (no live WAL seen at open).
        self.immutable = False

    @classmethod
    def open(cls, path: str, timeout: float = 0.25, setup_s: float = 3.0) -> Index:
        """Open (and create) the index database at ``path`` for reading and writing.

        Setting a database up (WAL mode, the tables) takes SQLite's write lock once; when the
        ranks of a job open a new store together they queue for it. That first open retries for
        up to ``setup_s`` seconds; every later statement waits at most ``timeout``."""
        deadline = time.monotonic() + setup_s
        while True:
            try:
                return cls._open_once(path, timeout)
            except sqlite3.OperationalError as e:
                if "locked" not in str(e).lower() and "busy" not in str(e).lower():
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005 + 0.02 * random.random())

    @classmethod
    def _open_once(cls, path: str, timeout: float) -> Index:
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                conn.execute("PRAGMA journal_mode=WAL")  # persistent: set once, by the creator
            conn.execute("PRAGMA synchronous=NORMAL")
            # The index counts against the store's size bound (it is in the folder a quota sees):
            # checkpoint the log every 128 KB (not SQLite's 4 MB) and give the space back
            # afterwards, so that it never holds more than a few dozen old pages. (The flush
            # thread writes a few pages a second at most: a checkpoint every few seconds.)
            conn.execute("PRAGMA wal_autocheckpoint=32")
            conn.execute("PRAGMA journal_size_limit=131072")
            created = False
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone():
                with _transaction(conn):
                    # Looked at again inside the write lock: another process may have made it.
                    if not conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
                    ).fetchone():
                        if conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
                            raise CorruptIndex("the database holds tables kcache did not make")
                        for stmt in _SCHEMA_SQL:
                            conn.execute(stmt)
                        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
                        created = True
            cls._check_schema(conn)
        except BaseException:  # re-raised: it only cleans up on the way
            conn.close()
            raise
        return cls(conn, path, readonly=False, created=created)

    @classmethod
    def open_readonly(cls, path: str | None, *, immutable: bool = False, timeout: float = 1.0) -> Index:
        """Open the index at ``path`` without writing anything; None (no database yet): an empty
        in-memory index. ``immutable`` (no process has it open: no ``-wal`` file) reads the file
        without even a shared-memory file; otherwise ``mode=ro`` reads through the live WAL."""
        if path is None:
            conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            for stmt in _SCHEMA_SQL:
                conn.execute(stmt)
            conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
        else:
            from urllib.parse import quote

            mode = "immutable=1" if immutable else "mode=ro"
            conn = sqlite3.connect(
                f"file:{quote(path)}?{mode}",
                uri=True,
                timeout=timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                if not conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
                    raise IndexNotMade("the index has no tables (being made, or left empty by a full disk)")
                cls._check_schema(conn)
            except BaseException:  # re-raised: it only cleans up on the way
                conn.close()
                raise
        idx = cls(conn, path or ":memory:", readonly=True)
        idx.immutable = immutable
        return idx

    @staticmethod
    def _check_schema(conn: sqlite3.Connection) -> None:
        try:
            row = conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                raise CorruptIndex("not a kcache index (no meta table)") from None
            raise
        # (isdecimal, not isdigit: int() takes every decimal digit, and no superscript "²")
        if row is not None and str(row[0]).isdecimal() and int(row[0]) > SCHEMA:
            raise IndexTooNew(f"the index has schema {row[0]}, from a newer kcache (this one reads {SCHEMA})")
        if row is None or row[0] != str(SCHEMA):
            raise CorruptIndex(f"index schema {row[0] if row else None!r} is not {SCHEMA}")

    def close(self) -> None:
        self.conn.close()

    def quick_check(self) -> list[str]:
        """SQLite's own structural check: [] when the database is sound."""
        out = [str(r[0]) for r in self.conn.execute("PRAGMA quick_check").fetchall()]
        return [] if out == ["ok"] else out

    def transaction(self) -> Any:
        """``with index.transaction():`` groups writes into one transaction."""
        return _transaction(self.conn)

    # -- entries -----------------------------------------------------------------------------
    def insert(self, rec: Record, last_used: float | None = None, hits: int = 0) -> bool:
        """Add or replace the row of ``rec`` (an entry just written, or found on disk). A row
        that cannot be written (a number SQLite refuses, a record that does not encode) is
        skipped, not raised: inside a batch's transaction, one bad row must not fail every
        later write of the process (SQLite undoes only the failed statement). False then."""
        created = rec.created if _finite(rec.created) else time.time()
        used = created if last_used is None or not _finite(last_used) else last_used
        try:
            self.conn.execute(
                "INSERT OR REPLACE INTO entries (id, kind, size, created, last_used, hits, record)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (rec.id, rec.kind, rec.size, created, used, hits, rec.encode()),
            )
        except (sqlite3.IntegrityError, OverflowError, ValueError, TypeError) as e:
            logger.info("index row of %s not written: %s", rec.id[:12], e)
            return False
        return True

    def insert_many(self, items: Iterable[tuple[Record, float | None]]) -> None:
        with self.transaction():
            for rec, at in items:
                self.insert(rec, at)

    def remove(self, ids: Iterable[str]) -> int:
        n = 0
        with self.transaction():
            for i in ids:
                n += self.conn.execute("DELETE FROM entries WHERE id = ?", (i,)).rowcount
        return n

    def remove_bad_rows(self) -> int:
        """Delete rows whose id is not an entry id (kcache never writes those)."""
        n = 0
        with self.transaction():
            for (ident,) in self.conn.execute("SELECT id FROM entries").fetchall():
                if not valid_id(ident):
                    n += self.conn.execute("DELETE FROM entries WHERE id IS ?", (ident,)).rowcount
        return n

    def touch(self, touches: dict[str, tuple[float, int]]) -> list[str]:
        """Record last use and hit counts; returns the ids the index does not know (to add)."""
        unknown = []
        with self.transaction():
            for i, (t, hits) in touches.items():
                if not _finite(t):
                    continue
                cur = self.conn.execute(
                    "UPDATE entries SET last_used = ?, hits = hits + ? WHERE id = ?",
                    (t, hits, i),
                )
                if cur.rowcount == 0:
                    unknown.append(i)
        return unknown

    def row(self, ident: str) -> Row | None:
        r = self.conn.execute(
            "SELECT id, kind, size, created, last_used, hits, record FROM entries WHERE id = ?", (ident,)
        ).fetchone()
        return _decode_row(*r) if r is not None else None

    def rows(
        self, *, kind: str | None = None, order: str = "last_used DESC", limit: int | None = None
    ) -> Iterator[Row]:
        """Every row (of ``kind``), in ``order``; rows that do not decode come with ``error`` set."""
        q = "SELECT id, kind, size, created, last_used, hits, record FROM entries"
        args: list[Any] = []
        if kind:
            q += " WHERE kind = ?"
            args.append(kind)
        q += f" ORDER BY {_ORDERS[order]}"
        if limit:
            q += " LIMIT ?"
            args.append(int(limit))
        for r in self.conn.execute(q, args).fetchall():
            yield _decode_row(*r)

    def columns(self, *, kind: str | None = None) -> list[tuple[str, str, int, float, float]]:
        """(id, kind, size, created, last_used) of every row (of ``kind``), no record decoded."""
        q = "SELECT id, kind, size, created, last_used FROM entries"
        args: tuple[Any, ...] = ()
        if kind:
            q, args = q + " WHERE kind = ?", (kind,)
        return [tuple(r) for r in self.conn.execute(q, args).fetchall()]

    def oldest(self, limit: int, before: float) -> list[tuple[str, float, int]]:
        """(id, last_used, size) of the least recently used rows, oldest first."""
        return [
            tuple(r)
            for r in self.conn.execute(
                "SELECT id, last_used, size FROM entries WHERE last_used < ? ORDER BY last_used ASC LIMIT ?",
                (before, limit),
            ).fetchall()
        ]

    def last_uses(self) -> dict[str, tuple[float, int]]:
        """id -> (last use, hits) of every row (for eviction: no record decoded)."""
        return {
            i: (float(at) if isinstance(at, (int, float)) else 0.0, int(h) if isinstance(h, int) else 0)
            for i, at, h in self.conn.execute("SELECT id, last_used, hits FROM entries")
            if isinstance(i, str)
        }

    def totals(self) -> dict[str, tuple[int, int]]:
        """kind -> (entries, bytes)."""
        return {
            str(k): (int(n), int(s or 0))
            for k, n, s in self.conn.execute("SELECT kind, COUNT(*), SUM(size) FROM entries GROUP BY kind")
        }

    def total_bytes(self) -> int:
        return int(self.conn.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0])

    def get_meta(self, name: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return row[0] if row and isinstance(row[0], str) else None

    def set_meta(self, name: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    def ids(self) -> set[str]:
        return {i for (i,) in self.conn.execute("SELECT id FROM entries") if isinstance(i, str)}

    # -- counters and misses ----------------------------------------------------------------
    def add_counters(self, deltas: dict[tuple[str, str], float], at: float | None = None) -> None:
        """Add ``deltas`` to the counters; ``at`` (the store's clock) is kept as when they were
        last updated (``kcache stats``: "updated", as ccache's "Stats updated")."""
        with self.transaction():
            if at is not None and _finite(at):
                self.set_meta(COUNTERS_UPDATED, repr(float(at)))
            for (kind, name), v in deltas.items():
                if not _finite(v):  # a NaN would fail the NOT NULL column, and the whole batch
                    continue
                self.conn.execute(
                    "INSERT INTO counters (kind, name, value) VALUES (?, ?, ?) "
                    "ON CONFLICT (kind, name) DO UPDATE SET value = value + excluded.value",
                    (kind, name, v),
                )

    def counters(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for kind, name, v in self.conn.execute("SELECT kind, name, value FROM counters"):
            if isinstance(v, (int, float)):
                out.setdefault(str(kind), {})[str(name)] = float(v)
        return out

    def reset_counters(self, at: float | None = None) -> None:
        """Zero every counter; ``at`` is kept as when (ccache's "Stats zeroed")."""
        with self.transaction():
            self.conn.execute("DELETE FROM counters")
            if at is not None and _finite(at):
                self.set_meta(COUNTERS_ZEROED, repr(float(at)))

    def meta_time(self, name: str) -> float | None:
        """A time kept in ``meta`` (:data:`COUNTERS_UPDATED`, :data:`COUNTERS_ZEROED`), or None."""
        try:
            v = float(self.get_meta(name) or "")
        except ValueError:
            return None
        return v if _finite(v) and v > 0 else None

    def add_misses(self, misses: list[tuple[float, str, str, dict[str, Any]]]) -> None:
        with self.transaction():
            for t, kind, key, comps in misses:
                self.conn.execute(
                    "INSERT INTO misses (time, kind, key, components) VALUES (?, ?, ?, ?)",
                    (t, kind, key, msgpack.packb(comps, use_bin_type=True, default=str)),
                )
            self.conn.execute(
                "DELETE FROM misses WHERE id <= (SELECT MAX(id) FROM misses) - ?", (MAX_MISSES,)
            )

    def misses(self, limit: int = 20) -> list[tuple[float, str, str, dict[str, Any]]]:
        out = []
        for t, kind, key, blob in self.conn.execute(
            "SELECT time, kind, key, components FROM misses ORDER BY id DESC LIMIT ?", (limit,)
        ):
            try:
                comps = msgpack.unpackb(blob, raw=False, strict_map_key=False) if blob else {}
                if not isinstance(comps, dict):
                    comps = {}
            except DECODE_ERRORS:  # a row another program wrote: no components
                comps = {}
            out.append((float(t or 0.0), str(kind), str(key), comps))
        return out


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error); nests as a no-op."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.outer = False

    def __enter__(self) -> None:
        if not self.conn.in_transaction:
            self.conn.execute("BEGIN IMMEDIATE")
            self.outer = True

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if not self.outer:
            return
        if exc_type is None:
            self.conn.execute("COMMIT")
        else:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass


def is_corrupt_db(e: BaseException) -> bool:
    """True for an error that says the database file itself is damaged or not ours."""
    if isinstance(e, CorruptIndex):
        return True
    msg = str(e).lower()
    return isinstance(e, sqlite3.DatabaseError) and (
        "malformed" in msg or "not a database" in msg or "file is encrypted" in msg or "disk image" in msg
    )


def _finite(v: Any) -> bool:
    """A number SQLite stores as it is (NaN becomes NULL; inf is refused by no column but sorts
    past every eviction)."""
    return isinstance(v, (int, float)) and -1e300 < v < 1e300
