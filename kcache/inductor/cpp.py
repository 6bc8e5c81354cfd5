"""Inductor's CPU kernels (C++ shared objects) in kcache's store.

On the CPU, none of Inductor's caches carries the compiled C++ kernels: an FX graph cache hit
(local, remote or through kcache) in an empty ``TORCHINDUCTOR_CACHE_DIR`` still runs g++ on every
kernel (measured: 12-30 s against about 2 s from a warm folder, torch 2.13, 2 cores). The build
goes through one method, ``torch._inductor.cpp_builder.CppBuilder.build`` (torch 2.8 to 2.13),
which writes ``<output dir>/<name>.so``; the name is a hash of the kernel's source. kcache wraps
it: when the target is missing and the store holds it, the stored library is written there and
the build skipped; after a real build, the library is stored.

The key is the target's name plus a hash of the whole compiler command line and the torch
version: a library built against other headers or flags is never served. The command's
per-process folders are made neutral first (the output folder, Inductor's folder, and the
default folder under ``$TMPDIR`` where torch keeps its precompiled headers whatever
``TORCHINDUCTOR_CACHE_DIR`` says): a process with its own ``TMPDIR`` (HPC schedulers, CI
runners) is served what another process built. A flag whose meaning is this host's CPU
(``-march=native``) enters the key as what it resolves to here (:mod:`.hostflags`): a kernel
built for one CPU is never served to another. These entries are host code
(``inductor-cpp``: loaded with dlopen), so they are served only from a store that passed its
ownership checks, and cross machines only when signed. Only plain shared objects are handled:
object files, precompiled headers, preprocessor runs and AOT builds go to the compiler as before.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from typing import Any

from ..boundary import guarded
from ..log import logger, warn_once
from ..patch import is_ours
from . import declare as _kinds
from . import pch
from .attached import patches
from .torchcall import TorchRaised
from .torchcall import own as torchs

MEMBER = "kernel.so"
MAX_SO = 256 << 20


def on_import(mod: Any) -> None:
    """Wrap ``CppBuilder.build`` of the ``torch._inductor.cpp_builder`` module ``mod``."""
    cls = getattr(mod, "CppBuilder", None)
    orig = getattr(cls, "build", None)
    if cls is None or orig is None or is_ours(orig):
        return
    if not all(hasattr(cls, a) for a in ("get_target_file_path", "get_command_line")):
        logger.info("torch.compile: CppBuilder has changed; CPU kernels are not kept in the store")
        return

    def build(self: Any) -> None:
        codecache = sys.modules.get(pch.MODULE)
        if pch.handles(self):  # the precompiled header's preprocessing and compile
            pch.build(self, orig, codecache)
            return
        plan = None
        # The edge (torch's CppBuilder.build): a bug, reported (raised when strict); compiled.
        with guarded("inductor-cpp", "kcache's lookup of a CPU kernel"):
            plan = _plan(self)
            if plan is not None and _restore(*plan):
                return
        pch.before_compile(self, codecache)  # a compiler run is coming: its header first
        t0 = time.perf_counter()
        orig(self)
        if plan is not None:
            with guarded("inductor-cpp-keep", "kcache's keeping of a CPU kernel"):  # torch has its library
                _keep(*plan, time.perf_counter() - t0)

    build.__wrapped__ = orig  # type: ignore[attr-defined]
    patches.wrap(cls, "build", lambda _: build)


def on_async_compile(mod: Any) -> None:
    """Wrap ``AsyncCompile.submit`` of the ``torch._inductor.async_compile`` module ``mod``.

    Inductor hands a C++ kernel whose library is not in its folder to its pool of compile
    threads (``submit``) and waits for the result when it loads the kernel. For a library the
    store holds, that is a pool started and a wait in the main thread for a file write: kcache
    writes it here instead, in the caller's thread (torch holds the build's lock around the
    call), and hands torch a finished future. No thread is started in a process whose every
    kernel is served."""
    cls = getattr(mod, "AsyncCompile", None)
    raw = vars(cls).get("submit") if cls is not None else None
    if not isinstance(raw, classmethod) or is_ours(raw.__func__):
        return
    own = raw.__func__

    def submit(cls_: Any, task: Any) -> Any:
        # The edge (torch's submit): a bug, reported (raised when strict); torch's pool builds.
        with guarded("inductor-cpp", "kcache's lookup of a CPU kernel"):
            if _served_now(task):
                from concurrent.futures import Future

                done: Future[None] = Future()
                done.set_result(None)
                return done
        return own(cls_, task)

    patches.wrap(cls, "submit", lambda _: classmethod(submit), raw=True)


def _served_now(task: Any) -> bool:
    """Whether ``task`` is torch's build of one C++ library (``_worker_compile_cpp``) that the
    store holds, now written in place."""
    codecache = sys.modules.get("torch._inductor.codecache")
    work = getattr(codecache, "_worker_compile_cpp", None)
    args = getattr(task, "args", None)
    if (
        work is None
        or getattr(task, "func", None) is not work
        or not isinstance(args, tuple)
        or len(args) != 2
    ):
        return False
    builders = list(args[1])
    missing = [b for b in builders if not os.path.exists(b.get_target_file_path())]
    if len(missing) != 1 or missing[0] is not builders[-1]:
        return False  # nothing to do (torch's own), or intermediate objects: the pool builds
    plan = _plan(missing[0])
    return plan is not None and _restore(*plan)


def _plan(builder: Any) -> tuple[str, str, dict[str, Any]] | None:
    """(target path, store key, components) for a plain shared object, else None."""
    if any(getattr(builder, a, False) for a in ("_use_relative_path", "_aot_mode", "_compile_only",
                                                "_precompiling", "_preprocessing")):  # fmt: skip
        return None
    target = builder.get_target_file_path()
    if not target.endswith(".so") or os.path.exists(target):
        return None  # present: torch's own business (it rebuilds only what is missing)
    return key_for(builder.get_command_line(), target)


def key_for(cmd: str, target: str) -> tuple[str, str, dict[str, Any]] | None:
    """(target, store key, components) of the build of ``target`` by command line ``cmd``; None
    when a host-dependent flag in it cannot be resolved (nothing is cached for it then)."""
    from .entries import _torch_version
    from .hostflags import resolve

    host = resolve(cmd)
    if host is None:
        return None
    neutral = neutral_command(cmd, os.path.dirname(target))
    comps = {
        "kernel": os.path.basename(target),
        "command_sha256": hashlib.sha256(neutral.encode("utf-8", "surrogateescape")).hexdigest(),
        "compiler": os.path.basename(cmd.split(" ", 1)[0]),
        "torch_version": _torch_version(),
    }
    key = f"{comps['kernel']}|{comps['command_sha256']}|torch={comps['torch_version']}"
    if host:
        comps["host_target"] = host
        key += f"|host={host}"
    return target, key, comps


def neutral_command(cmd: str, out_dir: str) -> str:
    """``cmd`` with this process's own folders replaced by names: the output folder, Inductor's
    folder and torch's default folder (under ``$TMPDIR``, where its precompiled headers live).
    A folder is replaced only as a whole path component.

    Inductor's folder and the default folder get the SAME name: which of the two a file sits in
    depends only on whether this process set ``TORCHINDUCTOR_CACHE_DIR`` (without it they are one
    folder), never on what the file holds (Inductor names every file in them by a hash of its
    content: sources, precompiled headers). With two names, a kernel built by a process without
    the variable (``kcache prewarm``, the README's first step) had ``-include <CACHE>/...`` in its
    key, and a serving process with its own folder looked up ``-include <DEFAULT>/...``: every
    kernel built with a precompiled header missed and was compiled again."""
    folders = [(out_dir, "<OUT>")]
    for root in (_inductor_cache_dir(), _default_cache_dir()):
        if root:
            folders.append((root, "<INDUCTOR>"))
    for path, name in sorted(folders, key=lambda p: -len(p[0])):
        path = path.rstrip("/")
        if len(path) > 1:
            cmd = re.sub(re.escape(path) + r"(?=/|\s|$|['\"])", name, cmd)
    return cmd


def _inductor_cache_dir() -> str | None:
    mod = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    try:
        return str(torchs(mod.cache_dir)) if mod is not None else None
    except TorchRaised:  # torch's own function (user names, folders): no such folder to name
        return None


def _default_cache_dir() -> str | None:
    mod = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    try:
        return os.path.abspath(torchs(mod.default_cache_dir)) if mod is not None else None
    except TorchRaised:  # as above
        return None


def _store() -> Any:
    from .attached import cache

    store = cache()
    if store is None or not store.trust_host_code:
        return None  # host code only from a store that passed every check
    return store


def _restore(target: str, key: str, comps: dict[str, Any]) -> bool:
    from . import policy

    store = _store()
    if store is None or not policy.may_serve(_kinds.INDUCTOR_CPP, key):
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
    from . import policy

    store = _store()
    if store is None or not policy.may_keep(_kinds.INDUCTOR_CPP):
        return
    from ..store.fs import UnsafePath, read_at

    try:
        data, _st = read_at(None, target, MAX_SO)
    except (OSError, UnsafePath) as e:  # gone, replaced or too large: not kept
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
    policy.kept(_kinds.INDUCTOR_CPP, key)
