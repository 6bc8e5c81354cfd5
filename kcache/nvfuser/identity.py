"""nvFuser's part of the machine's identity (named in :mod:`.declare`): the installed nvFuser
distribution and the NVRTC library, as :mod:`kcache.fingerprint` components."""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

from .. import fingerprint


def nvfuser_version() -> str | None:
    import importlib.metadata as md

    for dist in md.distributions():
        name = (dist.name or "").lower()
        if name.startswith("nvfuser"):
            return f"{name}=={dist.version}"
    return None


def nvrtc() -> str | None:
    candidates = ["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"]
    try:
        import glob

        for spdir in {p for p in sys.path if p.endswith("site-packages")}:
            candidates += sorted(glob.glob(os.path.join(spdir, "nvidia", "*", "lib", "libnvrtc.so*")))
    except (AttributeError, OSError):  # a sys.path entry that is no str; an unreadable folder
        pass
    for c in candidates:
        try:
            lib = ctypes.CDLL(c)
        except OSError:
            continue
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return f"{major.value}.{minor.value}"
    return None


def parts(costly: bool) -> dict[str, Any]:
    return {"nvfuser_version": fingerprint.current("nvfuser_version")}
