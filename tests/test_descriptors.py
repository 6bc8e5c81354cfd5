"""kcache.nvfuser.descriptors: nvFuser-exact tensor descriptors and the per-call runtime key.

The module never imports torch, and the tests of its algorithm need none: those with real tensors
are marked and skip when torch is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcache.nvfuser import descriptors as D
from kcache.nvfuser.descriptors import (
    SequenceDescriptor,
    StaticDescriptor,
    TensorDescriptor,
    compute_tensor_descriptor,
    exact_key,
    runtime_key,
    tensor_descriptor,
)

if importlib.util.find_spec("torch") is not None:
    import torch
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

VECTORS = Path(__file__).parent / "data" / "nvfuser_descriptor_vectors.json"
CASES = json.loads(VECTORS.read_text())["cases"]


def _strict_equal(got: object, want: object) -> bool:
    """Equal *and* of the same types all the way down (True == 1 must not pass)."""
    if type(got) is not type(want):
        return False
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_strict_equal(g, w) for g, w in zip(got, want))
    return got == want


# ---------------------------------------------------------------------------------------------
# compute_tensor_descriptor against nvFuser's own output


def test_vectors_file_shape():
    assert len(CASES) == 704
    assert sum("error" in c for c in CASES) == 1


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{c['origin']}" for i, c in enumerate(CASES)])
def test_nvfuser_vectors(case):
    if "error" in case:
        with pytest.raises(ValueError, match="negative stride"):
            compute_tensor_descriptor(case["sizes"], case["strides"])
        return
    got = compute_tensor_descriptor(case["sizes"], case["strides"])
    assert type(got) is tuple and len(got) == 2
    assert _strict_equal(got[0], case["contiguity"]), (case, got)
    assert _strict_equal(got[1], case["stride_order"]), (case, got)


@needs_torch
def test_vectors_through_torch_size_and_tuples():
    # torch hands out torch.Size and tuples; results must not depend on the container type.
    for case in CASES:
        if "error" in case:
            continue
        got = compute_tensor_descriptor(torch.Size(case["sizes"]), tuple(case["strides"]))
        assert _strict_equal(list(got), [case["contiguity"], case["stride_order"]])


def test_errors():
    with pytest.raises(ValueError, match=r"strides\[1\]=-1"):
        compute_tensor_descriptor([2, 3, 4], [12, -1, 1])
    with pytest.raises(ValueError, match="same number of dimensions"):
        compute_tensor_descriptor([2, 3], [1])
    assert compute_tensor_descriptor([], []) == ([], [])


def _nvfuser_literal(sizes, strides):
    """nvFuser's algorithm transcribed step by step (insert stride-0 dims, then one pass),
    a second, independent oracle for random layouts."""
    n = len(sizes)
    dims = [{"i": i, "size": sizes[i], "stride": strides[i]} for i in range(n)]
    nonzero = sorted([d for d in dims if d["stride"] != 0], key=lambda d: -d["stride"])
    for d in [d for d in dims if d["stride"] == 0]:
        nonzero.insert(d["i"], d)
    for d in nonzero:
        d["contig"] = None

    def bcast(d):
        return d["stride"] == 0 or d["size"] == 1

    i = 0
    while i < n:
        nonzero[i]["order"] = n - 1 - i
        if not bcast(nonzero[i]):
            left = i
            i += 1
            expected = 1
            while i < n:
                nonzero[i]["order"] = n - 1 - i
                if not bcast(nonzero[i]):
                    expected = nonzero[i]["stride"] * nonzero[i]["size"]
                    break
                i += 1
            nonzero[left]["contig"] = nonzero[left]["stride"] == expected
        else:
            i += 1
    order = [0] * n
    for d in nonzero:
        order[d["i"]] = d["order"]
    return [d["contig"] for d in nonzero], order


layouts = st.integers(0, 6).flatmap(
    lambda n: st.tuples(
        st.lists(st.sampled_from([0, 1, 1, 2, 3, 5, 8]), min_size=n, max_size=n),
        st.lists(st.sampled_from([0, 0, 1, 1, 2, 3, 4, 6, 8, 12, 24, 40]), min_size=n, max_size=n),
    )
)


@settings(max_examples=400, deadline=None)
@given(layouts)
def test_matches_literal_transcription(layout):
    sizes, strides = layout
    assert _strict_equal(
        list(compute_tensor_descriptor(sizes, strides)), list(_nvfuser_literal(sizes, strides))
    )


@needs_torch
def test_size_one_stride_changes_stride_order():
    # torch ignores the stride of a size-1 dim for is_contiguous(); nvFuser sorts by it.
    a = torch.empty_strided((4, 1), (1, 1))
    b = torch.empty_strided((4, 1), (1, 4))
    assert a.is_contiguous() and b.is_contiguous()
    assert compute_tensor_descriptor(a.shape, a.stride()) == ([True, None], [1, 0])
    assert compute_tensor_descriptor(b.shape, b.stride()) == ([None, True], [0, 1])
    assert runtime_key([a]) != runtime_key([b])


# ---------------------------------------------------------------------------------------------
# runtime_key on real tensors


#: name -> a tensor of that layout, made when the test runs (collection needs no torch)
VARIETY = {
    "contiguous": lambda: torch.randn(4, 6, 8),
    "permuted": lambda: torch.randn(4, 6, 8).permute(2, 0, 1),
    "transposed": lambda: torch.randn(4, 6, 8).transpose(1, 2),
    "expanded": lambda: torch.randn(4, 1, 8).expand(4, 5, 8),
    "sliced": lambda: torch.randn(4, 6, 8)[:, 1:5, ::2],
    "narrow_last": lambda: torch.randn(4, 6, 8)[..., :3],
    "channels_last": lambda: torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last),
    "size1": lambda: torch.randn(4, 1, 8),
    "size1_middle_odd_stride": lambda: torch.empty_strided((4, 1, 8), (8, 100, 1)),
    "zero_stride": lambda: torch.empty_strided((3, 4), (0, 1)),
    "all_zero_stride": lambda: torch.empty_strided((3, 4), (0, 0)),
    "scalar_cpu": lambda: torch.tensor(3.0),
    "scalar_meta": lambda: torch.empty((), device="meta"),
    "vector": lambda: torch.arange(7),
    "empty": lambda: torch.empty(0, 3),
    "bool": lambda: torch.zeros(2, 3, dtype=torch.bool),
    "half_t": lambda: torch.zeros(3, 5, dtype=torch.float16).t(),
}


@needs_torch
@pytest.mark.parametrize("name", list(VARIETY))
def test_runtime_key_agrees_with_compute_tensor_descriptor(name):
    t = VARIETY[name]()
    (k,) = runtime_key([t])
    assert type(k) is TensorDescriptor
    contig, order = compute_tensor_descriptor(list(t.shape), list(t.stride()))
    assert k.contiguity == tuple(contig)
    assert k.stride_order == tuple(order)
    assert k.dtype is t.dtype
    assert k.shape == tuple(1 if s == 1 else -1 for s in t.shape)
    assert k.cpu_scalar == (t.dim() == 0 and t.device.type == "cpu")
    assert tensor_descriptor(t) == k


@needs_torch
def test_same_layout_any_sizes_equal_keys():
    a = torch.randn(4, 6, 8)
    b = torch.randn(9, 2, 3)
    assert runtime_key([a]) == runtime_key([b])
    assert runtime_key([a.permute(2, 0, 1)]) == runtime_key([b.permute(2, 0, 1)])
    assert runtime_key([a[:, :, :3]]) == runtime_key([b[:, :, :2]])
    cl1 = torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last)
    cl2 = torch.randn(7, 4, 9, 3).to(memory_format=torch.channels_last)
    assert runtime_key([cl1, 1.0]) == runtime_key([cl2, 2.5])
    assert runtime_key([torch.randn(3, 1, 4).expand(3, 7, 4)]) == runtime_key(
        [torch.randn(5, 1, 2).expand(5, 2, 2)]
    )


@needs_torch
def test_different_layouts_different_keys():
    a = torch.randn(4, 6, 8)
    keys = {
        "base": runtime_key([a]),
        "order": runtime_key([a.permute(0, 2, 1).contiguous().permute(0, 2, 1)]),
        "dtype": runtime_key([a.double()]),
        "broadcast": runtime_key([torch.randn(4, 1, 8)]),
        "expanded": runtime_key([torch.randn(4, 1, 8).expand(4, 6, 8)]),
        "noncontig": runtime_key([a[:, :, ::2]]),
        "rank": runtime_key([torch.randn(4, 6)]),
    }
    assert len(set(keys.values())) == len(keys), keys
    # a 0-dim tensor: CPU (a scalar to nvFuser) vs another device
    assert runtime_key([torch.tensor(1.0)]) != runtime_key([torch.empty((), device="meta")])
    assert runtime_key([torch.tensor(1.0)]) != runtime_key([torch.tensor(1.0, dtype=torch.float64)])
    assert runtime_key([torch.tensor(1.0)]) == runtime_key([torch.tensor(5.0)])
    # rank-1+ tensors are not keyed by device (the definition does not depend on it)
    assert runtime_key([torch.randn(2, 3)]) == runtime_key([torch.empty(5, 7, device="meta")])
    # argument order matters
    assert runtime_key([a, 1]) != runtime_key([1, a])


def test_scalars_and_sequences():
    k = runtime_key([1, 2.0, True, 1j, None, "s", [1, 2], (3.0,)])
    assert k[:6] == (int, float, bool, complex, type(None), str)
    assert k[6] == SequenceDescriptor(list, 2, (int, int))
    assert k[7] == SequenceDescriptor(tuple, 1, (float,))
    assert runtime_key([1]) == runtime_key([7])
    assert runtime_key([1]) != runtime_key([True]) != runtime_key([1.0])
    assert runtime_key([[1, 2]]) != runtime_key([[1, 2, 3]])


@needs_torch
def test_dtype_arguments_are_keyed_by_type():
    assert runtime_key([torch.float32]) == runtime_key([torch.float16]) == (torch.dtype,)


@needs_torch
def test_static_positions():
    a = torch.randn(3, 4)
    assert runtime_key([a, 2], static=[1]) == runtime_key([torch.randn(5, 6), 2], static=[1])
    assert runtime_key([a, 2], static=[1]) != runtime_key([a, 3], static=[1])
    assert runtime_key([a, 2], static=[1])[1] == StaticDescriptor(int, 2)
    # equal values of different types stay apart (1 == 1.0 == True in Python)
    ks = {runtime_key([a, v], static=[1]) for v in (1, 1.0, True)}
    assert len(ks) == 3
    assert runtime_key([a, "gelu"], static=[-1]) != runtime_key([a, "relu"], static=[-1])
    assert runtime_key([a, 2, 9], static=(1,))[2] is int  # position 2 is not static
    # a tensor at a static position is keyed by its layout, and not kept alive by the memo
    assert runtime_key([a], static=[0]) == runtime_key([a])
    with pytest.raises(TypeError, match="hashable"):
        runtime_key([a, [1, 2], {}], static=[2])
    with pytest.raises(TypeError):
        runtime_key([a], static=["x"])


@needs_torch
def test_static_memo_does_not_hold_tensors():
    import gc
    import weakref

    t = torch.randn(3, 3)
    ref = weakref.ref(t)
    runtime_key([t, 4], static=[0, 1])
    runtime_key([t, 4], static=[0, 1])
    del t
    gc.collect()
    assert ref() is None


class _Duck:
    """A tensor-like that is not a torch tensor (duck typing, no torch involved)."""

    def __init__(self, dtype, shape, strides, device="cuda"):
        self.dtype, self.shape, self._strides = dtype, list(shape), list(strides)
        self.device = type("Dev", (), {"type": device})()

    def stride(self):
        return self._strides


def test_duck_typed_tensors():
    k = runtime_key([_Duck("f32", [2, 3], [3, 1]), _Duck("f32", [], [], "cpu"), _Duck("f32", [], [])])
    assert k[0] == TensorDescriptor("f32", (-1, -1), (True, True), (1, 0), False)
    assert k[1].cpu_scalar is True and k[2].cpu_scalar is False
    assert runtime_key([_Duck("f32", [4, 5], [5, 1])])[0] == k[0]
    with pytest.raises(ValueError, match="negative stride"):
        runtime_key([_Duck("f32", [2, 3], [-3, 1])])


# ---------------------------------------------------------------------------------------------
# the memo


def _cold(args):
    D.clear_memos()
    return D.runtime_key(args)


@needs_torch
@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(1, 4), min_size=0, max_size=4),
            st.permutations(range(4)),
            st.sampled_from(["float32", "float16", "int64"]),
            st.booleans(),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_memo_equals_cold_path(specs):
    args = []
    for sizes, perm, dtype, expand, slice_dim in specs:
        t = torch.zeros(sizes, dtype=getattr(torch, dtype))
        if len(sizes) > 1:
            t = t.permute(*[p for p in perm if p < len(sizes)])
        if expand and len(sizes) and t.shape[0] == 1:
            t = t.expand(3, *t.shape[1:])
        if slice_dim < t.dim() and t.shape[slice_dim] > 1:
            t = t.narrow(slice_dim, 0, t.shape[slice_dim] - 1)
        args.append(t)
        args.append(len(args))
    warm1 = runtime_key(args)
    warm2 = runtime_key(args)
    cold = _cold(args)
    assert warm1 == warm2 == cold
    assert runtime_key(args) == cold  # served by the memo the cold call filled
    for t, k in zip(args[::2], cold[::2]):
        c, o = compute_tensor_descriptor(list(t.shape), list(t.stride()))
        assert (k.contiguity, k.stride_order) == (tuple(c), tuple(o))


@needs_torch
def test_memo_is_bounded_and_stays_correct():
    D.clear_memos()
    ts = [torch.empty(i + 1, 3, device="meta") for i in range(D._MEMO_MAX + 50)]
    for t in ts:
        runtime_key([t])
    assert len(D._CALL_MEMO) <= D._MEMO_MAX
    assert len(D._TENSOR_MEMO) <= D._MEMO_MAX
    for t in ts[:10] + ts[-10:]:
        assert runtime_key([t]) == _cold([t])


@needs_torch
def test_most_recent_key_is_not_confused():
    a, b = torch.randn(3, 4), torch.randn(3, 4).t()
    ka, kb = _cold([a]), _cold([b])
    for _ in range(3):
        assert runtime_key([a]) == ka
        assert runtime_key([a]) == ka
        assert runtime_key([b]) == kb
    assert exact_key([a]) != exact_key([b])
    assert exact_key([a]) == exact_key([torch.randn(3, 4)])


def test_no_torch_at_import():
    heavy = ("torch", "nvfuser", "nvfuser_direct", "triton", "msgpack", "kcache.nvfuser.kerneldb")
    code = (
        "import sys, kcache.descriptors, kcache.nvfuser.descriptors, kcache.nvfuser; "
        f"bad = [m for m in {heavy!r} if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parent.parent
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_public_names_stay_at_kcache_descriptors():
    """``kcache.descriptors`` (the public contract's module) re-exports the very same objects."""
    import kcache.descriptors as public

    assert public.compute_tensor_descriptor is compute_tensor_descriptor
    assert public.runtime_key is runtime_key
    assert set(public.__all__) >= set(D.__all__)
    assert all(getattr(public, name) is getattr(D, name) for name in public.__all__)


@needs_torch
def test_key_of_exact_equals_runtime_key():
    args = [torch.randn(3, 4).t(), 2, torch.tensor(1.0), [1.0, 2.0], torch.randn(2, 1, 3)]
    D.clear_memos()
    assert D.key_of_exact(exact_key(args)) == runtime_key(args) == _cold(args)
    D.clear_memos()
    assert D.key_of_exact(exact_key(args)) == _cold(args)
