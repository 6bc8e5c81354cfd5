"""What the hostile-input cases (tools/chaos_inputs.py and its families) share: kcache's command
line run in a fresh child (:func:`cli`; :func:`cli_limited` under an address space limit, measured),
its failures judged (:func:`one_line_failure`), records and manifests made as kcache makes them,
and Triton cache folders (:func:`triton_group`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
PYTHON = sys.executable
GiB = 1 << 30
MiB = 1 << 20
#: The child's address space limit for the memory bomb cases.
AS_LIMIT = 1536 * MiB
#: What "the peak RSS stays small" means for a CLI child (Python, kcache, msgpack, sqlite: ~30 MiB;
#: with Triton imported, ~80 MiB).
RSS_SMALL = 300 * MiB
#: A wrong ``ptxas --version`` that looks right: Triton makes PTX ".version 95.9" from it.
WRONG_PTXAS = b"ptxas: NVIDIA (R) Ptx optimizing assembler\nCuda compilation tools, release 99.9, V99.9.1\n"
#: Wrong ones that do not: "Cannot find ptxas" from the first, nothing usable from the second.
IMPLAUSIBLE_PTXAS = (b"ptxas version: none\n", b"\xff\xfe\x00garbage")
WRONG_DIGEST = b"ab" * 32
SKEW_S = 3600.0


# ----------------------------------------------------------------------------------- children


def child_env(base: Path, **extra: str) -> dict[str, str]:
    """os.environ without KCACHE_*/TRITON_* settings, HOME and caches under ``base``, and this
    checkout first on the path (the code under test, also for a worktree of an older commit)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_"))}
    env["PYTHONPATH"] = str(REPO)
    env["HOME"] = str(base / "home")
    env["XDG_CACHE_HOME"] = str(base / "xdg")
    env["TRITON_CACHE_DIR"] = str(base / "triton-file-cache")
    env["PYTHONHASHSEED"] = "0"
    env.update(extra)
    return env


def cli(
    args: list[Any], env: dict[str, Any], timeout: float = 60, stdin: Any = subprocess.DEVNULL
) -> subprocess.CompletedProcess:
    """``python -m kcache ARGS`` (arguments may be bytes). Raises TimeoutExpired if it blocks.
    ``stdin``: what the child reads as its standard input (a pipe's read end: ``/dev/stdin``)."""
    return subprocess.run(
        [PYTHON, "-m", "kcache", *args], env=env, capture_output=True, timeout=timeout, check=False, cwd="/",
        stdin=stdin,
    )  # fmt: skip


LIMITED_CLI = r"""
import json, resource, sys
limit, out = int(sys.argv[1]), sys.argv[2]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from kcache.cli import main
try:
    rc = main(sys.argv[3:])
except BaseException as e:  # what main let through: reported, then the usual traceback
    rc = -1
    raise
finally:
    # VmHWM: this program's own peak RSS (getrusage's ru_maxrss also counts what the process
    # held before its exec, a copy of a large parent).
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    hwm = int(status["VmHWM"].split()[0]) * 1024
    io_ = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    with open(out, "w") as f:
        json.dump({"rc": rc, "maxrss": hwm, "wchar": int(io_["wchar"])}, f)
sys.exit(rc)
"""


def cli_limited(
    args: list[Any],
    env: dict[str, Any],
    work: Path,
    *,
    limit: int = AS_LIMIT,
    timeout: float = 120,
    stdin: Any = subprocess.DEVNULL,
) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """``kcache ARGS`` in a child whose address space is limited to ``limit``; returns the process
    and its measures: ``maxrss`` (bytes), ``wchar`` (bytes it wrote), ``rc``. Raises
    TimeoutExpired (the child killed) if it does not end within ``timeout``."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"measure.{os.getpid()}.{time.monotonic_ns()}.json"
    r = subprocess.run(
        [PYTHON, "-c", LIMITED_CLI, str(limit), str(out), *args],
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
        cwd="/",
        stdin=stdin,
    )
    try:
        m = json.loads(out.read_text())
        out.unlink()
    except (OSError, ValueError):
        m = {"rc": None, "maxrss": None, "wchar": None}
    return r, m


def text(b: bytes | str) -> str:
    return b if isinstance(b, str) else b.decode("utf-8", "replace")


def error_lines(r: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in text(r.stderr).splitlines() if ln.strip()]


def one_line_failure(r: subprocess.CompletedProcess, names: str | None = None, want: int = 1) -> str | None:
    """None if the command failed as it should (exit ``want``: 1 a failure, 2 a bad argument such
    as a file that is no file to read; one ``kcache: error:`` line (``kcache prewarm: error:``),
    naming ``names`` if given, no traceback, no MemoryError), else what is wrong."""
    lines = error_lines(r)
    if r.returncode != want:
        return f"exit {r.returncode} (want {want}): {lines[-3:]}"
    if len(lines) != 1 or not lines[0].startswith(("kcache: error:", "kcache prewarm: error:")):
        return f"want one error line, got {lines[-5:]}"
    if "MemoryError" in lines[0] or "Traceback" in text(r.stderr):
        return f"memory error or traceback: {lines[0]}"
    if names is not None and names not in lines[0]:
        return f"the message does not name {names!r}: {lines[0]}"
    return None


# ----------------------------------------------------------------------------------- records


def kcache_records() -> Any:
    from kcache.store import records  # the code under test (PYTHONPATH)

    return records


def make_record(kind: str, key: str, files: dict[str, bytes], key_tag: str = "") -> Any:
    r = kcache_records()
    return r.Record(
        kind=kind,
        key=key,
        id=r.entry_id(kind, key, key_tag),
        files=[r.file_info(n, b) for n, b in files.items()],
    )


def declared_record(
    kind: str, key: str, sizes: dict[str, int], key_tag: str = "", sha: str | None = None
) -> Any:
    """A record that declares members of ``sizes`` (checksums of nothing: for bundles refused
    before any member is read, or whose members fail their checksum)."""
    r = kcache_records()
    files = [r.FileInfo(n, s, 0, sha or "0" * 64) for n, s in sizes.items()]
    return r.Record(kind=kind, key=key, id=r.entry_id(kind, key, key_tag), files=files)


def manifest_bytes(
    records: Iterable[Any],
    *,
    key_tag: Any = "",
    secret: bytes | None = None,
    body: Any = None,
    outer: Any = None,
    schema: Any = 1,
) -> bytes:
    """A MANIFEST as kcache writes it (``records``: Record objects or anything, for malformed
    ones); ``body`` replaces the decoded manifest, ``outer`` the whole outer map."""
    import msgpack

    if outer is not None:
        return msgpack.packb(outer, use_bin_type=True)
    if body is None:
        body = {
            "format": "kcache-bundle",
            "schema": schema,
            "created": time.time(),
            "key_tag": key_tag,
            "records": [r.encode() if hasattr(r, "encode") and hasattr(r, "files") else r for r in records],
        }
    raw = msgpack.packb(body, use_bin_type=True)
    sig = hmac.new(secret, raw, hashlib.sha256).hexdigest() if secret else None
    return msgpack.packb({"body": raw, "hmac": sig}, use_bin_type=True)


# ----------------------------------------------------------------------------------- Triton folders


TRITON_KEY = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST"


def triton_key(i: int) -> str:
    """A folder name shaped like Triton's cache keys (52 base32 characters)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    return alphabet[i % 32] + alphabet[(i // 32) % 32] + TRITON_KEY[2:]


def triton_group(folder: Path, name: str = "k", files: dict[str, bytes] | None = None) -> Path:
    """A Triton cache key folder holding one kernel group (``__grp__<name>.json``)."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    files = (
        files
        if files is not None
        else {
            f"{name}.json": b'{"name": "k", "triton_version": "0"}',
            f"{name}.cubin": b"\x7fELF" + b"c" * 200,
        }
    )
    for n, data in files.items():
        (folder / n).write_bytes(data)
    children = {n: str(folder / n) for n in files}
    (folder / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    return folder
