"""Tiers behind the local store: backends the composed cache (:mod:`kcache.store.cache`) asks
after a local miss and hands what the local store commits (the :class:`~kcache.store.api.Tier`
face). :func:`tier_for` is the one place that maps a ``KCACHE_REMOTE`` URL to a tier: a new kind
of tier is a module here, with a ``make(settings, key_tag, counts)`` function, and a line in
:data:`SCHEMES`."""

from __future__ import annotations

import importlib
from typing import Any

#: URL scheme (lower case) -> the module (in this package) of the tier that serves it.
SCHEMES = {
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "redis+cluster": "redis",  # a Redis Cluster or a Valkey cluster (redis_cluster.py)
    "rediss+cluster": "redis",
}


def tier_for(settings: Any, key_tag: str, counts: Any) -> Any:
    """The tier for ``settings.remote`` (:class:`kcache.config.Settings`), or None when none is
    configured (or its scheme names no tier: the settings say so). The tier imports its client
    library at its first use, not here."""
    url = getattr(settings, "remote", None)
    if not url:
        return None
    name = SCHEMES.get(url.split(":", 1)[0].lower())
    if name is None:
        return None
    return importlib.import_module(f"{__name__}.{name}").make(settings, key_tag, counts)
