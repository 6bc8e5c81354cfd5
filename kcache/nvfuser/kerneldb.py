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

How nvFuser is pointed at the private folder (see docs/nvfuser.md for the details):

``direct``
    nvFuser exports ``nvfuser::KernelDb::get(dir, file, use_temp_dir, disabled, reset)`` (a
    testing entry point). Called once through ctypes with ``use_temp_dir=false`` and the private
    folder, it opens the KernelDb there for the rest of the process. Nothing in the environment
    changes: ``TMPDIR`` and ``tempfile.gettempdir()`` stay what they were, for this process and
    its children.
``tmpdir``
    The fallback when that symbol is not there. nvFuser opens ``temp_directory_path() /
    "nvfuser_kernel_db"``, and libstdc++ reads ``TMPDIR`` for it. kcache pins Python's
    ``tempfile.gettempdir()`` first, then sets ``TMPDIR`` to the private folder's parent only
    *during* ``FusionDefinition.execute`` calls, and only until nvFuser has opened its KernelDb
    (seen from the access time of the seeded ``db.csv``); then it stays restored.

The option itself is turned on per call: the wrapped ``FusionDefinition.execute`` adds
``kernel_db`` to its ``_enable_options`` (nvFuser's per-call equivalent of ``NVFUSER_ENABLE``),
so no environment variable leaks into child processes.

The folder-level functions (:func:`seed`, :func:`harvest`, :func:`read_rows`,
:func:`list_members`) take a folder and a :class:`~kcache.store.Store` and need no nvFuser.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import msgpack

from .. import fingerprint as _fp
from .._imports import forget, when_imported
from ..log import logger, warn_once

__all__ = [
    "KIND",
    "MANIFEST_KIND",
    "Fingerprint",
    "Kernel",
    "Session",
    "attach",
    "codegen_options",
    "current_fingerprint",
    "flush",
    "harvest",
    "list_members",
    "read_rows",
    "seed",
    "status",
]

KIND = "nvfuser"
MANIFEST_KIND = "nvfuser-manifest"
DB_DIR = "nvfuser_kernel_db"
DB_FILE = "db.csv"
HEADER = "kernel_signature,compile_args,kernel_code_file,cubin_file"
SCHEMA = "kcache-nvfuser-kerneldb/1"
ROOT_PREFIX = "kcache-nvfuser-"
SESSION_FILE = "kcache-session.json"
MAX_FILE = 256 << 20  # a member larger than this is not a kernel nvFuser wrote
LOCK_TIMEOUT_S = 20.0

# nvFuser's own row pattern (kernel_db.cpp), minus '/' in file names: a row must stay inside the
# folder. ASCII classes, as std::regex's \w.
_ROW_RE = re.compile(r"([\w-]+),([\w \+\-\=]+),([\w-]+\.cu),([\w-]+\.cubin)", re.ASCII)
_HEX_RE = re.compile(r"[0-9a-f]{40}")
_O_NOATIME = getattr(os, "O_NOATIME", 0)
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

#: NVFUSER_ENABLE options that do not change generated code or binaries (dropped from the key).
NEUTRAL_ENABLE = frozenset({"kernel_db", "warn_register_spill", "wait_debugger"})
#: NVFUSER_DISABLE options that do not change generated code or binaries (dropped from the key).
NEUTRAL_DISABLE = frozenset({"parallel_compile", "nvtx", "fallback", "python_inline_definitions"})
#: Other NVFUSER_* variables that are diagnostics or multi-device plumbing, not codegen.
NEUTRAL_ENV = frozenset(
    {
        "NVFUSER_ENABLE",
        "NVFUSER_DISABLE",
        "NVFUSER_DUMP",
        "NVFUSER_PROF",
        "NVFUSER_TRACE",
        "NVFUSER_MASTER_ADDR",
        "NVFUSER_MASTER_PORT",
    }
)


# ---------------------------------------------------------------------------------------------
# Fingerprint: what decides whether a stored kernel may be offered to this process's nvFuser.


@dataclass(frozen=True)
class Fingerprint:
    """Named components (see :func:`current_fingerprint`) and their hash, the key prefix."""

    components: Mapping[str, str | None]
    hash: str = ""

    def __post_init__(self) -> None:
        if not self.hash:
            blob = json.dumps(
                [SCHEMA, sorted((str(k), v) for k, v in self.components.items())], separators=(",", ":")
            )
            object.__setattr__(self, "hash", hashlib.sha256(blob.encode()).hexdigest()[:32])


def split_options(value: str | None) -> list[str]:
    """Split an ``NVFUSER_ENABLE``/``DISABLE`` value at top-level commas (``opt(a,b)`` is one)."""
    out: list[str] = []
    depth, cur = 0, []
    for ch in value or "":
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        depth += ch == "("
        depth -= ch == ")" and depth > 0
        cur.append(ch)
    out.append("".join(cur).strip())
    return [t for t in out if t]


def codegen_options(value: str | None, neutral: Iterable[str] = ()) -> str:
    """The options of ``value`` that may change generated code: every option (with its arguments)
    except those named in ``neutral``, sorted (nvFuser keeps them in a map: order means nothing)."""
    drop = set(neutral)
    return ",".join(sorted(t for t in split_options(value) if t.split("(", 1)[0].strip() not in drop))


def _maps_paths() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if line.count(" ") >= 5 and "/" in line}
    except (OSError, IndexError):
        return []
    return sorted(p for p in paths if p.startswith("/"))


def _loaded(prefix: str) -> list[str]:
    return [p for p in _maps_paths() if os.path.basename(p).startswith(prefix)]


def _loaded_nvrtc() -> str | None:
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


def _module_build(module: ModuleType | None) -> str | None:
    """The nvFuser build: its version string (with the git hash) and the size of its codegen library."""
    if module is None:
        return None
    parts = []
    name = module.__name__
    ver = getattr(sys.modules.get(f"{name}.version"), "_version_str", None)
    if ver is None:
        fn = getattr(module, "version", None)
        try:
            ver = fn() if callable(fn) else getattr(module, "__version__", None)
        except Exception:
            ver = None
    if ver is not None:
        parts.append(str(ver))
    lib = _codegen_path(module)
    if lib is not None:
        with contextlib.suppress(OSError):
            parts.append(f"{os.path.basename(lib)}:{os.stat(lib).st_size}")
    return " ".join(parts) or None


def _module_dist(module: ModuleType | None) -> str | None:
    """``name==version`` of the distribution installed beside ``module`` (its ``.dist-info``).

    Looked up here rather than through :mod:`kcache.fingerprint`, whose per-process value may have
    been computed before the module's folder joined ``sys.path``."""
    f = getattr(module, "__file__", None) if module is not None else None
    if f:
        site = os.path.dirname(os.path.dirname(os.path.abspath(f)))
        try:
            names = sorted(os.listdir(site))
        except OSError:
            names = []
        for n in names:
            if n.startswith("nvfuser") and n.endswith(".dist-info"):
                try:
                    with open(os.path.join(site, n, "METADATA"), encoding="utf-8", errors="replace") as fh:
                        meta = fh.read(8192)
                except OSError:
                    continue
                name = re.search(r"^Name:\s*(\S+)", meta, re.M)
                ver = re.search(r"^Version:\s*(\S+)", meta, re.M)
                if name and ver:
                    top = os.path.join(site, n, "top_level.txt")
                    try:
                        with open(top) as fh:
                            tops = fh.read().split()
                    except OSError:
                        tops = []
                    if not tops or module.__name__.split(".")[0] in tops:
                        return f"{name.group(1).lower()}=={ver.group(1)}"
    return _fp.current("nvfuser_version")


def current_fingerprint(
    module: ModuleType | None = None, environ: Mapping[str, str] | None = None
) -> Fingerprint:
    """This process's fingerprint for nvFuser kernels.

    nvFuser version (distribution) and build (version string with git hash, codegen library size),
    the NVRTC loaded (version and library), the GPU architecture with its suffix (``sm_90a``), the
    torch version and its CUDA, and the ``NVFUSER_ENABLE``/``NVFUSER_DISABLE`` options and other
    ``NVFUSER_*`` variables that may change generated code (all of them but those known not to)."""
    env = os.environ if environ is None else environ
    other = sorted(f"{k}={v}" for k, v in env.items() if k.startswith("NVFUSER_") and k not in NEUTRAL_ENV)
    comps: dict[str, str | None] = {
        "nvfuser_version": _module_dist(module),
        "nvfuser_build": _module_build(module),
        "nvrtc": _loaded_nvrtc() or _fp.current("nvrtc"),
        "arch": _fp.current("arch"),
        "torch_version": _fp.current("torch_version"),
        "cuda_runtime": _fp.current("cuda_runtime"),
        "nvfuser_enable": codegen_options(env.get("NVFUSER_ENABLE"), NEUTRAL_ENABLE),
        "nvfuser_disable": codegen_options(env.get("NVFUSER_DISABLE"), NEUTRAL_DISABLE),
        "nvfuser_env": ";".join(other),
    }
    return Fingerprint(comps)


# ---------------------------------------------------------------------------------------------
# Kernels and nvFuser's folder format.


@dataclass(frozen=True)
class Kernel:
    """One KernelDb kernel: nvFuser's lowered name, its NVRTC arguments, its source and binary."""

    signature: str
    compile_args: str
    code: bytes
    cubin: bytes

    @property
    def content_hash(self) -> str:
        """Hash of (signature, compile arguments, source): what identifies the kernel.

        The source is part of it: the signature alone (e.g. ``nvfuser_pointwise_f0_c1_r0_g0``,
        mangled) is the same for the first kernel of every fusion definition. The cubin is not:
        KernelDb looks kernels up by source and arguments, and the same kernel compiled twice is
        one kernel."""
        h = hashlib.sha256(b"kcache-nvfuser-kernel/1\0")
        h.update(self.signature.encode())
        h.update(b"\0")
        h.update(self.compile_args.encode())
        h.update(b"\0")
        h.update(self.code)
        return h.hexdigest()[:40]

    def problem(self) -> str | None:
        """Why nvFuser could not use this kernel as it stands, or None."""
        if not _ROW_RE.fullmatch(f"{self.signature},{self.compile_args},a.cu,a.cubin"):
            return "signature or arguments that nvFuser's db.csv cannot hold"
        if not self.code or not self.cubin:
            return "empty source or binary"
        if self.signature.encode() not in self.cubin:
            return "the binary does not contain the kernel's signature"
        return None


@dataclass(frozen=True)
class DbRow:
    signature: str
    compile_args: str
    code_file: str
    cubin_file: str


def _read_file(path: str, limit: int = MAX_FILE) -> bytes | None:
    """A regular file's bytes without following links or touching its access time; None if not."""
    flags = _O_READ | _O_NOATIME
    try:
        try:
            fd = os.open(path, flags)
        except PermissionError:  # O_NOATIME needs ownership
            fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_rows(db_dir: str | os.PathLike) -> tuple[list[DbRow], int]:
    """The complete, well-formed rows of ``db_dir/db.csv`` and the number of bad lines.

    A wrong header makes every line bad (nvFuser wipes such a folder). A last line without its
    newline is a row being written: neither returned nor counted as bad."""
    data = _read_file(os.path.join(os.fspath(db_dir), DB_FILE))
    if not data:
        return [], 0
    lines = data.decode("ascii", "replace").split("\n")
    complete = lines[:-1]  # the piece after the last newline is unfinished (or empty)
    if not complete:
        return [], 0
    if complete[0] != HEADER:
        return [], len(complete)
    rows, bad = [], 0
    for line in complete[1:]:
        m = _ROW_RE.fullmatch(line)
        if m is None:
            bad += line != ""
            continue
        rows.append(DbRow(*m.groups()))
    return rows, bad


def load_kernel(db_dir: str | os.PathLike, row: DbRow) -> Kernel | None:
    """The kernel a row names, read from its files; None if a file is missing or they disagree."""
    d = os.fspath(db_dir)
    code = _read_file(os.path.join(d, row.code_file))
    cubin = _read_file(os.path.join(d, row.cubin_file))
    if code is None or cubin is None:
        return None
    k = Kernel(row.signature, row.compile_args, code, cubin)
    return None if k.problem() else k


# ---------------------------------------------------------------------------------------------
# The store side: entries, manifest, listing.


def _entry_key(fp: Fingerprint, content_hash: str) -> str:
    return f"{fp.hash}/{content_hash}"


def _short_name(signature: str) -> str:
    """``nvfuser_pointwise_f0_c1_r0_g0`` from its mangled form, else the signature itself."""
    m = re.match(r"_ZN3nvf(\d+)", signature)
    if m:
        n = int(m.group(1))
        return signature[m.end() : m.end() + n]
    return signature[:80]


def _components(fp: Fingerprint, k: Kernel | None = None) -> dict[str, Any]:
    comps: dict[str, Any] = dict(fp.components)
    comps["fingerprint"] = fp.hash
    if k is not None:
        comps["kernel"] = _short_name(k.signature)
        comps["kernel_signature"] = k.signature
        comps["compile_args"] = k.compile_args
        comps["source_hash"] = hashlib.sha256(k.code).hexdigest()[:16]
    return comps


def _put_kernel(store: Any, fp: Fingerprint, k: Kernel) -> str | None:
    """Store one kernel: ``"added"``, ``"already"`` (another process committed the same kernel
    first: the store keeps the first, immutable), or None when the store refused."""
    meta = msgpack.packb(
        {
            "schema": SCHEMA,
            "kernel_signature": k.signature,
            "compile_args": k.compile_args,
            "fingerprint": fp.hash,
        },
        use_bin_type=True,
    )
    summary = {
        "kernel": _short_name(k.signature),
        "arch": fp.components.get("arch"),
        "nvfuser": fp.components.get("nvfuser_build") or fp.components.get("nvfuser_version"),
        "nvrtc": fp.components.get("nvrtc"),
    }
    hit = store.put(
        KIND,
        _entry_key(fp, k.content_hash),
        {"kernel.cu": k.code, "kernel.cubin": k.cubin, "meta.msgpack": meta},
        components=_components(fp, k),
        summary=summary,
    )
    if hit is None:
        return None
    mine = hashlib.sha256(k.cubin).hexdigest()
    theirs = next((f.sha256 for f in hit.record.files if f.name == "kernel.cubin"), None)
    return "added" if theirs == mine else "already"


def _kernel_from_hit(hit: Any, content_hash: str) -> Kernel | None:
    """The stored kernel, if its members decode and agree with the key they are stored under."""
    try:
        meta = msgpack.unpackb(hit.read("meta.msgpack"), raw=False, max_str_len=1 << 20, max_bin_len=1 << 20)
        if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
            return None
        sig, args = meta.get("kernel_signature"), meta.get("compile_args")
        if not isinstance(sig, str) or not isinstance(args, str):
            return None
        k = Kernel(sig, args, hit.read("kernel.cu"), hit.read("kernel.cubin"))
    except Exception:
        return None
    if k.problem() or k.content_hash != content_hash:
        return None
    return k


def _read_manifest(store: Any, fp: Fingerprint, count: bool = True) -> list[str] | None:
    hit = store.get(MANIFEST_KIND, fp.hash, count=count)
    if hit is None:
        return None
    try:
        d = msgpack.unpackb(hit.read("manifest.msgpack"), raw=False, max_str_len=1 << 10)
        members = d["members"] if isinstance(d, dict) and d.get("schema") == SCHEMA else None
        if not isinstance(members, list):
            return None
        return [m for m in members if isinstance(m, str) and _HEX_RE.fullmatch(m)]
    except Exception:
        return None


def _index_members(store: Any, fp: Fingerprint) -> list[str]:
    """Members of ``fp`` as the store's index knows them (the fallback listing)."""
    prefix = fp.hash + "/"
    out = []
    try:
        for _ident, _at, _hits, _size, rec, _err in store.index().rows(kind=KIND, order="store_time DESC"):
            if rec is not None and rec.key.startswith(prefix):
                h = rec.key[len(prefix) :]
                if _HEX_RE.fullmatch(h):
                    out.append(h)
    except Exception as e:
        logger.info("nvfuser: cannot list kernels from the index: %s", e)
    out.reverse()  # oldest first, as a manifest lists them
    return out


def list_members(store: Any, fp: Fingerprint) -> tuple[list[str], str]:
    """Content hashes stored for ``fp`` (oldest first) and where the list came from:
    ``manifest``, or ``index`` when there is no readable manifest."""
    members = _read_manifest(store, fp)
    if members is None and not store.readonly:
        # A harvester replaces the manifest (remove, then put) under the lock: read it there.
        lk = store.lock(MANIFEST_KIND, fp.hash, timeout=5.0)
        try:
            members = _read_manifest(store, fp, count=False)
        finally:
            if lk is not None:
                lk.release()
    if members is not None:
        return members, "manifest"
    return _index_members(store, fp), "index"


def update_manifest(
    store: Any, fp: Fingerprint, add: Iterable[str] = (), drop: Iterable[str] = ()
) -> list[str] | None:
    """Add members to (and remove confirmed-absent members from) ``fp``'s manifest, under the
    store's lock for it. Returns the new member list, or None if it could not be written."""
    if store.readonly:
        return None
    add, drop = list(add), list(drop)
    lk = store.lock(MANIFEST_KIND, fp.hash, timeout=LOCK_TIMEOUT_S)
    if lk is None:
        warn_once("nvfuser-manifest-lock", "nvfuser: the kernel list of this store is locked; not updated")
        return None
    try:
        cur = _read_manifest(store, fp, count=False)
        existed = cur is not None
        if cur is None:
            cur = _index_members(store, fp)
        gone = set()
        for h in drop:
            if h in cur:
                hit, _problem = store.read_any(store.entry_id(KIND, _entry_key(fp, h)))
                if hit is None:  # missing or corrupt: confirmed here, under the lock
                    gone.add(h)
        seen = set()
        new = []
        for h in [*cur, *add]:
            if h not in seen and h not in gone:
                seen.add(h)
                new.append(h)
        if existed and new == cur:
            return new
        blob = msgpack.packb(
            {"schema": SCHEMA, "fingerprint": fp.hash, "members": new, "updated": time.time()},
            use_bin_type=True,
        )
        if existed:
            with contextlib.suppress(Exception):
                store.remove([store.entry_id(MANIFEST_KIND, fp.hash)])
        hit = store.put(
            MANIFEST_KIND,
            fp.hash,
            {"manifest.msgpack": blob},
            components=_components(fp),
            summary={
                "kernels": len(new),
                "arch": fp.components.get("arch"),
                "nvfuser": fp.components.get("nvfuser_build") or fp.components.get("nvfuser_version"),
            },
        )
        return new if hit is not None else None
    finally:
        lk.release()


# ---------------------------------------------------------------------------------------------
# Seeding and harvesting a private folder.


@dataclass
class SeedResult:
    #: content hash -> the seeded binary's file name
    seeded: dict[str, str] = field(default_factory=dict)
    #: listed members that are gone or corrupt (not seeded)
    missing: list[str] = field(default_factory=list)
    #: members left out because another one has the same source (KernelDb keeps one per source)
    shadowed: int = 0
    source: str = ""
    bytes: int = 0
    seconds: float = 0.0


def _write_new(path: str, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)


def _zero_atime(path: str) -> None:
    """Access time 0, so that a later read by nvFuser shows (relatime updates atime < mtime)."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        os.utime(path, ns=(0, st.st_mtime_ns))


def seed(store: Any, db_dir: str | os.PathLike, fp: Fingerprint) -> SeedResult:
    """Write every kernel stored for ``fp`` into ``db_dir`` in nvFuser's format (a fresh db.csv
    with ``seed_<i>`` files). ``db_dir`` is created if needed and must hold no db.csv yet.
    Corrupt or mismatching entries are skipped (and reported in ``missing``)."""
    t0 = time.perf_counter()
    d = os.fspath(db_dir)
    os.makedirs(d, mode=0o700, exist_ok=True)
    res = SeedResult()
    members, res.source = list_members(store, fp)
    chosen: dict[bytes, tuple[str, Kernel]] = {}  # source digest -> (content hash, kernel)
    for h in members:
        hit = store.get(KIND, _entry_key(fp, h), count=False)
        k = _kernel_from_hit(hit, h) if hit is not None else None
        if k is None:
            res.missing.append(h)
            continue
        src = hashlib.sha256(k.code).digest()
        if src in chosen:
            res.shadowed += 1
            del chosen[src]  # the later one (newer in the list) wins, as in nvFuser's own reader
        chosen[src] = (h, k)
    lines = [HEADER]
    for i, (h, k) in enumerate(chosen.values()):
        cu, cubin = f"seed_{i}.cu", f"seed_{i}.cubin"
        _write_new(os.path.join(d, cu), k.code)
        _write_new(os.path.join(d, cubin), k.cubin)
        _zero_atime(os.path.join(d, cubin))
        lines.append(f"{k.signature},{k.compile_args},{cu},{cubin}")
        res.seeded[h] = cubin
        res.bytes += len(k.code) + len(k.cubin)
    csv = os.path.join(d, DB_FILE)
    tmp = os.path.join(d, f".{DB_FILE}.{os.getpid()}.tmp")
    _write_new(tmp, ("\n".join(lines) + "\n").encode("ascii"))
    os.replace(tmp, csv)
    _zero_atime(csv)
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class HarvestResult:
    added: list[str] = field(default_factory=list)  # content hashes newly stored
    already: int = 0  # new here, but already in the store (another process stored them)
    bad: int = 0  # rows skipped: malformed, files missing or inconsistent
    failed: int = 0  # store refused (read-only, full, broken)
    used: int = 0  # seeded kernels nvFuser read this time (counted as hits)
    manifest: bool = False  # the manifest was updated


def harvest(
    store: Any,
    db_dir: str | os.PathLike,
    fp: Fingerprint,
    known: set[str] | None = None,
    *,
    done_files: set[str] | None = None,
    seeded: Mapping[str, str] | None = None,
    used: set[str] | None = None,
    missing: Iterable[str] = (),
    pending: set[str] | None = None,
) -> HarvestResult:
    """Store the kernels nvFuser added to ``db_dir`` that are not stored yet, and list them in
    ``fp``'s manifest. Never raises for a bad folder: bad rows are skipped and counted.

    ``known`` (content hashes already stored or seeded) and ``done_files`` (rows already looked
    at, by file name) are updated in place so that repeated harvests of one folder skip quickly.
    ``seeded`` (content hash -> binary file name) and ``used`` count the seeded kernels nvFuser
    read since the last harvest as hits. ``missing`` members are pruned from the manifest when
    confirmed absent. ``pending`` holds members not yet in the manifest (a locked manifest is
    retried at the next harvest)."""
    res = HarvestResult()
    if store.readonly:
        return res
    d = os.fspath(db_dir)
    known = set() if known is None else known
    done_files = set() if done_files is None else done_files
    pending = set() if pending is None else pending
    rows, res.bad = read_rows(d)
    for row in rows:
        if row.cubin_file.startswith("seed_") or row.cubin_file in done_files:
            continue
        done_files.add(row.cubin_file)
        k = load_kernel(d, row)
        if k is None:
            res.bad += 1
            continue
        h = k.content_hash
        if h in known:
            continue
        key = _entry_key(fp, h)
        # Counted: a miss (with its key components, for `kcache explain`) is what this process
        # had; a hit only when another process stored the same kernel since this one started.
        if store.get(KIND, key, components=lambda k=k: _components(fp, k)) is not None:
            res.already += 1
        else:
            how = _put_kernel(store, fp, k)
            if how is None:
                res.failed += 1
                continue
            if how == "added":
                res.added.append(h)
            else:
                res.already += 1
        known.add(h)
        pending.add(h)
    if seeded:
        used = set() if used is None else used
        for h, cubin in seeded.items():
            if h in used:
                continue
            try:
                read_by_nvfuser = os.stat(os.path.join(d, cubin)).st_atime_ns > 0
            except OSError:
                continue
            if read_by_nvfuser:
                used.add(h)
                res.used += 1
                store.get(KIND, _entry_key(fp, h))  # a hit: counted, and its last use refreshed
    drop = list(missing)
    if pending or drop:
        order = [h for h in res.added if h in pending] + sorted(pending - set(res.added))
        if update_manifest(store, fp, add=order, drop=drop) is not None:
            pending.clear()
            res.manifest = True
    return res


# ---------------------------------------------------------------------------------------------
# Pointing nvFuser at a folder.

_GET_SYMBOL = "_ZN7nvfuser8KernelDb3getERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES8_bbb"


class _StdString(ctypes.Structure):
    """libstdc++'s std::string (C++11 ABI): data pointer, length, then capacity or local buffer.
    Only read by the callee (taken by const reference), which uses the pointer and length."""

    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t), ("local", ctypes.c_char * 16)]


def _std_string(b: bytes) -> tuple[_StdString, Any]:
    buf = ctypes.create_string_buffer(b)
    s = _StdString()
    s.ptr = ctypes.addressof(buf)
    s.size = len(b)
    s.local = struct.pack("<Q", len(b)) + b"\0" * 8  # the capacity of a heap string
    return s, buf


def _codegen_path(module: ModuleType | None = None) -> str | None:
    libs = _loaded("libnvfuser_codegen")
    if not libs:
        return None
    if module is not None and len(libs) > 1:
        base = os.path.dirname(os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or ".")))
        near = [p for p in libs if p.startswith(base + os.sep)]
        if near:
            return near[0]
    return libs[0]


class DirectKernelDb:
    """nvFuser's KernelDb singleton, opened on a folder of ours through its exported ``get``."""

    def __init__(self, lib_path: str) -> None:
        mode = getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1)
        self.lib = ctypes.CDLL(lib_path, mode=mode)  # already loaded by nvFuser: no new load
        fn = getattr(self.lib, _GET_SYMBOL)  # AttributeError when not exported (or another ABI)
        fn.argtypes = [
            ctypes.POINTER(_StdString),
            ctypes.POINTER(_StdString),
            ctypes.c_bool,
            ctypes.c_bool,
            ctypes.c_bool,
        ]
        fn.restype = ctypes.c_void_p
        self._get = fn
        self.address: int | None = None

    def open(self, db_dir: str) -> bool:
        """Open the KernelDb on ``db_dir`` (absolute). True when nvFuser reports it open."""
        d, dkeep = _std_string(os.fspath(db_dir).encode())
        f, fkeep = _std_string(DB_FILE.encode())
        addr = self._get(ctypes.byref(d), ctypes.byref(f), False, False, True)
        del dkeep, fkeep
        if not addr:
            return False
        self.address = addr
        st = self.state()
        return st["initialized"] is True and st["disabled"] is False

    def state(self) -> dict[str, Any]:
        """The singleton's flags and kernel count, read from its memory (diagnostics).

        Layout: ``bool disabled_; bool initialized_;`` then the ``unordered_map``, whose element
        count is its fourth word (libstdc++)."""
        if not self.address:
            return {"initialized": None, "disabled": None, "entries": None}
        a = self.address
        n = ctypes.c_size_t.from_address(a + 8 + 24).value
        return {
            "disabled": bool(ctypes.c_uint8.from_address(a).value),
            "initialized": bool(ctypes.c_uint8.from_address(a + 1).value),
            "entries": n if n < 1 << 32 else None,
        }


# ---------------------------------------------------------------------------------------------
# A process's session: its private folder, bookkeeping, and the nvFuser side.


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


class Session:
    """One process's private KernelDb folder for one nvFuser module, and what it seeded and stored."""

    def __init__(self, store: Any, fp: Fingerprint, root: str, module_name: str = "nvfuser_direct") -> None:
        self.store = store
        self.fp = fp
        self.root = root
        self.db_dir = os.path.join(root, DB_DIR)
        self.module_name = module_name
        self.pid = os.getpid()
        self.mode = "none"
        self.seed_result = SeedResult()
        self.known: set[str] = set()
        self.done_files: set[str] = set()
        self.used: set[str] = set()
        self.pending: set[str] = set()
        self.added = 0
        self.adopted = 0
        self.harvests: list[HarvestResult] = []
        self.start_s = 0.0  # fingerprint, folder, seeding and pointing nvFuser at it
        self.direct: DirectKernelDb | None = None
        self.tmpdir_pending = False  # tmpdir mode, nvFuser not seen opening the folder yet
        self.slow = False  # the wrapper must look at the session (tmpdir pending, or forked)
        self.forked = False
        self.disabled = False
        self.legacy: Any = None
        self._lock = threading.RLock()
        self._env_lock = threading.Lock()
        self._env_depth = 0
        self._env_saved: str | None = None
        self._lockfd: int | None = None

    # -- setting up ---------------------------------------------------------------------------
    @classmethod
    def create(cls, store: Any, fp: Fingerprint, module_name: str = "nvfuser_direct") -> Session:
        base = tempfile.gettempdir()  # Python's value is computed (and cached) before any TMPDIR change
        root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=base)
        s = cls(store, fp, root, module_name)
        s._write_session_file()
        s.adopted = adopt_stale(store, fp, base, exclude=root)
        s.seed()
        return s

    def _write_session_file(self) -> None:
        info = {"pid": os.getpid(), "fingerprint": self.fp.hash, "module": self.module_name}
        path = os.path.join(self.root, SESSION_FILE)
        with open(path, "w") as f:
            json.dump(info, f)
        # Held for the life of the process: a folder whose lock can be taken belongs to nobody
        # (a pid check alone is wrong across pid namespaces sharing one /tmp).
        self._lockfd = _hold_lock(path)

    def seed(self) -> SeedResult:
        with self._lock:
            r = seed(self.store, self.db_dir, self.fp)
            self.seed_result = r
            self.known |= set(r.seeded)
            logger.info(
                "nvfuser: seeded %d kernels (%d bytes, from the %s) into %s in %.1f ms",
                len(r.seeded),
                r.bytes,
                r.source,
                self.db_dir,
                r.seconds * 1e3,
            )
            return r

    def point(self, module: ModuleType | None, prefer: str = "direct") -> str:
        """Make nvFuser use this session's folder: ``direct`` if its KernelDb entry point can be
        called, else ``tmpdir``. Returns the mode."""
        if prefer == "direct" and module is not None:
            lib = _codegen_path(module)
            if lib is not None:
                try:
                    db = DirectKernelDb(lib)
                    if db.open(self.db_dir):
                        self.direct, self.mode = db, "direct"
                        self.tmpdir_pending = False
                        self.slow = self.forked
                        return self.mode
                    logger.info("nvfuser: KernelDb did not open through its entry point: %s", db.state())
                except (OSError, AttributeError) as e:
                    logger.info("nvfuser: KernelDb entry point not usable (%s); using TMPDIR", e)
        self.mode = "tmpdir"
        self.tmpdir_pending = True
        self.slow = True
        return self.mode

    # -- the per-call hook ----------------------------------------------------------------------
    def before_call(self) -> bool:
        """Run before a wrapped execute on the slow path; True when TMPDIR was set for it."""
        if self.forked:
            self._rehome()
        if not self.tmpdir_pending or self.disabled:
            return False
        with self._env_lock:
            if self._env_depth == 0:
                self._env_saved = os.environ.get("TMPDIR")
                os.environ["TMPDIR"] = self.root
            self._env_depth += 1
        return True

    def after_call(self) -> None:
        with self._env_lock:
            self._env_depth -= 1
            if self._env_depth > 0:
                return
            if self._env_saved is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = self._env_saved
            if self.opened_by_nvfuser():
                self.tmpdir_pending = False
                self.slow = self.forked

    def opened_by_nvfuser(self) -> bool:
        """True once nvFuser has read the seeded db.csv (its access time moved off 0)."""
        try:
            return os.stat(os.path.join(self.db_dir, DB_FILE)).st_atime_ns > 0
        except OSError:
            return False

    # -- fork -----------------------------------------------------------------------------------
    def after_fork_in_child(self) -> None:
        # Nothing heavy here (another thread may have held a lock at fork): the next wrapped call
        # in the child moves it to a folder of its own.
        self.forked = True
        self.slow = True
        self._lock = threading.RLock()
        self._env_lock = threading.Lock()
        self._env_depth = 0

    def _rehome(self) -> None:
        with self._lock:
            if not self.forked:
                return
            self.forked = False
            was_open = self.mode == "direct" or not self.tmpdir_pending
            base = tempfile.gettempdir()
            self.root = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-", dir=base)
            self.db_dir = os.path.join(self.root, DB_DIR)
            self.pid = os.getpid()
            self.done_files = set()
            self.used = set()
            self._write_session_file()
            self.seed()
            if self.mode == "direct" and self.direct is not None:
                if not self.direct.open(self.db_dir):
                    self.disabled = True
            elif was_open:
                # nvFuser in this child still points at the parent's folder and cannot be moved.
                self.disabled = True
                warn_once(
                    "nvfuser-fork",
                    "nvfuser: a forked child cannot move nvFuser's KernelDb; it is off in this child",
                )
            self.slow = self.tmpdir_pending and not self.disabled

    # -- harvesting -----------------------------------------------------------------------------
    def flush(self) -> int:
        """Store the kernels added since the last flush. Returns how many were new to the store."""
        with self._lock:
            if self.pid != os.getpid() or self.store is None or getattr(self.store, "_closed", False):
                return 0
            if self.mode == "tmpdir" and self.tmpdir_pending:
                return 0  # nvFuser has not opened the folder: nothing of its own there
            r = harvest(
                self.store,
                self.db_dir,
                self.fp,
                self.known,
                done_files=self.done_files,
                seeded=self.seed_result.seeded,
                used=self.used,
                missing=self.seed_result.missing,
                pending=self.pending,
            )
            self.seed_result.missing = []
            if self.legacy is not None:
                try:
                    self.legacy.save()
                except Exception as e:
                    warn_once("nvfuser-legacy-save", f"nvfuser: could not save the fusion cache: {e}")
            self.added += len(r.added)
            self.harvests.append(r)
            if r.added or r.bad:
                logger.info(
                    "nvfuser: stored %d new kernels (%d already stored, %d bad rows)",
                    len(r.added),
                    r.already,
                    r.bad,
                )
            return len(r.added)

    def close(self, remove: bool = True) -> None:
        try:
            self.flush()
        finally:
            if remove and self.pid == os.getpid():
                shutil.rmtree(self.root, ignore_errors=True)

    def new_rows(self) -> int:
        """Rows nvFuser added to this folder: kernels it compiled with NVRTC in this process."""
        rows, _bad = read_rows(self.db_dir)
        return sum(1 for r in rows if not r.cubin_file.startswith("seed_"))

    def status(self) -> dict[str, Any]:
        return {
            "module": self.module_name,
            "mode": self.mode,
            "root": self.root,
            "fingerprint": self.fp.hash,
            "components": dict(self.fp.components),
            "seeded": len(self.seed_result.seeded),
            "seed_source": self.seed_result.source,
            "seed_ms": round(self.seed_result.seconds * 1e3, 2),
            "start_ms": round(self.start_s * 1e3, 2),
            "shadowed": self.seed_result.shadowed,
            "new_rows": self.new_rows(),
            "stored": self.added,
            "adopted": self.adopted,
            "used": len(self.used),
            "tmpdir_pending": self.tmpdir_pending,
            "disabled": self.disabled,
            "kerneldb": self.direct.state() if self.direct is not None else None,
        }


def _hold_lock(path: str) -> int | None:
    """An exclusive flock on ``path``, held until the process ends (the fd is kept open)."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def _owned_by_nobody(root: str, pid: int) -> bool:
    """True when no live process holds ``root``: its session lock is free (or, for a folder whose
    owner died before taking it, the pid is gone and the folder is a minute old)."""
    path = os.path.join(root, SESSION_FILE)
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except ImportError:
        return not _pid_alive(pid)
    except OSError:
        try:
            return not _pid_alive(pid) and time.time() - os.lstat(root).st_mtime > 60
        except OSError:
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also releases the probe's lock


def adopt_stale(store: Any, fp: Fingerprint, base: str, exclude: str = "") -> int:
    """Harvest, then remove, private folders that dead processes of this user left in ``base``
    (a crash skips the harvest at exit). Folders of another fingerprint are only removed."""
    n = 0
    try:
        names = [x for x in os.listdir(base) if x.startswith(ROOT_PREFIX)]
    except OSError:
        return 0
    uid = os.getuid() if hasattr(os, "getuid") else None
    for name in names:
        path = os.path.join(base, name)
        if path == exclude:
            continue
        try:
            pid = int(name[len(ROOT_PREFIX) :].split("-", 1)[0])
            st = os.lstat(path)
        except (ValueError, OSError):
            continue
        if not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid) or pid == os.getpid():
            continue
        if not _owned_by_nobody(path, pid):
            continue
        try:
            with open(os.path.join(path, SESSION_FILE)) as f:
                info = json.load(f)
            if isinstance(info, dict) and info.get("fingerprint") == fp.hash and not store.readonly:
                n += len(harvest(store, os.path.join(path, DB_DIR), fp).added)
        except Exception:
            pass
        shutil.rmtree(path, ignore_errors=True)
    return n


# ---------------------------------------------------------------------------------------------
# Integration: the import hooks and the wrapped execute.

_lock = threading.RLock()
_sessions: dict[str, Session] = {}
_states: dict[str, _ModuleState] = {}
_wrapped: dict[str, tuple[Any, Callable[..., Any]]] = {}  # module name -> (class, original execute)
_fork_registered = False
_KERNEL_DB = ("kernel_db",)

#: "direct" or "tmpdir": how to point nvFuser at the folder ("direct" falls back to "tmpdir").
PREFER = "direct"


class _ModuleState:
    """kcache's hold on one nvFuser module: its store and, once started, its session."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.name = module.__name__
        self.store: Any = None
        self.session: Session | None = None
        self.failed = False


def _start(st: _ModuleState) -> Session | None:
    """Create the module's session (fingerprint, private folder, seeding, pointing nvFuser at it).

    For ``nvfuser_direct`` this runs at the first ``execute``, not at import: the fingerprint's
    ``arch`` initialises the CUDA driver, which an import must not do (a process that forks
    before using CUDA keeps CUDA usable in its children); at the first execute the inputs are
    already CUDA tensors."""
    with _lock:
        if st.session is not None or st.failed:
            return st.session
        if st.store is None:
            return None
        try:
            t0 = time.perf_counter()
            fp = current_fingerprint(st.module)
            s = Session.create(st.store, fp, st.name)
            s.point(st.module, prefer=PREFER)
            s.start_s = time.perf_counter() - t0
            if st.name == "nvfuser":
                from .legacy import LegacyFusionCache

                s.legacy = LegacyFusionCache.install(st.module, s)
        except Exception as e:
            st.failed = True
            warn_once("nvfuser-attach", f"nvfuser: kernels are not kept by kcache in this process: {e}")
            return None
        st.session = s
        _sessions[st.name] = s
    logger.info("nvfuser: kernels kept by kcache (%s mode, %s)", s.mode, s.db_dir)
    return s


def _make_execute(orig: Callable[..., Any], st: _ModuleState) -> Callable[..., Any]:
    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        session = st.session
        if session is None:
            session = _start(st)
            if session is None:
                return orig(self, *args, **kwargs)
        if session.disabled:
            return orig(self, *args, **kwargs)
        opts = kwargs.get("_enable_options")
        if not opts:
            kwargs["_enable_options"] = list(_KERNEL_DB)
        elif "kernel_db" not in opts:
            kwargs["_enable_options"] = [*opts, "kernel_db"]
        if not session.slow:
            return orig(self, *args, **kwargs)
        scoped = session.before_call()
        try:
            return orig(self, *args, **kwargs)
        finally:
            if scoped:
                session.after_call()

    execute._kcache_kerneldb = True  # type: ignore[attr-defined]
    execute.__wrapped__ = orig  # type: ignore[attr-defined]
    execute.__doc__ = getattr(orig, "__doc__", None)
    execute.__name__ = "execute"
    return execute


def _wrap(st: _ModuleState) -> bool:
    cls = getattr(st.module, "FusionDefinition", None)
    orig = getattr(cls, "execute", None) if cls is not None else None
    if orig is None:
        return False
    if getattr(orig, "_kcache_kerneldb", False):
        orig = orig.__wrapped__
    cls.execute = _make_execute(orig, st)
    _wrapped[st.name] = (cls, orig)
    return True


def _unwrap(name: str) -> None:
    cls, orig = _wrapped.pop(name, (None, None))
    if cls is not None:
        with contextlib.suppress(Exception):
            cls.execute = orig


def _active_store() -> Any:
    import kcache

    return kcache.active_store()


def _install(module: ModuleType) -> None:
    name = module.__name__
    store = _active_store()
    if store is None:
        return
    with _lock:
        st = _states.get(name)
        if st is None:
            st = _states[name] = _ModuleState(module)
        st.store = store
        if st.session is not None:  # kcache enabled again: keep nvFuser's folder, use the new store
            st.session.store = store
        if not _wrap(st):
            warn_once(
                f"nvfuser-wrap:{name}",
                f"nvfuser: {name}.FusionDefinition.execute not found; kernels not kept",
            )
            return
        if name == "nvfuser":
            import warnings

            # The legacy frontend warns on every per-call option; kernel_db changes no result.
            warnings.filterwarnings("ignore", message="Reset the FusionCache manually", category=UserWarning)
        # Our harvest must run before the store closes at exit (atexit runs last-registered first).
        atexit.unregister(_at_exit)
        atexit.register(_at_exit)
        global _fork_registered
        if not _fork_registered and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork)
            _fork_registered = True
    if name == "nvfuser":
        # The legacy FusionCache must be loaded before the first definition fills it (and
        # FusionCache.get initialises CUDA itself): start now.
        _start(st)


def _on_import(module: ModuleType) -> None:
    try:
        _install(module)
    except Exception as e:
        warn_once("nvfuser-attach", f"nvfuser: kernels are not kept by kcache in this process: {e}")


def _after_fork() -> None:
    for s in list(_sessions.values()):
        s.after_fork_in_child()


def _at_exit() -> None:
    for s in list(_sessions.values()):
        try:
            s.close()
        except Exception as e:
            warn_once("nvfuser-exit", f"nvfuser: could not store new kernels at exit: {e}")


def flush() -> int:
    """Store the nvFuser kernels compiled since the last flush (also done at exit). Returns the
    number of kernels that were new to the store."""
    n = 0
    for s in list(_sessions.values()):
        try:
            n += s.flush()
        except Exception as e:
            warn_once("nvfuser-flush", f"nvfuser: could not store new kernels: {e}")
    return n


def status() -> dict[str, Any]:
    """Per nvFuser module: mode, folder, fingerprint, kernels seeded, compiled here, stored."""
    return {name: s.status() for name, s in list(_sessions.items())}


def attach() -> Callable[[], None]:
    """Keep nvFuser's kernels when ``nvfuser_direct`` (or the legacy ``nvfuser``) is imported
    (now, if it already is). Returns a function that undoes it (after storing what is new)."""
    when_imported("nvfuser_direct", _on_import)
    when_imported("nvfuser", _on_import)

    def detach() -> None:
        forget("nvfuser_direct", _on_import)
        forget("nvfuser", _on_import)
        detach_all()

    return detach


def detach_all() -> None:
    """Store what is new, then unwrap nvFuser and forget the store (kcache.disable())."""
    with _lock:
        for s in list(_sessions.values()):
            try:
                s.flush()
            except Exception as e:
                warn_once("nvfuser-detach", f"nvfuser: could not store new kernels: {e}")
            s.store = None
        for name, st in list(_states.items()):
            _unwrap(name)
            st.store = None
