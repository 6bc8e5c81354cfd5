"""Remember what Inductor asks the C++ compiler about itself: no compiler run for ``--version``.

Before its first C++ kernel in a process, Inductor asks the compiler about itself, each time a
new process: ``g++ --version`` (``cpp_compiler_search``: is it there; ``_is_intel_compiler``,
``_is_apple_clang``), ``g++ -v`` (``get_compiler_version_info``: the fingerprint of its
vector-ISA probes and the name of its precompiled headers) and ``-dumpfullversion``. In a
process whose every kernel is served from the store, those runs were the only compiler runs
left beside the precompiled header's (:mod:`.pch`), and they are process starts on the way to
the first call.

kcache remembers each answer like the CUDA tools' versions of :mod:`kcache.triton.toolmemo`
(see :mod:`kcache.memo`): machine-local (kind ``triton-meta``: never exported, imported or
shared), keyed by this boot, the identity of the executable the name resolves to on ``PATH``
(real path, inode, size, times: a replaced compiler is asked again), the exact arguments, how
the output was asked for (``stderr``, ``text``) and the environment variables that change what
a compiler says about itself (locale, GCC's search prefixes). Only
``check_output([compiler, <one of the questions>], ...)`` made from ``torch._inductor.cpp_builder``
is answered; every other call, and every call that fails, goes to :mod:`subprocess` untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

from .. import memo as _memo
from ..boundary import guarded
from ..log import logger
from .attached import cache as active_cache

MODULE = "torch._inductor.cpp_builder"
MEMBER = "output"
#: What Inductor asks a compiler about itself (the arguments after the compiler's name).
QUESTIONS = (("--version",), ("-v",), ("-dumpfullversion", "-dumpversion"))
#: What changes a compiler's answer beside its binary: the locale of its messages, GCC's prefixes.
ENV = ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE", "GCC_EXEC_PREFIX", "COMPILER_PATH")
#: The fail-open boundary's topic (kcache/boundary.py): the compiler is asked as without kcache.
TOPIC, WHAT = "inductor-compiler-info", "kcache's memo of what the C++ compiler says about itself"


def memo_key(exe: str, args: tuple[str, ...], kwargs: dict[str, Any]) -> str:
    env = kwargs.get("env")
    env = env if isinstance(env, dict) else os.environ
    said = "|".join(f"{k}={env.get(k, '')}" for k in ENV)
    return (
        f"compiler-info/v1|boot={_memo.boot_id()}|{_memo.identity(exe)}|argv0={args[0]}"
        f"|args={' '.join(args[1:])}|stderr={kwargs.get('stderr')!r}|text={bool(kwargs.get('text'))}|{said}"
    )


def _executable(args: Any, kwargs: dict[str, Any]) -> str | None:
    """The file ``args`` would run, when ``args`` is one of :data:`QUESTIONS` asked plainly."""
    if (
        not isinstance(args, (list, tuple))
        or len(args) < 2
        or tuple(args[1:]) not in QUESTIONS
        or not all(isinstance(a, str) for a in args)
        or set(kwargs) - {"stderr", "env", "text"}
    ):
        return None
    env = kwargs.get("env")
    path = (env if isinstance(env, dict) else os.environ).get("PATH")
    return shutil.which(args[0], path=path)


class _InfoSubprocess:
    """Stands in for the ``subprocess`` module inside ``torch._inductor.cpp_builder``."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def check_output(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        store = _memo.usable(active_cache())
        if store is None or rest:
            return self._real.check_output(args, *rest, **kwargs)
        key = out = None
        with guarded(TOPIC, WHAT):  # the edge (Inductor asks its compiler): a bug, reported
            try:
                exe = _executable(args, kwargs)
                key = memo_key(exe, tuple(args), kwargs) if exe is not None else None
                out = _memo.recall(store, key, MEMBER) if key is not None else None
            except OSError as e:  # the compiler or the memo's entry changed under us: it is asked
                logger.debug("torch.compile: compiler info memo not read: %s", e)
                key = out = None
        if out is not None:
            return out.decode("utf-8", "surrogateescape") if kwargs.get("text") else out
        t0 = time.perf_counter()
        got = self._real.check_output(args, *rest, **kwargs)  # its errors are torch's to meet
        if key is not None and isinstance(got, (bytes, str)):
            raw = got.encode("utf-8", "surrogateescape") if isinstance(got, str) else got
            with guarded(TOPIC, WHAT):  # the store skips what it cannot write: a raise is a bug
                _memo.keep(store, key, MEMBER, raw, {"probe": "compiler-info"}, time.perf_counter() - t0)
        return got


def on_import(mod: Any) -> None:
    """Called when ``torch._inductor.cpp_builder`` has been imported."""
    from .attached import patches

    if getattr(mod, "subprocess", None) is subprocess:
        patches.wrap(mod, "subprocess", lambda real: _InfoSubprocess(real))
