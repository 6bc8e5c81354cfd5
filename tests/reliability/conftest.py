"""Helpers for the reliability tests (issue 10): the chaos tool, child processes (also as an
unprivileged user), tmpfs and read-only mounts, real Triton compiles in fresh processes.

The long versions of these runs are ``tools/chaos.py --full``; these are sized for CI.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CHAOS_PATH = REPO / "tools" / "chaos.py"
PYTHON = sys.executable
NOBODY = 65534


def load_chaos() -> Any:
    spec = importlib.util.spec_from_file_location("kcache_chaos", CHAOS_PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kcache_chaos", mod)
    spec.loader.exec_module(mod)
    return sys.modules["kcache_chaos"]


@pytest.fixture(scope="session")
def chaos() -> Any:
    """tools/chaos.py as a module: the same workers and checks as the long runs."""
    return load_chaos()


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """os.environ without KCACHE_*/TRITON_* settings, HOME and caches inside tmp_path."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TRITON_")) or k == "KCACHE_STRICT"
    }
    env.pop("PYTHONPATH", None)
    env["HOME"] = str(tmp_path / "home")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-file-cache")
    env["PYTHONHASHSEED"] = "0"
    env.update(extra)
    return env


def kenv(tmp_path: Path, store: Path, **extra: str) -> dict[str, str]:
    """The environment of a child with ``KCACHE=1`` on ``store``."""
    return base_env(tmp_path, KCACHE="1", KCACHE_DIR=str(store), **extra)


def run_py(
    code: str, env: dict[str, str], timeout: float = 300, user: int | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment. With ``user``, the child first
    imports what kcache needs (the interpreter lives under /root, which that user cannot read),
    then drops to that uid/gid for good and runs ``code``."""
    if user is not None:
        code = AS_USER_PRELUDE.format(uid=user) + textwrap.dedent(code)
    return subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
        cwd=cwd or "/",
    )


# Everything kcache may import lazily is imported before the privileges go.
AS_USER_PRELUDE = """
import os, sys, json, logging, sqlite3, shutil, uuid, hashlib, errno, stat, time, zlib, struct, re
import contextlib, tempfile, threading, atexit, argparse, textwrap, io, traceback, importlib.metadata
import subprocess, signal
import msgpack, fcntl, urllib.parse
import kcache, kcache.config, kcache.store, kcache.store.disk, kcache.store.index, kcache.kinds
import kcache.maintenance, kcache.cli, kcache.fingerprint, kcache.counters, kcache.log
os.setgroups([])
os.setgid({uid})
os.setuid({uid})
assert os.geteuid() == {uid} and os.getuid() == {uid}
"""


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("kcache: WARNING")]


def no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr, r.stderr[-4000:]


def last_json(r: subprocess.CompletedProcess) -> Any:
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def tree(root: Path) -> dict[str, tuple]:
    """Every path under root: type, size, mode, mtime_ns (what 'unchanged' means)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mode, st.st_mtime_ns)
    return out


# ------------------------------------------------------------------------------------- skips
def cannot_run(reason: str) -> None:
    """Skip a hostile test that cannot run here (it needs root for a mount or a second user, or
    gcc for the launcher probe), but not in CI, which runs as root on a clean box with gcc
    (``KCACHE_TEST_NO_SKIP=1``, set by .ci/run): there the same reason fails the test, so that no
    hostile test is skipped silently."""
    if os.environ.get("KCACHE_TEST_NO_SKIP") == "1":
        pytest.fail(f"KCACHE_TEST_NO_SKIP=1 and {reason}")
    pytest.skip(reason)


# ------------------------------------------------------------------------------------- mounts
def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextlib.contextmanager
def tmpfs(path: Path, size: str, inodes: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (and at most ``inodes`` files and folders) at ``path`` (root only; the
    test is skipped otherwise, but fails in CI: :func:`cannot_run`)."""
    path.mkdir(parents=True, exist_ok=True)
    if not _can_mount():
        cannot_run("mounting a tmpfs needs root")
    opts = f"size={size},mode=0700" + (f",nr_inodes={inodes}" if inodes else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        cannot_run(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def read_only_bind(path: Path) -> Iterator[Path]:
    """``path`` bind-mounted read-only over itself: even root gets EROFS on writes."""
    if not _can_mount():
        cannot_run("a read-only bind mount needs root")
    r = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if r.returncode != 0:
        cannot_run(f"cannot bind-mount here: {r.stderr.decode().strip()}")
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True)
        if r.returncode != 0:
            cannot_run(f"cannot remount read-only: {r.stderr.decode().strip()}")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def chown_tree(root: Path, uid: int, gid: int) -> None:
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


@pytest.fixture
def nobody_dir(tmp_path: Path) -> Path:
    """A directory the unprivileged user can reach and write (tmp_path's parents are opened up
    for traversal only while the test runs)."""
    if os.geteuid() != 0:
        cannot_run("running a child as another user needs root")
    opened = []
    p = tmp_path
    while p != p.parent:
        st = p.stat()
        if not st.st_mode & stat.S_IXOTH:
            opened.append((p, stat.S_IMODE(st.st_mode)))
            os.chmod(p, stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        p = p.parent
    d = tmp_path / "nobody"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    try:
        yield d
    finally:
        for path, mode in opened:
            os.chmod(path, mode)


# ------------------------------------------------------------------------------------- Triton
# A child that compiles chaos.KERNELS[:n] (or the specs given) and prints their digests as JSON.
COMPILE_CHILD = """
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("kcache_chaos", {chaos!r})
chaos = importlib.util.module_from_spec(spec); sys.modules["kcache_chaos"] = chaos
spec.loader.exec_module(chaos)
{before}
import triton  # the KCACHE hook attaches here
import kcache
out = {{"enabled": kcache.is_enabled(), "kernels": {{}}, "seconds": {{}}}}
for spec in {specs!r}:
    t = time.perf_counter()
    k = chaos.compile_kernel(tuple(spec))
    name = "/".join(map(str, spec))
    out["seconds"][name] = time.perf_counter() - t
    out["kernels"][name] = chaos.kernel_digest(k)
    out.setdefault("arch", {{}})[name] = k.metadata.target.arch
st = kcache.active_store()
if st is not None:
    st.flush(force=True)
    out["counts"] = st.counts.process_totals()
{after}
print(json.dumps(out))
"""


def compile_in_child(
    specs: list, env: dict[str, str], *, before: str = "", after: str = "", timeout: float = 600
) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    code = COMPILE_CHILD.format(
        chaos=str(CHAOS_PATH), specs=[list(s) for s in specs], before=textwrap.dedent(before), after=after
    )
    r = run_py(code, env, timeout=timeout)
    no_traceback(r)
    return last_json(r), r


@pytest.fixture(scope="session")
def reference_kernels(tmp_path_factory: pytest.TempPathFactory, chaos: Any) -> dict[str, Any]:
    """Digests of the first 12 chaos kernels compiled by Triton alone (no kcache)."""
    tmp = tmp_path_factory.mktemp("reference")
    out, _ = compile_in_child(chaos.kernel_specs(12), base_env(tmp))
    assert not out["enabled"]
    return out["kernels"]


@pytest.fixture(scope="session")
def compiled_store(tmp_path_factory: pytest.TempPathFactory, chaos: Any) -> Any:
    """``compiled_store(n)``: a store made by a real compile of the first ``n`` chaos kernels under
    ``KCACHE=1`` (one child, once a session for each ``n``), for tests that start from such a
    store and test what comes after: they copy it (``shutil.copytree(..., symlinks=True)``, modes
    kept) rather than start a child of their own for it (0.8-1 s of CPU each)."""
    made: dict[int, Path] = {}

    def make(n: int) -> Path:
        if n not in made:
            tmp = tmp_path_factory.mktemp(f"compiled{n}")
            out, r = compile_in_child(chaos.kernel_specs(n), kenv(tmp, tmp / "store"))
            assert out["enabled"] and len(out["kernels"]) == n, r.stderr[-2000:]
            assert warning_lines(r.stderr) == [], r.stderr[-2000:]
            made[n] = tmp / "store"
        return made[n]

    return make


def store_entries(root: Path) -> list[str]:
    ids = []
    with contextlib.suppress(FileNotFoundError):
        for shard in os.listdir(root / "entries"):
            ids += os.listdir(root / "entries" / shard)
    return ids
