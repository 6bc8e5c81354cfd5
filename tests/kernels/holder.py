"""Compile one spec with kcache, and hang at the first file Triton stores: this process then holds
the kernel's single-flight lock, as a process that crashes or hangs mid-compile would.

    python -m kernels.holder SPEC FLAG_FILE   (FLAG_FILE is created once the lock is held)
"""

from __future__ import annotations

import sys
import time
from typing import Any

from kcache.triton.manager import KcacheCacheManager
from kernels.specs import SPECS, compile_spec


def main() -> None:
    spec, flag = sys.argv[1], sys.argv[2]

    def put(self: Any, data: Any, filename: str, binary: bool = True) -> str:
        assert self._flight is not None and self._flight.held, "expected to hold the kernel's lock"
        with open(flag, "w"):
            pass
        time.sleep(3600)
        raise SystemExit(1)

    KcacheCacheManager.put = put  # type: ignore[method-assign]
    compile_spec(SPECS[spec])


if __name__ == "__main__":
    main()
