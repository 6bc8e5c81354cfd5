"""``KCACHE_RECORD=FILE``: a running program appends the Triton kernels it compiles to a spec.

Each kernel the program's JIT prepares (compiled, or loaded from a cache: both go through
``JITFunction._do_compile``) becomes one ``[[triton]]`` entry: the import path of the kernel (the
autotuner or heuristics object when the kernel is wrapped, with the wrapper's own arguments), the
arguments (tensors by dtype, shape, strides when not contiguous and alignment when not 16 bytes;
scalars by value; constexprs), the compile options, the grid when it can be written down, and
Triton's cache-invalidating environment. Never tensor contents, never a file path.

How: Triton's ``knobs.runtime.jit_cache_hook`` (called before each compile, inside the JIT's
``run``, whose bound arguments it reads from the stack) and ``jit_post_compile_hook`` (called
after it succeeded). Both are single slots: kcache chains whatever the program set, before or
after kcache (the ``knobs.runtime`` object gets a subclass whose two properties call the
program's hooks after kcache's, and return what they return). The post-compile hook also fires
on cache hits; entries are deduplicated (per process and in the file).

Concurrent processes append under a lock (``flock`` on FILE itself); each entry is a complete
TOML table (written by tomli_w: :func:`entry_toml`) written in one append, so the file is a valid
spec after every append. A kernel that cannot be imported by name in another process (defined in
``__main__``, inside a function, or in a module loaded from a path) is written as a comment saying
so, and so is one with a string that TOML cannot hold (a lone surrogate: :func:`toml_ready`);
every other string reads back exactly.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType, ModuleType
from typing import Any

from .._imports import forget, when_imported
from ..boundary import guarded
from ..log import warn_once
from .env import WORKER_ENV, current_invalidating_env
from .recordargs import Unrecordable, fit_grid, grid_value, import_name, spec_value
from .spectoml import entry_toml, toml_comment, toml_ready, toml_text

# Importable from here, as before the split (tests, tools/chaos_links.py, callers of entry_toml).
__all__ = [
    "HEADER",
    "MAX_RECORD_BYTES",
    "Recorder",
    "Unrecordable",
    "attach",
    "chain_hooks",
    "entry_toml",
    "fit_grid",
    "import_name",
    "spec_value",
    "toml_comment",
    "toml_ready",
    "toml_text",
]

HEADER = (
    "# kcache prewarm spec, appended to by programs run with KCACHE_RECORD=<this file>.\n"
    "# Replay: kcache prewarm <this file> [--target cuda:90]. Tensor contents are never recorded.\n"
    "version = 1\n"
)
_EXCLUDED_OPTIONS = {"debug", "instrumentation_mode", "fpsan_homomorphic_casts"}


# ------------------------------------------------------------------------------ the recorder
class Recorder:
    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, str], tuple[str, dict[str, Any] | None, str | None]] = {}
        self._written: set[str] = set()
        self.recorded = 0
        self.skipped = 0

    # called by the chained hooks
    def capture(self, kw: Mapping[str, Any]) -> None:
        info = kw.get("fn")
        jit = getattr(info, "jit_function", None)
        if jit is None:
            return
        entry, why = self._build(jit, kw)
        if entry is None and why is None:
            return
        rid = _record_id(entry if entry is not None else {"skip": why, "fn": getattr(jit, "__name__", "")})
        with self._lock:
            self._pending[(id(jit), str(kw.get("key")))] = (rid, entry, why)

    def commit(self, kw: Mapping[str, Any]) -> None:
        info = kw.get("fn")
        jit = getattr(info, "jit_function", None)
        with self._lock:
            got = self._pending.pop((id(jit), str(kw.get("key"))), None)
            if got is None or got[0] in self._written:
                return
            self._written.add(got[0])
        rid, entry, why = got
        try:
            self._append(rid, entry, why)
        except (OSError, TypeError, ValueError) as e:  # the file (a link, full, another user's),
            # or an entry TOML cannot hold: recording never fails the program's compile (a bug
            # goes to the hook's edge: see chain_hooks)
            warn_once("record-write", f"KCACHE_RECORD: cannot append to {self.path}: {e}")

    def _build(self, jit: Any, kw: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        import inspect

        f: FrameType | None = sys._getframe(1)
        run = None
        while f is not None:
            loc = f.f_locals
            if f.f_code.co_name == "run" and loc.get("self") is jit and "bound_args" in loc:
                run = f
                break
            f = f.f_back
        if run is None:
            return None, None  # preload() or an unknown path: nothing to record
        from triton.runtime.jit import JITFunction, KernelInterface

        from .kernels import kernel_chain

        outer, outer_frame = None, None
        f = run.f_back
        while f is not None:
            s = f.f_locals.get("self") if f.f_code.co_name in ("run", "warmup") else None
            if (
                s is not None
                and isinstance(s, KernelInterface)
                and not isinstance(s, JITFunction)
                and any(c is jit for c in kernel_chain(s))
            ):
                outer, outer_frame = s, f
            f = f.f_back
        params = list(inspect.signature(jit.fn).parameters)
        warmup = bool(kw.get("is_manual_warmup"))
        obj = outer if outer is not None else jit
        ref, why = import_name(obj, jit.fn)
        if ref is None:
            return None, why
        if outer is not None and outer_frame is not None:
            loc = outer_frame.f_locals
            names = getattr(outer, "arg_names", params)
            given = dict(zip(names, loc.get("args", ())))
            given.update(loc.get("kwargs", {}) or {})
            grid = given.pop("grid", loc.get("grid"))
            given.pop("warmup", None)
            if isinstance(getattr(outer, "values", None), dict):  # heuristics add these
                for k in outer.values:
                    given.pop(k, None)
            excluded: set[str] = set()
        else:
            loc = run.f_locals
            given = dict(loc["bound_args"])
            given.update({k: v for k, v in (loc.get("kwargs") or {}).items() if k not in given})
            grid = loc.get("grid")
            excluded = _EXCLUDED_OPTIONS
        args: dict[str, Any] = {}
        options: dict[str, Any] = {}
        for k, v in given.items():
            if k in excluded:
                continue
            try:
                val = spec_value(v)
            except Unrecordable as e:
                return None, f"{ref}: argument {k} is {e}, which a spec cannot describe"
            if k in params:
                args[k] = val
            elif v is not None:
                options[k] = val
        entry: dict[str, Any] = {"kernel": ref, "args": args}
        if options:
            entry["options"] = options
        if not warmup:
            g = grid_value(grid, given if outer is None else None)
            if g is None and callable(grid) and outer is not None:
                g = fit_grid(grid, given, outer)  # an autotuner's lambda: per config
            if g is not None:
                entry["grid"] = g
        env = _env_now()
        if env:
            entry["env"] = env
        try:  # written at commit, checked now: the reason goes in the file instead of the entry
            entry_toml(entry)
        except (TypeError, ValueError) as e:
            return None, f"{ref}: cannot be written to a spec: {e}"
        return entry, None

    def _append(self, rid: str, entry: dict[str, Any] | None, why: str | None) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        if entry is not None:
            text = entry_toml(entry, comment=f"kcache record-id {rid} ({stamp}, pid {os.getpid()})")
        else:
            text = toml_comment(f"kcache record-id {rid}: not recorded: {why}") + "\n"
        fd = _open_record_file(self.path)
        try:
            # One flock on the file itself (processes of one job record into one file). No
            # separate lock file: a name beside it is one more place a link could be planted.
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                chunks.append(b)
            existing = b"".join(chunks).decode("utf-8", "replace")
            if f"record-id {rid}" in existing:
                return
            out = ""
            if not existing.strip():
                out = HEADER
            elif not existing.endswith("\n"):
                out = "\n"
            data = (out + "\n" + text).encode("utf-8")
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if entry is not None:
            self.recorded += 1
        else:
            self.skipped += 1
            warn_once(f"record-skip:{why}", f"KCACHE_RECORD: not recorded: {why}")


def _env_now() -> dict[str, str]:
    try:
        return dict(sorted(current_invalidating_env().items()))
    except RuntimeError:  # Triton's lister (C++: pybind's RuntimeError) failed: no env recorded
        return {}


def _record_id(entry: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------ chaining
def chain_hooks(recorder: Recorder) -> Callable[[], None]:
    """Route ``knobs.runtime.jit_cache_hook``/``jit_post_compile_hook`` through ``recorder``,
    keeping (and calling) whatever the program set, now or later. Returns an undo function."""
    from triton import knobs

    rt = knobs.runtime
    base = type(rt)
    if getattr(base, "_kcache_chained", False):
        base._kcache_recorder = recorder
        return lambda: setattr(base, "_kcache_recorder", None)

    def make(slot: str, before: bool) -> property:
        user_slot = f"_kcache_user_{slot}"

        def get(self: Any) -> Any:
            user = self.__dict__.get(user_slot)
            rec = type(self)._kcache_recorder

            if rec is None:
                return user

            def hook(**kw: Any) -> Any:
                # The edge (Triton calls it): recording never breaks the program; a bug is
                # reported once (raised when strict), and the program's own hook runs.
                with guarded("record-hook", "KCACHE_RECORD's recording of a kernel", then="not recorded"):
                    (rec.capture if before else rec.commit)(kw)
                return user(**kw) if user is not None else None

            return hook

        def set_(self: Any, value: Any) -> None:
            self.__dict__[user_slot] = value

        return property(get, set_)

    # Triton's knobs find their environment-backed settings in ``type(self).__dict__``
    # (``knob_descriptors``, which ``scope()`` and ``reset()`` use): the subclass lists its base's
    # too, or a ``scope()`` would no longer put back what it changed (TRITON_OVERRIDE_ARCH, ...).
    inherited = {k: v for k, v in vars(base).items() if not k.startswith("__")}
    chained = type(
        base.__name__,
        (base,),
        {
            **inherited,
            "_kcache_chained": True,
            "_kcache_recorder": recorder,
            "jit_cache_hook": make("jit_cache_hook", True),
            "jit_post_compile_hook": make("jit_post_compile_hook", False),
        },
    )
    for slot in ("jit_cache_hook", "jit_post_compile_hook"):
        rt.__dict__[f"_kcache_user_{slot}"] = rt.__dict__.pop(slot, None)
    rt.__class__ = chained

    def undo() -> None:
        chained._kcache_recorder = None  # type: ignore[attr-defined]

    return undo


# ------------------------------------------------------------------------------ attach
def attach(record_path: str | None) -> Callable[[], None]:
    """Called by :func:`kcache.enable`: when triton is imported, check the store's prewarm build,
    and with ``record_path`` (``KCACHE_RECORD``) start recording. In a child of a prewarm, protect
    this process's puts. Returns a function that undoes it all. Imports nothing heavy."""
    from .. import active_store
    from .meta import check_store_build, protect_from_env

    undo: list[Callable[[], None]] = []
    with_protect = protect_from_env(active_store())
    if with_protect is not None:
        undo.append(with_protect)

    def on_triton(mod: ModuleType) -> None:
        # An advisory check at Triton's import (see .integration): a bug is reported, not raised.
        with guarded(
            "prewarm-build-check", "kcache's check of the store's prewarm build", then="not checked"
        ):
            check_store_build(active_store())
        if record_path and not os.environ.get(WORKER_ENV):
            rec = Recorder(record_path)
            undo.append(chain_hooks(rec))

    when_imported("triton", on_triton)

    def detach() -> None:
        forget("triton", on_triton)
        while undo:
            with guarded("prewarm-detach", "undoing KCACHE_RECORD's recorder", then="going on"):
                undo.pop()()  # an undo expects nothing to fail: a bug is reported, the rest undone

    return detach


MAX_RECORD_BYTES = 64 << 20  # a KCACHE_RECORD file: a spec of thousands of kernels is a few MiB


def _open_record_file(path: str) -> int:
    """Open the ``KCACHE_RECORD`` file for appending (and reading): created 0600 if absent; never
    through a link (a link planted at the name is refused, not followed), only a regular file of
    this user's with one name (in a shared folder such as /tmp, another user may have made the
    name first), never waited on (a FIFO): :func:`kcache.userfile.open_append`. Refused:
    :class:`~kcache.userfile.UserFileError` (a ``ValueError``)."""
    from ..userfile import open_append

    # read whole to find the entries it holds: bounded
    return open_append(path, what="the KCACHE_RECORD spec", read=True, limit=MAX_RECORD_BYTES, private=True)
