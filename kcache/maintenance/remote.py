"""``kcache remote``: whether the shared tier answers, each of its nodes (a Redis server, every node
of a cluster, an S3 bucket), and what kcache holds there (entries by kind, with their sizes):
the backend's own survey (:meth:`kcache.store.tiers.backend.Backend.survey`)."""

from __future__ import annotations

from typing import Any

from ..config import Settings, redact
from ..redact import redact_all


def remote_report(
    settings: Settings, *, limit: int = 10_000, timeout_s: float = 2.0, budget_s: float = 10.0
) -> dict[str, Any]:
    """What ``kcache remote`` prints, every string in it redacted (a password in an endpoint URL,
    a secret quoted by an error). ``reachable`` is False (with ``error``) when no node answers
    within ``timeout_s``; ``limit`` bounds the entry keys looked at (0: all) and ``budget_s`` the
    time spent looking (``complete`` says whether every key was seen)."""
    from ..store.tiers import backend_for
    from ..store.tiers.backend import Unavailable
    from ..store.tiers.entry import trust_line

    backend = backend_for(settings)
    if backend is None:
        raise ValueError("no shared tier configured (set KCACHE_REMOTE)")
    cfg = backend.cfg
    out: dict[str, Any] = {
        "url": cfg.shown_url,
        "backend": backend.name,
        "mode": backend.describe().get("mode", "server"),
        "prefix": cfg.prefix,
        "signed": bool(cfg.secret),
        "authenticated": bool(cfg.secret),
        "trust": trust_line(cfg.secret),
        "max_entry": cfg.max_entry,
        "timeout_ms": round(cfg.timeout_s * 1000, 3),
        "lock_lease_s": cfg.lease_s,
        "leases": backend.leases,
        "reachable": False,
    }
    try:
        backend.open()
        try:
            out.update(
                backend.survey(limit=limit, budget_s=budget_s, timeout_s=max(cfg.timeout_s, timeout_s))
            )
        finally:
            backend.close()
    except ImportError:
        how = f" (pip install 'kcache[{backend.extra}]')" if backend.extra else ""
        out["error"] = f"the {backend.name} backend's client library is not installed{how}"
    except (ValueError, TypeError, OSError, Unavailable) as e:  # an option the client library refuses, ...
        out["error"] = redact(f"{type(e).__name__}: {e}")
    redacted: dict[str, Any] = redact_all(out)
    return redacted
