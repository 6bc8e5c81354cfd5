"""The shared libraries this process has loaded, read from ``/proc/self/maps``.

What nvFuser compiles with is what is loaded, not what is installed: the NVRTC version goes into
the fingerprint, and nvFuser's codegen library gives both its build (:mod:`.fingerprint`) and the
exported ``KernelDb::get`` that :mod:`.direct` calls.
"""

from __future__ import annotations

import ctypes
import os
from types import ModuleType


def _maps_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/" in line}
    except (OSError, IndexError):
        return []
    return sorted(p for p in paths if p.startswith("/"))


def _loaded(prefix: str) -> list[str]:
    return [p for p in _maps_paths() if os.path.basename(p).startswith(prefix)]


def loaded_nvrtc() -> str | None:
    """NVRTC version(s) as loaded in this process: what nvFuser compiles with."""
    found = []
    for p in _loaded("libnvrtc"):
        if "builtins" in os.path.basename(p):
            continue
        try:
            lib = ctypes.CDLL(p, mode=getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1))
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
                found.append(f"{major.value}.{minor.value} ({os.path.basename(p)})")
        except (OSError, AttributeError):
            continue
    return "; ".join(sorted(set(found))) or None


def codegen_path(module: ModuleType | None = None) -> str | None:
    """The loaded ``libnvfuser_codegen`` (the one beside ``module`` when several are), or None."""
    libs = _loaded("libnvfuser_codegen")
    if not libs:
        return None
    if module is not None and len(libs) > 1:
        base = os.path.dirname(os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or ".")))
        near = [p for p in libs if p.startswith(base + os.sep)]
        if near:
            return near[0]
    return libs[0]
