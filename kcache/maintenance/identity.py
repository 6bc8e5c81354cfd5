"""This machine's identity as the keys see it, named part by part: what ``kcache fingerprint
--json`` writes, and the side ``kcache explain --against`` compares another one with.

Each part is one that enters some kind's key (which kinds: :data:`KINDS_OF`): the library
builds (Triton's version and libtriton, torch's version and commit, the Python ABI), the GPU
(model, architecture, driver, the device ordinal the process uses), ``KCACHE_KEY_TAG``, Triton's
cache-invalidating variables (``env.TRITON_...``), and folders that Triton 3.9 hashes into the key
of the host modules it builds (its own folder, libcuda's): those as digests, never as paths (a
fingerprint file travels between machines and into tickets).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Any

FORMAT = "kcache-fingerprint"
VERSION = 1

#: The kinds whose keys a part enters (a prefix of the part's name; ``*``: every kind).
KINDS_OF: dict[str, tuple[str, ...]] = {
    "key_tag": ("*",),
    "triton_version": ("triton", "triton-autotune", "triton-aux"),
    "libtriton_sha256": ("triton", "triton-autotune"),
    "python_abi": ("triton", "triton-aux"),
    "env.": ("triton",),
    "torch_version": ("inductor-",),
    "gpu_name": ("triton-autotune", "inductor-autotune"),
    "arch": ("triton",),
    "device": ("triton-autotune", "inductor-autotune"),
    "path.triton": ("triton-aux",),
    "path.libcuda": ("triton-aux",),
    "ptxas": ("triton",),
    "driver": (),
    "cuda_runtime": (),
    "nvfuser_version": ("nvfuser",),
}

#: Words for the parts in explain's table.
WHAT = {
    "key_tag": "KCACHE_KEY_TAG",
    "triton_version": "Triton build (version)",
    "libtriton_sha256": "Triton build (libtriton)",
    "python_abi": "Python ABI",
    "torch_version": "torch build",
    "gpu_name": "GPU model",
    "arch": "GPU architecture",
    "device": "device ordinal (CUDA_VISIBLE_DEVICES / KCACHE_DEVICE)",
    "path.triton": "a path in the key: Triton's folder",
    "path.libcuda": "a path in the key: libcuda's folder",
    "ptxas": "ptxas (CUDA toolchain)",
    "driver": "CUDA driver",
    "cuda_runtime": "CUDA runtime",
    "nvfuser_version": "nvFuser build",
}


def applies(part: str, kind: str) -> bool:
    """Whether ``part`` enters the key of entries of ``kind``."""
    for prefix, kinds in KINDS_OF.items():
        if part == prefix or (prefix.endswith(".") and part.startswith(prefix)):
            return any(k == "*" or kind == k or (k.endswith("-") and kind.startswith(k)) for k in kinds)
    return False


def describe(part: str) -> str:
    if part.startswith("env."):
        return f"environment variable {part[4:]}"
    return WHAT.get(part, part)


def _digest(text: str | None) -> str | None:
    return None if text is None else "sha256:" + hashlib.sha256(os.fsencode(text)).hexdigest()[:16]


def _torch_build() -> str | None:
    """torch's version as Inductor's entries record it: ``__version__+<commit[:12]>``."""
    from .. import fingerprint

    v = fingerprint.current("torch_version")
    if v is None:
        return None
    git = fingerprint.current("torch_git")
    return f"{v}+{git[:12]}" if git else v


def _libtriton() -> str | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec("triton")
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = list(spec.submodule_search_locations)[0]
    except Exception:  # broad: find_spec runs the import system's finders (any code)
        return None
    path = os.path.join(folder, "_C", "libtriton.so")
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return _sha256(f)
    except OSError:
        return None


def _sha256(f: Any) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1 << 22):
        h.update(chunk)
    return h.hexdigest()


def _triton_paths() -> dict[str, str | None]:
    """Folders that Triton 3.9 hashes into the key of ``cuda_utils`` (library and include dirs)."""
    out: dict[str, str | None] = {"path.triton": None, "path.libcuda": None}
    try:
        import importlib.util

        spec = importlib.util.find_spec("triton")
        if spec is not None and spec.submodule_search_locations:
            out["path.triton"] = _digest(list(spec.submodule_search_locations)[0])
    except Exception:  # broad: find_spec runs the import system's finders (any code)
        pass
    out["path.libcuda"] = _digest(os.environ.get("TRITON_LIBCUDA_PATH") or _libcuda_dir())
    return out


def _libcuda_dir() -> str | None:
    """The folder of the libcuda this process loads (as the dynamic linker found it), or None."""
    from .. import fingerprint

    if fingerprint._libcuda() is None:
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


def this_machine(key_tag: str, *, with_env: bool = True, with_digest: bool = True) -> dict[str, Any]:
    """The parts of this process's identity, by name (None: absent here, e.g. no GPU)."""
    from .. import fingerprint

    parts: dict[str, Any] = {
        "key_tag": key_tag,
        "python_abi": fingerprint.current("python_abi"),
        "triton_version": fingerprint.current("triton_version"),
        "torch_version": _torch_build(),
        "nvfuser_version": fingerprint.current("nvfuser_version"),
        "gpu_name": fingerprint.current("gpu_name"),
        "arch": fingerprint.current("arch"),
        "driver": fingerprint.current("driver"),
        "cuda_runtime": fingerprint.current("cuda_runtime"),
        "device": os.environ.get("KCACHE_DEVICE") or os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if with_digest:
        parts["libtriton_sha256"] = _libtriton()
        parts["ptxas"] = fingerprint.current("ptxas")
        parts.update(_triton_paths())
    if with_env:
        parts.update({f"env.{k}": v for k, v in invalidating_env().items()})
    return parts


def invalidating_env() -> dict[str, str]:
    """Triton's cache-invalidating variables set in this process (imports Triton, if present)."""
    from .. import fingerprint

    try:
        return fingerprint.triton_env()
    except Exception:  # a Triton whose lister raises: the variables that look like its own
        return {k: v for k, v in os.environ.items() if k.startswith("TRITON_") and v}


def document(key_tag: str) -> dict[str, Any]:
    """What ``kcache fingerprint --json`` writes."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": time.time(),
        "python": sys.version.split()[0],
        "parts": this_machine(key_tag),
    }


def read_document(data: Any) -> dict[str, Any] | None:
    """The parts of a fingerprint document, or None when ``data`` is not one."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("parts"), dict):
        return None
    return {str(k): v for k, v in data["parts"].items() if v is None or isinstance(v, (str, int, float))}
