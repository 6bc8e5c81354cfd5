"""Triton's part of the machine's identity (named in :mod:`.declare`): its version and ptxas as
:mod:`kcache.fingerprint` components, and the parts of ``kcache fingerprint`` that enter its keys
(libtriton's digest, the folders Triton 3.9 hashes, its cache-invalidating variables).

Nothing here imports Triton at import; :func:`triton_env` imports it when called.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from .. import fingerprint

#: Not in Triton's list of cache-invalidating variables, but in its key all the same: read at
#: import into the ``debug`` option.
TRITON_EXTRA_ENV = ("TRITON_DEBUG",)


def triton_version() -> str | None:
    mod = sys.modules.get("triton")  # imported already: its own attribute, no metadata scan
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        return str(mod.__version__)
    return fingerprint.dist_version("triton", "pytorch-triton", "triton-nightly")


def ptxas() -> str | None:
    """The version of the ptxas Triton uses (its bundled one unless TRITON_PTXAS_PATH says)."""
    import importlib.metadata as md
    import subprocess

    path = os.environ.get("TRITON_PTXAS_PATH")
    if not path:
        try:
            files = md.files("triton") or []
        except md.PackageNotFoundError:
            return None
        for f in files:
            s = str(f).replace("\\", "/")
            if s.endswith("/bin/ptxas") and "nvidia" in s:
                path = str(f.locate())
                break
    if not path or not os.path.exists(path):
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    m = re.search(r"release (\S+?),? V(\S+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else None


def triton_env_lister() -> Callable[[], dict[str, Any]] | None:
    """Triton's ``get_cache_invalidating_env_vars`` (libtriton in 3.4-3.9; ``triton.runtime.cache``
    in some builds), or None without Triton. Imports Triton."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return get_cache_invalidating_env_vars
    except ImportError:  # no Triton, or one that cannot load its library: nothing in the key
        pass
    try:
        from triton.runtime.cache import get_cache_invalidating_env_vars

        return get_cache_invalidating_env_vars
    except ImportError:  # as above
        return None


def triton_env() -> dict[str, str]:
    """The variables of this process that are in Triton's key: those Triton lists (as it reports
    them) and :data:`TRITON_EXTRA_ENV`. Imports Triton."""
    fn = triton_env_lister()
    out = {k: str(v) for k, v in (fn() if fn is not None else {}).items()}
    for k in TRITON_EXTRA_ENV:
        if os.environ.get(k):
            out[k] = os.environ[k]
    return out


def invalidating_env() -> dict[str, str]:
    """Triton's cache-invalidating variables set in this process (imports Triton, if present)."""
    try:
        return triton_env()
    except RuntimeError:  # a Triton whose lister (C++: pybind's RuntimeError) fails: the
        # variables that look like its own
        return {k: v for k, v in os.environ.items() if k.startswith("TRITON_") and v}


def _digest(text: str | None) -> str | None:
    return None if text is None else "sha256:" + hashlib.sha256(os.fsencode(text)).hexdigest()[:16]


def _triton_folder() -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):  # a finder's refusal, or a module without __spec__
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(list(spec.submodule_search_locations)[0])


def _libtriton() -> str | None:
    folder = _triton_folder()
    if folder is None:
        return None
    path = os.path.join(folder, "_C", "libtriton.so")
    if not os.path.exists(path):
        return None
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def _libcuda_dir() -> str | None:
    """The folder of the libcuda this process loads (as the dynamic linker found it), or None."""
    if fingerprint.libcuda() is None:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libcuda.so"):
                    return os.path.dirname(path)
    except OSError:
        pass
    return None


def parts(costly: bool) -> dict[str, Any]:
    """Triton's parts of ``kcache fingerprint``; ``costly``: libtriton's digest, ptxas and the
    folders Triton 3.9 hashes into the key of its host modules (as digests, never paths: a
    fingerprint file travels between machines and into tickets), and its variables."""
    out: dict[str, Any] = {"triton_version": fingerprint.current("triton_version")}
    if costly:
        out["libtriton_sha256"] = _libtriton()
        out["ptxas"] = fingerprint.current("ptxas")
        out["path.triton"] = _digest(_triton_folder())
        out["path.libcuda"] = _digest(os.environ.get("TRITON_LIBCUDA_PATH") or _libcuda_dir())
    out.update({f"env.{k}": v for k, v in invalidating_env().items()})
    return out
