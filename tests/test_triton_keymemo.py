"""The ``triton_key`` memo: the same key as Triton's own, libtriton hashed once per machine (not
once per process), an edited Triton source still changes the key, and the modules that bind
``triton_key`` by name (Triton's autotuner, torch's Inductor) get the memo."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

# Triton is a dependency of kcache on Linux (pyproject.toml) and CI installs it (.ci/run): these
# tests skip only where Triton does not exist (other platforms), never in CI.
pytest.importorskip("triton")

from kernels.harness import PYTHON, TESTS_DIR, clean_env  # noqa: E402

import kcache  # noqa: E402
from kcache.triton import keymemo  # noqa: E402


def probe(env: dict[str, str], *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [PYTHON, "-m", "kernels.keyprobe", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# Triton's key in a fresh process, counting every read of libtriton while it is computed: the
# memo's own hashing and any by Triton's code (a memo that fell back to Triton's own function would
# read it). Then Triton's own key, computed afresh, to compare.
KEY_READS = """
import builtins, json, os
from kernels.compat import triton_key_module
cache_mod = triton_key_module()
lib_dir = os.path.realpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(cache_mod.__file__))), "_C"))
reads = []
real_open = builtins.open
def counting_open(file, *args, **kwargs):
    if isinstance(file, (str, os.PathLike)):
        path = os.path.realpath(file)
        if os.path.dirname(path) == lib_dir and os.path.basename(path).startswith("libtriton"):
            reads.append(path)
    return real_open(file, *args, **kwargs)
builtins.open = counting_open
try:
    key = cache_mod.triton_key()
finally:
    builtins.open = real_open
from kcache.triton import keymemo
print(json.dumps({"memo_installed": keymemo.installed(), "key": key, "own_key": keymemo.own_key(), "libtriton_reads": len(reads)}))
"""


def test_memo_key_equals_tritons_own_and_is_reused_by_the_next_process(tmp_path: Path) -> None:
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    first = probe(env)
    assert first["memo_installed"] and first["equal"], first
    assert first["hashed_libtriton"] == 1  # computed once, and remembered
    assert first["autotuner_has_memo"]
    out = subprocess.run([PYTHON, "-c", KEY_READS], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    second = json.loads(out.stdout.strip().splitlines()[-1])
    assert second["memo_installed"] and second["key"] == second["own_key"] == first["memo_key"], second
    # the digest came from the store, and Triton's own read of the library was answered by the memo:
    # the library was not read at all (this is the saving; counted, not timed)
    assert second["libtriton_reads"] == 0, second


def test_edited_triton_source_changes_the_key_with_the_memo_too(tmp_path: Path) -> None:
    import triton

    src = Path(triton.__file__).parent
    site = tmp_path / "site"
    big = {"_C", "bin", "lib", "include"}  # shared by symlink: 600 MB of binaries, not hashed as sources

    def ignore(d: str, names: list[str]) -> list[str]:
        return [n for n in names if n in big or n == "__pycache__"]

    shutil.copytree(src, site / "triton", ignore=ignore)
    for path in src.rglob("*"):
        if path.name in big and path.is_dir() and "__pycache__" not in path.parts:
            link = site / "triton" / path.relative_to(src)
            if link.parent.exists() and not link.exists():
                link.symlink_to(path, target_is_directory=True)
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    env["PYTHONPATH"] = f"{site}{os.pathsep}{TESTS_DIR}"
    before = probe(env)
    # without the memo installed, "equal" would compare Triton's key with itself
    assert before["triton_file"].startswith(str(site)) and before["memo_installed"] and before["equal"]
    assert before["hashed_libtriton"] == 1
    core = site / "triton" / "language" / "core.py"
    core.write_text(core.read_text() + "\n# an edit\n")
    after = probe(env)
    assert after["memo_installed"] and after["equal"], after  # Triton's own key, with the memo
    assert after["memo_key"] != before["memo_key"]  # the edit counts
    assert after["hashed_libtriton"] == 0  # and libtriton's digest still came from the memo


def test_memo_reaches_torch_inductor_modules(tmp_path: Path) -> None:
    """Both orders, in two processes at once (importing Inductor takes seconds): kcache on from the
    start (Inductor binds the patched name), and kcache enabled after torch and triton were imported
    (kcache patches the modules that bound Triton's function)."""
    # torch is no dependency of kcache; CI (.ci/run) installs it, so there this test always runs
    # (not imported here, 4 s of CPU: the children import it and report an import error)
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    cmd = [PYTHON, "-m", "kernels.keyprobe", "--torch"]
    early = subprocess.Popen(
        cmd,
        env=clean_env(tmp_path / "a", kcache_dir=tmp_path / "a" / "store"),
        stdout=subprocess.PIPE,
        text=True,
    )
    late = subprocess.Popen(
        [*cmd, "--enable-late", str(tmp_path / "b" / "store")],
        env=clean_env(tmp_path / "b"),
        stdout=subprocess.PIPE,
        text=True,
    )
    results = []
    for proc in (early, late):
        stdout, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    for r in results:
        assert "torch_error" not in r, r
        assert r["memo_installed"] and r["equal"], r
        assert r["autotuner_has_memo"] and r["compat_has_memo"] and r["codecache_key_equal"], r
    assert results[1]["late_enabled"]


def test_digest_is_keyed_by_file_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("KCACHE") and k != "KCACHE_STRICT":
            monkeypatch.delenv(k)
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False)
    try:
        lib = tmp_path / "libfake.so"
        lib.write_bytes(b"one" * 1000)
        d1, memo1 = keymemo.libtriton_digest(str(lib))
        assert (d1, memo1) == (hashlib.sha256(b"one" * 1000).hexdigest(), False)
        assert keymemo.libtriton_digest(str(lib)) == (d1, True)
        lib.write_bytes(b"two" * 1000)  # same size, new contents: mtime/ctime change
        d2, memo2 = keymemo.libtriton_digest(str(lib))
        assert (d2, memo2) == (hashlib.sha256(b"two" * 1000).hexdigest(), False)
        ident = keymemo.file_identity(str(lib))
        assert "ino=" in ident and "mtime=" in ident and "ctime=" in ident and "triton=" in ident
    finally:
        kcache.disable()


# Races between the memo's run of Triton's code (libtriton's read answered by a stand-in put into
# Triton's module) and everything else that runs Triton's own code, in a fresh process with the
# real Triton. Thread A computes the key through the memo and is held (sys.settrace, at the call
# of Triton's code, where the stand-in is in; or at the call of the memo's trampoline) while the
# other party runs; every key any party gets is printed, to be compared with Triton's own.
RACE = """
import json, os, sys, threading
from kernels.compat import triton_key_module
cache_mod = triton_key_module()
import kcache, kcache.memo
from kcache.triton import keymemo
assert keymemo.installed()
mode = sys.argv[1]
own = keymemo.own_key()  # Triton's own key, nothing else running
fn = cache_mod.triton_key  # the lru_cache every caller holds
trampoline = fn.__wrapped__.__code__

def tritons_code(code):
    return code.co_filename == cache_mod.__file__ and code.co_name == "triton_key"

inside, go, other_waits = threading.Event(), threading.Event(), threading.Event()
keys, errors = [], []

def hold_at(match):
    def tracer(frame, event, arg):
        if event == "call" and match(frame.f_code) and not inside.is_set():
            inside.set()
            go.wait(120)
    return tracer

def a_thread(match):
    sys.settrace(hold_at(match))
    try:
        fn.cache_clear()
        keys.append(fn())
    except BaseException as e:
        errors.append(repr(e))
    finally:
        sys.settrace(None)

if mode == "reenter":
    # Triton's code, run by the memo, asks for the key again on the same thread (as an import it
    # makes could): the inner call must get Triton's key too.
    def tracer(frame, event, arg):
        if event == "call" and tritons_code(frame.f_code) and not inside.is_set():
            inside.set()
            keys.append(fn())  # (calls from a tracer are not traced)
    sys.settrace(tracer)
    fn.cache_clear()
    outer = fn()
    sys.settrace(None)
    keys.append(outer)
    keys.append(fn())  # what the lru_cache kept
elif mode == "thread":
    # Another thread runs Triton's own code (keymemo.own_key) while A's stand-in is in.
    lock = kcache.memo._open_lock
    class Noting:  # the memo's lock, noting when B starts to wait for it (then A may go on)
        def __enter__(self):
            if threading.current_thread() is b:
                other_waits.set()
            return lock.__enter__()
        def __exit__(self, *exc):
            return lock.__exit__(*exc)
    kcache.memo._open_lock = Noting()
    a = threading.Thread(target=a_thread, args=(tritons_code,))
    b = threading.Thread(target=lambda: keys.append(keymemo.own_key()))
    a.start()
    assert inside.wait(120)
    assert "open" in cache_mod.__dict__  # the stand-in is in
    b.start()
    while b.is_alive() and not other_waits.wait(0.05):
        pass
    go.set()
    a.join(120)
    b.join(120)
elif mode == "fork":
    # A fork while A's stand-in is in: the child turns kcache off and asks Triton for its key.
    a = threading.Thread(target=a_thread, args=(tritons_code,))
    a.start()
    assert inside.wait(120)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            kcache.disable()
            fn.cache_clear()
            os.write(w, json.dumps({"installed": keymemo.installed(), "key": fn()}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    child = json.loads(os.read(r, 1 << 16).decode())
    assert os.waitstatus_to_exitcode(status) == 0 and not child["installed"], child
    keys.append(child["key"])
    go.set()
    a.join(120)
elif mode == "disable":
    # kcache is turned off while A has entered the memo's trampoline (Triton's function, whose
    # code goes back at once) but not yet looked up where it leads.
    a = threading.Thread(target=a_thread, args=(lambda code: code is trampoline,))
    a.start()
    assert inside.wait(120)
    kcache.disable()
    assert not keymemo.installed()
    go.set()
    a.join(120)
    fn.cache_clear()
    keys.append(fn())  # Triton's own function, kcache off
print(json.dumps({"own": own, "keys": keys, "errors": errors, "open_left": "open" in cache_mod.__dict__}))
"""


@pytest.mark.parametrize("mode", ["reenter", "thread", "fork", "disable"])
def test_tritons_own_code_never_runs_with_the_memos_stand_in(tmp_path: Path, mode: str) -> None:
    """Every key Triton's code gives is Triton's own (a stand-in digest in it would be a random key,
    kept by the lru_cache: misses for the whole process), and turning kcache off while a key is
    being computed raises nothing into Triton."""
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    out = subprocess.run([PYTHON, "-c", RACE, mode], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert not r["errors"], r
    assert len(r["keys"]) == {"reenter": 3, "thread": 2, "fork": 2, "disable": 2}[mode], r
    assert all(k == r["own"] for k in r["keys"]), r
    assert not r["open_left"], r
