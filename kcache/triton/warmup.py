"""Triton's own one-time work on the way to a process's first kernel, moved off that path.

Measured on the H200 after a prewarm (every kernel a hit), the first call at the first shape took
93 ms, almost all of it Triton's per-process work, not kcache's: 68 ms importing
``triton.experimental.gluon`` (the JIT's specializer imports it at its first use) and ~18 ms in
subprocesses, among them ``/sbin/ldconfig -p`` to find libcuda. Two things here, neither of which
changes what Triton computes:

- :func:`start_gluon_import`: when Triton has been imported, a daemon thread imports
  ``triton.experimental.gluon.language``, the module the specializer will import anyway. A real
  program spends far longer than that between ``import triton`` and its first launch (CUDA's
  context alone takes 100+ ms), so the import is done by then; if not, the first call waits on
  Python's per-module import lock for the rest of it, never imports twice.
- :func:`install_libcuda_memo`: ``libcuda_dirs()`` (an ``ldconfig -p`` fork and exec in every
  process) is remembered across processes, machine-locally (kind ``triton-meta``: never exported
  or shared), keyed by this boot, the linker cache's identity and the variables Triton reads; a
  remembered answer is used only if each folder still holds ``libcuda.so.1`` (Triton's own
  check), else Triton is asked.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from .. import kinds as _kinds
from ..log import logger

GLUON = "triton.experimental.gluon.language"
_started = False


def start_gluon_import() -> None:
    """Import Triton's gluon language in a daemon thread (once per process)."""
    global _started
    if _started or GLUON in sys.modules or os.environ.get("KCACHE_NO_TRITON_WARMUP"):
        return
    _started = True

    def run() -> None:
        try:
            __import__(GLUON)
        except Exception as e:  # the JIT will import it (and report) itself
            logger.debug("gluon pre-import: %s", e)

    threading.Thread(target=run, name="kcache-triton-warmup", daemon=True).start()


def _key(driver: Any) -> str | None:
    try:
        st = os.stat("/etc/ld.so.cache")
        ident = f"ino={st.st_ino}|size={st.st_size}|mtime={st.st_mtime_ns}"
    except OSError:
        ident = "no-ld.so.cache"
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read(64).strip().decode("ascii", "replace")
    except OSError:
        return None  # no per-boot id: not worth the risk of an answer from another machine
    knob = ""
    try:
        knob = str(driver.knobs.nvidia.libcuda_path or "")
    except Exception:
        pass
    return f"libcuda-dirs/v1|boot={boot}|ldcache={ident}|LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')}|knob={knob}"


def install_libcuda_memo(driver: Any) -> None:
    """Remember ``driver.libcuda_dirs()`` across processes (see the module doc)."""
    orig = getattr(driver, "libcuda_dirs", None)
    if orig is None or getattr(orig, "_kcache", False):
        return

    def libcuda_dirs() -> list[str]:
        from .. import active_store

        store = active_store()
        key = _key(driver) if store is not None and store.trust_host_code else None
        if key is not None:
            try:
                hit = store.get(_kinds.TRITON_META, key, count=False)
                if hit is not None:
                    dirs = json.loads(hit.read("dirs.json"))
                    if (
                        isinstance(dirs, list)
                        and dirs
                        and all(
                            isinstance(d, str) and os.path.exists(os.path.join(d, "libcuda.so.1"))
                            for d in dirs
                        )
                    ):
                        return dirs
            except Exception as e:
                logger.debug("libcuda memo: %s", e)
        dirs = orig()
        if key is not None and dirs:
            store.put(
                _kinds.TRITON_META,
                key,
                {"dirs.json": json.dumps(list(dirs)).encode()},
                summary={"file": "libcuda"},
            )
        return dirs

    libcuda_dirs = _lru(libcuda_dirs)
    libcuda_dirs._kcache = True  # type: ignore[attr-defined]
    libcuda_dirs.__wrapped__ = orig  # type: ignore[attr-defined]
    driver.libcuda_dirs = libcuda_dirs


def uninstall_libcuda_memo() -> None:
    driver = sys.modules.get("triton.backends.nvidia.driver")
    fn = getattr(driver, "libcuda_dirs", None) if driver is not None else None
    if fn is not None and getattr(fn, "_kcache", False):
        driver.libcuda_dirs = fn.__wrapped__  # type: ignore[union-attr]


def _lru(fn: Any) -> Any:
    import functools

    return functools.lru_cache(maxsize=None)(fn)
