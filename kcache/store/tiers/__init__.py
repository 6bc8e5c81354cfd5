"""Tiers behind the local store: the shared tier the composed cache (:mod:`kcache.store.cache`)
asks after a local miss and hands what the local store commits (the
:class:`~kcache.store.api.Tier` face).

One machinery (:mod:`.shared`) over thin backends (:mod:`.backend`): :mod:`.redis` (a Redis
server or cluster), :mod:`.s3` (S3-compatible object storage), or a user's class. Which backend
``KCACHE_REMOTE`` names is :mod:`kcache.remotes`' to say; :func:`tier_for` makes the tier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...log import warn_once

if TYPE_CHECKING:
    from ...config import Settings
    from ...counters import Counters
    from .backend import Backend
    from .shared import SharedTier


def backend_for(settings: Settings, key_tag: str | None = None) -> Backend | None:
    """The backend ``settings.remote`` names, made (no network, no client library yet), or None
    when none is configured or usable (the settings' problems say why; a user's class that
    cannot be imported warns once)."""
    from ... import remotes
    from .backend import Backend, TierConfig

    cfg = TierConfig.from_settings(settings)
    if cfg is None:
        return None
    if key_tag is not None:
        cfg.key_tag = key_tag
    if not remotes.is_class_name(cfg.url):
        cls = remotes.for_url(cfg.url)
        if cls is None:
            return None
        if (
            cls.default_timeout_s
            and (getattr(settings, "sources", None) or {}).get("remote_timeout") == "default"
        ):
            cfg.timeout_s = cls.default_timeout_s  # (an object store's, not a memory server's)
        made: Backend = cls(cfg)
        return made
    try:
        user: Any = remotes.load(cfg.url)
    except (ImportError, AttributeError) as e:
        warn_once("remote-class", f"KCACHE_REMOTE={cfg.url}: cannot import it ({e}); the shared tier is off")
        return None
    if not (isinstance(user, type) and issubclass(user, Backend)):
        warn_once(
            "remote-class",
            f"KCACHE_REMOTE={cfg.url} is not a kcache.store.tiers.backend.Backend subclass; "
            "the shared tier is off (docs/remote.md: your own backend)",
        )
        return None
    try:
        backend: Backend = user(cfg)
    except Exception as e:  # broad: a user's class is foreign code; its failure turns the tier off
        warn_once("remote-class", f"KCACHE_REMOTE={cfg.url}: {type(e).__name__}: {e}; the shared tier is off")
        return None
    from .foreign import Foreign

    return Foreign(backend)  # (its failures sorted as foreign code's: never raised into the program)


def tier_for(settings: Settings, key_tag: str, counts: Counters | None) -> SharedTier | None:
    """The shared tier for ``settings.remote`` (:class:`kcache.config.Settings`), or None when
    none is configured (or usable: the settings say why). The backend imports its client library
    at the tier's first use, not here."""
    from .shared import SharedTier

    backend = backend_for(settings, key_tag)
    return None if backend is None else SharedTier(backend, counts)
