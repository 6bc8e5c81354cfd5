"""Remember the hash of libtriton.so across processes: ``triton_key()`` without 0.3-0.75 s.

``triton_key()`` hashes Triton's Python sources (about 10 ms) and the whole libtriton shared
object (hundreds of MB, almost all of the cost). kcache keeps the library's sha256 in the store,
keyed by what identifies the file (real path, inode, size, mtime and ctime in ns, Triton
version), and runs Triton's OWN ``triton_key`` with that one file read replaced: the
sources are still hashed as Triton hashes them, so an edited source still changes the key, and
the algorithm is whatever the installed Triton's is (the result is checked to contain the
digest where the file's hash would be; if not, Triton's own result is used).

Triton's autotuner and torch's Inductor bind ``triton_key`` by name: every loaded module whose
``triton_key`` is Triton's function gets the memo too, and modules imported later bind the
patched attribute of ``triton.runtime.cache`` themselves.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import os
import sys
import uuid
from typing import Any

from .. import fingerprint
from .. import kinds as _kinds
from ..boundary import failed
from ..forksafe import module_lock
from ..log import logger
from ..memo import boot_id, remember, sha256_file
from ..patch import is_ours
from .attached import cache as active_cache

KIND = _kinds.TRITON_META
_lock = module_lock(__name__, "_lock")
#: The fail-open boundary's topic (kcache/boundary.py): Triton's own triton_key runs then.
TOPIC, WHAT = "triton-key-memo", "kcache's memo of triton_key"


def _libtriton_path(cache_mod: Any) -> str | None:
    import sysconfig

    root = os.path.dirname(os.path.dirname(os.path.abspath(cache_mod.__file__)))
    ext = (sysconfig.get_config_var("EXT_SUFFIX") or ".so").split(".")[-1]
    p = os.path.join(root, "_C", f"libtriton.{ext}")
    return p if os.path.exists(p) else None


def file_identity(path: str) -> str:
    st = os.stat(path)
    real = os.path.realpath(path)
    # "v3" and this boot's id (see kcache.memo.boot_id): a digest planted under a key anyone could
    # compute (v1, v2: an older kcache imported them from bundles) is never read; a wrong one
    # would give this Triton another build's key.
    return (
        f"v3|boot={boot_id()}|{real}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}"
        f"|ctime={st.st_ctime_ns}|triton={fingerprint.current('triton_version')}"
    )


def _is_digest(value: bytes) -> bool:
    digest = value.decode("ascii", "replace")
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


def libtriton_digest(path: str) -> tuple[str, bool]:
    """(sha256 of the file, whether it came from the memo)."""
    ident = file_identity(path)
    value, memo = remember(
        active_cache(),
        ident,
        "digest",
        lambda: sha256_file(path).encode(),
        summary={"file": os.path.basename(path)},
        valid=_is_digest,
    )
    return value.decode("ascii"), memo


class _SentinelFile:
    """Stands in for libtriton.so inside Triton's own triton_key(): one unique chunk, then EOF."""

    def __init__(self, chunk: bytes) -> None:
        self._chunks = [chunk]

    def read(self, *args: Any) -> bytes:
        return self._chunks.pop() if self._chunks else b""

    def __enter__(self) -> _SentinelFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def memo_triton_key(original: Any, cache_mod: Any) -> str:
    """Triton's own ``original()`` with libtriton's digest taken from the memo."""
    path = _libtriton_path(cache_mod)
    if path is None:
        return original()
    digest, _ = libtriton_digest(path)
    chunk = b"kcache-sentinel-" + uuid.uuid4().hex.encode()
    fake_digest = hashlib.sha256(chunk).hexdigest()
    real_path = os.path.realpath(path)
    real_open = builtins.open

    def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == real_path:
                return _SentinelFile(chunk)
        except Exception:  # broad: a caller's path-like (its __fspath__ may raise anything): the
            pass  # real open() below meets the same error, as without kcache
        return real_open(file, *args, **kwargs)

    target = getattr(original, "__wrapped__", original)
    g = target.__globals__
    with _lock:
        had = "open" in g
        old = g.get("open")
        g["open"] = open_
        try:
            result = target()
        finally:
            if had:
                g["open"] = old
            else:
                g.pop("open", None)
    if fake_digest not in result:
        logger.info("triton_key memo: Triton hashed libtriton differently; using its own key")
        return original()
    return result.replace(fake_digest, digest)


def install_key_memo() -> None:
    """Replace ``triton_key`` in triton.runtime.cache and in every module that bound it by name."""
    import importlib

    from .attached import patches

    # 3.5+ define triton_key in triton.runtime.cache; 3.4 in triton.compiler.compiler.
    cache_mod = importlib.import_module("triton.runtime.cache")
    if not hasattr(cache_mod, "triton_key"):
        cache_mod = importlib.import_module("triton.compiler.compiler")
    original = getattr(cache_mod, "triton_key", None)
    if original is None or is_ours(original):
        return

    @functools.cache
    def triton_key() -> str:
        # Expected: a file that cannot be read (libtriton, one of Triton's sources, the memo's
        # entry): Triton's own function reads them itself. Anything else is the memo's bug, even
        # when Triton's function raised it (it ran with the memo's open()): reported, or raised
        # when strict. Either way Triton's own function then gives the key, or its own error.
        try:
            return memo_triton_key(original, cache_mod)
        except OSError as e:
            logger.info("triton_key memo failed (%s); using Triton's", e)
        except Exception as e:  # the edge (Triton asks for its key)
            failed(TOPIC, WHAT, e)
        return original()

    for mod in list(sys.modules.values()):
        if mod is not None and getattr(mod, "triton_key", None) is original:
            try:
                patches.wrap(mod, "triton_key", lambda _: triton_key)
            except Exception:  # broad: a foreign module may refuse the attribute
                pass
    patches.wrap(cache_mod, "triton_key", lambda _: triton_key)
