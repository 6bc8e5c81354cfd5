"""Named components of Triton's cache key, so that ``kcache explain`` can say what changed.

Triton hands a cache manager only the hash of its key. ``triton.compile`` builds that key with
``get_cache_key(src, backend, options, env_vars)``, hashes it and builds the manager at once, on
the same thread. Wrapping ``get_cache_key`` (same arguments, same result) lets kcache keep what
the key was made of for the manager that comes next: kernel name, source hash, backend (target
arch and ptxas), options and the cache-invalidating environment.

Nothing is computed on the way to a hit: the wrapper only keeps its arguments (a thread-local
reference, well under a microsecond; it hashed the key, the source and the backend again at
every compile before, tens of microseconds), and the manager asks for the components only when
it needs them: on a miss (the miss log, the record of a new entry) and for the compile's target
(checked against a served group's). Whether they belong to the manager's key is checked then,
by hashing the key text as Triton does: arguments kept for another key are never used.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from typing import Any

from .. import fingerprint

_local = threading.local()


def _base32(hexdigest: str) -> str:
    return base64.b32encode(bytes.fromhex(hexdigest)).decode().rstrip("=")


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Origin:
    """What one ``get_cache_key`` call was given; the components are made from it on demand."""

    __slots__ = ("key_text", "src", "backend", "options", "env_vars", "_key", "_comps")

    def __init__(self, key_text: str, src: Any, backend: Any, options: Any, env_vars: Any) -> None:
        self.key_text, self.src, self.backend, self.options, self.env_vars = (
            key_text,
            src,
            backend,
            options,
            env_vars,
        )
        self._key: str | None = None
        self._comps: dict[str, Any] | None = None

    def matches(self, key: str) -> bool:
        """Whether this is the key a manager was built for (Triton's hash of the key text, as
        ``get_cache_manager`` names it: base32 of the sha256 hex digest)."""
        if self._key is None:
            self._key = _base32(hashlib.sha256(self.key_text.encode("utf-8")).hexdigest())
        return self._key == key

    def target(self) -> str | None:
        t = getattr(self.backend, "target", None)
        return f"{getattr(t, 'backend', '?')}:{getattr(t, 'arch', '?')}" if t is not None else None

    def components(self) -> dict[str, Any]:
        if self._comps is None:
            self._comps = _components(self.src, self.backend, self.options, self.env_vars)
        return self._comps


def _components(src: Any, backend: Any, options: Any, env_vars: Any) -> dict[str, Any]:
    comps: dict[str, Any] = {}
    try:
        comps["kernel"] = getattr(src, "name", None)
        comps["src_hash"] = src.hash()[:16] if hasattr(src, "hash") else None
        target = getattr(backend, "target", None)
        if target is not None:
            comps["target"] = f"{getattr(target, 'backend', '?')}:{getattr(target, 'arch', '?')}"
        comps["backend_hash"] = _short(backend.hash()) if hasattr(backend, "hash") else None
        opts = getattr(options, "__dict__", None)
        if isinstance(opts, dict):
            for k in sorted(opts):
                v = opts[k]
                if isinstance(v, (int, float, str, bool)) or v is None:
                    comps[f"option.{k}"] = v
        for k, v in sorted(dict(env_vars or {}).items()):
            comps[f"env.{k}"] = v
    except (AttributeError, TypeError, ValueError):  # a source, backend or options of another
        pass  # shape: components are for explain only, a key never fails for them
    return comps


def remember(key_text: str, src: Any, backend: Any, options: Any, env_vars: Any) -> None:
    """Keep what the ``get_cache_key`` call on this thread was given, for the next manager."""
    _local.last = Origin(key_text, src, backend, options, env_vars)


def take() -> Origin | None:
    """What the last ``get_cache_key`` on this thread was given (once: the manager built right
    after it takes it), or None."""
    o = getattr(_local, "last", None)
    _local.last = None
    return o


def components_for(key: str, filename: str, origin: Origin | None = None) -> dict[str, Any]:
    """What kcache knows of the parts of Triton key ``key`` (plus library identity)."""
    comps = dict(origin.components()) if origin is not None and origin.matches(key) else {}
    comps.setdefault("kernel", filename.split(".")[0])
    comps["triton_version"] = fingerprint.current("triton_version")
    comps["python_abi"] = fingerprint.current("python_abi")
    return comps


def target_for(key: str, origin: Origin | None) -> str | None:
    """The target (``"cuda:90"``) of the compile that built key ``key``, when known."""
    return origin.target() if origin is not None and origin.matches(key) else None


def install_component_capture() -> None:
    """Wrap ``triton.compiler.compiler.get_cache_key`` (where ``compile`` looks it up)."""
    import triton.compiler.compiler as cc

    from .attached import patches

    if getattr(cc, "get_cache_key", None) is None or patches.holds(cc, "get_cache_key"):
        return

    def make(orig: Any) -> Any:
        def get_cache_key(src: Any, backend: Any, backend_options: Any, env_vars: Any) -> str:
            key = orig(src, backend, backend_options, env_vars)
            _local.last = Origin(key, src, backend, backend_options, env_vars)
            return key

        get_cache_key.__wrapped__ = orig  # type: ignore[attr-defined]
        return get_cache_key

    patches.wrap(cc, "get_cache_key", make)
