"""Triton's own one-time work on the way to a process's first kernel, moved off that path.

Measured on the H200 after a prewarm (every kernel a hit), the first call at the first shape took
93 ms, almost all of it Triton's per-process work, not kcache's: 68 ms importing
``triton.experimental.gluon`` (the JIT's specializer imports it at its first use) and ~18 ms in
subprocesses, among them ``/sbin/ldconfig -p`` to find libcuda. Two things here, neither of which
changes what Triton computes:

- :func:`start_gluon_import`: when the program defines its first kernel of its own (a
  ``@triton.jit`` function outside Triton's and Inductor's packages: :func:`arm_gluon_import`), a
  daemon thread imports ``triton.experimental.gluon``, the package the specializer will import
  anyway. A real program spends far longer than that between defining a kernel and its first
  launch (CUDA's context alone takes 100+ ms), so the import is done by then; if not, the first
  call waits for it, never imports twice (how that is made safe against Python's import-lock
  cycles: see the function). Not at ``import triton``: torch imports Triton in every process
  that compiles or merely asks whether Triton is there, and Inductor launches its kernels
  through their compiled launchers, never the JIT's specializer: no process of Inductor's own
  imports gluon (H100, session 22), and the pre-import was 35 modules of work for nothing there.
- :func:`install_libcuda_memo`: ``libcuda_dirs()`` (an ``ldconfig -p`` fork and exec in every
  process) is remembered across processes, machine-locally (kind ``triton-meta``: never exported
  or shared), keyed by this boot, the linker cache's identity and the variables Triton reads; a
  remembered answer is used only if each folder still holds ``libcuda.so.1`` (Triton's own
  check), else Triton is asked.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from typing import Any

from .. import kinds as _kinds
from ..boundary import fail_open, guarded
from ..forksafe import module_lock
from ..log import logger

# The module Triton's specializer (C++, ``native_specialize_impl``) imports first at a process's
# first kernel, in Triton 3.6 and 3.9 alike; importing the package runs gluon's whole __init__.
ENTRY = "triton.experimental.gluon.nvidia.hopper"
FALLBACK = "triton.experimental.gluon.language"  # a Triton without the hopper module
_started = False
_thread: threading.Thread | None = None
_fork_hook = [False]
_FORK_WAIT_S = 10.0
_JOIN_S = 5.0
# idle -> importing -> done, or idle -> cancelled; moved under _gate only (see _guard).
_state = "idle"
_gate = module_lock(__name__, "_gate")  # a forked child gets a free one (kcache.forksafe)
_orig_import: Any = None
#: The fail-open boundary's topic (kcache/boundary.py) where Triton asks for libcuda's folders.
TOPIC, WHAT = "triton-libcuda-memo", "kcache's memo of libcuda's folders"


#: Kernels defined in these packages are not launched through the JIT's specializer by the
#: program's thread: Triton's own library functions (``@jit`` helpers, called from kernels) and
#: Inductor's (its runtime helpers, and the kernels it generates, which are run as modules named
#: ``torch._inductor.runtime.compile_tasks.<key>`` and launched through compiled launchers).
NOT_LAUNCHED = ("triton.", "torch._inductor.")


def arm_gluon_import() -> None:
    """Start :func:`start_gluon_import` at the first ``JITFunction`` made for a function outside
    :data:`NOT_LAUNCHED` (the program's or a library's kernel: one the JIT may specialise), not
    before. A Triton whose ``JITFunction`` kcache does not know: started now, as before."""
    from .attached import patches

    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # a Triton laid out otherwise
        JITFunction = None
    own = getattr(JITFunction, "__dict__", {}).get("__init__")
    if not callable(own):  # no JITFunction kcache knows
        start_gluon_import()
        return
    if patches.holds(JITFunction, "__init__"):
        return

    @functools.wraps(own)
    def __init__(self: Any, fn: Any, *args: Any, **kwargs: Any) -> None:
        own(self, fn, *args, **kwargs)
        if not _started:
            # The edge (Triton builds a kernel): a bug here is reported (raised when strict),
            # the kernel is Triton's all the same, and its JIT imports gluon itself.
            with guarded(
                "triton-warmup", "starting kcache's gluon pre-import", then="Triton imports it itself"
            ):
                module = getattr(fn, "__module__", None)
                if not isinstance(module, str) or not module.startswith(NOT_LAUNCHED):
                    start_gluon_import()

    patches.wrap(JITFunction, "__init__", lambda _: __init__, raw=True)


def start_gluon_import() -> None:
    """Import Triton's gluon package in a daemon thread (once per process), safely.

    Python's import locks are per module, and a thread importing a submodule holds its lock
    while it imports the parents: two threads entering a package with cyclic imports through
    different submodules can each hold what the other needs. CPython detects that cycle and raises
    ``_DeadlockError`` in one of the two threads: in the program's thread, that is a crash
    (seen in CI with Triton 3.9: the JIT's first kernel against this thread). So, for as long as
    the import runs, any other thread's import of ``triton.experimental...`` first waits for it
    to finish (a guard on ``builtins.__import__``, which is how both ``import`` statements and
    the JIT's C++ reach the import system), and this thread enters through the module the JIT
    enters through. A guard that fires before the import has started cancels it instead.
    """
    global _started, _thread, _orig_import
    if (
        _started
        or ENTRY in sys.modules
        or FALLBACK in sys.modules
        or os.environ.get("KCACHE_NO_TRITON_WARMUP")
        or _compiles_anyway()
    ):
        return
    with _gate:  # two threads defining their first kernels at once: one starts it (a second
        if _started:  # guard would take the first for the original import and call itself)
            return
        _started = True
    import builtins

    _orig_import = builtins.__import__
    _thread = threading.Thread(target=_run, name="kcache-triton-warmup", daemon=True)
    builtins.__import__ = _guard
    try:
        _thread.start()
    except RuntimeError as e:  # "can't start new thread": the JIT imports it itself
        _thread = None
        _unguard()
        logger.debug("gluon pre-import not started: %s", e)
        return
    if not _fork_hook[0] and hasattr(os, "register_at_fork"):
        _fork_hook[0] = True
        os.register_at_fork(before=_finish_before_fork, after_in_child=_after_fork_child)


def _compiles_anyway() -> bool:
    """``TRITON_ALWAYS_COMPILE=1``: every kernel compiles in the program's thread, which imports
    gluon itself at the first one (the compiler needs it): a pre-import could only race it."""
    try:
        from triton import knobs

        return bool(knobs.compilation.always_compile)
    except (ImportError, AttributeError):  # a Triton without this knob: the warm-up as before
        return False


def _run() -> None:
    global _state
    try:
        # The hook that started this thread runs inside the program's own ``import triton``:
        # wait for that to finish (this thread holds no import lock while it waits).
        if "triton" in sys.modules:
            import triton  # noqa: F401

        with _gate:
            if _state != "idle" or ENTRY in sys.modules or FALLBACK in sys.modules:
                return
            _state = "importing"
        try:
            __import__(ENTRY)
        except ImportError:
            __import__(FALLBACK)
    except Exception as e:  # broad: a thread's last resort around Triton's own module code;
        # the JIT imports it (and reports what it raises) itself
        logger.debug("gluon pre-import: %s", e)
    finally:
        with _gate:
            if _state == "importing":
                _state = "done"
        _unguard()


def _unguard() -> None:
    import builtins

    if builtins.__import__ is _guard and _orig_import is not None:
        builtins.__import__ = _orig_import


# The other way into the cycle: Triton's compiler imports gluon from the middle of its code
# generator's module body (the ``CodeGenerator`` class), and gluon imports the code generator. A
# program's thread that waited for the pre-import from in there held the code generator's module
# lock that the pre-import needed: both stood still until the bounded wait ran out (5 s at every
# compile racing the pre-import, every kernel under TRITON_ALWAYS_COMPILE=1: issue 33). Waiting
# before the code generator's import begins holds nothing the pre-import needs.
CODEGEN = "triton.compiler.code_generator"


def _wants_gluon(name: str, globals: Any, fromlist: Any, level: int) -> bool:
    """The import enters the gluon <-> code generator cycle (see :data:`CODEGEN`)."""
    if level:
        pkg = (globals or {}).get("__package__") or ""
        if not pkg.startswith("triton"):
            return False
        base = pkg.rsplit(".", level - 1)[0] if level > 1 else pkg
        name = f"{base}.{name}" if name else base
    if name.startswith("triton.experimental") or name == CODEGEN:
        return True
    if name == "triton":
        return bool(fromlist) and "experimental" in fromlist
    return name == "triton.compiler" and bool(fromlist) and "code_generator" in fromlist


def _guard(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
    """``builtins.__import__`` while the pre-import may run (see :func:`start_gluon_import`)."""
    global _state
    if _state in ("idle", "importing") and _wants_gluon(name, globals, fromlist, level):
        t = _thread
        if t is not None and t is not threading.current_thread():
            with _gate:
                if _state == "idle":
                    _state = "cancelled"  # the program imports it itself, alone
            if _state == "importing":
                # Bounded: should the pre-import ever wait on a lock this thread holds, the
                # program goes on after _JOIN_S rather than never.
                t.join(_JOIN_S)
    return _orig_import(name, globals, locals, fromlist, level)


def _finish_before_fork() -> None:
    """A fork while the import runs would copy its module locks held by a thread the child does
    not have: the child's own import of gluon (its first kernel) would wait for ever. The fork
    waits for the import instead (bounded; it takes ~70 ms)."""
    t = _thread
    if t is not None and t.is_alive() and t is not threading.current_thread():
        t.join(_FORK_WAIT_S)


def _after_fork_child() -> None:
    """The child has no warm-up thread: nothing to wait for, no guard to keep (and a gate that
    another thread may have held at the fork is replaced: kcache.forksafe)."""
    global _state, _thread
    _thread = None
    if _state in ("idle", "importing"):
        _state = "cancelled"
    _unguard()


def _knob(driver: Any) -> str:
    """``TRITON_LIBCUDA_PATH`` as Triton's knob reads it ("" when unset)."""
    try:
        return str(driver.knobs.nvidia.libcuda_path or "")
    except AttributeError:  # a Triton without this knob (they vary between versions)
        return ""


def _key(driver: Any) -> str | None:
    try:
        st = os.stat("/etc/ld.so.cache")
        ident = f"ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}"
    except OSError:
        ident = "no-ld.so.cache"
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read(64).strip().decode("ascii", "replace")
    except OSError:
        return None  # no per-boot id: not worth the risk of an answer from another machine
    knob = _knob(driver)
    return f"libcuda-dirs/v1|boot={boot}|ldcache={ident}|LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}|knob={knob}"


def install_libcuda_memo(driver: Any) -> None:
    """Remember ``driver.libcuda_dirs()`` across processes (see the module doc)."""
    from .attached import patches

    if getattr(driver, "libcuda_dirs", None) is not None:
        patches.wrap(driver, "libcuda_dirs", lambda orig: _memo(driver, orig))


def _memo(driver: Any, orig: Any) -> Any:
    def remembered() -> list[str]:
        from .attached import cache

        store = cache()
        key = _key(driver) if store is not None and store.trust_host_code else None
        if key is not None and store is not None:
            hit = store.get(_kinds.TRITON_META, key, count=False)
            if hit is not None:
                try:
                    dirs = json.loads(hit.read("dirs.json"))
                except (KeyError, ValueError, RecursionError) as e:  # an entry without the member,
                    logger.debug("libcuda memo: %s", e)  # or not JSON: Triton's own search runs
                    dirs = None
                if (
                    isinstance(dirs, list)
                    and dirs
                    and all(
                        isinstance(d, str) and os.path.exists(os.path.join(d, "libcuda.so.1")) for d in dirs
                    )
                ):
                    return dirs
        dirs = orig()
        if key is not None and store is not None and dirs:
            store.put(
                _kinds.TRITON_META,
                key,
                {"dirs.json": json.dumps(list(dirs)).encode()},
                summary={"file": "libcuda"},
            )
        return dirs

    # The edge (Triton asks for libcuda's folders): a bug of the memo's is reported (raised under
    # KCACHE_STRICT=1) and Triton's own search answers.
    guarded_memo = fail_open(TOPIC, WHAT, fallback=lambda: orig())(remembered)

    def libcuda_dirs() -> list[str]:
        if _knob(driver):
            # Triton answers from TRITON_LIBCUDA_PATH without ldconfig: nothing to remember (and
            # an entry per folder named, e.g. prewarm's stand-in, would only add up).
            return orig()
        return guarded_memo()

    libcuda_dirs = _lru(libcuda_dirs)
    libcuda_dirs.__wrapped__ = orig  # type: ignore[attr-defined]
    return libcuda_dirs


def _lru(fn: Any) -> Any:
    import functools

    return functools.lru_cache(maxsize=None)(fn)
