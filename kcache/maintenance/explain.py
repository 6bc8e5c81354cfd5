"""``kcache explain``: why lookups missed, by the key components that differ from stored entries.

Ranking stored entries against a miss is done on key components, as JAX's cache key is built
from named components: a miss is explained by naming the component that changed.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

from ..store import Record
from ..store.api import Admin
from ..store.index import MAX_MISSES
from .common import jsonable

#: explain ranks stored entries among this many most recently used of the kind.
EXPLAIN_SCAN = 20_000


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
    store: Admin, *, kind: str | None = None, limit: int | None = 10, nearest: int = 3
) -> list[dict[str, Any]]:
    """The most recent misses (repeated keys once, with a count), each with the ``nearest`` stored
    entries of its kind, ranked by how many key components they share with the miss (ties: the
    most recently used), and the components that differ."""
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
                "stored_now": store.record_mtime(ident) is not None,
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
