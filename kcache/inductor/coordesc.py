"""A warm max-autotune start that stays warm: cached coordinate-descent winners, applied.

With ``mode="max-autotune"`` (or ``coordinate_descent_tuning``), Inductor tunes each Triton
kernel by coordinate descent at its first run and saves the winner in its autotune cache
(Inductor's ``.best_config`` files, and kind ``inductor-autotune`` in kcache's store) marked
``found_by_coordesc``. A process whose FX graph comes from a cache gets its kernels back as
"static autotuners" and asks the autotune cache again
(``CachingAutotuner.recheck_autotune_cache``). In torch 2.11 that recheck loses the winner in two
cases (pytorch/pytorch#172819; torch 2.13's recheck has neither):

- the kernel was compiled with one config: the hit is ignored;
- the winner is one of the compiled configs: it is kept, but without the ``found_by_coordesc``
  mark.

Either way the kernel's first run tunes again, and puts a new winner: seconds per warm process,
with Inductor's own warm folder as with kcache's store (seen on the H200, docs/benchmarks.md).

kcache wraps the recheck. After torch's own, when the cache answered "hit" and torch left one
config without the mark, it reads the cache once more (the configs it is given are those torch
hashed) and, when the winner was found by coordinate descent, applies it as the fixed torch does:
the matching compiled config gets the mark, or the winner is compiled. A torch that applies the
winner itself leaves nothing to do: the wrapper then reads nothing and changes nothing. An error
of torch's own functions called here (its autotune cache's read, a compile) leaves the kernel as
torch left it (it tunes again, as without kcache); an error of kcache's own code is a bug, met
at the fail-open boundary (:mod:`kcache.boundary`: one warning, or raised when strict).

Called from an import hook with ``torch._inductor.runtime.triton_heuristics``; imports nothing.
"""

from __future__ import annotations

import functools
from typing import Any

from ..boundary import guarded
from ..log import logger
from .attached import patches
from .torchcall import TorchRaised
from .torchcall import own as _torch  # torch's own functions (its autotune cache's read, a compile)

TOPIC, WHAT = "inductor-coordesc", "kcache's applying of a cached coordinate-descent config"


def on_import(mod: Any) -> None:
    cls = getattr(mod, "CachingAutotuner", None)
    original = getattr(cls, "recheck_autotune_cache", None)
    check = getattr(mod, "check_autotune_cache", None)
    hashable = getattr(mod, "triton_config_to_hashable", None)
    if original is None or check is None or hashable is None or patches.holds(cls, "recheck_autotune_cache"):
        return  # a torch without this path, or already wrapped

    @functools.wraps(original)
    def recheck_autotune_cache(self: Any, reload_kernel_from_src: Any) -> None:
        before = list(getattr(self, "compile_results", None) or ())
        original(self, reload_kernel_from_src)
        with guarded(TOPIC, WHAT):  # the edge (torch's recheck): a bug of kcache's, reported
            try:
                _apply_winner(self, before, reload_kernel_from_src, check, hashable)
            except TorchRaised as e:  # the kernel stays as torch left it: it tunes again
                logger.debug("torch.compile: cached coordinate-descent config not applied: %s", e)

    patches.wrap(cls, "recheck_autotune_cache", lambda _: recheck_autotune_cache)


def _apply_winner(
    self: Any, before: list[Any], reload_kernel_from_src: Any, check: Any, hashable: Any
) -> None:
    meta = getattr(self, "inductor_meta", None) or {}
    if not meta.get("coordinate_descent_tuning") or not before:
        return
    info = getattr(self, "autotune_cache_info", None) or {}
    results = self.compile_results
    if info.get("autotune_cache_state") != "hit" or len(results) != 1:
        return  # a miss (the first run tunes, rightly), or torch kept several configs
    if getattr(results[0].config, "found_by_coordesc", False):
        return  # torch applied the winner itself
    cached, _, _ = _torch(check, [r.config for r in before], self.filename, meta)
    if len(cached) != 1 or not getattr(cached[0], "found_by_coordesc", False):
        return  # plain autotuning's winner: coordinate descent starts from it, as torch means
    best = cached[0]
    want = _torch(hashable, best)
    for result in before:
        if _torch(hashable, result.config) == want:
            result.config.found_by_coordesc = True
            self.compile_results = [result]
            break
    else:  # found by coordinate descent after the kernel was saved: compile it now
        if getattr(self.fn, "fn", None) is None:
            self.fn = _torch(reload_kernel_from_src).fn
        self.compile_results = [_torch(self._precompile_config, best)]
    logger.debug(
        "torch.compile: applied the cached coordinate-descent config of %s",
        meta.get("kernel_name", "a kernel"),
    )
