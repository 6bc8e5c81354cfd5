"""Run a test's body in a fresh Python process: for what depends on the process's own table of
descriptors (which numbers are free, how large the table is), which the tests run before it in
the same pytest worker can fill with descriptors of their own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

_CHILD = """
import importlib, sys
from pathlib import Path
sys.path[:0] = [{root!r}, {tests!r}]
getattr(importlib.import_module({module!r}), {func!r})(Path({tmp!r}))
"""


def run_body(module: str, func: str, tmp: Path, timeout: float = 300.0) -> None:
    """``module.func(tmp)`` in a new interpreter (this checkout's kcache); its assertion errors
    come back as this test's failure, with the child's output."""
    code = _CHILD.format(root=str(TESTS.parent), tests=str(TESTS), module=module, func=func, tmp=str(tmp))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{module}.{func} in a fresh process failed:\n{p.stdout}\n{p.stderr[-4000:]}"
