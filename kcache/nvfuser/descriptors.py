"""Tensor descriptors as nvFuser sees them, and the fast per-call key of a list of arguments.

A fusion definition fixes, for every tensor input, its dtype, rank, broadcast pattern (which dims
have size 1), contiguity and stride order, and for a 0-dim tensor whether it lives on the CPU
(nvFuser takes a CPU 0-dim tensor as a scalar). Everything else (the sizes, the values of
ordinary scalars) is left to runtime. :func:`runtime_key` reduces a call's arguments to exactly
that, so that two calls get equal keys when one definition serves both.

:func:`runtime_key` runs on every kernel launch. It first builds the *exact* key (dtype, sizes and
strides of each tensor, as torch hands them out) and looks that up in a bounded memo; only a call
shape never seen before computes descriptors. torch is never imported here: tensors are
recognised by duck typing (``dtype``, ``shape``, ``stride()``, ``is_cpu``).

nvFuser semantics worth knowing (checked against nvFuser 0.2.36 on the shared vectors):

* A dim with stride 0 *or* size 1 is a broadcast dim: its contiguity is ``None``.
* Stride-0 dims keep their logical position in allocation order; all other dims, size-1 dims with
  a non-zero stride included, are stably sorted by decreasing stride. So the stride of a size-1
  dim, which torch ignores for ``is_contiguous()``, does change the stride order (size ``(4, 1)``
  with strides ``(1, 1)`` and with ``(1, 4)`` are both contiguous for torch but get stride orders
  ``[1, 0]`` and ``[0, 1]``, and contiguity ``[True, None]`` and ``[None, True]``).
* A non-broadcast dim is contiguous when its stride equals stride * size of the next
  non-broadcast dim inward in allocation order, or 1 when there is none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "SequenceDescriptor",
    "StaticDescriptor",
    "TensorDescriptor",
    "compute_tensor_descriptor",
    "exact_key",
    "key_of_exact",
    "runtime_key",
    "tensor_descriptor",
]


class TensorDescriptor(NamedTuple):
    """What a fusion definition fixes about one tensor input.

    ``shape`` is nvFuser's symbolic shape: 1 for a size-1 (broadcast) dim, -1 for any other, so
    its length is the rank. ``contiguity`` is in allocation order (outermost first) with ``None``
    for broadcast dims; ``stride_order[i] = k`` means logical dim ``i`` has the k-th smallest
    stride. ``cpu_scalar`` is True for a 0-dim tensor on the CPU (nvFuser takes it as a scalar).
    """

    dtype: Any
    shape: tuple[int, ...]
    contiguity: tuple[bool | None, ...]
    stride_order: tuple[int, ...]
    cpu_scalar: bool


class StaticDescriptor(NamedTuple):
    """A non-tensor argument whose value is baked into the definition (marked ``static``)."""

    type: type
    value: Any


class SequenceDescriptor(NamedTuple):
    """A list or tuple argument: nvFuser defines a vector of fixed length; one descriptor per item."""

    type: type
    length: int
    items: tuple[Any, ...]


def compute_tensor_descriptor(
    sizes: Sequence[int], strides: Sequence[int]
) -> tuple[list[bool | None], list[int]]:
    """``(contiguity, stride_order)`` of a tensor, exactly as nvFuser's function of that name.

    Returns a tuple of two lists, as nvFuser's binding does: contiguity in allocation order
    (``True``/``False``, ``None`` for broadcast dims) and the stride order per logical dim.
    Raises ``ValueError`` on a negative stride (nvFuser raises ``RuntimeError``) and when
    ``sizes`` and ``strides`` differ in length.
    """
    n = len(sizes)
    if len(strides) != n:
        raise ValueError(
            f"compute_tensor_descriptor: sizes and strides must have the same number of dimensions "
            f"(got {len(sizes)} sizes and {len(strides)} strides)"
        )
    if n and min(strides) < 0:
        i = next(i for i, st in enumerate(strides) if st < 0)
        raise ValueError(
            f"compute_tensor_descriptor: negative stride on tensor is not supported: "
            f"strides[{i}]={strides[i]} (nvFuser rejects negative strides)"
        )
    contig, order = _descriptor(sizes, strides)
    return contig, order


def _descriptor(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list[bool | None], list[int]]:
    contig, order, _ = _layout(sizes, strides)
    return contig, order


def _layout(sizes: Sequence[int], strides: Sequence[int]) -> tuple[list, list, list]:
    """(contiguity, stride_order, symbolic shape) as lists; strides already checked >= 0."""
    # Allocation order: stride-0 dims stay at their logical position, the others fill the
    # remaining positions sorted by decreasing stride (stable: ties keep logical order).
    # Strides already non-increasing (the common case) give the identity.
    n = len(strides)
    st_list = list(strides)
    if n < 2 or (0 not in st_list and sorted(st_list, reverse=True) == st_list):
        alloc: Sequence[int] = range(n)
    else:
        nz = sorted([i for i in range(n) if st_list[i]], key=st_list.__getitem__, reverse=True)
        if len(nz) == n:
            alloc = nz
        else:
            it = iter(nz)
            alloc = [i if not st_list[i] else next(it) for i in range(n)]
    order = [0] * n
    contig: list[bool | None] = [None] * n
    shape = [-1] * n
    last = n - 1
    expected = 1
    # Walk from the innermost position out: a non-broadcast dim is contiguous when its stride is
    # stride * size of the next non-broadcast dim inward (1 for the innermost one).
    for p in range(last, -1, -1):
        d = alloc[p]
        order[d] = last - p
        sz = sizes[d]
        if sz == 1:
            shape[d] = 1
        else:
            st = st_list[d]
            if st:
                contig[p] = st == expected
                expected = st * sz
    return contig, order, shape


# ---------------------------------------------------------------------------------------------
# Per-tensor descriptors, memoised on the exact (dtype, sizes, strides | is_cpu).

_MEMO_MAX = 4096
_tuple_new = tuple.__new__

#: exact tensor item (dtype, sizes, strides, or is_cpu for a 0-dim tensor) -> TensorDescriptor
_TENSOR_MEMO: dict[tuple, TensorDescriptor] = {}


def _tensor_desc(item: tuple) -> TensorDescriptor:
    """TensorDescriptor of an exact tensor item ``(dtype, sizes, strides or is_cpu)``."""
    r = _TENSOR_MEMO.get(item)
    if r is None:
        dtype, sizes, st = item
        if st is True or st is False:  # 0-dim: the flag says whether it is on the CPU
            r = _tuple_new(TensorDescriptor, (dtype, (), (), (), st))
        else:
            if min(st) < 0:
                compute_tensor_descriptor(sizes, st)  # raises the ValueError
            contig, order, shape = _layout(sizes, st)
            r = _tuple_new(TensorDescriptor, (dtype, tuple(shape), tuple(contig), tuple(order), False))
        if len(_TENSOR_MEMO) >= _MEMO_MAX:
            _TENSOR_MEMO.clear()
        _TENSOR_MEMO[item] = r
    return r


def _is_cpu(t: Any) -> bool:
    v = getattr(t, "is_cpu", None)
    if isinstance(v, bool):
        return v
    return getattr(t.device, "type", None) == "cpu"


def _tensor_item(t: Any) -> tuple:
    """The exact item of a tensor-like object, hashable whatever its shape and stride return."""
    shape = t.shape
    st = t.stride()
    if not isinstance(shape, tuple):
        shape = tuple(shape)
    return (t.dtype, shape, tuple(st) or _is_cpu(t))


def tensor_descriptor(t: Any) -> TensorDescriptor:
    """The :class:`TensorDescriptor` of one tensor (anything with ``dtype``, ``shape``, ``stride()``)."""
    return _tensor_desc(_tensor_item(t))


# ---------------------------------------------------------------------------------------------
# Argument classification (by type, decided once per type).


class _NoTensor:
    """Stands for torch.Tensor until one is seen (this module never imports torch)."""


#: torch.Tensor once an instance has been seen: the hot path tests ``type(a) is _T`` first.
_T: type = _NoTensor
#: Types recognised as tensors (subclasses such as nn.Parameter): ``type(a) in _TENSOR_TYPES``.
#: A type joins the first time an instance passes the duck-typing test in :func:`_classify`.
_TENSOR_TYPES: set[type] = set()
#: Types known not to be tensors (scalars, None, dtypes, ...): their exact item is their type.
_PLAIN_TYPES: set[type] = {int, float, bool, complex, str, bytes, type(None)}
_SEQ_TYPES: set[type] = {list, tuple}
#: Tensor-likes that are not torch tensors (keyed through _tensor_item).
_DUCK_TYPES: set[type] = set()


def _classify(a: Any) -> int:
    """0: plain (keyed by type), 1: tensor, 2: sequence. Decided on the first instance of a type
    and cached per type."""
    global _T
    tp = type(a)
    if tp in _TENSOR_TYPES or tp in _DUCK_TYPES:
        return 1
    if tp in _PLAIN_TYPES:
        return 0
    if tp in _SEQ_TYPES or (issubclass(tp, (list, tuple)) and not hasattr(a, "stride")):
        return 2
    if (
        callable(getattr(a, "stride", None))
        and hasattr(a, "shape")
        and hasattr(a, "dtype")
        and (hasattr(a, "is_cpu") or hasattr(a, "device"))
    ):
        # Only torch tensors (and subclasses) take the inline fast path, which reads
        # ``a.stride() or a.is_cpu`` and keys on ``a.shape`` as it comes; other tensor-likes go
        # through _tensor_item, which normalises what they return.
        if any(c.__module__ == "torch" and c.__name__ == "Tensor" for c in tp.__mro__):
            _TENSOR_TYPES.add(tp)
            if tp.__module__ == "torch" and tp.__name__ == "Tensor":
                _T = tp
        else:
            _DUCK_TYPES.add(tp)
        return 1
    _PLAIN_TYPES.add(tp)
    return 0


def _arg_descriptor(a: Any) -> Any:
    """The descriptor of one non-static argument (the cold path)."""
    kind = _classify(a)
    if kind == 1:
        return tensor_descriptor(a)
    if kind == 2:
        return _tuple_new(SequenceDescriptor, (type(a), len(a), tuple([_arg_descriptor(x) for x in a])))
    return type(a)


def _static_descriptor(a: Any) -> Any:
    if _classify(a) == 1:  # a tensor's value cannot be part of a key: keyed by layout
        return tensor_descriptor(a)
    try:
        hash(a)
    except TypeError:
        raise TypeError(
            f"runtime_key: an argument marked static must be hashable, got {type(a).__name__}"
        ) from None
    return _tuple_new(StaticDescriptor, (type(a), a))


def _exact_item(a: Any) -> Any:
    """Exact-key item of an argument that is not of a type in ``_TENSOR_TYPES``.

    A tensor's item is a plain tuple ``(dtype, sizes, strides or is_cpu)``; anything else's is
    its descriptor (a type or a NamedTuple), never a plain tuple, so the two cannot be confused.
    """
    kind = _classify(a)
    if kind == 1:
        return _tensor_item(a)
    if kind == 2:
        return _arg_descriptor(a)
    return type(a)


def _normalise_static(static: Any, n: int) -> frozenset[int]:
    out = set()
    for i in static:
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"runtime_key: static positions must be ints, got {i!r}")
        out.add(i + n if i < 0 else i)
    return frozenset(out)


def _from_exact(ex: tuple) -> tuple:
    """The runtime key of a call from its exact key (tensor items are the plain tuples)."""
    return tuple([_tensor_desc(it) if type(it) is tuple else it for it in ex])


# ---------------------------------------------------------------------------------------------
# The per-call key.

#: exact key of a whole call -> its runtime key. Cleared when it grows past _MEMO_MAX.
_CALL_MEMO: dict[tuple, tuple] = {}
#: the most recent (exact key, runtime key) pair: checked first, an equality test costs less than
#: hashing the exact key (tuples do not cache their hash). One tuple, replaced whole, so that a
#: thread never sees one call's exact key with another's runtime key.
_last: tuple[Any, Any] = ((_NoTensor,), ())


def exact_key(args: Sequence[Any]) -> tuple:
    """The exact key of a call: dtype, sizes and strides of each tensor, type of anything else.

    Two calls with equal exact keys always have equal :func:`runtime_key`; the converse does not
    hold (sizes differ freely). Arguments are not marked static here.
    """
    return tuple(
        [
            (a.dtype, a.shape, a.stride() or a.is_cpu)
            if type(a) is _T or type(a) in _TENSOR_TYPES
            else _exact_item(a)
            for a in args
        ]
    )


def runtime_key(args: Sequence[Any], *, static: Sequence[int] | frozenset[int] = ()) -> tuple:
    """The key of a call's arguments: equal exactly when one nvFuser definition serves both calls.

    One item per argument: a :class:`TensorDescriptor` for a tensor; for anything else its type,
    a :class:`SequenceDescriptor` for a list or tuple, or, where its position is in ``static``
    (the value changes the fusion), a :class:`StaticDescriptor` holding the value.

    Memoised on the exact dtypes, sizes and strides (bounded), so a call shape seen before costs
    about as much as reading each tensor's shape, stride and dtype.
    """
    global _last
    # No local names inside the comprehension: a closure would cost more than the globals.
    ex = tuple(
        [
            (a.dtype, a.shape, a.stride() or a.is_cpu)
            if type(a) is _T or type(a) in _TENSOR_TYPES
            else _exact_item(a)
            for a in args
        ]
    )
    if static:
        return _static_key(args, static, ex)
    last = _last
    if ex == last[0]:
        return last[1]
    k = _CALL_MEMO.get(ex)
    if k is None:
        k = _new_key(ex)
    _last = (ex, k)
    return k


def key_of_exact(ex: tuple) -> tuple:
    """The runtime key of a call from its :func:`exact_key` (memoised like :func:`runtime_key`)."""
    k = _CALL_MEMO.get(ex)
    if k is None:
        k = _new_key(ex)
    return k


def _new_key(ex: tuple) -> tuple:
    k = _from_exact(ex)
    if len(_CALL_MEMO) >= _MEMO_MAX:
        _CALL_MEMO.clear()
    _CALL_MEMO[ex] = k
    return k


def _static_key(args: Sequence[Any], static: Any, ex: tuple) -> tuple:
    st = static if isinstance(static, frozenset) else _normalise_static(static, len(args))
    if not st:
        return runtime_key(args)
    # The static values join the exact key (which already holds each argument's type, so 1,
    # 1.0 and True stay apart). A tensor marked static is keyed by its layout only: the memo
    # must never hold a reference to a tensor.
    n = len(args)
    vals = tuple([None if i >= n or _classify(args[i]) == 1 else args[i] for i in sorted(st)])
    full: tuple[Any, ...] | None = (ex, st, vals)
    try:
        k = _CALL_MEMO.get((ex, st, vals))
    except TypeError:  # an unhashable static value: _static_descriptor raises the clear error
        k = None
        full = None
    if k is None:
        k = tuple(
            [
                _static_descriptor(a) if i in st else (_tensor_desc(it) if type(it) is tuple else it)
                for i, (a, it) in enumerate(zip(args, ex))
            ]
        )
        if full is not None:
            if len(_CALL_MEMO) >= _MEMO_MAX:
                _CALL_MEMO.clear()
            _CALL_MEMO[full] = k
    return k


def clear_memos() -> None:
    """Forget every memoised key (tests and benchmarks use this to time the cold path)."""
    global _last
    _CALL_MEMO.clear()
    _TENSOR_MEMO.clear()
    _last = ((_NoTensor,), ())
