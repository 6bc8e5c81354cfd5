"""What a prewarmed store was built with, eviction protection for prewarmed entries.

Triton's key hashes the whole ``libtriton.so``, and the wheels for each Python version carry
different builds: a store prewarmed with Python 3.11 misses every kernel under Python 3.12, with
nothing to say why. Prewarm records, as ``triton-meta`` entries, the build it used (Python ABI,
Triton version, sha256 of libtriton); a process that uses the store with another build warns once.

Prewarmed entries are protected from eviction until their first hit, for at most
:data:`DEFAULT_PROTECT_S` (``Store.put(protect_s=...)``): every put of a prewarm process goes
through :func:`protect_puts`. Child processes of a prewarm (torch's compile workers) inherit
``KCACHE_PREWARM_PROTECT_S`` and protect their puts too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..kinds import TRITON_META as KIND
from ..log import logger, warn_once

if TYPE_CHECKING:
    from ..store import Store
    from ..store.api import Cache

ANY_KEY = "prewarm-build:any"
DEFAULT_PROTECT_S = 7 * 86400.0
PROTECT_ENV = "KCACHE_PREWARM_PROTECT_S"


def _build_key(abi: str, version: str, digest: str) -> str:
    return f"prewarm-build:{abi}:{version}:{digest}"


def libtriton_path() -> str | None:
    try:
        import triton.runtime.cache as cache_mod

        from ..triton.keymemo import _libtriton_path

        return _libtriton_path(cache_mod)
    except (ImportError, OSError):  # no Triton, or one that cannot load its library: not checked
        return None


def current_build(*, compute: bool = True) -> dict[str, Any]:
    """This process's Triton build: python_abi, triton_version, libtriton_sha256 (None when unknown
    and ``compute`` is False: the digest is read from the key memo, hashing 400 MB is not cheap)."""
    from .. import active_store, fingerprint

    out: dict[str, Any] = {
        "python_abi": fingerprint.current("python_abi"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "triton_version": fingerprint.current("triton_version"),
        "libtriton_sha256": None,
    }
    path = libtriton_path()
    if path is None:
        return out
    try:
        from ..triton.keymemo import KIND as MEMO_KIND
        from ..triton.keymemo import file_identity, libtriton_digest

        if compute:
            out["libtriton_sha256"], _ = libtriton_digest(path)
        else:
            store = active_store()
            hit = store.get(MEMO_KIND, file_identity(path), count=False) if store is not None else None
            if hit is not None:
                d = hit.read("digest").decode()
                out["libtriton_sha256"] = d if len(d) == 64 else None
    except (OSError, KeyError, UnicodeDecodeError) as e:  # libtriton unreadable, a memo entry
        logger.debug("libtriton digest: %s", e)  # without its member or not text: an optional field
    return out


def record_build(store: Cache, target: str | None) -> dict[str, Any]:
    """Note in ``store`` the build this prewarm uses. Returns it."""
    b = current_build(compute=True)
    if not b.get("libtriton_sha256") or not b.get("python_abi"):
        return b
    blob = json.dumps({**b, "target": target}, sort_keys=True).encode()
    summary = {"file": "build.json", "python_abi": b["python_abi"], "triton_version": b["triton_version"]}
    store.put(KIND, ANY_KEY, {"build.json": blob}, summary=summary)
    for key in (
        _build_key(b["python_abi"], b["triton_version"] or "", b["libtriton_sha256"]),
        _build_key(b["python_abi"], b["triton_version"] or "", "any"),
    ):
        store.put(KIND, key, {"build.json": blob}, summary=summary)
    return b


def check_store_build(store: Cache | None) -> str | None:
    """Warn once if ``store`` was prewarmed with another Triton build than this process's. Cheap:
    two lookups, no hashing (without a memoised libtriton digest only the ABI and version count).
    Returns the warning, or None."""
    if store is None:
        return None
    first = store.get(KIND, ANY_KEY, count=False)
    if first is None:
        return None  # never prewarmed
    try:
        built = json.loads(first.read("build.json"))
    except (KeyError, ValueError, RecursionError):  # the stored build is advice: an entry without
        return None  # it, or bytes that are not JSON, say nothing
    if not isinstance(built, dict):
        return None
    me = current_build(compute=False)
    digest = me.get("libtriton_sha256") or "any"  # without the memo, the ABI and version only
    if store.get(KIND, _build_key(me["python_abi"], me["triton_version"] or "", digest), count=False):
        return None
    msg = (
        f"the store at {store.root} was prewarmed with Python {built.get('python')} "
        f"({built.get('python_abi')}), Triton {built.get('triton_version')}, libtriton "
        f"{str(built.get('libtriton_sha256'))[:12]}; this process runs Python {me['python']} "
        f"({me['python_abi']}), Triton {me['triton_version']}"
        + (f", libtriton {me['libtriton_sha256'][:12]}" if me.get("libtriton_sha256") else "")
        + ": Triton's key covers its library, so prewarmed kernels will not be found "
        "(prewarm with the same image: same Triton wheel and Python minor version)"
    )
    warn_once("prewarm-build", msg)
    return msg


def protect_puts(store: Store | None, seconds: float) -> Callable[[], None]:
    """Make every put of this process protect its entry for ``seconds`` (until first hit), and
    this process's own hits leave last-use times alone (:meth:`Store.protect`). Returns a
    function that undoes it."""
    if store is None or seconds <= 0:
        return lambda: None
    return store.protect(seconds)


def protect_from_env(store: Store | None) -> Callable[[], None] | None:
    """In a child of a prewarm (``KCACHE_PREWARM_PROTECT_S`` set): protect this process's puts."""
    from ..config import env_number

    seconds = env_number(PROTECT_ENV)  # a bad value: warned once, and ignored
    if seconds is None:
        return None
    return protect_puts(store, seconds)
