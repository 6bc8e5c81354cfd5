"""Remember the hash of libtriton.so across processes: ``triton_key()`` without 0.3-0.75 s.

``triton_key()`` hashes Triton's Python sources (about 10 ms) and the whole libtriton shared
object (hundreds of MB, almost all of the cost). kcache keeps the library's sha256 in the store,
keyed by what identifies the file (real path, inode, size, mtime and ctime in ns, Triton
version, this boot), and runs Triton's OWN ``triton_key`` code with that one file read replaced:
the sources are still hashed as Triton hashes them, so an edited source still changes the key,
and the algorithm is whatever the installed Triton's is (the result is checked to contain the
digest where the file's hash would be; if not, Triton's own result is used).

Every caller gets it, however it holds Triton's function (the autotuner's and torch's bound
names, an alias, a closure, a thread): the memo goes into the function itself, not into the names
that point at it (:func:`install_key_memo`).
"""

from __future__ import annotations

import builtins
import hashlib
import os
import sys
import threading
import types
import uuid
from typing import Any

from .. import fingerprint
from .. import kinds as _kinds
from ..boundary import guarded
from ..log import logger
from ..memo import boot_id, open_replaced, open_restored, remember, sha256_file
from .attached import cache as active_cache

KIND = _kinds.TRITON_META
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


def run_own(own: Any) -> str:
    """Triton's own key function ``own`` (a copy of its code) as without kcache: with its module's
    own ``open``, never the memo's stand-in that another thread (waited for), or this one further
    up (a re-entered call), has put there (:func:`kcache.memo.open_restored`)."""
    with open_restored(own.__globals__):
        return str(own())


def memo_triton_key(own: Any, cache_mod: Any) -> str:
    """Triton's own key function ``own`` (a copy of its code) run with libtriton's digest taken
    from the memo."""
    path = _libtriton_path(cache_mod)
    if path is None:
        return run_own(own)
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

    with open_replaced(own.__globals__, open_):
        result = own()
    if fake_digest not in result:
        logger.info("triton_key memo: Triton hashed libtriton differently; using its own key")
        return run_own(own)
    return str(result.replace(fake_digest, digest))


# Where Triton's function finds kcache once the memo is in: a name in the module's globals (the
# function's code, once replaced, looks it up there).
_ENTRY = "_kcache_triton_key"


def _entry_point() -> Any:  # the code Triton's triton_key runs once the memo is in (see below)
    return _kcache_triton_key()  # type: ignore[name-defined]  # noqa: F821  (Triton's globals)


def _trampoline_code() -> Any:
    code = _entry_point.__code__.replace(co_name="triton_key")
    # Named as Triton's function in tracebacks and profiles, and found in this file
    # (co_qualname: Python 3.11+).
    if hasattr(code, "co_qualname"):  # 3.11+; mypy checks for 3.10, where replace() lacks it
        code = code.replace(co_qualname="triton_key")  # type: ignore[call-arg]
    return code


_TRAMPOLINE = _trampoline_code()
_busy = threading.local()


def _key_function(cache_mod: Any) -> tuple[Any, types.FunctionType] | None:
    """(Triton's ``triton_key`` as callers hold it, the plain function inside its lru_cache), or
    None where that is not the shape this memo knows (then Triton's own runs, as without kcache)."""
    held = getattr(cache_mod, "triton_key", None)
    raw = getattr(held, "__wrapped__", None)
    if not isinstance(raw, types.FunctionType) or raw.__code__.co_freevars or raw.__code__.co_argcount:
        return None
    if raw.__globals__ is not vars(cache_mod):
        return None
    return held, raw


def installed() -> bool:
    """Whether Triton's ``triton_key`` runs through the memo in this process."""
    mod = _key_module(import_it=False)
    found = _key_function(mod) if mod is not None else None
    return found is not None and found[1].__code__ is _TRAMPOLINE


def own_key() -> str | None:
    """Triton's own key, computed afresh by its own code without the memo (tests compare the two);
    None when Triton is not loaded."""
    mod = _key_module(import_it=False)
    found = _key_function(mod) if mod is not None else None
    if found is None:
        return None
    raw = found[1]
    code = _own_code.get(id(raw), raw.__code__) if raw.__code__ is _TRAMPOLINE else raw.__code__
    return run_own(types.FunctionType(code, raw.__globals__, raw.__name__))


_own_code: dict[int, Any] = {}  # id(Triton's plain function) -> the code it had before the memo


def _key_module(*, import_it: bool = True) -> Any:
    """The module that defines ``triton_key``: triton.runtime.cache (3.5+) or
    triton.compiler.compiler (3.4)."""
    import importlib

    for name in ("triton.runtime.cache", "triton.compiler.compiler"):
        mod = importlib.import_module(name) if import_it else sys.modules.get(name)
        if mod is not None and hasattr(mod, "triton_key"):
            return mod
    return None


def install_key_memo() -> None:
    """Make Triton's own ``triton_key`` take libtriton's digest from the memo, for every caller.

    Triton's function is an ``lru_cache`` around a plain function, and callers hold it under
    many names: ``triton.runtime.cache.triton_key``, the autotuner's and torch's
    ``triton_compat``'s copies of the name, whatever a program or library bound before kcache was
    enabled (an alias, a closure, a class attribute, torch's ``prefetchable_cache`` running it
    in a thread). Replacing names reaches only those kcache can see; so the plain function's
    code is replaced instead, by a trampoline into :func:`memo_triton_key`, which runs a copy of
    Triton's original code. Every holder of the ``lru_cache`` then gets the memo, and the
    ``lru_cache`` keeps the result as it keeps Triton's own: asked once per process, whoever asks.
    Undone with the other patches (the code goes back; a key computed meanwhile stays, and it is
    Triton's own key; the name the trampoline looks up stays, leading to Triton's own code)."""
    from .attached import patches

    cache_mod = _key_module()
    if cache_mod is None:
        return
    found = _key_function(cache_mod)
    if found is None:
        logger.info("triton_key memo: Triton's triton_key has a shape the memo does not know; not installed")
        return
    _, raw = found
    if raw.__code__ is _TRAMPOLINE:
        return
    own = types.FunctionType(raw.__code__, raw.__globals__, raw.__name__)
    _own_code[id(raw)] = raw.__code__

    def entry() -> str:
        # Expected: a file that cannot be read (libtriton, one of Triton's sources, the memo's
        # entry): Triton's own code reads them itself. Anything else is the memo's bug, even
        # when Triton's code raised it (it ran with the memo's open()): reported, or raised
        # when strict. Either way Triton's own code then gives the key, or its own error.
        # Re-entered on this thread (an import Triton's code makes asks for the key again):
        # Triton's own code, as without kcache (run_own takes the memo's stand-in out meanwhile).
        if getattr(_busy, "on", False):
            return run_own(own)
        _busy.on = True
        try:
            with guarded(TOPIC, WHAT):  # the edge (Triton asks for its key)
                try:
                    return memo_triton_key(own, cache_mod)
                except OSError as e:
                    logger.info("triton_key memo failed (%s); using Triton's", e)
        finally:
            _busy.on = False
        return run_own(own)

    def plain() -> str:
        return run_own(own)

    # What the name holds once the memo is undone: a thread that entered the trampoline just
    # before (its code is back now) still looks the name up, and must find Triton's own code,
    # not a NameError raised into Triton.
    setattr(cache_mod, _ENTRY, plain)
    patches.set(cache_mod, _ENTRY, entry)
    patches.set(raw, "__code__", _TRAMPOLINE)
