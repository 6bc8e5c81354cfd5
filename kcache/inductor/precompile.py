"""Dynamo's caching precompile, kept in kcache's store when the program turns it on.

kcache never turns caching precompile on (docs/torch-compile.md: with it, Dynamo drops guards,
so a frame can be reused where it should not be). A program that turns it on
(``TORCH_CACHING_PRECOMPILE=1``, or ``torch._dynamo.config.caching_precompile``) and saves
(``torch.compiler.save_cache_artifacts()``) has torch write each compiled package to
``<TORCHINDUCTOR_CACHE_DIR>/dynamo/<source id>/entry``, a folder like any of Inductor's: a new
node or container starts without it. Here, torch's ``DynamoCache`` (one object of
``torch._dynamo.package``) is given two small wrappers:

- after torch writes a package to its folder, kcache keeps the same bytes (kind
  ``inductor-precompile``, keyed by the source id and the torch version; a pickle: the same trust
  rules as Inductor's FX entries);
- before torch looks a package up, if its folder has none and kcache's store does, kcache writes
  it there (one atomic write), and torch reads it as its own.

kcache never decodes the package. Nothing is done while caching precompile is off, and a torch
whose ``DynamoCache`` lacks the methods below is left alone.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from .. import kinds as _kinds
from ..log import logger

KIND = _kinds.INDUCTOR_PRECOMPILE
_SOURCE_ID = re.compile(r"[0-9A-Za-z_.-]{1,200}")
_wrapped: dict[str, Any] = {}  # method name -> torch's own, while installed


def _on() -> bool:
    cfg = sys.modules.get("torch._dynamo.config")
    return bool(getattr(cfg, "caching_precompile", False))


def on_import(mod: Any) -> None:
    """Called when ``torch._dynamo.package`` has been imported."""
    cache = getattr(mod, "DynamoCache", None)
    pkg = getattr(mod, "CompilePackage", None)
    needed = ("_write_to_local_cache", "load", "path_prefix")
    if cache is None or pkg is None or _wrapped or not all(hasattr(cache, n) for n in needed):
        logger.debug("caching precompile: this torch's DynamoCache is not one kcache knows")
        return
    if not hasattr(pkg, "source_id_from_fn"):
        return
    write, load = cache._write_to_local_cache, cache.load

    def _write_to_local_cache(pickled_content: bytes, path: str) -> None:
        write(pickled_content, path)  # torch's own first: its failure is torch's to report
        if _on() and isinstance(path, str) and _SOURCE_ID.fullmatch(path):
            from . import put

            put(KIND, path, pickled_content)

    def load_(fn: Any) -> Any:
        if _on():
            try:
                _materialize(cache.path_prefix(), pkg.source_id_from_fn(fn))
            except Exception as e:  # never in torch's way: it then misses as it would have
                logger.debug("caching precompile: %s", e)
        return load(fn)

    _wrapped.update(_write_to_local_cache=write, load=load)
    cache._write_to_local_cache = _write_to_local_cache
    cache.load = load_


def _materialize(prefix: str, source_id: str) -> None:
    """Write the stored package for ``source_id`` where torch will look, if it has none."""
    if not isinstance(source_id, str) or not _SOURCE_ID.fullmatch(source_id):
        return
    folder = os.path.join(prefix, source_id)
    target = os.path.join(folder, "entry")
    if os.path.lexists(target):
        return  # torch's own (or an earlier copy): torch's to judge
    from . import get

    data = get(KIND, source_id)
    if data is None:
        return
    from ..store.fs import atomic_write

    os.makedirs(folder, mode=0o700, exist_ok=True)
    atomic_write(target, data)
    logger.debug("caching precompile: %s from kcache's store", source_id)


def uninstall() -> None:
    """Give torch its DynamoCache methods back (kcache.disable())."""
    mod = sys.modules.get("torch._dynamo.package")
    cache = getattr(mod, "DynamoCache", None) if mod is not None else None
    if cache is not None:
        for name in list(_wrapped):
            cache.__dict__.pop(name, None)  # the class's own methods show through again
    _wrapped.clear()
