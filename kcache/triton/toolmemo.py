"""Remember ``ptxas --version`` (and the like) across processes.

Triton asks its CUDA tools for their version in every process (``knobs.NvidiaTool.from_path``
and the backend's ``get_ptxas_version``), each a fork and exec: milliseconds, more on a VM, on
the way to the first kernel of every process. The output names the ptxas that is in Triton's
key, so it is remembered exactly, keyed by what identifies the binary (real path, inode, size,
mtime and ctime in ns); a replaced binary is asked again.

The memo is machine-local (kind ``triton-meta``): it is never exported, imported or shared; its
key also names this boot of this machine (:func:`kcache.memo.boot_id`), so an entry that reached the store
any other way (an older kcache's import, another host on a shared folder) is never looked up; a
store that failed its trust checks (``KCACHE_ALLOW_INSECURE=1``) is never asked; and an answer
without the ``release X.Y`` Triton parses is ignored (the tool is asked).

Only calls of the form ``check_output([path, "--version"], ...)`` made from the Triton modules
listed in :data:`MODULES` are answered from the memo; everything else goes to :mod:`subprocess`
untouched, errors included.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Any

from .. import kinds as _kinds
from ..boundary import guarded
from ..memo import boot_id, identity, keep, recall, trusted
from .attached import cache as active_cache

KIND = _kinds.TRITON_META
MODULES = ("triton.knobs", "triton.backends.nvidia.compiler")


def memo_key(path: str, stderr: Any) -> str:
    """The store key of ``[path, "--version"]`` run with ``stderr``."""
    # "v3": bound to this boot (see kcache.memo.boot_id); v1 and v2 entries (which an import could have
    # planted under a key anyone could compute) are never read.
    return f"tool-version/v3|boot={boot_id()}|{identity(path)}|stderr={stderr!r}"


class _MemoSubprocess:
    """Stands in for the ``subprocess`` module inside one Triton module."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def check_output(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        store = active_cache()
        if (
            store is None
            or not trusted(store)
            or rest
            or set(kwargs) - {"stderr"}
            or not isinstance(args, (list, tuple))
            or len(args) != 2
            or args[1] != "--version"
            or not isinstance(args[0], str)
            or not os.path.isfile(args[0])
        ):
            return self._real.check_output(args, *rest, **kwargs)
        key: str | None = None  # stays None when the memo cannot be used: asked, nothing kept
        # The edge (Triton asks for a tool's version): a bug is reported (raised when strict).
        with guarded("triton-tool-memo", "kcache's memo of a tool's version"):
            try:
                known = memo_key(args[0], kwargs.get("stderr"))
                out = recall(store, known, "output", _plausible)
            except OSError:  # the tool changed or vanished under us: ask it
                out = None
            else:
                if out is not None:
                    return out
                key = known
        t0 = time.perf_counter()
        out = self._real.check_output(args, *rest, **kwargs)
        if key is not None and isinstance(out, bytes):
            with guarded("triton-tool-memo", "kcache's memo of a tool's version"):
                keep(store, key, "output", out, {"tool": os.path.basename(args[0])}, time.perf_counter() - t0)
        return out


def _plausible(out: bytes) -> bool:
    """A remembered answer that could be a CUDA tool's ``--version`` output (else: ask the tool).
    Triton reads the version from ``release X.Y`` (knobs.NvidiaTool.from_path): an answer without
    one made every compile fail with "Cannot find ptxas"."""
    if not out or len(out) > 1 << 16:
        return False
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return re.search(r"release \d+\.\d+", text) is not None


def _patch(mod: Any) -> None:
    from .attached import patches

    if getattr(mod, "subprocess", None) is subprocess:
        patches.wrap(mod, "subprocess", _MemoSubprocess)


def install_tool_memo() -> None:
    """Patch the listed modules now if loaded, else when they are imported (nothing is imported here)."""
    from .._imports import when_imported

    for name in MODULES:
        when_imported(name, _patch)


def uninstall_tool_memo() -> None:
    """Stop patching the listed modules as they are imported (:data:`.attached.patches` undoes
    the patches made)."""
    from .._imports import forget

    for name in MODULES:
        forget(name, _patch)
