"""Run in a fresh process: Triton's key with kcache's memo and without it, and who sees the memo.

    python -m kernels.keyprobe [--torch] [--enable-late DIR]

Prints one JSON line: both keys, how often libtriton was hashed by the memo (0: the digest came
from the store), timings, and which modules that bind ``triton_key`` by name got the memo.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--torch", action="store_true", help="also import torch's Inductor modules first")
    p.add_argument("--enable-late", default=None, help="import first, then kcache.enable(dir)")
    a = p.parse_args()
    out: dict[str, Any] = {}
    if a.torch:
        try:
            import torch._inductor.codecache  # noqa: F401
            import torch._inductor.runtime.triton_compat  # noqa: F401
        except Exception as e:
            out["torch_error"] = repr(e)
    import triton.runtime.autotuner as autotuner

    from kernels.compat import triton_key_module

    cache_mod = triton_key_module()

    import kcache

    if a.enable_late:
        assert not kcache.is_enabled()
        out["late_enabled"] = kcache.enable(dir=a.enable_late)
    from kcache.triton import keymemo

    hashed: list[str] = []
    real_sha = keymemo.sha256_file

    def counting_sha(path: str) -> str:
        hashed.append(path)
        return real_sha(path)

    keymemo.sha256_file = counting_sha
    t = time.perf_counter()
    memo_key = cache_mod.triton_key()
    out["t_memo"] = time.perf_counter() - t
    out["memo_installed"] = keymemo.installed()
    t = time.perf_counter()
    own_key = keymemo.own_key()  # Triton's own, computed afresh by its own code
    out["t_original"] = time.perf_counter() - t
    out.update(
        memo_key=memo_key,
        own_key=own_key,
        equal=memo_key == own_key,
        hashed_libtriton=len(hashed),
        triton_file=cache_mod.__file__,
        # 3.5+ bind it by name at import; 3.4 imports it from the compiler module at each call
        autotuner_has_memo=getattr(autotuner, "triton_key", cache_mod.triton_key)() == memo_key,
    )
    if a.torch and "torch_error" not in out:
        import torch._inductor.codecache as codecache
        import torch._inductor.runtime.triton_compat as compat

        out["compat_has_memo"] = compat.triton_key() == memo_key
        out["codecache_key_equal"] = codecache.triton_key() == own_key
    print(json.dumps(out))


if __name__ == "__main__":
    main()
