"""The environment variables that the recorder (:mod:`.record`) and the runner (:mod:`.runner`)
both read: Triton's cache-invalidating variables, and the marker of a prewarm worker process.

Its own module so that neither of the two imports the other. The recorder is loaded in every
``KCACHE=1`` process that imports Triton: this module imports nothing but ``os`` (Triton is
imported only when :func:`current_invalidating_env` is called).
"""

from __future__ import annotations

import os
from typing import Any

#: Set in a prewarm's own processes (and in the prewarm itself while it runs inline):
#: ``KCACHE_RECORD`` is for programs, a prewarm does not record itself.
WORKER_ENV = "KCACHE_PREWARM_WORKER"

#: Not in Triton's list, but in its key all the same: read at import into the ``debug`` option.
EXTRA_ENV = ("TRITON_DEBUG",)
#: Unset before Triton is imported when a spec's env does not name them (Triton reads some at
#: import); after the import, Triton's own list decides. Triton 3.6-3.9's list, and EXTRA_ENV.
KNOWN_ENV = EXTRA_ENV + (
    "TRITON_DEFAULT_FP_FUSION", "TRITON_DISABLE_LINE_INFO", "TRITON_F32_DEFAULT", "TRITON_OVERRIDE_ARCH",
    "TRITON_ENABLE_ASAN", "TRITON_ENABLE_LLVM_DEBUG", "TRITON_LLVM_DEBUG_ONLY", "TRITON_DUMP_MIR",
    "TRITON_ENABLE_EXPERIMENTAL_CONSAN", "TRITON_FORCE_DISABLE_FP_FUSION", "DISABLE_LLVM_OPT",
    "DISABLE_PTXAS_OPT", "DISABLE_MMA_V3", "DISABLE_MMA_V5", "LLVM_IR_ENABLE_DUMP", "MLIR_ENABLE_DUMP",
    "NVPTX_ENABLE_DUMP", "USE_IR_LOC",
)  # fmt: skip


def env_vars_function() -> Any:
    """Triton's ``get_cache_invalidating_env_vars`` (libtriton in 3.4-3.9; ``triton.runtime.cache``
    in some builds), or None without Triton."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        return get_cache_invalidating_env_vars
    except Exception:
        pass
    try:
        from triton.runtime.cache import get_cache_invalidating_env_vars  # type: ignore[attr-defined]

        return get_cache_invalidating_env_vars
    except Exception:
        return None


def current_invalidating_env() -> dict[str, str]:
    """The variables of this process that are in Triton's key: those Triton lists (as it reports
    them) and :data:`EXTRA_ENV`. Imports Triton."""
    fn = env_vars_function()
    out = {k: str(v) for k, v in (fn() if fn is not None else {}).items()}
    for k in EXTRA_ENV:
        if os.environ.get(k):
            out[k] = os.environ[k]
    return out
