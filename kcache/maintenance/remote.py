"""``kcache remote``: whether the shared tier answers, the server's state, and what kcache holds
there (from the prefix's index, each listed entry checked with one pipelined ``STRLEN``)."""

from __future__ import annotations

import time
from typing import Any

from ..config import Settings, redact

#: INFO fields reported (server, memory, stats, clients sections).
_INFO = (
    "redis_version",
    "valkey_version",
    "redis_mode",
    "uptime_in_seconds",
    "connected_clients",
    "used_memory",
    "maxmemory",
    "maxmemory_policy",
    "evicted_keys",
    "expired_keys",
    "keyspace_hits",
    "keyspace_misses",
    "rejected_connections",
)


def remote_report(settings: Settings, *, limit: int = 10_000, timeout_s: float = 2.0) -> dict[str, Any]:
    """What ``kcache remote`` prints. ``reachable`` is False (with ``error``) when the server does
    not answer within ``timeout_s``; ``limit`` bounds the entries checked (newest first; 0: all)."""
    from ..store.tiers.redis import RemoteConfig, connect, trust_line

    cfg = RemoteConfig.from_settings(settings)
    if cfg is None:
        raise ValueError("no shared tier configured (set KCACHE_REMOTE)")
    out: dict[str, Any] = {
        "url": cfg.shown_url,
        "prefix": cfg.prefix,
        "signed": bool(cfg.secret),
        "authenticated": bool(cfg.secret),
        "trust": trust_line(cfg.secret),
        "max_entry": cfg.max_entry,
        "timeout_ms": round(cfg.timeout_s * 1000, 3),
        "lock_lease_s": cfg.lease_s,
        "reachable": False,
    }
    try:
        r = connect(cfg, timeout_s=max(cfg.timeout_s, timeout_s))
    except ImportError:
        out["error"] = "the redis package is not installed (pip install 'kcache[redis]')"
        return out
    try:
        t0 = time.perf_counter()
        r.ping()
        out["ping_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        out["reachable"] = True
        try:
            info = r.info()
            out["server"] = {k: info[k] for k in _INFO if k in info}
        except Exception as e:  # INFO may be denied by an ACL
            out["server"] = {"error": redact(e)}
        idx = cfg.index_key
        out["indexed"] = int(r.zcard(idx))
        stop = -1 if limit == 0 else limit - 1
        rows = r.zrevrange(idx, 0, stop, withscores=True)
        by_kind: dict[str, dict[str, int]] = {}
        present = nbytes = 0
        newest = oldest = None
        for i in range(0, len(rows), 1000):
            chunk = rows[i : i + 1000]
            p = r.pipeline(transaction=False)
            for member, _score in chunk:
                ident = member.decode(errors="replace").rpartition(" ")[2]
                p.strlen(cfg.entry_key(ident))
            for (member, score), n in zip(chunk, p.execute()):
                kind = member.decode(errors="replace").partition(" ")[0] or "?"
                k = by_kind.setdefault(kind, {"entries": 0, "bytes": 0, "gone": 0})
                if n:
                    k["entries"] += 1
                    k["bytes"] += int(n)
                    present += 1
                    nbytes += int(n)
                    newest = score if newest is None else max(newest, score)
                    oldest = score if oldest is None else min(oldest, score)
                else:
                    k["gone"] += 1
        out.update(
            checked=len(rows),
            entries=present,
            bytes=nbytes,
            gone=len(rows) - present,
            newest=newest,
            oldest=oldest,
            by_kind=dict(sorted(by_kind.items())),
        )
    except Exception as e:
        out["error"] = redact(f"{type(e).__name__}: {e}")
    finally:
        try:
            r.close()
        except Exception:
            pass
    return out
