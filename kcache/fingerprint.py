"""The machine and library identity, as named components, each computed lazily once per process.

Integrations pick what decides their kind's content: a kernel compiled for a target is keyed by
that target and the toolchain (so a store built on one machine serves every machine of that
target); GPU model and driver matter only where the content depends on them (autotune timings).
An absent component (no GPU, no torch) is recorded as None, never guessed.

The machine's own components (the Python ABI, the GPU and its driver) are defined here; each
integration declares those of its library (versions, toolchains) in its package
(:mod:`kcache.registry`), and they are found by name here, their module imported only when one
is first asked for. Nothing here imports torch, triton or nvfuser: device facts come from the
CUDA driver API through ctypes, only when asked for.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import sysconfig
from collections.abc import Callable, Iterable
from typing import Any

from .forksafe import module_lock

_lock = module_lock(__name__, "_lock")
_values: dict[str, str | None] = {}
_computers: dict[str, Callable[[], str | None]] = {}


def version_components() -> tuple[str, ...]:
    """Components that describe libraries (an entry made under other values is stale here): the
    Python ABI and each integration's declared versions."""
    from . import registry

    return ("python_abi", *(v for d in registry.declarations() for v in d.versions))


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
    try:
        fn = _computers.get(name) or _declared(name)
        value = fn() if fn is not None else None
    except Exception as e:  # broad: an integration's declared probe runs anything; sorted below
        import subprocess

        from .boundary import expected

        # What a probe expects: a library or file it cannot load or read (ctypes, an import), a
        # tool that fails or hangs (subprocess), output it cannot parse. Its part is unknown.
        expected(
            e,
            (OSError, ImportError, subprocess.SubprocessError, ValueError),
            "fingerprint",
            f"kcache's probe of {name}",
            then="that part of the key is unknown",
        )
        value = None
    with _lock:
        _values[name] = value
    return value


def _declared(name: str) -> Callable[[], str | None] | None:
    """The function an integration declares for component ``name`` (imports its module), or None."""
    from . import registry

    for d in registry.declarations():
        ref = d.components.get(name)
        if ref is not None:
            fn: Callable[[], str | None] = registry.resolve(ref)
            _computers[name] = fn
            return fn
    return None


def components(names: Iterable[str]) -> dict[str, str | None]:
    return {n: current(n) for n in names}


def names() -> list[str]:
    from . import registry

    return sorted({*_computers, *(n for d in registry.declarations() for n in d.components)})


def override(name: str, value: str | None) -> None:
    """Set a component's value for this process (tests; ``prewarm --target`` for the arch)."""
    with _lock:
        _values[name] = value


def reset() -> None:
    with _lock:
        _values.clear()


def dist_version(*dists: str) -> str | None:
    """The version of the first of ``dists`` that is installed, from its metadata."""
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


# -- CUDA driver facts, through libcuda (loaded only when a component needs it) -------------------
@functools.lru_cache(maxsize=1)
def libcuda() -> Any:
    """libcuda, loaded (ctypes), or None."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def _cuda_device() -> int | None:
    lib = libcuda()
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
    lib = libcuda()
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
    lib = libcuda()
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
    lib = libcuda()
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
    if libcuda().cuDeviceGetAttribute(ctypes.byref(n), 16, dev):  # MULTIPROCESSOR_COUNT
        return None
    return str(n.value)
