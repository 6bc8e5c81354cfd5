"""What changes Triton's key: backend options and the cache-invalidating environment variables.

The tests compile one kernel under each variation and check that kcache misses (never serves a
kernel built under other settings). The lists are checked against the installed Triton: every
field of its CUDA options class must be covered here (or named with the reason it is not), and
the environment variables are the ones Triton itself lists as cache-invalidating.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

#: A changed value for each CUDA backend option (field of ``CUDAOptions``), 3.4-3.9.
OPTION_CHANGES: dict[str, Any] = {
    "num_warps": 8,
    "num_ctas": 2,
    "num_stages": 2,
    "warp_size": 64,
    "maxnreg": 128,
    "ptx_version": 84,
    "ptx_options": "--warn-on-spills",
    "enable_fp_fusion": "flip",
    "enable_reflect_ftz": False,
    "launch_cooperative_grid": True,
    "launch_pdl": True,
    "supported_fp8_dtypes": ("fp8e5",),
    "deprecated_fp8_dot_operand_dtypes": ("fp8e5",),
    "default_dot_input_precision": "ieee",
    "allowed_dot_input_precisions": ("ieee",),
    "extern_libs": "modified-libdevice",  # a libdevice copy with other bytes: hashed by content
    "debug": True,
    "backend_name": "cuda-other",
    "sanitize_overflow": False,
    "arch": "sm80",
    "instrumentation_mode": "consan",
    "ir_override": "ttir-file",  # the kernel's own TTIR, from a file
    # 3.4
    "cluster_dims": (2, 1, 1),
    # 3.7+
    "sched4reg": True,
    "fpsan_homomorphic_casts": True,
    "min_shared_mem": 1024,
    "clc": True,
}

#: Options a user cannot change (Triton overwrites them): the key stays the same, a hit is right.
NOT_SETTABLE = {
    "max_num_imprecise_acc_default": "parse_options sets it from the arch, whatever is passed",
}

#: Options Triton rejects for this target before it computes a key (no lookup happens).
REJECTED_ON_SM90 = {"clc": "clc=True requires SM100+ (parse_options raises for sm_90)"}

#: Names Triton has listed as cache-invalidating in 3.4-3.9 (the tests keep those the installed
#: Triton lists: ``get_cache_invalidating_env_vars()`` with all of them set).
ENV_CANDIDATES = [
    "ALLOW_LHS_TMEM_LAYOUT_CONVERSION",
    "AMDGCN_ENABLE_DUMP",
    "AMDGCN_USE_BUFFER_ATOMICS",
    "AMDGCN_USE_BUFFER_OPS",
    "DISABLE_FAST_REDUCTION",
    "DISABLE_LLVM_OPT",
    "DISABLE_MMA_V3",
    "DISABLE_MMA_V5",
    "DISABLE_PTXAS_OPT",
    "LLVM_ENABLE_TIMING",
    "LLVM_EXTRACT_DI_LOCAL_VARIABLES",
    "LLVM_IR_ENABLE_DUMP",
    "LLVM_PASS_PLUGIN_PATH",
    "MLIR_DISABLE_MULTITHREADING",
    "MLIR_DUMP_PATH",
    "MLIR_ENABLE_DIAGNOSTICS",
    "MLIR_ENABLE_DUMP",
    "MLIR_ENABLE_TIMING",
    "NVPTX_ENABLE_DUMP",
    "TRITON_CONSAN_INIT_ALLOCATIONS",
    "TRITON_DEFAULT_FP_FUSION",
    "TRITON_DISABLE_LINE_INFO",
    "TRITON_DISABLE_RESHAPE_ENCODING_INFERENCE",
    "TRITON_DUMP_MIR",
    "TRITON_ENABLE_ASAN",
    "TRITON_ENABLE_EXPERIMENTAL_CONSAN",
    "TRITON_ENABLE_LLVM_DEBUG",
    "TRITON_F32_DEFAULT",
    "TRITON_FORCE_DISABLE_FP_FUSION",
    "TRITON_HIP_GLOBAL_PREFETCH",
    "TRITON_HIP_LOCAL_PREFETCH",
    "TRITON_HIP_USE_ASYNC_COPY",
    "TRITON_HIP_USE_BLOCK_PINGPONG",
    "TRITON_HIP_USE_COEXEC_SCHEDULER",
    "TRITON_HIP_USE_EXPERT_SCHEDULING",
    "TRITON_HIP_USE_IN_THREAD_TRANSPOSE",
    "TRITON_LLVM_DEBUG_ONLY",
    "TRITON_OVERRIDE_ARCH",
    "TRITON_PARTITION_SCHEDULING_DUMP_DATA_ONLY",
    "TRITON_PARTITION_SCHEDULING_DUMP_LOOP_ONLY",
    "TRITON_PARTITION_SCHEDULING_ENABLE_DUMP_DOT",
    "TRITON_PLUGIN_PATHS",
    "TRITON_PLUGIN_VERSION_CHECK",
    "USE_IR_LOC",
    "USE_TTGIR_LOC",
]


def env_value(name: str, tmp: str) -> str:
    """A value for ``name`` that differs from its default (compiling may still fail: the lookup
    happens first, which is what the tests check)."""
    special = {
        "MLIR_DUMP_PATH": os.path.join(tmp, "mlir-dump"),
        "TRITON_DUMP_MIR": os.path.join(tmp, "mir-dump"),
        "LLVM_PASS_PLUGIN_PATH": os.path.join(tmp, "no-such-plugin.so"),
        "TRITON_PLUGIN_PATHS": os.path.join(tmp, "no-such-plugin.so"),
        "TRITON_OVERRIDE_ARCH": "sm80",
        "USE_IR_LOC": "ttir",
        "USE_TTGIR_LOC": "1",
        "TRITON_F32_DEFAULT": "ieee",
        "TRITON_LLVM_DEBUG_ONLY": "tritongpu-coalesce",
        "TRITON_DEFAULT_FP_FUSION": "0",
        "AMDGCN_USE_BUFFER_OPS": "0",
        "AMDGCN_USE_BUFFER_ATOMICS": "0",
    }
    return special.get(name, "1")


def listed_env_vars() -> list[str]:
    """The candidates that the installed Triton lists as cache-invalidating (call it in a process
    whose environment may be changed)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    saved = {n: os.environ.get(n) for n in ENV_CANDIDATES}
    try:
        for n in ENV_CANDIDATES:
            os.environ[n] = env_value(n, "/nonexistent")
        listed = sorted(get_cache_invalidating_env_vars())
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v
    return listed


def options_fields() -> list[str]:
    """The fields of the installed Triton's CUDA options class."""
    from triton.backends.nvidia.compiler import CUDAOptions

    return [f.name for f in dataclasses.fields(CUDAOptions)]


def option_value(name: str, tmp: str) -> Any:
    """The concrete changed value for option ``name`` (files it needs are made under ``tmp``)."""
    value = OPTION_CHANGES[name]
    if value == "flip":
        import triton.knobs as knobs

        return not bool(getattr(knobs.language, "default_fp_fusion", True))
    if value == "modified-libdevice":
        import shutil

        from triton.backends.nvidia.compiler import CUDAOptions

        src = dict(CUDAOptions(arch="sm90").extern_libs)["libdevice"]
        dst = os.path.join(tmp, "libdevice-modified.bc")
        shutil.copyfile(src, dst)
        with open(dst, "ab") as f:
            f.write(b"\0\0\0\0")
        return {"libdevice": dst}
    if value == "ttir-file":
        return os.path.join(tmp, "add_kernel.ttir")
    return value
