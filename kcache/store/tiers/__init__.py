"""Tiers behind the local store: backends the composed cache asks after a local miss.

:func:`tier_for` is the one place that maps a shared tier's URL (``KCACHE_REMOTE``) to the tier
that serves it; a new kind of tier is a module here and a line in :data:`SCHEMES`.
"""

from __future__ import annotations

from typing import Any

#: URL scheme -> the module of the tier that serves it (imported on use: tiers import clients).
SCHEMES = {
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "redis+cluster": "redis",  # a Redis Cluster or a Valkey cluster (tiers/redis_cluster.py)
    "rediss+cluster": "redis",
}


def tier_for(url: str, settings: Any, counts: Any) -> Any:
    """The tier for ``url``, configured from ``settings`` (:class:`kcache.config.Settings`: its
    ``remote_*`` values, the secret, the key tag), counting into ``counts``. Raises ValueError
    for a scheme no tier serves."""
    scheme = url.partition("://")[0].lower()
    if SCHEMES.get(scheme) == "redis":
        from .redis import RemoteConfig, RemoteTier

        cfg = RemoteConfig.from_settings(settings, url=url)
        if cfg is None:
            raise ValueError(
                "the shared tier's settings have problems: " + "; ".join(settings.remote_problems)
            )
        return RemoteTier(cfg, counts)
    raise ValueError(f"no tier serves {scheme or url[:20]!r} URLs (known: {', '.join(SCHEMES)})")
