"""The environment variables that the recorder (:mod:`.record`) and the runner (:mod:`.runner`)
both read: Triton's cache-invalidating variables, and the marker of a prewarm worker process.

Its own module so that neither of the two imports the other. The recorder is loaded in every
``KCACHE=1`` process that imports Triton: this module imports nothing heavy (Triton is imported
only when :func:`current_invalidating_env` is called). Which variables are in Triton's key is
read in one place, :func:`kcache.triton.identity.triton_env` (``kcache fingerprint`` shows them too).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping

from ..triton.identity import TRITON_EXTRA_ENV as EXTRA_ENV
from ..triton.identity import triton_env as current_invalidating_env
from ..triton.identity import triton_env_lister as env_vars_function

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


@contextlib.contextmanager
def applied_env(env: Mapping[str, str]) -> Iterator[list[str]]:
    """Set ``env`` and unset Triton's other cache-invalidating variables; restore afterwards.
    The spec's values are set before Triton is imported here (it reads some at import)."""
    saved = dict(os.environ)
    try:
        unset = [k for k in KNOWN_ENV if k in os.environ and k not in env]
        for k in unset:
            os.environ.pop(k, None)
        os.environ.update(env)
        more = [k for k in current_invalidating_env() if k not in env]
        for k in more:
            os.environ.pop(k, None)
        yield sorted(set(unset) | set(more))
    finally:
        for k in [k for k in os.environ if k not in saved]:
            os.environ.pop(k, None)
        for k, v in saved.items():
            if os.environ.get(k) != v:
                os.environ[k] = v


@contextlib.contextmanager
def env_set(name: str, value: str) -> Iterator[None]:
    """``name`` set to ``value`` for the block (a prewarm run inline marks itself a worker)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def env_key(env: Mapping[str, str]) -> str:
    """One environment as a stable string: items with equal keys share a worker group."""
    return json.dumps(dict(sorted(env.items())))
