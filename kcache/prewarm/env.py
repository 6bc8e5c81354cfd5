"""The environment variables that the recorder (:mod:`.record`) and the runner (:mod:`.runner`)
both read: Triton's cache-invalidating variables, and the marker of a prewarm worker process.

Its own module so that neither of the two imports the other. The recorder is loaded in every
``KCACHE=1`` process that imports Triton: this module imports nothing heavy (Triton is imported
only when :func:`current_invalidating_env` is called). Which variables are in Triton's key is
read in one place, :func:`kcache.fingerprint.triton_env` (``kcache fingerprint`` shows them too).
"""

from __future__ import annotations

from ..fingerprint import TRITON_EXTRA_ENV as EXTRA_ENV
from ..fingerprint import triton_env as current_invalidating_env
from ..fingerprint import triton_env_lister as env_vars_function

__all__ = ["EXTRA_ENV", "KNOWN_ENV", "WORKER_ENV", "current_invalidating_env", "env_vars_function"]

#: Set in a prewarm's own processes (and in the prewarm itself while it runs inline):
#: ``KCACHE_RECORD`` is for programs, a prewarm does not record itself.
WORKER_ENV = "KCACHE_PREWARM_WORKER"
#: Unset before Triton is imported when a spec's env does not name them (Triton reads some at
#: import); after the import, Triton's own list decides. Triton 3.6-3.9's list, and EXTRA_ENV.
KNOWN_ENV = EXTRA_ENV + (
    "TRITON_DEFAULT_FP_FUSION", "TRITON_DISABLE_LINE_INFO", "TRITON_F32_DEFAULT", "TRITON_OVERRIDE_ARCH",
    "TRITON_ENABLE_ASAN", "TRITON_ENABLE_LLVM_DEBUG", "TRITON_LLVM_DEBUG_ONLY", "TRITON_DUMP_MIR",
    "TRITON_ENABLE_EXPERIMENTAL_CONSAN", "TRITON_FORCE_DISABLE_FP_FUSION", "DISABLE_LLVM_OPT",
    "DISABLE_PTXAS_OPT", "DISABLE_MMA_V3", "DISABLE_MMA_V5", "LLVM_IR_ENABLE_DUMP", "MLIR_ENABLE_DUMP",
    "NVPTX_ENABLE_DUMP", "USE_IR_LOC",
)  # fmt: skip
