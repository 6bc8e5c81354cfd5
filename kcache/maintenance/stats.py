"""``kcache stats`` and :func:`kcache.stats`: entries, bytes and counters from a store's index."""

from __future__ import annotations

from typing import Any

from ..store.api import Admin


def store_stats(store: Admin) -> dict[str, Any]:
    """entries, bytes, hits, misses, hit_rate, saved_s, puts, evictions, errors, and by_kind."""
    idx = store.index()
    totals = idx.totals()
    counters = idx.counters()
    kinds = sorted(set(totals) | set(counters) - {"store"})
    by_kind: dict[str, dict[str, Any]] = {}
    for k in kinds:
        n, b = totals.get(k, (0, 0))
        c = counters.get(k, {})
        hits, misses = int(c.get("hits", 0)), int(c.get("misses", 0))
        by_kind[k] = {
            "entries": n,
            "bytes": b,
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else None,
            "puts": int(c.get("puts", 0)),
            "errors": int(c.get("errors", 0)),
            "quarantined": int(c.get("quarantined", 0)),  # entries whose use raised (redone)
            "saved_s": round(c.get("saved_s", 0.0), 3),
            # hits whose compile time a served torch.compile graph already counted (not saved twice)
            "covered_s": round(c.get("covered_s", 0.0), 3),
            "uses": int(c.get("uses", 0)),  # machine-local answers used (not hits; their time is saved)
            "recached": int(c.get("recached", 0)),  # lookups KCACHE_RECACHE=1 turned into misses
        }
        remote = _remote_counts(c)
        if remote:
            by_kind[k]["remote"] = remote
    hits = sum(v["hits"] for v in by_kind.values())
    misses = sum(v["misses"] for v in by_kind.values())
    from ..store.index import COUNTERS_UPDATED, COUNTERS_ZEROED

    return {
        "dir": str(store.root),
        "max_size": store.max_size,
        "entries": sum(v["entries"] for v in by_kind.values()),
        "bytes": sum(v["bytes"] for v in by_kind.values()),
        "hits": hits,
        "misses": misses,
        "hit_rate": hits / (hits + misses) if hits + misses else None,
        "puts": sum(v["puts"] for v in by_kind.values()),
        "evictions": int(counters.get("store", {}).get("evictions", 0)),
        "errors": sum(v["errors"] for v in by_kind.values()),
        "quarantined": sum(v["quarantined"] for v in by_kind.values()),
        "recached": sum(v["recached"] for v in by_kind.values()),
        "saved_s": round(sum(v["saved_s"] for v in by_kind.values()), 3),
        "by_kind": by_kind,
        "remote": _remote_totals(by_kind),
        # ccache's "Stats updated" and "Stats zeroed": when the counters were last written, and
        # last reset (None: never; the counters then run from the store's first use)
        "updated_at": idx.meta_time(COUNTERS_UPDATED),
        "zeroed_at": idx.meta_time(COUNTERS_ZEROED),
    }


#: The shared tier's counters (``remote_*`` in the index, per kind; see kcache/store/tiers/redis.py),
#: as ``kcache stats`` shows them.
REMOTE_FIELDS = (
    "hits",
    "misses",
    "puts",
    "fills",
    "bytes_in",
    "bytes_out",
    "errors",
    "refused",
    "dropped",
    "too_large",
    "bypassed",
    "waited",
    "ignored",
    "wait_s",
    "fruitless_s",
    "marked_bad",
    "s",
)
_SECONDS = ("s", "wait_s", "fruitless_s")


def _remote_counts(c: dict[str, float]) -> dict[str, float]:
    """A kind's shared-tier counters (empty when it never used one)."""
    got = {name[len("remote_") :]: v for name, v in c.items() if name.startswith("remote_")}
    if not got:
        return {}
    return {f: (round(got.get(f, 0.0), 3) if f in _SECONDS else int(got.get(f, 0))) for f in REMOTE_FIELDS}


def _remote_totals(by_kind: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The shared tier's counters over every kind, with its hit rate; None if never used."""
    parts = [v["remote"] for v in by_kind.values() if "remote" in v]
    if not parts:
        return None
    out: dict[str, Any] = {f: sum(p[f] for p in parts) for f in REMOTE_FIELDS}
    for f in _SECONDS:
        out[f] = round(out[f], 3)
    asked = out["hits"] + out["misses"]
    out["hit_rate"] = out["hits"] / asked if asked else None
    return out


def stats(store: Admin) -> dict[str, Any]:
    """``kcache stats``: :func:`store_stats`, and where the index is."""
    out = store_stats(store)
    out["index"] = str(store.index_dir)
    return out


def zero_counters(store: Admin) -> None:
    """Reset the hit/miss/put/eviction counters (not the entries, nor their per-entry hits)."""
    if store.readonly:  # a missing directory: nothing to reset
        return
    store.index().reset_counters(at=store.now())
