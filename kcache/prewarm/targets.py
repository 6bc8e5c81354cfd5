"""Whether this machine's Triton can compile for a ``--target``, asked before any work.

``kcache prewarm --target cuda:999`` passed argument checking and ``--dry-run``; the real run then
printed kilobytes of PTX and failed in ptxas (or, on some Tritons, aborted in LLVM with exit 134)
for every kernel. The GPUs a Triton can compile for are those of the ptxas it would run: the one
:func:`triton.backends.nvidia.compiler.get_ptxas` picks for the architecture (a separate ptxas
for sm_100 and newer since Triton 3.6, ``TRITON_PTXAS_PATH`` and friends honoured), which lists
them in its ``--help`` (``--gpu-name``: ``'sm_90', 'sm_90a', ...``).
"""

from __future__ import annotations

import re
import subprocess

_SM_RE = re.compile(r"'sm_(\d+)a?'")


def _ptxas_for(arch: int) -> str | None:
    """The path of the ptxas Triton runs for ``arch`` (None when that cannot be told)."""
    try:
        from triton.backends.nvidia import compiler as nvc
    except ImportError:  # no Triton, or a Triton without the CUDA backend: not ours to judge
        return None
    try:
        try:
            tool = nvc.get_ptxas(arch)  # Triton 3.5+: one ptxas per architecture family
        except TypeError:
            tool = nvc.get_ptxas()
        path = getattr(tool, "path", None)
        return str(path) if path else None
    except (RuntimeError, OSError, ValueError, AttributeError):  # Triton's own lookup failed ("Cannot find
        return None  # ptxas", a tool that does not run): the compile will say why


def supported_archs(arch: int) -> tuple[set[int], str] | None:
    """(the architectures the ptxas that would compile ``arch`` accepts, its path), or None when
    that cannot be told (no Triton, no ptxas, an unreadable ``--help``)."""
    path = _ptxas_for(arch)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    archs = {int(m) for m in _SM_RE.findall(out)}
    return (archs, path) if archs else None


def target_problem(arch: int) -> str | None:
    """Why ``--target cuda:ARCH`` cannot be compiled here (one line), or None when it can (or
    when that cannot be told: the compile then says what it meets)."""
    got = supported_archs(arch)
    if got is None:
        return None
    archs, _path = got
    if arch in archs:
        return None
    try:
        from importlib.metadata import version

        which = f"Triton {version('triton')}"
    except ImportError:  # PackageNotFoundError: Triton not installed as a distribution
        which = "this Triton"
    return (
        f"--target cuda:{arch}: the ptxas of {which} cannot compile for sm_{arch}; it compiles for "
        + ", ".join(f"cuda:{a}" for a in sorted(archs))
    )
