"""Helpers for the link and swap tests (issues 16 and 17): a second user who plants links and
swaps folders, folders of victim files and their fingerprints, every command line in one child,
and the launcher probe (a C extension built the way Triton builds its launchers).

The second user is uid 65534 ("nobody"), reached by forking this process and dropping to it for
good: the child runs a plain Python function (no interpreter start, no imports), so it can do
what an attacker's shell would (rename, symlink, copy) with that user's rights only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sysconfig
import tempfile
import textwrap
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import NOBODY, cannot_run, no_traceback, run_py

STALE = 2 * 86400  # seconds: victim files look two days old (past any "stale leftover" age)


# ------------------------------------------------------------------------------ the second user
def private_tmp() -> Iterator[Path]:
    """What the link and swap tests use as ``tmp_path``: a fresh private folder directly under
    the system's temporary folder (0711 when root: the second user can reach what it is given
    inside, and list or write nothing), removed after. Not under pytest's base temp folder: a
    pytest session starting meanwhile (another job on the machine) resets that folder to 0700,
    which would lock the second user out in the middle of a test."""
    d = Path(tempfile.mkdtemp(prefix="kcache-test-"))
    if os.geteuid() == 0:
        os.chmod(d, 0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(uid: int, fn: Callable[[], Any]) -> None:
    """Run ``fn()`` in a forked child that has dropped to ``uid`` (and gid ``uid``, no groups)
    for good. Raises AssertionError if it failed (its traceback is on stderr)."""
    if os.geteuid() != 0:
        cannot_run("acting as another user needs root")
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the child as uid {uid} failed"


def as_nobody(fn: Callable[[], Any]) -> None:
    as_user(NOBODY, fn)


def plant(planter: str, fn: Callable[[], Any]) -> None:
    """Do ``fn`` as the planter: "self" (this process) or "nobody" (the second user)."""
    if planter == "self":
        fn()
    else:
        as_nobody(fn)


# ------------------------------------------------------------------------------ victims
def make_victims(d: Path) -> Path:
    """A private folder (0700) of this user's precious files (0600), with the names the store
    itself uses (so a store that followed a link into it would find 'its' files there), and
    names and ages that a clean-up of stale leftovers would pick (dead pids, two days old)."""
    d.mkdir(mode=0o700, parents=True)
    names = [
        "precious",
        "kcache.sqlite",
        "kcache.sqlite-wal",
        "kcache.sqlite-shm",
        "clock",
        "evict.lock",
        "usage",
        "KCACHE_STORE",
        "scratch.999999999.0123456789abcdef",
        "served.999999999.fedcba9876543210",
        "00" * 20 + ".lock",
    ]
    for i, n in enumerate(names):
        p = d / n
        p.write_bytes(f"victim file {i}: {n}\n".encode() * 8)
        os.chmod(p, 0o600)
    sub = d / "0123456789abcdef0123456789abcdef01234567.999999999.00"
    sub.mkdir(mode=0o700)
    (sub / "inner").write_bytes(b"inner victim\n")
    os.chmod(sub / "inner", 0o600)
    old = os.path.getmtime(d) - STALE
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            os.utime(os.path.join(dirpath, n), (old, old))
    return d


def fingerprint(d: Path) -> dict[str, tuple]:
    """Everything about the files under ``d`` (and ``d`` itself) that a write, a removal, a
    chmod or a truncation would change: type, mode, owner, size, mtime, content digest."""
    out: dict[str, tuple] = {}

    def one(p: str) -> None:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            with open(p, "rb") as f:
                extra = hashlib.sha256(f.read()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            extra = os.readlink(p)
        else:
            extra = ""
        out[os.path.relpath(p, d)] = (st.st_mode, st.st_uid, st.st_size, st.st_mtime_ns, extra)

    one(str(d))
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            one(os.path.join(dirpath, n))
    return out


def shared_folder(path: Path, mode: int, owner: int | None = None) -> Path:
    """A folder of ``mode`` (e.g. 0o777 or 0o1777: others can write it), owned by ``owner``
    (default: this user)."""
    path.mkdir(parents=True, exist_ok=True)
    if owner is not None:
        os.chown(path, owner, owner)
    os.chmod(path, mode)
    return path


def needs_root(planter: str = "nobody") -> None:
    """Skip unless this test can act as the second user (CI runs as root)."""
    if planter != "self" and os.geteuid() != 0:
        cannot_run("acting as another user needs root")


# ------------------------------------------------------------------------------ the command line
CLI_BATCH = """
import contextlib, io, json, sys
import kcache.cli, kcache.log
out = []
for args in json.loads(sys.argv[1]):
    kcache.log._warned.clear()
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = kcache.cli.main(args)
    out.append({"args": args, "rc": rc, "stdout": o.getvalue()[-3000:], "stderr": e.getvalue()[-3000:]})
print(json.dumps(out))
"""


def run_cli(commands: list[list[str]], env: dict[str, str], timeout: float = 120) -> list[dict[str, Any]]:
    """Run ``kcache <args>`` for each of ``commands``, one after the other in one fresh process
    (the command line's own ``main``: exit status, stdout and stderr of each)."""
    import sys

    r = subprocess.run(
        [sys.executable, "-c", CLI_BATCH, json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd="/",
    )
    no_traceback(r)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def every_command(store: Path, *, bundle: Path, triton_cache: Path, export_to: Path) -> list[list[str]]:
    """Every command that opens a store, with every option of ``clear`` and ``verify``."""
    d = ["--dir", str(store)]
    return [
        ["stats", *d],
        ["stats", "--json", *d],
        ["stats", "--zero", *d],
        ["inspect", *d],
        ["inspect", "--json", "ab", *d],
        ["explain", *d],
        ["config", *d],
        ["verify", *d],
        ["verify", "--fix", *d],
        ["clear", "--kind", "triton", *d],
        ["clear", "--kind", "triton-aux", "--dry-run", *d],
        ["clear", "--kind", "nosuchkind", *d],
        ["clear", "--older-than", "1s", *d],
        ["clear", "--older-than", "0s", "--kind", "triton-autotune", *d],
        ["clear", "--stale", *d],
        ["clear", "--all", "--dry-run", *d],
        ["clear", "--all", *d],
        ["clear", "--all", "--kind", "triton", "--older-than", "0s", "--stale", *d],
        ["import", str(bundle), *d],
        ["import", "--triton-cache", str(triton_cache), *d],
        ["export", str(export_to), *d],
    ]


# ------------------------------------------------------------------------------ launcher probe
PROBE_SRC = r"""
#include <Python.h>
static PyObject* f(PyObject* self, PyObject* args) { return PyLong_FromLong(%(value)d); }
static PyMethodDef M[] = {{"f", f, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef D = {PyModuleDef_HEAD_INIT, "kc_probe", NULL, -1, M};
PyMODINIT_FUNC PyInit_kc_probe(void) {
    %(init)s
    return PyModule_Create(&D);
}
"""

GOOD_SRC = PROBE_SRC % {"value": 42, "init": ""}


class Probe:
    """The launcher probe: ``good`` is the module source Triton builds (f() == 42); ``evil`` is a
    library built from other source that a planter puts under the good source's key (f() ==
    666, and loading it creates ``marker``)."""

    def __init__(self, tmp: Path) -> None:
        build = pytest.importorskip("triton.runtime.build")
        if not hasattr(build, "compile_module_from_src") or not shutil.which("gcc"):
            cannot_run("needs Triton's compile_module_from_src and gcc")
        self.marker = tmp / "PWNED"
        self.good = GOOD_SRC
        evil_c = tmp / "evil.c"
        evil_c.write_text(
            PROBE_SRC % {"value": 666, "init": f'FILE* m = fopen("{self.marker}", "w"); if (m) fclose(m);'}
        )
        self.evil = tmp / "evil.so"
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-O0",
                f"-I{sysconfig.get_paths()['include']}",
                str(evil_c),
                "-o",
                str(self.evil),
            ],
            check=True,
            capture_output=True,
        )
        os.chmod(self.evil, 0o644)

    @staticmethod
    def filename() -> str:
        return "kc_probe" + sysconfig.get_config_var("EXT_SUFFIX")


# A child that plants the evil library in the cache of its environment (KCACHE=1: the store of
# KCACHE_DIR, through kcache's manager; else Triton's own TRITON_CACHE_DIR) under the key Triton
# itself uses for the good source: Triton's own code is run for the good source, with its C
# compiler step answering with the evil library and its loading step left out. A valid entry,
# made the way an attacker who could write the store would make it, for any Triton version.
PLANT_CHILD = """
import json
import triton
from triton.runtime import build
build._build = lambda *a, **k: {evil!r}
build._load_module_from_path = lambda name, path: None
build.compile_module_from_src({src!r}, "kc_probe")
print(json.dumps({{"planted": True}}))
"""

# A child that loads the probe as Triton loads a launcher. With {wait}, it opens the store first,
# says READY, and waits for a line on stdin before it builds (someone swaps folders meanwhile).
LOAD_CHILD = """
import json, sys
import triton
from triton.runtime import build
import kcache
out = {{"enabled": kcache.is_enabled()}}
if {wait!r}:
    st = kcache.active_store()
    out["opened"] = st is not None
    out["trust_host_code"] = getattr(st, "trust_host_code", None)
    print("READY", flush=True)
    sys.stdin.readline()
mod = build.compile_module_from_src({src!r}, "kc_probe")
out["f"] = mod.f()
out["file"] = mod.__file__
st = kcache.active_store()
out["store"] = None if st is None else str(st.root)
print(json.dumps(out))
"""


def plant_launcher(probe: Probe, env: dict[str, str]) -> None:
    r = run_py(PLANT_CHILD.format(src=probe.good, evil=str(probe.evil)), env, timeout=300)
    no_traceback(r)
    assert r.returncode == 0 and '"planted": true' in r.stdout, r.stderr[-3000:]


def load_probe(probe: Probe, env: dict[str, str]) -> tuple[dict[str, Any], subprocess.CompletedProcess]:
    r = run_py(LOAD_CHILD.format(src=probe.good, wait=False), env, timeout=300)
    no_traceback(r)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r


class Waiting:
    """A child that has opened its store and waits (see LOAD_CHILD): ``go()`` lets it build."""

    def __init__(self, probe: Probe, env: dict[str, str]) -> None:
        import sys

        self.p = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(LOAD_CHILD.format(src=probe.good, wait=True))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd="/",
        )
        assert self.p.stdout is not None
        line = self.p.stdout.readline().strip()
        if line != "READY":
            self.p.kill()
            _, err = self.p.communicate()
            raise AssertionError(f"the child did not start: {line!r} {err[-3000:]}")

    def go(self) -> tuple[dict[str, Any], str]:
        out, err = self.p.communicate("go\n", timeout=300)
        assert "Traceback" not in err, err[-4000:]
        assert self.p.returncode == 0, err[-4000:]
        return json.loads(out.strip().splitlines()[-1]), err

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.p.kill()
            self.p.communicate(timeout=10)
