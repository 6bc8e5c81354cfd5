"""Remember torch's source hash across processes: ``torch_key()`` without reading torch.

Inductor's keys (FX graphs, AOTAutograd entries, autotune results, the compile workers' kernel
table) hold ``torch._inductor.codecache.torch_key()``: a sha256 over torch's version and every
module file of the installed torch (about 2,300 files, 46 MB), computed once per process:
0.17-0.18 s of every process's first call on the H100 machine, warm or cold.

kcache keeps torch's answer in the store (a machine-local memo, :mod:`kcache.memo`: kind
``triton-meta``, never exported, imported or shared), keyed by this boot and by the identity of
every file torch hashes: the walk of torch's packages that ``build_code_hash`` does (every
module file of every package folder), each file's path, inode, size and times in ns (one
``stat``, no read), and the version. An edited, added, removed or replaced module file changes
its identity, hence the key: torch's own function runs again. The answer is torch's own: its
function is what computes it, once; while it runs, the files it opens are noted, and the answer
is remembered only when every one of them is among the files the key covers (a torch that
hashes another file than this walk knows is never memoised). The walk costs one ``stat`` per
file (20-40 ms on a loaded 2-core box, against 0.16 s for the hash).

torch binds ``torch_key`` by name in several modules (the compile workers' pool, the async
compiler, standalone compile) and gives it ``set``/``clear``/``prefetch``: the memo goes INSIDE
torch's caching wrapper (the wrapped function it calls), so every binding, ``set`` included,
keeps working as torch wrote it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sys
import threading
from typing import Any

from .. import memo as _memo
from ..boundary import guarded
from ..log import logger
from .attached import cache as active_cache

MODULE = "torch._inductor.codecache"
MEMBER = "key"
#: torch's extra files beside its modules (``get_code_hash``'s ``extra_files``, torch 2.8-2.13),
#: relative to ``torch/_inductor``: part of the key; what torch opens is checked against it.
EXTRA = ("codegen/aoti_runtime/interface.cpp", "script.ld")
#: The fail-open boundary's topic (kcache/boundary.py): torch computes its key itself then.
TOPIC, WHAT = "inductor-torch-key", "kcache's memo of torch_key"

_SUFFIXES = tuple(importlib.machinery.all_suffixes())


def _module_files(folder: str, out: list[str]) -> None:
    """Every module file of the package ``folder`` and of its sub-packages (what pkgutil's walk
    in torch's ``build_code_hash`` can reach: folders with an ``__init__`` module, files with a
    module suffix), each with its identity."""
    subs = []
    with os.scandir(folder) as it:
        for e in it:
            name = e.name
            if name.endswith(_SUFFIXES) and e.is_file():
                st = e.stat()
                out.append(f"{e.path}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}")
            elif "." not in name and name != "__pycache__" and e.is_dir():
                subs.append(e.path)
    for sub in subs:
        if any(os.path.exists(os.path.join(sub, "__init__" + s)) for s in _SUFFIXES):
            _module_files(sub, out)


def covered(root: str, inductor_root: str) -> list[str]:
    """The files the key covers, each ``path|ino|size|mtime|ctime``."""
    out: list[str] = []
    _module_files(root, out)
    for rel in EXTRA:
        path = os.path.join(inductor_root, rel)
        try:
            st = os.stat(path)
        except OSError:
            out.append(f"{path}|absent")  # torch skips a missing one: so does the key
            continue
        out.append(f"{path}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}")
    return out


def memo_key(files: list[str], root: str, version: str) -> str:
    digest = hashlib.sha256("\n".join(sorted(files)).encode("utf-8", "surrogateescape")).hexdigest()
    return f"torch-key/v1|boot={_memo.boot_id()}|torch={version}|root={root}|files={len(files)}|{digest}"


def _is_key(value: bytes) -> bool:
    return len(value) == 32  # torch's sha256 digest


def _computed_by_torch(original: Any, codecache: Any, files: list[str]) -> tuple[bytes, bool]:
    """torch's own ``original()``, and whether every file it opened is among ``files``."""
    paths = {f.rsplit("|", 4)[0] if not f.endswith("|absent") else f[: -len("|absent")] for f in files}
    opened: list[str] = []
    me = threading.get_ident()
    g = codecache.__dict__
    real_open = open

    def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:
            opened.append(os.fspath(file) if isinstance(file, (str, os.PathLike)) else repr(file))
        return real_open(file, *args, **kwargs)

    with _memo.open_replaced(g, open_):
        value = original()
    return value, bool(opened) and all(p in paths for p in opened)


def memo_torch_key(original: Any) -> bytes:
    """torch's ``torch_key()``: remembered, or computed by torch's ``original`` and kept."""
    codecache = sys.modules.get(MODULE)
    torch = sys.modules.get("torch")
    root = getattr(codecache, "_TORCH_PATH", None)
    where = getattr(codecache, "__file__", None)
    store = _memo.usable(active_cache())
    if store is None or not isinstance(root, str) or not isinstance(where, str) or torch is None:
        return original()
    read = False  # the memo was read (a hit or a miss): else torch computes, nothing is kept
    with guarded(TOPIC, WHAT):  # the edge (torch asks for its key): a bug, reported; torch computes
        try:
            inductor_root = os.path.dirname(os.path.abspath(where))
            files = covered(root, inductor_root)
            key = memo_key(files, root, str(torch.__version__))
            value = _memo.recall(store, key, MEMBER, _is_key)
            read = True
        except OSError as e:  # a file went while walking, the memo's entry changed: torch computes
            logger.debug("torch.compile: torch_key memo not read: %s", e)
    if not read:
        return original()
    if value is not None:
        return value
    import time

    t0 = time.perf_counter()
    value, checked = _computed_by_torch(original, codecache, files)
    if not checked:
        logger.info("torch_key memo: torch hashed a file the memo's key does not cover; not kept")
    elif isinstance(value, bytes) and _is_key(value):
        # The store skips what it cannot write: a raise is a bug, reported (raised when strict).
        with guarded(TOPIC, WHAT, then="torch's key is used, not remembered"):
            _memo.keep(store, key, MEMBER, value, {"probe": "torch-key"}, time.perf_counter() - t0)
    return value


def _func_cell(wrapper: Any) -> Any:
    """The cell of torch's caching wrapper (``torch_key_cache``, ``prefetchable_cache``) that
    holds the function it caches; None when the wrapper is not one of those."""
    code = getattr(wrapper, "__code__", None)
    cells = getattr(wrapper, "__closure__", None)
    if code is None or not cells or "func" not in code.co_freevars:
        return None
    cell = cells[code.co_freevars.index("func")]
    try:
        inner = cell.cell_contents
    except ValueError:  # an empty cell
        return None
    if getattr(inner, "__name__", None) != "torch_key" or not callable(getattr(wrapper, "set", None)):
        return None
    return cell


def on_import(mod: Any) -> None:
    """Called when ``torch._inductor.codecache`` has been imported: the memo goes inside
    torch's ``torch_key`` wrapper, which every module that bound it by name shares."""
    from .attached import patches

    cell = _func_cell(getattr(mod, "torch_key", None))
    if cell is None:
        logger.debug("torch.compile: this torch's torch_key is not one kcache knows; not memoised")
        return

    def make(original: Any) -> Any:
        def torch_key() -> bytes:
            return memo_torch_key(original)

        torch_key.__wrapped__ = original  # type: ignore[attr-defined]
        return torch_key

    patches.wrap(cell, "cell_contents", make)
