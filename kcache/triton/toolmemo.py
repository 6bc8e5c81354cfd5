"""Remember ``ptxas --version`` (and the like) across processes.

Triton asks its CUDA tools for their version in every process (``knobs.NvidiaTool.from_path``
and the backend's ``get_ptxas_version``), each a fork and exec: milliseconds, more on a VM, on
the way to the first kernel of every process. The output names the ptxas that is in Triton's
key, so it is remembered exactly, keyed by what identifies the binary (real path, inode, size,
mtime and ctime in ns); a replaced binary is asked again.

The memo is machine-local (kind ``triton-meta``): it is never exported, imported or shared, and
an answer that does not look like a version banner is ignored (the tool is asked).

Only calls of the form ``check_output([path, "--version"], ...)`` made from the Triton modules
listed in :data:`MODULES` are answered from the memo; everything else goes to :mod:`subprocess`
untouched, errors included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from .. import active_store
from .. import kinds as _kinds

KIND = _kinds.TRITON_META
MODULES = ("triton.knobs", "triton.backends.nvidia.compiler")


def _identity(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.realpath(path)}|ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}|ctime={st.st_ctime_ns}"


class _MemoSubprocess:
    """Stands in for the ``subprocess`` module inside one Triton module."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def check_output(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        store = active_store()
        if (
            store is None
            or rest
            or set(kwargs) - {"stderr"}
            or not isinstance(args, (list, tuple))
            or len(args) != 2
            or args[1] != "--version"
            or not isinstance(args[0], str)
            or not os.path.isfile(args[0])
        ):
            return self._real.check_output(args, *rest, **kwargs)
        try:
            # "v2": entries written before machine-local kinds were refused from bundles (which
            # could carry a wrong answer for this very binary) are never read.
            key = f"tool-version/v2|{_identity(args[0])}|stderr={kwargs.get('stderr')!r}"
            hit = store.get(KIND, key, count=False)
            if hit is not None and _plausible(hit.read("output")):
                return hit.read("output")
        except Exception:
            return self._real.check_output(args, *rest, **kwargs)
        out = self._real.check_output(args, *rest, **kwargs)
        if isinstance(out, bytes):
            store.put(KIND, key, {"output": out}, summary={"tool": os.path.basename(args[0])})
        return out


def _plausible(out: bytes) -> bool:
    """A remembered answer that could be a tool's ``--version`` output (else: ask the tool)."""
    if not out or len(out) > 1 << 16:
        return False
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return "version" in text.lower() or "release" in text.lower()


def _patch(mod: Any) -> None:
    if getattr(mod, "subprocess", None) is subprocess:
        mod.subprocess = _MemoSubprocess(subprocess)


def install_tool_memo() -> None:
    """Patch the listed modules now if loaded, else when they are imported (nothing is imported here)."""
    from .._imports import when_imported

    for name in MODULES:
        when_imported(name, _patch)


def uninstall_tool_memo() -> None:
    from .._imports import forget

    for name in MODULES:
        forget(name, _patch)
        mod = sys.modules.get(name)
        if mod is not None and isinstance(getattr(mod, "subprocess", None), _MemoSubprocess):
            mod.subprocess = subprocess  # type: ignore[attr-defined]
