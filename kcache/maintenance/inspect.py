"""``kcache inspect``: entries from the index; with a prefix, whole records read from disk."""

from __future__ import annotations

import re
from typing import Any

from ..store import Record
from ..store.api import Admin
from .common import entry_dict, jsonable


def printable(text: Any) -> str:
    """``text`` as a terminal may show it: control characters (escape sequences, carriage
    returns, bidirectional overrides, ...) as ``\\x1b``-style escapes. Keys, summaries and
    components come from other machines too (the shared tier, bundles): printed raw, they could
    rewrite what the terminal shows."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else _escape(c) for c in s)


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


#: ``inspect --sort``: the index's order for each.
SORTS = {"used": "last_used DESC", "size": "size DESC", "hits": "hits DESC"}


def list_entries(
    store: Admin,
    *,
    kind: str | None = None,
    limit: int | None = 50,
    sort: str = "used",
    name: str | None = None,
) -> list[dict[str, Any]]:
    """Entries from the index alone (no entry file is read): most recently used first, or the
    largest (``sort="size"``) or most hit (``"hits"``) first; with ``name``, only entries whose
    name matches it (see :mod:`.select`)."""
    from .select import entry_name, name_matches

    out: list[dict[str, Any]] = []
    rows = store.index().rows(kind=kind, order=SORTS[sort], limit=None if name else (limit or None))
    for row in rows:
        if name is not None:
            if row.record is None or not name_matches(entry_name(row.record), name):
                continue
            if limit and len(out) >= limit:
                break
        if row.record is None:
            out.append(
                {
                    "id": row.id,
                    "kind": row.kind,
                    "key": None,
                    "size": row.size,
                    "created": row.created or None,
                    "last_used": row.last_used,
                    "hits": row.hits,
                    "summary": {},
                    "error": row.error,
                }
            )
        else:
            d = entry_dict(row.record, last_used=row.last_used, hits=row.hits, size=row.size)
            d["name"] = entry_name(row.record)
            out.append(d)
    return out


def group_entries(
    store: Admin,
    *,
    kind: str | None = None,
    name: str | None = None,
    sort: str = "size",
    limit: int | None = 50,
) -> list[dict[str, Any]]:
    """Entries grouped by what they hold (kernel, model or graph name; else kind), as
    ``huggingface-cli scan-cache`` groups by repository: per group the entries, bytes, kinds,
    last use and hits; the largest first (``sort``: size, used, hits)."""
    from .select import entry_name, group_key, name_matches

    groups: dict[str, dict[str, Any]] = {}
    for row in store.index().rows(kind=kind):
        if name is not None and (row.record is None or not name_matches(entry_name(row.record), name)):
            continue
        key = group_key(row.record, row.kind)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {
                "name": key,
                "entries": 0,
                "bytes": 0,
                "kinds": {},
                "last_used": None,
                "hits": 0,
            }
        g["entries"] += 1
        g["bytes"] += row.size
        g["kinds"][row.kind] = g["kinds"].get(row.kind, 0) + 1
        if row.last_used and (g["last_used"] is None or row.last_used > g["last_used"]):
            g["last_used"] = row.last_used
        g["hits"] += row.hits or 0
    order = {"size": "bytes", "used": "last_used", "hits": "hits"}[sort]
    out = sorted(groups.values(), key=lambda g: (-(g[order] or 0), g["name"]))
    return out[: limit or None]


def find_entries(
    store: Admin, prefix: str, *, kind: str | None = None, limit: int | None = 50
) -> list[dict[str, Any]]:
    """Entries whose id starts with ``prefix`` (looked up on disk), else whose key does (through
    the index), each with its whole record, a check of its members and its path."""
    recs: dict[str, Record | None] = {}
    problems: dict[str, str] = {}
    p = prefix.lower()
    if re.fullmatch(r"[0-9a-f]{1,40}", p):
        for ident in store.iter_entry_ids():
            if not ident.startswith(p):
                continue
            rec, why = store.read_record(ident)
            if rec is not None and kind and rec.kind != kind:
                continue
            recs[ident] = rec
            if why:
                problems[ident] = why
    idx = store.index()
    if not recs:
        for listed in idx.rows(kind=kind):
            if listed.record is not None and listed.record.key.startswith(prefix):
                recs[listed.id] = listed.record
    out = []
    for ident, rec in sorted(recs.items())[: limit or None]:
        row = idx.row(ident)
        if rec is None:
            out.append({"id": ident, "kind": None, "key": None, "status": problems.get(ident, "unreadable")})
            continue
        d = entry_dict(rec, last_used=row.last_used if row else None, hits=row.hits if row else None)
        _hit, why = store.read_any(ident)
        d["status"] = "ok" if why is None else why
        d["path"] = store.entry_dir(ident)
        d["schema"] = rec.schema
        d["components"] = jsonable(rec.components)
        d["files"] = [
            {"name": f.name, "size": f.size, "crc32": f.crc32, "sha256": f.sha256, "xxh3": f.xxh3}
            for f in rec.files
        ]
        out.append(d)
    return out
