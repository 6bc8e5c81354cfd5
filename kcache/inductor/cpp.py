"""Inductor's CPU kernels (C++ shared objects) in kcache's store.

On the CPU, none of Inductor's caches carries the compiled C++ kernels: an FX graph cache hit
(local, remote or through kcache) in an empty ``TORCHINDUCTOR_CACHE_DIR`` still runs g++ on every
kernel (measured: 12-30 s against about 2 s from a warm folder, torch 2.13, 2 cores). The build
goes through one method, ``torch._inductor.cpp_builder.CppBuilder.build`` (torch 2.8 to 2.13),
which writes ``<output dir>/<name>.so``; the name is a hash of the kernel's source. kcache wraps
it: when the target is missing and the store holds it, the stored library is written there and
the build skipped; after a real build, the library is stored.

The key is the target's name plus a hash of the whole compiler command line with the folders
made neutral (flags, include paths of this torch, -march, libraries) and the torch version: a
library built against other headers or flags is never served. These entries are host code
(``inductor-cpp``: loaded with dlopen), so they are served only from a store that passed its
ownership checks, and cross machines only when signed. Only plain shared objects are handled:
object files, precompiled headers, preprocessor runs and AOT builds go to the compiler as before.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Any

from .. import kinds as _kinds
from ..log import logger, warn_once

MEMBER = "kernel.so"
MAX_SO = 256 << 20


def on_import(mod: Any) -> None:
    """Wrap ``CppBuilder.build`` of the ``torch._inductor.cpp_builder`` module ``mod``."""
    cls = getattr(mod, "CppBuilder", None)
    orig = getattr(cls, "build", None)
    if cls is None or orig is None or getattr(orig, "_kcache", False):
        return
    if not all(hasattr(cls, a) for a in ("get_target_file_path", "get_command_line")):
        logger.info("torch.compile: CppBuilder has changed; CPU kernels are not kept in the store")
        return

    def build(self: Any) -> None:
        plan = None
        try:
            plan = _plan(self)
            if plan is not None and _restore(*plan):
                return
        except Exception as e:
            logger.debug("cpp restore: %s", e)
        t0 = time.perf_counter()
        orig(self)
        if plan is not None:
            _keep(*plan, time.perf_counter() - t0)

    build._kcache = True  # type: ignore[attr-defined]
    build.__wrapped__ = orig  # type: ignore[attr-defined]
    cls.build = build


def uninstall() -> None:
    mod = sys.modules.get("torch._inductor.cpp_builder")
    cls = getattr(mod, "CppBuilder", None) if mod is not None else None
    fn = getattr(cls, "build", None)
    if fn is not None and getattr(fn, "_kcache", False):
        cls.build = fn.__wrapped__  # type: ignore[union-attr]


def _plan(builder: Any) -> tuple[str, str, dict[str, Any]] | None:
    """(target path, store key, components) for a plain shared object, else None."""
    if any(getattr(builder, a, False) for a in ("_use_relative_path", "_aot_mode", "_compile_only",
                                                "_precompiling", "_preprocessing")):  # fmt: skip
        return None
    target = builder.get_target_file_path()
    if not target.endswith(".so") or os.path.exists(target):
        return None  # present: torch's own business (it rebuilds only what is missing)
    out_dir = os.path.dirname(target)
    cmd = builder.get_command_line().replace(out_dir, "<OUT>")
    cache_root = _inductor_cache_dir()
    if cache_root:
        cmd = cmd.replace(cache_root, "<CACHE>")
    from . import _torch_version

    comps = {
        "kernel": os.path.basename(target),
        "command_sha256": hashlib.sha256(cmd.encode("utf-8", "surrogateescape")).hexdigest(),
        "compiler": os.path.basename(cmd.split(" ", 1)[0]),
        "torch_version": _torch_version(),
    }
    key = f"{comps['kernel']}|{comps['command_sha256']}|torch={comps['torch_version']}"
    return target, key, comps


def _inductor_cache_dir() -> str | None:
    mod = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    try:
        return str(mod.cache_dir()) if mod is not None else None
    except Exception:
        return None


def _store() -> Any:
    from .. import active_store

    store = active_store()
    if store is None or not store.trust_host_code:
        return None  # host code only from a store that passed every check
    return store


def _restore(target: str, key: str, comps: dict[str, Any]) -> bool:
    store = _store()
    if store is None:
        return False
    hit = store.get(_kinds.INDUCTOR_CPP, key, comps)
    if hit is None:
        return False
    from ..store.fs import atomic_write

    try:
        atomic_write(target, hit.read(MEMBER), mode=0o700)
    except OSError as e:
        warn_once(
            "inductor-cpp-write",
            f"cannot write a stored CPU kernel to {os.path.dirname(target)} ({e}); compiling",
        )
        return False
    return True


def _keep(target: str, key: str, comps: dict[str, Any], seconds: float) -> None:
    store = _store()
    if store is None:
        return
    try:
        from ..store.fs import read_at

        data, _st = read_at(None, target, MAX_SO)
    except Exception as e:
        logger.debug("cpp keep: %s", e)
        return
    store.put(
        _kinds.INDUCTOR_CPP,
        key,
        {MEMBER: data},
        components=comps,
        summary={"file": comps["kernel"]},
        compile_s=seconds,
    )
