"""Whether Inductor can safely use a cached autotune result (kind ``inductor-autotune``), checked
before kcache hands it to torch.

What torch writes (``AutotuneCache.save``, torch 2.8 to 2.13): one JSON object per kernel,

    {**config.kwargs, "num_warps": int, "num_stages": int, "configs_hash": sha256 hex,
     "found_by_coordesc": bool, "time_taken_ms": int, "triton_cache_hash": str | None}

plus ``extra_options`` (2.13, only when a backend set some) and ``num_consumer_groups`` /
``num_buffers_warp_spec`` (torch builds with warp specialisation). ``config.kwargs`` are the
kernel's tuned constexprs: Inductor's block sizes (``XBLOCK``, ``R0_BLOCK``, ``BLOCK_M``, with a
``_<n>`` suffix in combo kernels; powers of two), ``RSPLIT``, ``NUM_STAGES``, ROCm's
``waves_per_eu``/``kpack``/``matrix_instr_nonkdim``, or a user kernel's own ``triton.autotune``
parameters (any constexpr).

What torch does with it (``_load_cached_autotuning``): a result whose ``configs_hash`` matches
is turned into a Triton ``Config``: the compiled config it equals, or, when found by coordinate
descent or equal to none (2.13), a new ``Config(best_config, num_warps=..., num_stages=...)``
that Inductor compiles and launches. Nothing is checked there, and the bytes are decoded with
``json.loads`` inside the user's compile. So without this check anyone who can write to the
shared tier (no ``KCACHE_SECRET``: autotune results are not signed) or to a bundle can make the
user's program raise (bytes that are not JSON, a ``num_warps`` of 3, a missing ``num_stages``, a
string where a block size goes) or compile a kernel with any block size, warp count, stage count
or extra constexpr. A result that is not of the shape and ranges torch writes is not served: it
is quarantined (:mod:`kcache.store.quarantine`) and Inductor tunes again.

What it cannot see: values in range that this kernel cannot run with (a block too large for its
shared memory) fail as they would with a result torch itself measured on another GPU model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.api import Cache
    from ..store.hit import Hit

MAX_ENTRY = 64 << 10  # bytes (torch's own: a few hundred)
MAX_KEYS = 256
MAX_BLOCK = 1 << 20  # Triton's largest tensor (TRITON_MAX_TENSOR_NUMEL)
MAX_WARPS = 32  # 1024 threads of 32 (NVIDIA); 16 wavefronts of 64 on ROCm
MAX_STAGES = 16
MAX_INT = 1 << 20  # Inductor's other integer constexprs (RSPLIT, NUM_STAGES, waves_per_eu, ...)

#: Inductor's block sizes: powers of two (``tl.arange``), suffixed ``_<n>`` in combo kernels.
_BLOCK = re.compile(r"(?:[XYZ]BLOCK|RBLOCK|R[01]_BLOCK|BLOCK_[MNK])(?:_\d{1,3})?")
#: Inductor's other integer constexprs (kwargs of its heuristics' configs, ROCm's included).
_INDUCTOR_INTS = frozenset(
    {"RSPLIT", "RSPLIT_SIZE", "NUM_STAGES", "GROUP_M", "waves_per_eu", "kpack", "matrix_instr_nonkdim"}
)
#: Config options and launch options torch never writes in a result: here they would become a
#: constexpr the kernel does not have, or a launch option set by whoever wrote the entry.
_NEVER = frozenset(
    {
        "num_ctas",
        "maxnreg",
        "pre_hook",
        "ir_override",
        "kwargs",
        "grid",
        "warmup",
        "stream",
        "debug",
        "enable_fp_fusion",
        "launch_cooperative_grid",
        "launch_pdl",
        "sanitize_overflow",
        "extern_libs",
        "arch",
        "instrumentation_mode",
        "time_saved_ns",
    }
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_HASH = re.compile(r"[0-9A-Za-z_+/=-]{1,128}")


class _Bad(Exception):
    pass


def _int(v: Any, low: int, high: int) -> bool:
    return type(v) is int and low <= v <= high


def _pow2(v: Any, high: int) -> bool:
    return _int(v, 1, high) and v & (v - 1) == 0


def _text(v: Any, n: int = 256) -> bool:
    return type(v) is str and len(v) <= n and v.isprintable()


def _scalar(v: Any) -> bool:
    """A user kernel's constexpr as JSON can hold it: a bool, an int, a finite float, a short
    printable string, or null."""
    t = type(v)
    if v is None or t is bool:
        return True
    if t is int:
        return abs(v) < 1 << 63
    if t is float:
        return math.isfinite(v)
    return _text(v)


def _json_value(v: Any, depth: int = 0) -> bool:
    """``extra_options``: any JSON a backend may have stored, finite and of bounded depth."""
    if depth > 8:
        return False
    if type(v) is dict:
        return all(_text(k, 128) and _json_value(x, depth + 1) for k, x in v.items())
    if type(v) is list:
        return all(_json_value(x, depth + 1) for x in v)
    return _scalar(v)


def _reserved(name: str, v: Any) -> str | None:
    """Why the value of one of torch's own fields is not one torch writes, or None."""
    ok = {
        "num_warps": lambda: _pow2(v, MAX_WARPS),
        "num_stages": lambda: _int(v, 0, MAX_STAGES),
        "num_consumer_groups": lambda: _int(v, 0, 64),
        "num_buffers_warp_spec": lambda: _int(v, 0, 64),
        "configs_hash": lambda: type(v) is str and _HASH.fullmatch(v) is not None,
        "found_by_coordesc": lambda: type(v) is bool,
        "time_taken_ms": lambda: type(v) in (int, float) and 0 <= v < 1 << 53 and math.isfinite(v),
        "triton_cache_hash": lambda: v is None or (type(v) is str and _HASH.fullmatch(v) is not None),
        "extra_options": lambda: _json_value(v),
    }[name]()
    return None if ok else f"{name} = {str(v)[:40]!r}"


_RESERVED = (
    "num_warps",
    "num_stages",
    "num_consumer_groups",
    "num_buffers_warp_spec",
    "configs_hash",
    "found_by_coordesc",
    "time_taken_ms",
    "triton_cache_hash",
    "extra_options",
)
_REQUIRED = ("configs_hash", "num_warps", "num_stages")


def _kwarg(name: str, v: Any) -> str | None:
    """Why a kernel constexpr ``name`` = ``v`` is not one torch writes, or None."""
    if _IDENT.fullmatch(name) is None:
        return f"a key {name[:40]!r} that no kernel parameter has"
    if name in _NEVER:
        return f"a key {name!r} torch never writes"
    if _BLOCK.fullmatch(name):
        return None if _pow2(v, MAX_BLOCK) else f"{name} = {str(v)[:40]!r} (a block size: a power of two)"
    if name in _INDUCTOR_INTS:
        return None if _int(v, 0, MAX_INT) else f"{name} = {str(v)[:40]!r}"
    return None if _scalar(v) else f"{name} = {str(v)[:40]!r}"


def _no_constant(c: str) -> Any:
    raise _Bad(f"{c} (torch writes finite numbers)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise _Bad("a key written twice")
    return d


def problem(blob: bytes) -> str | None:
    """None when ``blob`` is an autotune result of the shape and ranges torch writes; else why
    not (one line)."""
    try:
        return _problem(blob)
    except _Bad as e:
        return str(e)
    except (ValueError, RecursionError) as e:  # hostile bytes: the codec's and json's errors
        return f"{type(e).__name__}: {str(e)[:200]}"  # (a huge integer too), nesting too deep


def _problem(blob: bytes) -> str | None:
    if len(blob) > MAX_ENTRY:
        return f"{len(blob)} bytes"
    d = json.loads(blob.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    if type(d) is not dict:
        return f"a JSON {type(d).__name__}, not an object"
    if len(d) > MAX_KEYS:
        return f"{len(d)} keys"
    for name in _REQUIRED:
        if name not in d:
            return f"no {name}"
    for name, v in d.items():
        why = _reserved(name, v) if name in _RESERVED else _kwarg(name, v)
        if why is not None:
            return why
    return None


def servable(store: Cache, hit: Hit, blob: bytes) -> bool:
    """Whether the cached autotune result ``blob`` (of the entry ``hit``) may be handed to torch.
    One that fails :func:`problem`, or whose content was quarantined in this process, is
    quarantined and counted as a miss instead: Inductor tunes again. Never raises."""
    from ..store.quarantine import judge

    return judge(store, hit.record, lambda: problem(blob), "autotune result")


def checks(member: str) -> dict[str, Callable[[Any], str | None]]:
    """kind -> ``check(hit)`` for ``kcache verify``: why torch could not safely use this
    verified autotune result (its file ``member``), or None."""
    from . import declare as kinds

    def autotune(hit: Any) -> str | None:
        why = problem(hit.read(member)) if member in hit.names else f"no {member}"
        return f"torch could not use it: {why}" if why else None

    return {kinds.INDUCTOR_AUTOTUNE: autotune}
