"""Caching precompile, then a new frame in the same module (tests/test_inductor.py's child for
Dynamo's caching precompile).

    python precompile_names.py FN[,FN...]      (TORCH_CACHING_PRECOMPILE=1 in the environment)

Compiles the named functions of this module in order; with ``CHILD_SAVE_ARTIFACTS=1`` saves the
caching-precompile packages at the end. ``f`` and ``g`` use builtins, so each compiled frame
installs a ``__builtins_dict___<n>`` global in this module. With ``CHILD_BREAK_INSTALL=1``, torch
fails to install a caching-precompile package the way torch 2.11 did on the H200 (see
``child.py``). Prints one JSON line: each function's outcome ("ok" or the error), ``ok`` (all of
them), Dynamo's package counters, the number of graphs compiled, whether caching precompile was
on, and kcache's counters of the process.
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
    if os.environ.get("CHILD_BREAK_INSTALL"):
        from child import break_install  # (this script's folder is on sys.path)

        break_install()
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

    out["ok"] = all(out[name] == "ok" for name in names)
    out["caching_precompile"] = bool(getattr(torch._dynamo.config, "caching_precompile", False))
    out["dynamo_cache"] = dict(counters["dynamo_cache"])
    out["unique_graphs"] = counters["stats"]["unique_graphs"]
    kcache = sys.modules.get("kcache")
    if kcache is not None and kcache.is_enabled():
        out["process"] = kcache.stats()["process"]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1].split(",")))
