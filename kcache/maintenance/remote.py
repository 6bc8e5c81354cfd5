"""``kcache remote``: whether the shared tier answers, each of its nodes (a single server, or every
node of a cluster), and what kcache holds there (entries found by ``SCAN`` on each master, with
their sizes and kinds; :mod:`kcache.store.tiers.redis_survey`)."""

from __future__ import annotations

from typing import Any

from ..config import Settings, redact


def remote_report(
    settings: Settings, *, limit: int = 10_000, timeout_s: float = 2.0, budget_s: float = 10.0
) -> dict[str, Any]:
    """What ``kcache remote`` prints. ``reachable`` is False (with ``error``) when no node answers
    within ``timeout_s``; ``limit`` bounds the entry keys looked at (0: all) and ``budget_s`` the
    time spent looking (``complete`` says whether every key was seen)."""
    from ..store.tiers.redis import RemoteConfig, trust_line
    from ..store.tiers.redis_survey import survey

    cfg = RemoteConfig.from_settings(settings)
    if cfg is None:
        raise ValueError("no shared tier configured (set KCACHE_REMOTE)")
    out: dict[str, Any] = {
        "url": cfg.shown_url,
        "mode": "cluster" if cfg.cluster else "server",
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
        out.update(survey(cfg, limit=limit, budget_s=budget_s, timeout_s=max(cfg.timeout_s, timeout_s)))
    except ImportError:
        out["error"] = "the redis package is not installed (pip install 'kcache[redis]')"
    except Exception as e:  # a URL option redis-py refuses, ...
        out["error"] = redact(f"{type(e).__name__}: {e}")
    return out
