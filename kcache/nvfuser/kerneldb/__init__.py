"""nvFuser kernels that outlive the process: nvFuser's own KernelDb, kept by kcache per fingerprint.

nvFuser (``NVFUSER_ENABLE=kernel_db``) can keep compiled kernels in a folder ``nvfuser_kernel_db/``:
``db.csv`` (header ``kernel_signature,compile_args,kernel_code_file,cubin_file``) and one
``.cu``/``.cubin`` pair per kernel. It reads the folder once per process, at the first kernel it
compiles with the option on, and then looks kernels up by their full CUDA source and NVRTC
arguments. The folder has no version key, no cross-process lock (a new kernel is written as
``kernel_<N>`` with N the number of kernels the process knows, so two processes sharing a folder
overwrite each other's files) and no eviction.

kcache therefore never lets nvFuser share a folder. Each process gets a private folder, seeded
from the store with every kernel stored for its fingerprint (written as ``seed_<i>.cu/.cubin``,
names nvFuser never writes, so its own ``kernel_<N>`` files can never land on a seeded one).
The kernels nvFuser adds there reach the store at exit and on :func:`flush`, one ``nvfuser``
entry per kernel (the ``.cu``, the ``.cubin`` and a small msgpack ``meta``), deduplicated by the
hash of (signature, compile arguments, source): two processes that compile the same kernel store
it once. A per-fingerprint ``nvfuser-manifest`` entry lists the members, so a new process finds
its kernels with one read; the store's index is the fallback when the manifest is missing.

nvFuser is pointed at the private folder in one of two ways (docs/nvfuser.md has the details):
``direct``, the normal case, through nvFuser's exported ``KernelDb::get`` with nothing in the
environment changed (:mod:`.direct`); or ``tmpdir``, the fallback, with ``TMPDIR`` set around
``FusionDefinition.execute`` calls until nvFuser has opened its KernelDb (:mod:`.session`). The
``kernel_db`` option is turned on per call, never in the environment (:mod:`.hooks`).

The folder-level functions (:func:`seed`, :func:`harvest`, :func:`read_rows`,
:func:`list_members`) take a folder and the store (its :class:`~kcache.store.api.Cache` face) and need no nvFuser.

The modules, in the order they build on each other:

- :mod:`.libs`: the shared libraries the process has loaded (NVRTC, nvFuser's codegen library);
- :mod:`.fingerprint`: :class:`Fingerprint` and :func:`current_fingerprint`;
- :mod:`.folder`: nvFuser's folder format, :class:`Kernel`, :func:`read_rows`;
- :mod:`.entries`: the store side, one entry per kernel and the per-fingerprint manifest;
- :mod:`.seed_harvest`: :func:`seed` and :func:`harvest`;
- :mod:`.direct`: the ctypes call to nvFuser's ``KernelDb::get`` (``direct`` mode);
- :mod:`.session`: a process's private folder (:class:`Session`), ``tmpdir`` mode, stale folders;
- :mod:`.hooks`: the import hooks, the wrapped ``execute``, :func:`flush` and :func:`status`.

This package loads when nvFuser is imported (:data:`kcache.nvfuser.INTEGRATION` attaches it),
not in every process that has ``KCACHE=1``.
"""

from __future__ import annotations

from .direct import DirectKernelDb
from .entries import KIND, MANIFEST_KIND, list_members, update_manifest
from .fingerprint import (
    NEUTRAL_DISABLE,
    NEUTRAL_ENABLE,
    NEUTRAL_ENV,
    Fingerprint,
    codegen_options,
    current_fingerprint,
)
from .folder import DB_DIR, DB_FILE, HEADER, DbRow, Kernel, load_kernel, read_rows
from .hooks import detach_all, flush, on_import, status
from .seed_harvest import HarvestResult, SeedResult, harvest, seed
from .session import ROOT_PREFIX, SESSION_FILE, Session, adopt_stale

__all__ = [
    "DB_DIR",
    "DB_FILE",
    "HEADER",
    "KIND",
    "MANIFEST_KIND",
    "NEUTRAL_DISABLE",
    "NEUTRAL_ENABLE",
    "NEUTRAL_ENV",
    "ROOT_PREFIX",
    "SESSION_FILE",
    "DbRow",
    "DirectKernelDb",
    "Fingerprint",
    "HarvestResult",
    "Kernel",
    "SeedResult",
    "Session",
    "adopt_stale",
    "codegen_options",
    "current_fingerprint",
    "detach_all",
    "flush",
    "harvest",
    "list_members",
    "load_kernel",
    "on_import",
    "read_rows",
    "seed",
    "status",
    "update_manifest",
]
