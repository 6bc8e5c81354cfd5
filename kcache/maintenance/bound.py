"""The store's size bound as every process that opens it sees it, and where it comes from: the
store's ``kcache.conf`` (``kcache config --set max_size=...``), else the default; a process whose
environment sets ``KCACHE_MAX_SIZE`` uses that instead (``kcache stats`` and ``kcache config``
say so when this shell's does)."""

from __future__ import annotations

from typing import Any

from ..config import DEFAULT_MAX_SIZE, Settings
from ..store.conf import NAME, read_path


def bound_of(settings: Settings) -> dict[str, Any]:
    """``store``: the store's own bound; ``store_source``: where it comes from; ``env``: this
    process's overriding bound (KCACHE_MAX_SIZE or an argument), else None."""
    kept = read_path(settings.dir).get("max_size")
    overridden = settings.sources.get("max_size", "default") != "default"
    return {
        "store": int(kept or DEFAULT_MAX_SIZE),
        "store_source": f"the store's {NAME}" if kept else "the default",
        "env": int(settings.max_size) if overridden else None,
        "env_source": settings.sources.get("max_size") if overridden else None,
    }
