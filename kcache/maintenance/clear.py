"""``kcache clear``: remove entries by kind, age, staleness, or all of them.

Freeing space must work on a full disk, where SQLite cannot open its write-ahead log: the index
is read without writing, the entry folders are removed first (that frees the space), and only
then are their rows dropped. Rows the index could not drop are rows of missing entries: stats
and eviction skip them, and ``kcache verify --fix`` (or the next clear) removes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..kinds import valid_id
from ..log import logger
from ..store import Record
from ..store.api import Admin
from ..store.errors import EXPECTED
from .common import jsonable


def version_components() -> tuple[str, ...]:
    """Components that describe libraries, by which an entry can be stale (never arch or GPU)."""
    from .. import fingerprint

    return fingerprint.version_components()


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


def age_text(seconds: float) -> str:
    """An age as a person reads it: ``45s``, ``26m``, ``5.2h``, ``3.1d`` (the unit the age is
    counted in; "0.0d" for 26 minutes said nothing)."""
    s = max(0.0, float(seconds))
    if s < 120:
        return f"{s:.0f}s"
    if s < 2 * 3600:
        return f"{s / 60:.0f}m"
    if s < 2 * 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


class _Candidate:
    __slots__ = ("ident", "kind", "size", "last_used", "rec", "on_disk", "in_index", "why")

    def __init__(self, ident: str, kind: str | None, size: int, last_used: float | None, rec: Record | None,
                 on_disk: bool, in_index: bool) -> None:  # fmt: skip
        self.ident, self.kind, self.size, self.last_used, self.rec = ident, kind, size, last_used, rec
        self.on_disk, self.in_index = on_disk, in_index
        self.why: list[str] = []


def catalogue(store: Admin) -> tuple[Any, str | None]:
    """The store's index for reading, and why it is not the writable one (None when it is).

    A full disk, a locked or a corrupt index must not stop a clean-up: the index is opened
    read-only then, or (when even that fails) not at all, and the entries on disk decide."""
    try:
        return store.index(), None
    except EXPECTED as e:  # a full disk, a locked or corrupt index: see the docstring
        why = f"{type(e).__name__}: {e}"
    try:
        return store.index_readonly(), why
    except EXPECTED as e:  # as above: then without the index
        logger.debug("read-only index: %s", e)
        return None, why


def clear(
    store: Admin,
    *,
    kind: str | None = None,
    older_than: float | None = None,
    stale: bool = False,
    everything: bool = False,
    dry_run: bool = False,
    current: Callable[[str], str | None] | None = None,
    now: float | None = None,
    name: str | None = None,
    ids: Iterable[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Remove the entries that match every selector given (``everything``: all of them).

    ``name`` selects entries whose name (kernel, model, graph) matches the pattern (see
    :mod:`.select`); ``ids``, the entries with these ids. ``progress(n)`` is called as entries
    are removed.

    ``older_than`` (seconds) selects entries not used (nor created) for that long: the later of
    the index's last use and the record file's mtime, which a hit refreshes, both by the store's
    clock. ``stale`` selects entries whose library versions differ from this machine's (see
    :func:`stale_reasons`). Unreadable entries and rows go only with ``everything``. With
    ``dry_run`` nothing changes. The result says whether the index could be updated."""
    from .select import entry_name, name_matches

    wanted = set(ids) if ids is not None else None
    selective = bool(kind or older_than is not None or stale or name is not None or wanted is not None)
    if not (selective or everything):
        raise ValueError("no selector: pass --kind, --older-than, --stale, a name, an id or --all")
    now = store.now() if now is None else now
    if stale and current is None:
        from .. import fingerprint

        current = fingerprint.current
    names = version_components()
    idx, index_problem = catalogue(store)
    cands: dict[str, _Candidate] = {}
    bad_rows = False
    if idx is not None:
        try:
            # kind, size and last use are columns: no record decoded (100,000 rows: ~0.3 s)
            for ident, k, size, created, at in idx.columns():
                if not valid_id(ident):  # never a path: a crafted row must not name a folder
                    bad_rows = True
                    continue
                cands[ident] = _Candidate(ident, k, size or 0, at or created, None, False, True)
            if stale or name is not None:
                for row in idx.rows():
                    if row.record is not None and row.id in cands:
                        cands[row.id].rec = row.record
        except EXPECTED as e:  # a locked or corrupt index: the entries on disk decide
            index_problem = index_problem or f"{type(e).__name__}: {e}"
            cands.clear()
    for ident in store.iter_entry_ids():
        c = cands.get(ident)
        if c is None or ((stale or name is not None) and c.rec is None) or c.kind is None:
            rec, _why = store.read_record(ident)
            if c is None:
                c = cands[ident] = _Candidate(
                    ident, rec.kind if rec else None, rec.size if rec else 0, None, rec, True, False
                )
            elif rec is not None:
                c.rec, c.kind = rec, rec.kind
        c.on_disk = True
    chosen = []
    for c in cands.values():
        if wanted is not None and c.ident not in wanted:
            continue
        if c.kind is None:  # an entry folder without a readable record
            if (everything and not selective) or (wanted is not None and name is None and not kind):
                c.why.append("unreadable")
                chosen.append(c)
            continue
        if kind and c.kind != kind:
            continue
        if name is not None:
            n = entry_name(c.rec)
            if not name_matches(n, name):
                continue
            c.why.append(f"name {n}")
        if wanted is not None:
            c.why.append("id")
        if older_than is not None:
            if c.on_disk and (c.last_used is None or now - c.last_used > older_than):
                # the index says old (or does not know): a hit since refreshed the record's mtime
                mt = store.record_mtime(c.ident)
                if mt is not None:
                    c.last_used = mt if c.last_used is None else max(c.last_used, mt)
            last = c.last_used if c.last_used is not None else (c.rec.created if c.rec else None)
            if last is None or now - last <= older_than:
                continue
            c.why.append(f"unused for {age_text(now - last)}")
        if stale:
            assert current is not None
            diffs = stale_reasons(c.rec.components, current, names) if c.rec else []
            if not diffs:
                continue
            c.why.append("stale: " + ", ".join(f"{d['name']} {d['stored']} != {d['current']}" for d in diffs))
        chosen.append(c)
    if idx is not None:  # the names of what goes (only --name and --stale read the records above)
        for c in chosen:
            if c.rec is None and c.in_index:
                try:
                    row = idx.row(c.ident)
                except EXPECTED as e:  # a name is for the listing; the clear goes on
                    logger.debug("clear: row %s: %s", c.ident, e)
                    break
                c.rec = row.record if row is not None else None
    removed = [
        {
            "id": c.ident,
            "kind": c.kind,
            "size": c.size,
            "last_used": c.last_used,
            "why": "; ".join(c.why) or (f"kind {kind}" if kind else "all"),
            "name": entry_name(c.rec) if c.rec is not None else None,
        }
        for c in chosen
    ]
    leftovers = 0
    index_updated = True
    if not dry_run and not store.readonly:
        # Folders first: that frees the space, and works when the disk is full.
        on_disk = [c.ident for c in chosen if c.on_disk]
        for i in range(0, len(on_disk), 256):
            chunk = on_disk[i : i + 256]
            store.remove(chunk, index=False)
            if progress is not None:
                progress(len(chunk))
        leftovers = store.clean_tmp()
        drop = [c.ident for c in chosen if c.in_index]
        if drop or (bad_rows and everything and not selective):
            try:
                w = store.index()
                w.remove(drop)
                if bad_rows and everything:
                    w.remove_bad_rows()
                index_problem = None
            except EXPECTED as e:  # entries are removed, the index is reported
                index_updated = False
                index_problem = f"{type(e).__name__}: {e}"
    return {
        "dry_run": dry_run,
        "count": len(removed),
        "bytes": sum(r["size"] for r in removed),
        "leftovers": leftovers,
        "entries": removed,
        "index_updated": index_updated,
        "index_problem": index_problem,
    }
