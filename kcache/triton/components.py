"""Named components of Triton's cache key, so that ``kcache explain`` can say what changed.

Triton hands a cache manager only the hash of its key. ``triton.compile`` builds that key with
``get_cache_key(src, backend, options, env_vars)``; wrapping it (same arguments, same result)
lets kcache remember, per hash, the parts it was made of: kernel name, source hash, backend
(target arch and ptxas), options and the cache-invalidating environment.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections import OrderedDict
from typing import Any

from .. import fingerprint

_lock = threading.Lock()
_by_key: OrderedDict[str, dict[str, Any]] = OrderedDict()
_MAX = 4096
_installed = False


def _base32(hexdigest: str) -> str:
    return base64.b32encode(bytes.fromhex(hexdigest)).decode().rstrip("=")


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def remember(key_text: str, src: Any, backend: Any, options: Any, env_vars: Any) -> None:
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
    except Exception:
        pass
    h = _base32(hashlib.sha256(key_text.encode("utf-8")).hexdigest())
    with _lock:
        _by_key[h] = comps
        while len(_by_key) > _MAX:
            _by_key.popitem(last=False)


def components_for(key: str, filename: str) -> dict[str, Any]:
    """What kcache knows of the parts of Triton key ``key`` (plus library identity)."""
    with _lock:
        comps = dict(_by_key.get(key, {}))
    comps.setdefault("kernel", filename.split(".")[0])
    comps["triton_version"] = fingerprint.current("triton_version")
    comps["python_abi"] = fingerprint.current("python_abi")
    return comps


def install_component_capture() -> None:
    """Wrap ``triton.compiler.compiler.get_cache_key`` (where ``compile`` looks it up)."""
    global _installed
    if _installed:
        return
    import triton.compiler.compiler as cc

    orig = getattr(cc, "get_cache_key", None)
    if orig is None or getattr(orig, "_kcache_wrapped", False):
        return

    def get_cache_key(src: Any, backend: Any, backend_options: Any, env_vars: Any) -> str:
        key = orig(src, backend, backend_options, env_vars)
        try:
            remember(key, src, backend, backend_options, env_vars)
        except Exception:
            pass
        return key

    get_cache_key._kcache_wrapped = True  # type: ignore[attr-defined]
    get_cache_key.__wrapped__ = orig  # type: ignore[attr-defined]
    cc.get_cache_key = get_cache_key
    _installed = True


def uninstall_component_capture() -> None:
    """Put Triton's own ``get_cache_key`` back."""
    global _installed
    import sys

    cc = sys.modules.get("triton.compiler.compiler")
    fn = getattr(cc, "get_cache_key", None) if cc is not None else None
    if fn is not None and getattr(fn, "_kcache_wrapped", False):
        cc.get_cache_key = fn.__wrapped__  # type: ignore[union-attr]
    _installed = False
