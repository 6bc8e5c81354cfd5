"""The machine and library identity, as named components, each computed lazily once per process.

Integrations pick what decides their kind's content: a kernel compiled for a target is keyed by
that target and the toolchain (so a store built on one machine serves every machine of that
target); GPU model and driver matter only where the content depends on them (autotune timings).
An absent component (no GPU, no torch) is recorded as None, never guessed.

Nothing here imports torch, triton or nvfuser at import: versions come from package metadata,
and device facts from the CUDA driver API through ctypes, only when asked for; Triton's
cache-invalidating environment (:func:`triton_env`) from Triton itself, which it imports then.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterable
from typing import Any

from .forksafe import module_lock

_lock = module_lock(__name__, "_lock")
_values: dict[str, str | None] = {}
_computers: dict[str, Callable[[], str | None]] = {}

#: Components that describe libraries (an entry made under other values is stale here).
VERSION_COMPONENTS = ("python_abi", "triton_version", "torch_version", "nvfuser_version")


def component(name: str) -> Callable[[Callable[[], str | None]], Callable[[], str | None]]:
    def deco(fn: Callable[[], str | None]) -> Callable[[], str | None]:
        _computers[name] = fn
        return fn

    return deco


def current(name: str) -> str | None:
    """The value of one named component on this machine (None when absent). Cached per process."""
    with _lock:
        if name in _values:
            return _values[name]
    fn = _computers.get(name)
    try:
        value = fn() if fn is not None else None
    except Exception:  # broad: a probe (ctypes, a subprocess, an import) that fails: its part unknown
        value = None
    with _lock:
        _values[name] = value
    return value


def components(names: Iterable[str]) -> dict[str, str | None]:
    return {n: current(n) for n in names}


def names() -> list[str]:
    return sorted(_computers)


def override(name: str, value: str | None) -> None:
    """Set a component's value for this process (tests; ``prewarm --target`` for the arch)."""
    with _lock:
        _values[name] = value


def reset() -> None:
    with _lock:
        _values.clear()


def _dist_version(*dists: str) -> str | None:
    import importlib.metadata as md  # imported when asked: ~20 ms at start-up otherwise

    for d in dists:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            continue
    return None


@component("python_abi")
def _python_abi() -> str:
    return f"{sys.implementation.cache_tag}{sysconfig.get_config_var('EXT_SUFFIX') or ''}"


@component("triton_version")
def _triton_version() -> str | None:
    mod = sys.modules.get("triton")  # imported already: its own attribute, no metadata scan
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        return mod.__version__
    return _dist_version("triton", "pytorch-triton", "triton-nightly")


@component("torch_version")
def _torch_version() -> str | None:
    return _torch_attr("__version__") or _dist_version("torch")


@component("torch_git")
def _torch_git() -> str | None:
    return _torch_attr("git_version")


@component("cuda_runtime")
def _cuda_runtime() -> str | None:
    return _torch_attr("cuda")


def _torch_attr(attr: str) -> str | None:
    """torch/version.py holds __version__, git_version and cuda: read it without importing torch."""
    import importlib.metadata as md

    mod = sys.modules.get("torch.version")
    if mod is not None:
        v = getattr(mod, attr if attr != "__version__" else "__version__", None)
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


@component("nvfuser_version")
def _nvfuser_version() -> str | None:
    import importlib.metadata as md

    for dist in md.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if name.startswith("nvfuser"):
            return f"{name}=={dist.version}"
    return None


# -- CUDA driver facts, through libcuda (loaded only when a component needs it) -------------------
@functools.lru_cache(maxsize=1)
def _libcuda() -> Any:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def _cuda_device() -> int | None:
    lib = _libcuda()
    if lib is None or lib.cuInit(0) != 0:
        return None
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return None
    dev = 0
    from .config import env_number

    visible_current = env_number("KCACHE_DEVICE")  # which GPU the integration is about
    if visible_current is not None:
        dev = int(visible_current)
    handle = ctypes.c_int(0)
    if lib.cuDeviceGet(ctypes.byref(handle), dev) != 0:
        return None
    return handle.value


@component("driver")
def _driver() -> str | None:
    lib = _libcuda()
    if lib is None:
        return None
    v = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    return f"{v.value // 1000}.{(v.value % 1000) // 10}"


@component("gpu_name")
def _gpu_name() -> str | None:
    dev = _cuda_device()
    return None if dev is None else device_name(dev)


@functools.lru_cache(maxsize=64)
def device_name(ordinal: int) -> str | None:
    """The GPU model of CUDA device ``ordinal`` (as the process sees it), or None."""
    lib = _libcuda()
    if lib is None or lib.cuInit(0) != 0:
        return None
    handle = ctypes.c_int(0)
    if lib.cuDeviceGet(ctypes.byref(handle), int(ordinal)) != 0:
        return None
    buf = ctypes.create_string_buffer(256)
    if lib.cuDeviceGetName(buf, 256, handle.value) != 0:
        return None
    return buf.value.decode(errors="replace")


def capability() -> tuple[int, int] | None:
    dev = _cuda_device()
    if dev is None:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    lib = _libcuda()
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, MINOR = 76
    if lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev) or lib.cuDeviceGetAttribute(
        ctypes.byref(minor), 76, dev
    ):
        return None
    return major.value, minor.value


def arch_name(cap: int) -> str:
    """sm_XY with the ``a`` suffix where the arch-specific features apply (as Triton names it)."""
    return f"sm_{cap}{'a' if cap >= 90 else ''}"


@component("arch")
def _arch() -> str | None:
    cap = capability()
    return arch_name(cap[0] * 10 + cap[1]) if cap else None


@component("gpu_sms")
def _gpu_sms() -> str | None:
    dev = _cuda_device()
    if dev is None:
        return None
    n = ctypes.c_int(0)
    if _libcuda().cuDeviceGetAttribute(ctypes.byref(n), 16, dev):  # MULTIPROCESSOR_COUNT
        return None
    return str(n.value)


@component("nvrtc")
def _nvrtc() -> str | None:
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


@component("ptxas")
def _ptxas() -> str | None:
    """The version of the ptxas Triton uses (its bundled one unless TRITON_PTXAS_PATH says)."""
    import importlib.metadata as md

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


#: Not in Triton's list of cache-invalidating variables, but in its key all the same: read at
#: import into the ``debug`` option.
TRITON_EXTRA_ENV = ("TRITON_DEBUG",)


def triton_env_lister() -> Callable[[], dict[str, Any]] | None:
    """Triton's ``get_cache_invalidating_env_vars`` (libtriton in 3.4-3.9; ``triton.runtime.cache``
    in some builds), or None without Triton. Imports Triton."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return get_cache_invalidating_env_vars  # type: ignore[no-any-return]
    except Exception:  # no Triton, or one that cannot load its library: nothing in the key
        pass
    try:
        from triton.runtime.cache import get_cache_invalidating_env_vars  # type: ignore[attr-defined]

        return get_cache_invalidating_env_vars  # type: ignore[no-any-return]
    except Exception:  # as above
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
