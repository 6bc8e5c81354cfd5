"""The shared tier's backends, by name: which one a ``KCACHE_REMOTE`` value names.

A backend is one class (:class:`kcache.store.tiers.backend.Backend`) in one file; this registry
names kcache's own by string, as :mod:`kcache.integrations` names integrations, so that reading the
settings (:mod:`kcache.config`) imports none of them unless ``KCACHE_REMOTE`` is set, and then
only their modules (which import no client library until the tier is used). A new backend is its
file and one line in :data:`BACKENDS`.

``KCACHE_REMOTE`` is either a URL whose scheme one of :data:`BACKENDS` declares
(``redis://...``, ``s3://...``), or ``package.module:Class``: a user's own backend class, as
Triton's ``TRITON_CACHE_MANAGER`` names a cache manager. Naming a class means trusting its code:
it is imported, and runs in every process of the program that uses the shared tier, with the
program's rights. It is imported when the tier is first made, not when the settings are read.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

#: kcache's own backends, ``module:Class``, in the order their schemes are looked up.
BACKENDS = (
    "kcache.store.tiers.redis:RedisBackend",
    "kcache.store.tiers.s3:S3Backend",
)

_CLASS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_class_name(value: str) -> bool:
    """Whether ``value`` names a user's backend class (``package.module:Class``), not a URL."""
    return "://" not in value and bool(_CLASS_RE.match(value))


def load(spec: str) -> Any:
    """The class named ``module:Class`` (imported). Raises ImportError, AttributeError."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def builtin() -> list[Any]:
    """kcache's own backend classes (their modules imported; no client library)."""
    return [load(spec) for spec in BACKENDS]


def schemes() -> dict[str, Any]:
    """URL scheme (lower case) -> the backend class that serves it."""
    return {scheme: cls for cls in builtin() for scheme in cls.schemes}


def scheme_of(url: str) -> str | None:
    m = _SCHEME_RE.match(url)
    return m.group(1).lower() if m else None


def for_url(url: str) -> Any | None:
    """The backend class of ``url`` (a scheme of :data:`BACKENDS`), or None: a user's class is
    not imported here (:func:`load` does that, when the tier is made)."""
    scheme = scheme_of(url)
    return schemes().get(scheme) if scheme else None


def expected() -> str:
    """What ``KCACHE_REMOTE`` may be, for messages."""
    forms = [cls.url_forms for cls in builtin() if cls.url_forms]
    return "; ".join(forms + ["or package.module:Class (a backend class of your own)"])


def default_timeout_s(settings: Any) -> float | None:
    """The call deadline (seconds) of the backend ``settings.remote`` names, where
    ``KCACHE_REMOTE_TIMEOUT`` is not set and that backend has its own default (S3's 500 ms: an
    object store's, not a memory server's 100 ms); None otherwise. One rule for the tier that is
    made (:func:`kcache.store.tiers.backend_for`) and for what ``kcache config`` shows."""
    remote = getattr(settings, "remote", None)
    if not remote or (getattr(settings, "sources", None) or {}).get("remote_timeout") != "default":
        return None
    cls = for_url(remote) if "://" in remote else None  # (a user's class is not imported here)
    own = getattr(cls, "default_timeout_s", None)
    return float(own) if own else None
