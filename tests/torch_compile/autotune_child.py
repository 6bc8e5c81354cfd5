"""Inductor's autotune cache driven through torch's own code, in a process of its own.

``save``: torch's ``AutotuneCache.save`` keeps one result per kernel of :data:`KERNELS` (its remote
cache is kcache's store when ``KCACHE=1``); ``read``: torch's ``AutotuneCache.read_best`` for each,
as a kernel's first run asks. Prints one JSON line: per kernel the config torch would use (or
null, or the exception it raised), and kcache's counters for ``inductor-autotune``.

Inductor writes no autotune results on a machine without a GPU (its CPU kernels are not tuned),
so the results are made by the very functions a GPU run calls, with configs shaped as
Inductor's heuristics make them.
"""

from __future__ import annotations

import hashlib
import json
import sys

# name -> (the compiled configs [kwargs, num_warps, num_stages], the saved winner, found by coordesc)
KERNELS = {
    "plain": ([[{"XBLOCK": 64}, 4, 1], [{"XBLOCK": 128}, 4, 1], [{"XBLOCK": 256}, 8, 1]], 1, False),
    "reduction": (
        [[{"XBLOCK": 1, "R0_BLOCK": 2048}, 16, 1], [{"XBLOCK": 8, "R0_BLOCK": 128}, 4, 1]],
        0,
        False,
    ),
    "coordesc": ([[{"XBLOCK": 128}, 4, 1]], [{"XBLOCK": 512}, 16, 1], True),
}
HOSTILE = 8  # kernels "h0".."h7": results like "plain", for tests to replace


def _all() -> dict:
    out = dict(KERNELS)
    for i in range(HOSTILE):
        out[f"h{i}"] = KERNELS["plain"]
    return out


def main() -> None:
    from torch._inductor.runtime.autotune_cache import AutotuneCache, inductor_meta_from_config
    from torch._inductor.runtime.runtime_utils import cache_dir, triton_hash_to_path_key
    from torch._inductor.runtime.triton_compat import Config
    from torch._inductor.runtime.triton_heuristics import hash_configs

    import kcache

    mode = sys.argv[1]
    out: dict = {}
    for n, (name, (configs, best, coordesc)) in enumerate(sorted(_all().items())):
        cfgs = [Config(dict(kw), num_warps=w, num_stages=s) for kw, w, s in configs]
        meta = inductor_meta_from_config()
        # no GPU driver here: the backend hash a GPU machine would have (part of torch's key)
        meta.update(backend_hash="f" * 64, coordinate_descent_tuning=coordesc)
        cache = AutotuneCache.create(meta, f"{cache_dir()}/{name[:2]}/c{name}kernel.py", hash_configs(cfgs))
        assert cache is not None and cache.remote_cache is not None, "no remote autotune cache"
        if mode == "save":
            win = (
                cfgs[best]
                if isinstance(best, int)
                else Config(dict(best[0]), num_warps=best[1], num_stages=best[2])
            )
            # time_taken_ms tells the entries apart (n+1 ms): tests find a kernel's entry by it
            # the winner's Triton cache key, in the form Inductor records it (launcher.cache_hash)
            triton_hash = triton_hash_to_path_key(hashlib.sha256(name.encode()).hexdigest())
            cache.save(
                win, (n + 1) * 1_000_000 + 7, found_by_coordesc=coordesc, triton_cache_hash=triton_hash
            )
            out[name] = n + 1
            continue
        try:
            got = cache.read_best(meta, cfgs)
            out[name] = (
                None
                if got is None
                else {
                    "kwargs": got.kwargs,
                    "num_warps": got.num_warps,
                    "num_stages": got.num_stages,
                    "found_by_coordesc": bool(getattr(got, "found_by_coordesc", False)),
                }
            )
        except Exception as e:
            out[name] = {"raised": f"{type(e).__name__}: {e}"}
    store = kcache.active_store()
    for tier in getattr(store, "tiers", ()):  # the shared tier's queued writes (a bad entry's drop) done
        tier.flush(60)
    counts = kcache.stats()["process"].get("inductor-autotune", {}) if kcache.is_enabled() else {}
    print(json.dumps({"results": out, "counts": counts}))


if __name__ == "__main__":
    main()
