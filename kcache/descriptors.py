"""Moved to :mod:`kcache.nvfuser.descriptors`; kept here for the public names.

``kcache.descriptors.compute_tensor_descriptor`` and ``kcache.descriptors.runtime_key`` are part
of kcache's public contract, so this module re-exports the public names of
:mod:`kcache.nvfuser.descriptors` (the same objects, not copies). The memos and the module's other
state live there: code inside kcache, tests and tools import :mod:`kcache.nvfuser.descriptors`.
Importing this module imports neither torch nor nvFuser.
"""

from __future__ import annotations

from kcache.nvfuser.descriptors import (
    SequenceDescriptor,
    StaticDescriptor,
    TensorDescriptor,
    clear_memos,
    compute_tensor_descriptor,
    exact_key,
    key_of_exact,
    runtime_key,
    tensor_descriptor,
)

__all__ = [
    "SequenceDescriptor",
    "StaticDescriptor",
    "TensorDescriptor",
    "clear_memos",
    "compute_tensor_descriptor",
    "exact_key",
    "key_of_exact",
    "runtime_key",
    "tensor_descriptor",
]
