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
  replaced changes its identity: the preprocessor runs again. ``-MD`` lists the headers found,
  not the places the compiler looked first: a header added where the search finds it earlier
  (a folder before the one that held it, ``#include_next``, ``__has_include``) would leave every
  found header as it was. So the memo also holds every folder under the compiler's search path
  (as the compiler reports it with ``-v`` for this command's flags: ``-iquote``, ``-I``,
  ``-isystem``, ``CPATH`` and the like, its built-in folders), and each found header's folder,
  with each one's inode and mtime: a name added, removed or renamed in a folder changes that
  folder's mtime, so any header that could now be found elsewhere changes the memo's identity.
  Listed once, when the memo is made (one ``-v`` run of the compiler on an empty input, and a
  walk); checked with one ``stat`` per folder (about a thousand for torch's and the system's
  headers: 6 ms on a loaded 2-core box, against half a second of preprocessing). A change
  anywhere under those folders (a package installed into ``/usr/include``) preprocesses once more.
- **the precompiled header is compiled when a kernel is**: torch's build of it is held, and
  made (by torch's own ``_worker_compile_cpp``, under torch's lock) just before the first
  compiler run that includes it. A process whose kernels are all served never compiles it; one
  that compiles a kernel gets it first, as before. A kernel compiled without it (a compile in a
  process kcache does not see) would still be right: the compiler includes the plain header.

Fail open: without a usable store, or where torch's functions are not the ones this module
knows, torch runs as without kcache.
"""

from __future__ import annotations

import hashlib
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
_making: dict[str, tuple[str, dict[str, Any], float]] = {}  # preprocessed file -> (key, what it came from, s)
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
        f"preprocessed-header/v2|boot={_memo.boot_id()}|{_memo.identity(exe)}|host={host}|{env}|cmd={neutral}"
    )


def search_path(cmd: str, src_dir: str) -> list[str] | None:
    """The folders the compiler of ``cmd`` looks for headers in, in its order, as it reports them
    (``-v``, on an empty input with ``cmd``'s flags: ``-iquote``, ``-I``, ``-isystem``,
    ``-idirafter``, ``CPATH`` and the like, ``--sysroot``, its built-in folders); None when it
    does not say (then nothing is remembered)."""
    args, skip, prefix = [], False, src_dir.rstrip("/") + "/"
    for a in shlex.split(cmd):
        if skip or a == "-o":  # the output, and (below) the temporary source: not this run's
            skip = a == "-o"
            continue
        if not a.startswith(prefix):
            args.append(a)
    try:
        run = subprocess.run(
            [*args, "-v", "-x", "c++", os.devnull, "-o", os.devnull],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="surrogateescape", timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        logger.debug("torch.compile: the compiler's search path not known (%s)", e)
        return None
    dirs: list[str] = []
    inside = False
    for line in run.stderr.splitlines():
        if line.startswith("#include ") and line.endswith("search starts here:"):
            inside = True
        elif line.startswith("End of search list."):
            return dirs if run.returncode == 0 else None
        elif inside and line.startswith(" "):
            d = line.strip().removesuffix(" (framework directory)")
            if d not in dirs:
                dirs.append(d)
    return None


def folders_under(tops: list[str]) -> list[str]:
    """Every folder under ``tops`` (themselves included, links to folders followed, each folder
    once), each absent top too: what :func:`tree_identity` checks."""
    out: list[str] = []
    seen: set[tuple[int, int]] = set()
    for top in tops:
        todo = [top]
        while todo:
            d = todo.pop()
            try:
                st = os.stat(d)
            except OSError:
                out.append(d)  # absent: made later, the identity changes
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out.append(d)
            try:
                with os.scandir(d) as it:
                    todo.extend(e.path for e in it if e.is_dir())
            except OSError:
                pass  # unreadable: the compiler cannot look in it either; its mtime still counts
    return out


def tree_identity(folders: list[str]) -> str:
    """What identifies ``folders``' listings: each one's inode and mtime (a name added, removed or
    renamed in a folder changes its mtime), one ``stat`` each, as a sha256."""
    h = hashlib.sha256()
    for d in folders:
        try:
            st = os.stat(d)
            h.update(f"{d}|{st.st_ino}|{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        except OSError:
            h.update(f"{d}|absent\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _unchanged(value: bytes) -> bool:
    """A remembered answer holds while every header it was made from is the same file."""
    try:
        got = json.loads(value)
        if not (isinstance(got.get("sha512"), str) and re.fullmatch(r"[0-9a-f]{128}", got["sha512"])):
            return False
        if not all(_stat(path) == ident for path, ident in got["headers"]):
            return False
        folders = got["folders"]
        return (
            isinstance(folders, list)
            and all(isinstance(d, str) for d in folders)
            and (tree_identity(folders) == got["tree"])
        )
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
    t0 = time.perf_counter()
    folders = None
    with guarded(TOPIC, WHAT):
        tops = search_path(cmd, src_dir)
        folders = folders_under(tops) if tops is not None else None
    if folders is None:  # where the compiler looks is not known: nothing is remembered
        orig(builder)
        return
    tree = tree_identity(folders)  # before the run: a folder changed while it runs changes it
    deps = target + ".d"
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
            # a found header's own folder (a quoted include looks there first), where no search
            # folder holds it
            known = set(folders)
            extra = sorted({os.path.dirname(h) for h, _ in headers} - known)
            if extra:
                folders, tree = folders + extra, tree_identity(folders + extra)
            _making[target] = (
                key,
                {"headers": headers, "folders": folders, "tree": tree},
                time.perf_counter() - t0,
            )


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


def _keep(making: tuple[str, dict[str, Any], float], stdout: Any) -> None:
    key, sources, seconds = making
    text = stdout.decode("ascii", "replace") if isinstance(stdout, bytes) else str(stdout or "")
    words = text.split()
    if not words or not re.fullmatch(r"[0-9a-f]{128}", words[-1]):
        return
    store = _memo.usable(active_cache())
    if store is None:
        return
    value = json.dumps({"sha512": words[-1], **sources}).encode()
    # replacing: a stale answer under the same key (a header changed since) would stay for good
    _memo.keep(store, key, MEMBER, value, {"probe": "preprocessed-header"}, seconds, replace=True)


def uninstall() -> None:
    """kcache.disable(): what this process held for torch is dropped (torch's functions come
    back with :data:`.attached.patches`)."""
    with _lock:
        _held.clear()
    _answers.clear()
    _making.clear()
