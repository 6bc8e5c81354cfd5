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
if {table}:
    from fresh_process import table_of
    table_of({table})
getattr(importlib.import_module({module!r}), {func!r})(Path({tmp!r}))
"""


def table_of(size: int) -> None:
    """Grow this process's table of descriptors to hold ``size`` (a descriptor numbered
    ``size - 1``, made and closed: a table never shrinks)."""
    import fcntl
    import os

    os.close(fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, size - 1))


#: A parent with nothing past descriptor 2 of its own open: its child's table of descriptors is
#: the kernel's smallest. (A table is sized at the fork by the highest descriptor open then, and
#: a pytest started by a shell or a tool that leaks one numbered 250-255 passes a table of 256
#: on to every child it starts directly.)
BARE_PARENT = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def run_body(module: str, func: str, tmp: Path, timeout: float = 300.0, *, small_table: bool = False) -> None:
    """``module.func(tmp)`` in a new interpreter (this checkout's kcache); its assertion errors
    come back as this test's failure, with the child's output. It is started through a bare
    parent (its table of descriptors then starts at the kernel's smallest size, whatever pytest's
    worker has open), and its table is grown to hold 256, as a process started by a shell has;
    with ``small_table``, it is left at the smallest."""
    code = _CHILD.format(
        root=str(TESTS.parent),
        tests=str(TESTS),
        module=module,
        func=func,
        tmp=str(tmp),
        table=0 if small_table else 256,
    )
    argv = [sys.executable, "-c", BARE_PARENT, sys.executable, "-c", code]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{module}.{func} in a fresh process failed:\n{p.stdout}\n{p.stderr[-4000:]}"
