"""Caching precompile, then a new frame in the same module (a transparency test's child).

    python precompile_names.py FN[,FN...]      (TORCH_CACHING_PRECOMPILE=1 in the environment)

Compiles the named functions of this module in order; with ``CHILD_SAVE_ARTIFACTS=1`` saves the
caching-precompile packages at the end. ``f`` and ``g`` use builtins, so each compiled frame
installs a ``__builtins_dict___<n>`` global in this module. Prints one JSON line: each function's
outcome ("ok" or the error) and Dynamo's package counters.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def f(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) + len(x.shape) + abs(x.sum())


def g(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) + len(x.shape) + abs(x.mean())


def main(names: list[str]) -> int:
    x = torch.randn(8, 4)
    out: dict = {}
    for name in names:
        fn = globals()[name]
        try:
            got = torch.compile(fn)(x)
            out[name] = "ok" if torch.allclose(got, fn(x), atol=1e-5) else "wrong result"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {str(e).strip()[:200]}"
    if os.environ.get("CHILD_SAVE_ARTIFACTS"):
        torch.compiler.save_cache_artifacts()
    from torch._dynamo.utils import counters

    out["dynamo_cache"] = dict(counters["dynamo_cache"])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1].split(",")))
