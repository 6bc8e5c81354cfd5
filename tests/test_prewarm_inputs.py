"""Files a user names are read only when they are regular files of bounded size, as ``kcache
import`` reads its bundle: ``kcache prewarm SPEC`` on a FIFO waited forever, and on /dev/zero it
read until memory ran out. Real ``kcache prewarm`` processes, each under a wall-clock limit (the
test fails, it does not hang) and a memory limit (a reader of /dev/zero fails, it does not take
the machine's memory)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON = sys.executable
MEMORY_LIMIT = 2 << 30  # bytes of address space for the child: far above what a refusal needs


def _limit_memory() -> None:  # pragma: no cover (runs in the child)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _env(tmp: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env.update(HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "xdg"), KCACHE_DIR=str(tmp / "store"))
    return env


@pytest.mark.parametrize(
    "what", ["fifo", "fifo-with-writer", "dev-zero", "link-to-dev-zero", "folder", "huge-sparse-file"]
)
def test_prewarm_reads_only_a_regular_file_of_bounded_size(what: str, tmp_path: Path) -> None:
    path = {"dev-zero": "/dev/zero", "folder": str(tmp_path)}.get(what, str(tmp_path / "spec.toml"))
    writer = None
    if what.startswith("fifo"):
        os.mkfifo(path)
        if what == "fifo-with-writer":  # the open would return at once; the reads would wait
            writer = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    elif what == "link-to-dev-zero":
        os.symlink("/dev/zero", path)
    elif what == "huge-sparse-file":  # 1 GiB that takes no disk: read whole, it would take memory
        with open(path, "wb") as f:
            f.truncate(1 << 30)
    try:
        p = subprocess.run(
            [PYTHON, "-m", "kcache", "prewarm", path, "--target", "cuda:90"],
            env=_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_limit_memory,
        )
    finally:
        if writer is not None:
            os.close(writer)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])  # a bad argument, said in one line
    assert "Traceback" not in p.stderr and "MemoryError" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and path in lines[0], p.stderr
    assert "regular file" in lines[0] or "larger than" in lines[0], lines[0]


def test_a_huge_record_file_is_not_read_whole(tmp_path: Path, kcache_warnings: list[str]) -> None:
    """``KCACHE_RECORD`` names a file that is read whole before each append (to find the
    entries it holds): one over the bound is left alone, and said once."""
    from kcache.prewarm.record import MAX_RECORD_BYTES, Recorder

    spec = tmp_path / "spec.toml"
    with open(spec, "wb") as f:
        f.truncate(MAX_RECORD_BYTES + 1)
    rec = Recorder(str(spec))
    rec._pending[(id(None), "None")] = ("0" * 16, {"kernel": "m:f", "args": {"n": 1}}, None)
    rec.commit({})
    assert rec.recorded == 0 and spec.stat().st_size == MAX_RECORD_BYTES + 1
    w = [m for m in kcache_warnings if "KCACHE_RECORD" in m or str(spec) in m]
    assert len(w) == 1 and "larger than" in w[0], kcache_warnings
