"""Whether this Triton can load a kernel group, checked before kcache serves it; and what
happens when its loader still fails on one that was served.

A checked hit proves that a group's bytes are the ones its record names, not that Triton can
load them: without ``KCACHE_SECRET`` anyone who can write to the shared tier can publish a
well-formed group whose metadata (``<name>.json``) makes ``triton.compile()`` raise, and once
it is in a store it raises in every process. Triton's loader (``CompiledKernel.__init__``,
the same in 3.4 to 3.9) does, with the group Triton gets from ``get_group``:

- takes the FIRST member whose name ends in ``.json`` as the metadata, and ``json.loads`` it;
- rebuilds ``target`` as ``GPUTarget(t["backend"], t["arch"], t["warp_size"])``;
- builds ``namedtuple("KernelMetadata", sorted(keys))(**metadata)``: a key that is not an
  identifier, is a keyword or starts with ``_`` raises ValueError (one extra key is enough),
  and a non-ASCII key can raise TypeError (parameters are NFKC-normalised, keywords are not);
- ``make_backend(target)`` (exactly one backend must support it) and
  ``backend.pack_metadata(metadata)`` (reads ``num_warps``, ``num_ctas``, ``shared``);
- reads every other member, the binary (``.cubin``, ``.hsaco``) as bytes and the rest with
  ``read_text()`` (UTF-8), and takes ``asm[backend.binary_ext]``: no binary, KeyError.

At the first launch (on a GPU) it compares ``shared``, ``tmem_size`` and ``num_warps`` with the
device's limits and its launcher reads ``global_scratch_size``/``_align``,
``profile_scratch_size``/``_align``, ``launch_cooperative_grid``, ``launch_pdl`` and
``num_ctas`` and hands them to C as ints.

:func:`problem` checks all of that without building anything (no namedtuple class, no file
read: the verified bytes of the hit), plus bounds on sizes and on the numbers the launcher
takes. A group that fails is not served: it is quarantined (:mod:`kcache.store.quarantine`) and
Triton compiles. Should Triton's loader still raise on a group kcache served (a rule this
module does not know), :func:`install_compile_guard`'s wrapper of ``triton.compile`` sees the
loader's frame in the traceback, quarantines what it served for that call, and runs the same
call again, which now compiles. A failure of a fresh compile is Triton's and is not touched.
"""

from __future__ import annotations

import functools
import json
import keyword
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from ..forksafe import module_lock

if TYPE_CHECKING:
    from ..store.api import Cache
    from ..store.hit import Hit
    from ..store.records import Record

MAX_METADATA = 1 << 20  # bytes of <name>.json (Triton's own: a few KiB)
MAX_KEYS = 4096  # keys in it (Triton's own: about 60)
MAX_NAME = 1024  # a kernel's name, handed to the driver as a C string
_C_INT = 1 << 31  # the launcher passes these to C as ``int``

# Fields the loader or the launcher reads as numbers, checked whenever present:
_AT_LEAST_ONE = ("num_warps", "num_ctas", "global_scratch_align", "profile_scratch_align", "warp_size")
_SIZES = ("shared", "global_scratch_size", "profile_scratch_size")
_FLAGS = ("launch_cooperative_grid", "launch_pdl")
# Fields the CUDA launcher reads unconditionally at a kernel's first launch (an AttributeError
# there), from the first Triton version whose source has it (3.4-3.9 read).
_CUDA_LAUNCHER = (
    ((3, 4), ("global_scratch_size", "global_scratch_align", "launch_cooperative_grid", "launch_pdl")),
    ((3, 5), ("profile_scratch_size", "profile_scratch_align")),
)
# Fields every backend's loader reads (``CompiledKernel._init_handles``), likewise.
_LOADER = (((3, 9), ("warp_size",)),)

_lock = module_lock(__name__, "_lock")
_backends: dict[tuple[Any, ...], Any] = {}  # target -> (backend, GPUTarget)
_good_keys: set[str] = set()  # metadata keys seen to be valid field names (about 60 in all)


def _field_name(k: Any) -> str | None:
    """Why ``namedtuple`` (or the call of the class it builds) refuses ``k`` as a field name."""
    if not isinstance(k, str):
        return "is not a string"
    if not (k.isascii() and k.isidentifier()):
        return "is not an ASCII identifier"
    if keyword.iskeyword(k):
        return "is a Python keyword"
    if k.startswith("_"):
        return "starts with an underscore"
    return None


def _int(v: Any, lo: int, hi: int = _C_INT) -> bool:
    return type(v) is int and lo <= v < hi


def _backend(backend: str, arch: Any, warp_size: int) -> tuple[Any, Any]:
    """Triton's ``make_backend`` for this target, and the target (the loader makes both per
    kernel; remembered here)."""
    key = (backend, type(arch), arch, warp_size)
    got = _backends.get(key)
    if got is None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        t = GPUTarget(backend, arch, warp_size)
        got = (make_backend(t), t)
        with _lock:
            if len(_backends) < 64:
                _backends[key] = got
    return got


@functools.cache
def _triton_version() -> tuple[int, ...]:
    import triton

    try:
        return tuple(int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return ()


def _required_fields(table: tuple[tuple[tuple[int, int], tuple[str, ...]], ...]) -> tuple[str, ...]:
    """The fields of ``table`` that this Triton reads."""
    return tuple(f for since, fields in table if _triton_version() >= since for f in fields)


class _Metadata:
    """The metadata as the loader's namedtuple shows it to ``pack_metadata`` (attributes),
    without building a class per kernel."""

    __slots__ = ("_d", "target")

    def __init__(self, d: dict[str, Any], target: Any) -> None:
        self._d, self.target = d, target

    def __getattr__(self, name: str) -> Any:
        try:
            return self._d[name]
        except KeyError:
            raise AttributeError(name) from None


def problem(
    filename: str,
    members: Mapping[str, bytes],
    *,
    target: str | None = None,
    with_triton: bool = True,
) -> str | None:
    """None when this Triton's loader accepts the group ``members`` (name -> bytes) whose
    metadata is ``filename``; else why not, in a few words. ``target`` (``"cuda:90"``): the
    target the compile asked for, which the metadata's must match. ``with_triton``: also ask
    this Triton's backends (``kcache verify`` judges an entry of another Triton version, or
    runs without Triton, on the rules that do not depend on it). Never raises."""
    try:
        return _problem(filename, members, target, with_triton)
    # broad: judging hostile bytes with Triton's own backends: any error is a reason not to serve
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:200]}"


def _problem(
    filename: str, members: Mapping[str, bytes], target: str | None, with_triton: bool
) -> str | None:
    jsons = [n for n in members if n.endswith(".json")]
    if jsons != [filename]:
        return f"the group's .json members are {jsons[:4]}, not [{filename!r}]"
    blob = members[filename]
    if len(blob) > MAX_METADATA:
        return f"metadata of {len(blob)} bytes"
    meta = json.loads(blob.decode("utf-8"))
    if type(meta) is not dict:
        return "the metadata is not a JSON object"
    if len(meta) > MAX_KEYS:
        return f"{len(meta)} metadata keys"
    for k in meta:
        if k not in _good_keys:
            why = _field_name(k)
            if why:
                return f"metadata key {k[:40]!r} {why}"
            if len(_good_keys) < 4096:
                _good_keys.add(k)
    t = meta.get("target")
    if type(t) is not dict:
        return "no target"
    backend, arch, warp = t.get("backend"), t.get("arch"), t.get("warp_size")
    if type(backend) is not str or not (_int(arch, 0) or type(arch) is str) or not _int(warp, 1):
        return "a malformed target"
    if target is not None and f"{backend}:{arch}" != target:
        return f"target {backend}:{arch}, compiled for {target}"
    name = meta.get("name")
    if type(name) is not str or not 0 < len(name) <= MAX_NAME or "\0" in name:
        return "no usable kernel name"
    for f in _AT_LEAST_ONE:
        if f in meta and not _int(meta[f], 1):
            return f"{f} = {str(meta[f])[:40]}"
    for f in _SIZES:
        if f in meta and not _int(meta[f], 0):
            return f"{f} = {str(meta[f])[:40]}"
    if meta.get("tmem_size") is not None and not _int(meta["tmem_size"], 0):
        return f"tmem_size = {str(meta['tmem_size'])[:40]}"
    for f in _FLAGS:
        if f in meta and not (type(meta[f]) is bool or _int(meta[f], 0, 2)):  # C takes an int
            return f"{f} = {str(meta[f])[:40]}"
    dims = meta.get("cluster_dims")  # 3.4's loader takes tuple() of it, its pack_metadata [0..2]
    if dims is not None and not (type(dims) is list and len(dims) == 3 and all(_int(d, 1) for d in dims)):
        return f"cluster_dims = {str(dims)[:40]}"
    if meta.get("tensordesc_meta") is not None and type(meta["tensordesc_meta"]) is not list:
        return "tensordesc_meta is not a list"
    if not with_triton:
        binary_ext = {"cuda": "cubin", "hip": "hsaco"}.get(backend)
    else:
        b, gpu_target = _backend(backend, arch, cast(int, warp))  # an int: checked above
        binary_ext = b.binary_ext
        b.pack_metadata(_Metadata(meta, gpu_target))
        for f in _required_fields(_LOADER):
            if f not in meta:
                return f"no {f} (the loader reads it)"
        if backend == "cuda":
            for f in _required_fields(_CUDA_LAUNCHER):
                if f not in meta:
                    return f"no {f} (the launcher reads it)"
    has_binary = False
    for n, data in members.items():
        ext = n.rpartition(".")[2] if "." in n else ""
        if ext == binary_ext:
            has_binary = True
        elif n != filename and not data.isascii():
            data.decode("utf-8")  # Triton reads it with read_text(): UnicodeDecodeError
    if binary_ext is not None and not has_binary:
        return f"no .{binary_ext} member"
    return None


# ------------------------------------------------------------------ the loader's last word
_served = threading.local()


def note_served(store: Cache, rec: Record) -> None:
    """``get_group`` served ``rec`` from ``store`` in the current ``triton.compile()`` call."""
    lst = getattr(_served, "items", None)
    if lst is not None:
        lst.append((store, rec))


def _loader_codes() -> frozenset[Any]:
    from triton.compiler import compiler as cc

    init = getattr(getattr(cc, "CompiledKernel", None), "__init__", None)
    code = getattr(init, "__code__", None)
    return frozenset([code]) if code is not None else frozenset()


def _loader_frame(e: BaseException, codes: frozenset[Any]) -> Any:
    """The frame of Triton's loader (``CompiledKernel.__init__``) that ``e`` came through, or
    None: the exception is the loader's own."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return tb.tb_frame
        tb = tb.tb_next
    return None


def _defuse(frame: Any) -> None:
    """The half-built ``CompiledKernel`` the loader raised in (``frame``'s ``self``): give it
    ``module = None`` where its ``__init__`` did not get that far. Triton 3.9's ``__del__`` reads
    ``self.module``; without it the discarded object prints "Exception ignored in ...
    AttributeError" on stderr when it is collected, after kcache has compiled the kernel again
    (Triton 3.4-3.6 have no ``__del__``)."""
    obj = frame.f_locals.get("self")
    try:
        if obj is not None and "module" not in vars(obj):
            obj.module = None
    except (AttributeError, TypeError):  # no instance dict: nothing of Triton's to mend
        pass


def _guard(orig: Any, codes: frozenset[Any]) -> Any:
    def compile(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_served, "items", None)
        served: list[tuple[Any, Any]] = []
        _served.items = served
        try:
            try:
                return orig(*args, **kwargs)
            except Exception as e:  # broad: Triton's loader raises anything; kcache's only kept
                frame = _loader_frame(e, codes) if served else None
                if frame is None:
                    raise

                from ..store.quarantine import refuse

                why = f"Triton's loader raised {type(e).__name__}: {e}"
                try:
                    _defuse(frame)
                except Exception:  # broad: a tidy-up of Triton's object must not stop the recovery
                    pass
                del frame  # (it holds the half-built object: not kept through the recompile)
                for store, rec in served:
                    refuse(store, rec, why)
                del e
                _served.items = []
                return orig(*args, **kwargs)
        finally:
            _served.items = outer

    compile.__wrapped__ = orig  # type: ignore[attr-defined]
    compile.__doc__ = getattr(orig, "__doc__", None)
    return compile


_GUARDED = (("triton.compiler.compiler", "compile"), ("triton.compiler", "compile"), ("triton", "compile"))


def install_compile_guard() -> None:
    """Wrap ``triton.compile`` where callers find it: ``triton.compiler.compiler.compile`` (the
    AOT tools), ``triton.compiler.compile`` (the JIT imports it from there when it first runs a
    kernel) and ``triton.compile``. Same arguments, same result."""
    import sys

    import triton.compiler.compiler as cc

    from ..patch import is_ours
    from .attached import patches

    orig = cc.compile
    if is_ours(orig):
        return
    guarded = _guard(orig, _loader_codes())
    for modname, attr in _GUARDED:
        mod = sys.modules.get(modname)
        if mod is not None and getattr(mod, attr, None) is orig:
            patches.wrap(mod, attr, lambda _: guarded)


def servable(store: Cache, filename: str, hit: Hit, target: str | None) -> bool:
    """Whether ``get_group`` may hand the group ``hit`` (a verified store hit) to Triton. One
    that this Triton cannot load, or whose very content was quarantined in this process, is
    quarantined (again) and counted as a miss instead: Triton compiles. Never raises."""
    from ..store.quarantine import judge

    rec = hit.record
    if not judge(
        store,
        rec,
        lambda: problem(filename, {n: hit.read(n) for n in hit.names}, target=target),
        f"its metadata {filename}",
    ):
        return False
    note_served(store, rec)
    return True
