"""torch's part of the machine's identity (named in :mod:`.declare`): its version, commit and
CUDA runtime as :mod:`kcache.fingerprint` components, read from ``torch/version.py`` without
importing torch, and the parts of ``kcache fingerprint`` that enter Inductor's keys."""

from __future__ import annotations

import re
import sys
from typing import Any

from .. import fingerprint


def _torch_attr(attr: str) -> str | None:
    """torch/version.py holds __version__, git_version and cuda: read it without importing torch."""
    import importlib.metadata as md

    mod = sys.modules.get("torch.version")
    if mod is not None:
        v = getattr(mod, attr, None)
        return str(v) if v is not None else None
    try:
        files = md.files("torch") or []
    except md.PackageNotFoundError:
        return None
    for f in files:
        if str(f).replace("\\", "/") == "torch/version.py":
            text = f.read_text()
            m = re.search(rf"^{re.escape(attr)}\s*(?::\s*\S+)?\s*=\s*['\"]([^'\"]*)['\"]", text, re.M)
            return m.group(1) if m else None
    return None


def torch_version() -> str | None:
    return _torch_attr("__version__") or fingerprint.dist_version("torch")


def torch_git() -> str | None:
    return _torch_attr("git_version")


def cuda_runtime() -> str | None:
    return _torch_attr("cuda")


def parts(costly: bool) -> dict[str, Any]:
    """torch's version as Inductor's entries record it (``__version__+<commit[:12]>``) and the
    CUDA runtime it was built with."""
    v = fingerprint.current("torch_version")
    git = fingerprint.current("torch_git")
    build = None if v is None else f"{v}+{git[:12]}" if git else v
    return {"torch_version": build, "cuda_runtime": fingerprint.current("cuda_runtime")}
