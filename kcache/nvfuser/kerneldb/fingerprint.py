"""Fingerprint: what decides whether a stored kernel may be offered to this process's nvFuser.

Conservative on purpose: KernelDb's own key (source + NVRTC arguments) already separates most of
these, and the fingerprint keeps a kernel from being offered where a different nvFuser build,
NVRTC or option set might pair the same source with a different binary (docs/nvfuser.md, "What is
keyed"). Its hash is the key prefix of every entry it owns.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType

from ... import fingerprint as _fp
from .libs import codegen_path, loaded_nvrtc

SCHEMA = "kcache-nvfuser-kerneldb/1"

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
    depth = 0
    cur: list[str] = []
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
        except Exception:  # broad: nvFuser's version() is foreign code
            ver = None
    if ver is not None:
        parts.append(str(ver))
    lib = codegen_path(module)
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
                    if not tops or module is not None and module.__name__.split(".")[0] in tops:
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
        "nvrtc": loaded_nvrtc() or _fp.current("nvrtc"),
        "arch": _fp.current("arch"),
        "torch_version": _fp.current("torch_version"),
        "cuda_runtime": _fp.current("cuda_runtime"),
        "nvfuser_enable": codegen_options(env.get("NVFUSER_ENABLE"), NEUTRAL_ENABLE),
        "nvfuser_disable": codegen_options(env.get("NVFUSER_DISABLE"), NEUTRAL_DISABLE),
        "nvfuser_env": ";".join(other),
    }
    return Fingerprint(comps)
