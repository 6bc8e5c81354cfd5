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

Installing a package puts the globals its frames were compiled with into their modules, under
the names the saving process gave them (``__builtins_dict___0``, ``__compiled_fn_1_...``: a
counter of Dynamo's, from 0 in every process), and a frame traced afterwards in the same module
takes names from this process's counter: the first one is ``__builtins_dict___0`` again, and
Dynamo fails with "Name '__builtins_dict___0' already exists in scope" (torch's own warm folder
does the same; with kcache, a new empty folder gets the package too). After each install, the
counter is moved past the numbers of the names the package installed: names are arbitrary, and
nothing else changes.

A package kcache wrote into the folder that torch then fails to install (torch 2.11 cannot install
its own package of a BERT model: ``TypeError`` from ``DefaultsSource`` while unpickling guards,
seen on the H200) must not cost the program more than a compile would have: ``install`` is
wrapped too, and on such a failure the package is put back to a fresh one (what torch's
constructor makes without a cache entry), the written file and the store's entry are removed,
one warning is logged, and the function compiles as on a miss. Packages torch found in its folder
on its own stay torch's to judge.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from typing import Any

from ..boundary import guarded, raised_strict
from ..log import logger, warn_once
from . import declare as _kinds
from .torchcall import TorchRaised
from .torchcall import own as torchs

KIND = _kinds.INDUCTOR_PRECOMPILE
_SOURCE_ID = re.compile(r"[0-9A-Za-z_.-]{1,200}")
_served: dict[str, str] = {}  # source id -> the file kcache wrote for it in this process
#: The fail-open boundary's topic (kcache/boundary.py): torch then loads and installs as it would.
TOPIC, WHAT = "inductor-precompile", "kcache's handling of a caching-precompile package"


def _on() -> bool:
    cfg = sys.modules.get("torch._dynamo.config")
    return bool(getattr(cfg, "caching_precompile", False))


def on_import(mod: Any) -> None:
    """Called when ``torch._dynamo.package`` has been imported."""
    from .attached import patches

    cache = getattr(mod, "DynamoCache", None)
    pkg = getattr(mod, "CompilePackage", None)
    needed = ("_write_to_local_cache", "load", "path_prefix")
    if (
        cache is None
        or pkg is None
        or patches.holds(cache, "load")
        or not all(hasattr(cache, n) for n in needed)
    ):
        logger.debug("caching precompile: this torch's DynamoCache is not one kcache knows")
        return
    if not hasattr(pkg, "source_id_from_fn"):
        return
    write, load = cache._write_to_local_cache, cache.load

    def _write_to_local_cache(pickled_content: bytes, path: str) -> None:
        write(pickled_content, path)  # torch's own first: its failure is torch's to report
        if _on() and isinstance(path, str) and _SOURCE_ID.fullmatch(path):
            from .entries import put

            put(KIND, path, pickled_content)

    def load_(fn: Any) -> Any:
        if _on():
            try:
                where = (torchs(cache.path_prefix), torchs(pkg.source_id_from_fn, fn))
            except TorchRaised as e:  # torch's own, on the user's function: its load that
                logger.debug("caching precompile: %s", e)  # follows meets the same error
                where = None
            if where is not None:
                with guarded(TOPIC, WHAT):  # the edge (torch's DynamoCache.load): a bug, reported
                    try:
                        _materialize(*where)
                    except OSError as e:  # torch's folder cannot be written: torch misses, as it would
                        logger.debug("caching precompile: package not written for torch: %s", e)
        return load(fn)

    install: Any = getattr(pkg, "install", None)

    def install_(self: Any, backends: Any) -> None:
        try:
            install(self, backends)
        except Exception as e:  # broad: torch's install raises anything; re-raised unless kcache's doing
            afresh = False
            if not raised_strict(e):  # (a bug of kcache's met inside torch's install goes on)
                with guarded(TOPIC, WHAT):  # a bug here must not replace torch's error
                    afresh = _start_afresh(self, e)
            if not afresh:
                raise
        else:  # installed: a later failure of this function's package is no longer kcache's doing
            with guarded(TOPIC, WHAT):  # the edge: torch installed; kcache's bookkeeping after it
                _past_installed_names(self)
            if _served:
                with guarded(TOPIC, WHAT):
                    _served.pop(self.source_id, None)  # installed: torch's property is set

    # Set on the DynamoCache object itself: on undo, its class's methods show through again.
    patches.wrap(cache, "_write_to_local_cache", lambda _: _write_to_local_cache, raw=True)
    patches.wrap(cache, "load", lambda _: load_, raw=True)
    if callable(install):
        patches.wrap(pkg, "install", lambda _: install_, raw=True)


#: A name Dynamo made with ``unique_id``: ``<prefix>_<counter>``, with ``_<uuid>`` after it for some.
_UNIQUE_NAME = re.compile(
    r"__\w*?_([0-9]+)(?:_[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})?"
)


def _past_installed_names(package: Any) -> None:
    """Move Dynamo's unique-name counter past the numbers of the names it made that are in the
    globals of the modules the package installed into (see the module doc)."""
    bt: Any = sys.modules.get("torch._dynamo.bytecode_transformation")
    counter = getattr(bt, "_unique_id_counter", None)
    codes = getattr(package, "_codes", None)
    if bt is None or not isinstance(counter, itertools.count) or not isinstance(codes, dict):
        return  # a Dynamo whose internals differ: nothing moved (the names are cosmetic)
    highest = -1
    for entry in codes.values():
        module = sys.modules.get(getattr(entry, "python_module", "") or "")
        for name in list(getattr(module, "__dict__", {})):
            m = _UNIQUE_NAME.fullmatch(name)
            if m is not None:
                highest = max(highest, int(m.group(1)))
    if highest < 0:
        return
    if next(counter) <= highest:  # (one id skipped either way: harmless, ids only need to be unique)
        bt._unique_id_counter = itertools.count(highest + 1)


def _start_afresh(package: Any, error: Exception) -> bool:
    """After torch failed to install a package: if kcache wrote it, make ``package`` a fresh one
    (as ``CompilePackage(fn)`` would be), remove the file and the store's entry, and say so.
    Returns False (torch's error then goes on) for a package kcache did not write, or when the
    package cannot be put back."""
    try:
        source_id = torchs(getattr, package, "source_id")
    except TorchRaised:  # torch's property (AssertionError without a function), or a foreign
        return False  # package object's: not a package kcache wrote
    target = _served.pop(source_id, None) if isinstance(source_id, str) else None
    if target is None:
        return False
    try:
        fn = package._innermost_fn
        try:
            torchs(package.uninstall)  # what the failed install had put in modules' globals
        except TorchRaised as e:  # torch's uninstall of a package it failed to install
            logger.debug("caching precompile: uninstall after a failed install: %s", e)
        torchs(type(package).__init__, package, fn, None, ignore_inlined_sources=False)
    except (TorchRaised, AttributeError) as e:  # then torch's own error goes on (see the docstring)
        logger.debug("caching precompile: could not start %s afresh: %s", source_id, e)
        return False
    try:
        os.unlink(target)
        os.rmdir(os.path.dirname(target))  # torch takes the folder for a package, and reads it
    except OSError:
        pass
    from .entries import forget

    forget(KIND, source_id)
    warn_once(
        f"precompile-install:{source_id}",
        f"caching precompile: torch could not install the package kcache kept for {source_id} "
        f"({type(error).__name__}: {error}); it was removed and the function is compiled again",
    )
    return True


def _materialize(prefix: str, source_id: str) -> None:
    """Write the stored package for ``source_id`` where torch will look, if it has none."""
    if not isinstance(source_id, str) or not _SOURCE_ID.fullmatch(source_id):
        return
    folder = os.path.join(prefix, source_id)
    target = os.path.join(folder, "entry")
    if os.path.lexists(target):
        return  # torch's own (or an earlier copy): torch's to judge
    from .entries import get

    data = get(KIND, source_id)
    if data is None:
        return
    from ..store.fs import atomic_write

    os.makedirs(folder, mode=0o700, exist_ok=True)
    atomic_write(target, data)
    _served[source_id] = target
    logger.debug("caching precompile: %s from kcache's store", source_id)


def uninstall() -> None:
    """kcache.disable(): torch's DynamoCache methods come back with :data:`.attached.patches`;
    the packages served in this process are forgotten."""
    _served.clear()
