"""A stand-in ``libcuda.so.1`` for building Triton's host code on a machine without a GPU.

Every ``cu*`` symbol of Triton's ``cuda.h``, ``driver.c`` and launcher template, each returning
an error: enough to link and load Triton's ``cuda_utils`` module and (Triton <= 3.6) its
per-signature launchers, which then land in the store as ``triton-aux`` entries.

The folder is the same in every process: Triton 3.9's ``_compile_so`` (``runtime/build.py``)
hashes ``library_dirs`` into the key of what it builds, and ``library_dirs`` holds
``TRITON_LIBCUDA_PATH``; a folder new in every process made each prewarm build and store its
``cuda_utils`` again (Triton 3.6 keys the source alone). So the library lives in
``$XDG_CACHE_HOME/kcache-stub-libcuda/<digest>/`` (else ``~/.cache/...``), the digest being of
its source and the compiler. It is built under a temporary name beside that folder and renamed
into place whole: a concurrent prewarm finds nothing, or the finished library.

The library is loaded into the process (``RTLD_GLOBAL``): the folder, its files and every folder
above must be this user's (or root's) and writable by nobody else, as for the store; otherwise,
or when the folder cannot be made, a private folder of this process is used as before (the key is
then new again, nothing worse).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import inspect
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from ..forksafe import module_lock

HEADER = "/* kcache prewarm: a stand-in libcuda for building Triton's host code; no GPU */\n"
SO = "libcuda.so.1"
#: Temporary build folders left by a killed prewarm are removed after this long.
STALE_BUILD_S = 3600.0

_lock = module_lock(__name__, "_lock")
_dir: str | None = None
_error: str | None = None


def _cu_symbols() -> set[str]:
    """Every ``cu*`` function name in Triton's cuda.h, driver.c and launcher template."""
    import triton.backends.nvidia.driver as nvd

    here = os.path.dirname(os.path.realpath(nvd.__file__))
    texts = []
    for rel in (os.path.join("include", "cuda.h"), "driver.c"):
        p = os.path.join(here, rel)
        if os.path.exists(p):
            with open(p, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
    with contextlib.suppress(OSError, TypeError):  # a module without its source file
        texts.append(inspect.getsource(nvd))
    names: set[str] = set()
    for t in texts:
        names.update(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\b", t))
    return names


def source() -> str:
    """The stub's C source: every symbol returns 999 (CUDA_ERROR_UNKNOWN)."""
    return HEADER + "".join(f"int {n}(void) {{ return 999; }}\n" for n in sorted(_cu_symbols()))


def _base() -> str:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg else os.path.join(os.environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "kcache-stub-libcuda")


def _build(cc: str, src: str, folder: str) -> None:
    """Compile ``src`` into ``folder/libcuda.so.1`` (with ``libcuda.so`` linking to it)."""
    with open(os.path.join(folder, "stub.c"), "w", encoding="utf-8") as f:
        f.write(src)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O0", "-o", os.path.join(folder, SO), "-Wl,-soname," + SO,
         os.path.join(folder, "stub.c")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    os.symlink(SO, os.path.join(folder, "libcuda.so"))


def _ours(path: str, *, want_dir: bool) -> bool:
    """A real folder (or regular file) of this user's that nobody else may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    return kind_ok and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _usable(folder: str, src: str) -> bool:
    """Whether ``folder`` holds the finished stub of ``src``, safe to load."""
    from ..store.safety import insecure_parent

    if not (_ours(folder, want_dir=True) and _ours(os.path.join(folder, SO), want_dir=False)):
        return False
    if not _ours(os.path.join(folder, "stub.c"), want_dir=False) or insecure_parent(folder):
        return False
    try:
        with open(os.path.join(folder, "stub.c"), encoding="utf-8") as f:
            return f.read() == src and os.readlink(os.path.join(folder, "libcuda.so")) == SO
    except OSError:
        return False


def _clean_stale(base: str) -> None:
    now = time.time()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            p = os.path.join(base, name)
            with contextlib.suppress(OSError):
                if name.startswith(".build-") and now - os.lstat(p).st_mtime > STALE_BUILD_S:
                    shutil.rmtree(p, ignore_errors=True)


def _stable(cc: str, src: str) -> str | None:
    """The shared folder holding the stub of ``src`` (built now if missing), or None when it
    cannot be made or is not safe (the caller then builds a private one)."""
    from ..store.safety import insecure_parent, make_private_dir

    base = _base()
    digest = hashlib.sha256(f"{cc}\0{os.uname().machine}\0{src}".encode()).hexdigest()[:16]
    final = os.path.join(base, digest)
    if _usable(final, src):
        return final
    try:
        make_private_dir(Path(base))
    except OSError:
        return None
    if not _ours(base, want_dir=True) or insecure_parent(base):
        return None
    _clean_stale(base)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=base)
    try:
        _build(cc, src, tmp)
        try:
            os.rename(tmp, final)
            tmp = ""
        except OSError:
            pass  # another prewarm renamed its own first (or a broken one is in the way)
        return final if _usable(final, src) else None
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def stub_libcuda() -> str | None:
    """The folder of the stub ``libcuda.so.1``, loaded ``RTLD_GLOBAL`` (once per process), or
    None (no C compiler, or it failed: :func:`stub_error` says why)."""
    global _dir, _error
    with _lock:
        if _dir is not None or _error is not None:
            return _dir
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or shutil.which("cc")
        if not cc:
            _error = "no C compiler (gcc, clang or $CC): launchers are built on the GPU machine"
            return None
        d = None
        try:
            src = source()
            try:
                d = _stable(cc, src)
            except (OSError, subprocess.SubprocessError):  # an unusable cache folder, or a build
                d = None  # there that failed: a private one below, as before
            if d is None:
                d = tempfile.mkdtemp(prefix="kcache-stub-libcuda-")
                import atexit

                atexit.register(shutil.rmtree, d, True)
                _build(cc, src, d)
            ctypes.CDLL(os.path.join(d, SO), mode=os.RTLD_NOW | getattr(os, "RTLD_GLOBAL", 0))
        except (ImportError, OSError, subprocess.SubprocessError) as e:  # no Triton CUDA backend to
            # read the symbols from, a compiler that failed or timed out, a dlopen: told
            detail = getattr(e, "stderr", b"") or b""
            _error = f"could not build a stub libcuda ({e} {detail.decode(errors='replace')[:200]})".strip()
            return None
        _dir = d
        return d


def stub_error() -> str | None:
    return _error
