"""Inductor's precompiled headers: no compiler run for them in a process that compiles nothing.

Before it loads a C++ kernel, Inductor makes sure the precompiled form of the kernels' common
header exists (``codecache._precompile_header``, every process, whether the kernel's library is
there or not): it runs the preprocessor on the header (``g++ -E``, half a second on a small CPU),
hashes the output with ``openssl sha512`` (a process start) to name the precompiled header by
what it holds, and compiles the header (``g++ -x c++-header``, seconds) when no file of that name
is in ``$TMPDIR/torchinductor_<user>/precompiled_headers``. A process whose every kernel comes
from kcache's store (a new node, a new ``TMPDIR``) still paid all three, and used none of them.

kcache changes two things, both inside torch's own ``_precompile_header`` (its code still runs,
so the header's name is torch's):

- **the preprocessor's answer is remembered**: the first run gets ``-MD -MF`` added (the
  compiler also writes the list of every header the output was made from); the sha512 that
  ``openssl`` then prints is kept with the identity (inode, size, times) of each of those
  headers, as a machine-local memo (:mod:`kcache.memo`: kind ``triton-meta``, keyed by this
  boot, the preprocessor's command line with its temporary folder made neutral, the compiler's
  identity and the environment variables that change where a compiler looks for headers). In a
  later process, when no header changed, neither the preprocessor nor ``openssl`` runs: torch's
  ``openssl`` call is answered with the remembered sha512. A header edited, added in place or
  replaced changes its identity: the preprocessor runs again.
- **the precompiled header is compiled when a kernel is**: torch's build of it is held, and
  made (by torch's own ``_worker_compile_cpp``, under torch's lock) just before the first
  compiler run that includes it. A process whose kernels are all served never compiles it; one
  that compiles a kernel gets it first, as before. A kernel compiled without it (a compile in a
  process kcache does not see) would still be right: the compiler includes the plain header.

Fail open: without a usable store, or where torch's functions are not the ones this module
knows, torch runs as without kcache.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from .. import memo as _memo
from ..boundary import guarded
from ..forksafe import module_lock
from ..log import logger
from .attached import cache as active_cache
from .torchcall import TorchRaised
from .torchcall import own as torchs

if TYPE_CHECKING:
    from ..store.api import Cache

MODULE = "torch._inductor.codecache"
MEMBER = "preprocessed"
#: What changes where a compiler finds headers, beside its command line and its binary.
ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH", "SDKROOT")
#: The fail-open boundary's topic (kcache/boundary.py): torch makes its header as without kcache.
TOPIC, WHAT = "inductor-pch", "kcache's handling of Inductor's precompiled headers"

_lock = module_lock(__name__, "_lock")
_inside = threading.local()  # .depth: this thread is inside torch's _precompile_header
_answers: dict[str, str] = {}  # preprocessed file (never made) -> the remembered sha512
_making: dict[str, tuple[str, list[list[str]], float]] = {}  # preprocessed file -> (key, headers, s)
_held: dict[str, tuple[Any, Any, threading.Lock]] = {}  # header (.h) -> (torch's builder, build, lock)


# ------------------------------------------------------------------------------ attach
def on_import(mod: Any) -> None:
    """Called when ``torch._inductor.codecache`` has been imported."""
    from .attached import patches

    orig = getattr(mod, "_precompile_header", None)
    if not callable(orig) or not callable(getattr(mod, "_worker_compile_cpp", None)):
        return
    if not isinstance(getattr(mod, "_HEADER_LOCK_DIR", None), str):
        return
    if getattr(mod, "subprocess", None) is subprocess:
        patches.wrap(mod, "subprocess", lambda real: _ChecksumSubprocess(real))

    def _precompile_header(*args: Any, **kwargs: Any) -> Any:
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            return orig(*args, **kwargs)
        finally:
            _inside.depth -= 1

    patches.wrap(mod, "_precompile_header", lambda _: _precompile_header)


def _ours(mod: Any) -> bool:
    return isinstance(getattr(mod, "subprocess", None), _ChecksumSubprocess)


def handles(builder: Any) -> bool:
    """Whether ``builder`` is the preprocessor run or the header compile of torch's
    ``_precompile_header`` in this thread (:func:`build` takes it then)."""
    if not getattr(_inside, "depth", 0):
        return False
    return bool(getattr(builder, "_preprocessing", False) or getattr(builder, "_precompiling", False))


def build(builder: Any, orig: Any, codecache: Any) -> None:
    """torch's ``builder.build()`` for a builder :func:`handles`: the preprocessor's answer from
    the memo, the header compile held until a kernel needs it."""
    if getattr(builder, "_precompiling", False):
        header = _header_of(builder)
        if header is not None:
            with _lock:
                _held.setdefault(header, (builder, orig, threading.Lock()))
            return
        orig(builder)
        return
    store = _memo.usable(active_cache())
    if store is None or codecache is None or not _ours(codecache):
        orig(builder)
        return
    _preprocess(store, builder, orig)


def before_compile(builder: Any, codecache: Any) -> None:
    """A compiler run is coming for ``builder``: compile first a held precompiled header that
    its command includes (torch's own ``_worker_compile_cpp``, under torch's lock)."""
    if not _held or codecache is None:
        return
    wanted = getattr(getattr(builder, "_build_option", None), "precompiled_header", None)
    if not isinstance(wanted, str) or wanted not in _held:
        return
    with _lock:
        got = _held.get(wanted)
    if got is None:
        return
    pch_builder, orig, lock = got
    with lock:  # one thread compiles it; the others wait for it rather than read a torn file
        if _held.get(wanted) is None:
            return
        stem = os.path.splitext(os.path.basename(wanted))[0]
        os.makedirs(codecache._HEADER_LOCK_DIR, exist_ok=True)
        lock_path = os.path.join(codecache._HEADER_LOCK_DIR, f"{stem}.lock")
        target = pch_builder.get_target_file_path()
        from torch.utils._filelock import FileLock

        with FileLock(lock_path, timeout=getattr(codecache, "LOCK_TIMEOUT", 600)):
            if not os.path.exists(target):
                orig(pch_builder)
        with _lock:
            _held.pop(wanted, None)


def _header_of(builder: Any) -> str | None:
    """The header a precompiling builder compiles (``X.h`` of ``X.h.gch``), as kernels name it."""
    target = builder.get_target_file_path()
    header, ext = os.path.splitext(target)
    return header if ext in (".gch", ".pch") and header.endswith(".h") else None


# ------------------------------------------------------------------------------ the memo
def _stat(path: str) -> str:
    st = os.stat(path)
    return f"{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"


def memo_key(cmd: str, src_dir: str) -> str | None:
    """The memo's key for the preprocessor command ``cmd`` (its temporary folder made neutral)."""
    from .hostflags import compiler_of, resolve

    first = compiler_of(cmd)
    exe = shutil.which(first) if first is not None else None
    if exe is None:
        return None

    host = resolve(cmd)  # -march=native: the predefined macros are this CPU's
    if host is None:
        return None
    neutral = re.sub(re.escape(src_dir.rstrip("/")) + r"(?=/|\s|$)", "<SRC>", cmd)
    env = "|".join(f"{k}={os.environ.get(k, '')}" for k in ENV)
    return (
        f"preprocessed-header/v1|boot={_memo.boot_id()}|{_memo.identity(exe)}|host={host}|{env}|cmd={neutral}"
    )


def _unchanged(value: bytes) -> bool:
    """A remembered answer holds while every header it was made from is the same file."""
    try:
        got = json.loads(value)
        if not (isinstance(got.get("sha512"), str) and re.fullmatch(r"[0-9a-f]{128}", got["sha512"])):
            return False
        return all(_stat(path) == ident for path, ident in got["headers"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return False


def _preprocess(store: Cache, builder: Any, orig: Any) -> None:
    target = builder.get_target_file_path()
    src_dir = os.path.dirname(target)
    cmd = builder.get_command_line()
    key = value = None
    with guarded(TOPIC, WHAT):  # the edge (torch builds its header): a bug, reported
        try:
            key = memo_key(cmd, src_dir)
            value = _memo.recall(store, key, MEMBER, _unchanged) if key is not None else None
        except OSError as e:  # the compiler or the memo's entry changed under us: it runs
            logger.debug("torch.compile: precompiled header memo not read: %s", e)
            key = value = None
    if value is not None:
        _answers[target] = json.loads(value)["sha512"]  # torch's openssl call is answered
        return
    if key is None:
        orig(builder)
        return
    deps = target + ".d"
    t0 = time.perf_counter()
    builder.get_command_line = lambda: f"{cmd} -MD -MF {shlex.quote(deps)}"
    try:
        torchs(orig, builder)
    except TorchRaised as e:  # torch's build, with its own errors: a compiler without -MD
        logger.debug("torch.compile: preprocessing with -MD failed (%s); as torch asks", e)
        del builder.get_command_line
        orig(builder)
        return
    finally:
        builder.__dict__.pop("get_command_line", None)
    with guarded(TOPIC, WHAT):
        headers = _headers(deps, src_dir)
        if headers is not None:
            _making[target] = (key, headers, time.perf_counter() - t0)


def _headers(deps: str, src_dir: str) -> list[list[str]] | None:
    """[path, identity] of every header a make-style dependency file names (not the temporary
    source itself); None when it cannot be read whole."""
    try:
        with open(deps, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read().replace("\\\n", " ")
    except OSError:
        return None
    _, sep, rest = text.partition(": ")
    if not sep:
        return None
    out = []
    for path in re.split(r"(?<!\\)\s+", rest):
        if not path:
            continue
        if "\\" in path or not os.path.isabs(path):
            return None  # an escaped name (spaces) or a relative one: not remembered
        if os.path.dirname(path) == src_dir.rstrip("/"):
            continue
        try:
            out.append([path, _stat(path)])
        except OSError:
            return None
    return out or None


class _ChecksumSubprocess:
    """Stands in for the ``subprocess`` module inside ``torch._inductor.codecache``: answers
    ``run(("openssl", "sha512", <preprocessed header>))`` when that header was never made
    because its sha512 was remembered; remembers the answer after a real run."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def run(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        path = args[2] if isinstance(args, (tuple, list)) and len(args) == 3 and args[:2] in (("openssl", "sha512"), ["openssl", "sha512"]) else None  # fmt: skip
        if not isinstance(path, str):
            return self._real.run(args, *rest, **kwargs)
        sha = _answers.pop(path, None)
        if sha is not None:
            out = f"SHA2-512({path})= {sha}\n"
            text = kwargs.get("text") or kwargs.get("universal_newlines")
            return self._real.CompletedProcess(args, 0, out if text else out.encode(), "" if text else b"")
        result = self._real.run(args, *rest, **kwargs)
        making = _making.pop(path, None)
        if making is not None and getattr(result, "returncode", 1) == 0:
            with guarded(TOPIC, WHAT):
                _keep(making, result.stdout)
        return result


def _keep(making: tuple[str, list[list[str]], float], stdout: Any) -> None:
    key, headers, seconds = making
    text = stdout.decode("ascii", "replace") if isinstance(stdout, bytes) else str(stdout or "")
    words = text.split()
    if not words or not re.fullmatch(r"[0-9a-f]{128}", words[-1]):
        return
    store = _memo.usable(active_cache())
    if store is None:
        return
    value = json.dumps({"sha512": words[-1], "headers": headers}).encode()
    _memo.keep(store, key, MEMBER, value, {"probe": "preprocessed-header"}, seconds)


def uninstall() -> None:
    """kcache.disable(): what this process held for torch is dropped (torch's functions come
    back with :data:`.attached.patches`)."""
    with _lock:
        _held.clear()
    _answers.clear()
    _making.clear()
