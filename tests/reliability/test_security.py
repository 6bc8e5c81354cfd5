"""Security (issue 10, point 6). The store holds GPU code and host launcher libraries that get
loaded, so it is a trust boundary:

- it is created 0700; a store owned by someone else, or writable by group or others, is refused
  with one warning (caching off) unless KCACHE_ALLOW_INSECURE=1; a root-owned store (baked into
  an image) is accepted only read-only (KCACHE_READONLY=1), checked as an unprivileged user;
- entries that are symlinks (entry directory, member, record, shard) are refused;
- kcache never unpickles: a crafted index row holding a pickle is treated as corruption by every
  command and by the library (a marker file proves nothing ran);
- a row whose id names a path outside the store is never read nor deleted;
- every path taken from a record or an index row stays inside the store;
- nothing read from the store is executed except the GPU code and launcher libraries it exists
  to hold, and those only from a store that passed the ownership check (a planted launcher .so is
  loaded from a trusted store and refused from a foreign or group-writable one).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kcache.store.records import MAGIC, RECORD_NAME, crc32

from .attackers import run_cli
from .conftest import (
    NOBODY,
    PYTHON,
    base_env,
    cannot_run,
    chown_tree,
    compile_in_child,
    kenv,
    no_traceback,
    run_py,
    store_entries,
    tree,
    warning_lines,
)


def fill(chaos: Any, root: Path, n: int = 6) -> Any:
    st = chaos.open_store(root)
    for i in range(n):
        for kind in chaos.KINDS:
            st.put(kind, chaos.key_name(i), chaos.expected(kind, chaos.key_name(i)))
    st.close()
    return st


# ------------------------------------------------------------------------------ the directory
def test_store_is_private(tmp_path: Path, chaos: Any) -> None:
    """A store made by a real compile: the root and every directory 0700, no file writable by
    group or others."""
    store = tmp_path / "deep" / "store"
    compile_in_child(chaos.kernel_specs(2), kenv(tmp_path, store))
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    for dirpath, dirnames, filenames in os.walk(store):
        for d in dirnames:
            mode = stat.S_IMODE(os.lstat(os.path.join(dirpath, d)).st_mode)
            assert mode == 0o700, (os.path.join(dirpath, d), oct(mode))
        for f in filenames:
            mode = stat.S_IMODE(os.lstat(os.path.join(dirpath, f)).st_mode)
            assert not mode & 0o022, (os.path.join(dirpath, f), oct(mode))


@pytest.mark.parametrize("how", ["other_owner", "group_writable", "other_writable", "world_writable"])
def test_untrusted_store_refused(
    how: str, tmp_path: Path, chaos: Any, reference_kernels: dict, compiled_store: Any
) -> None:
    """Refused with one warning, caching off, nothing written; the compile goes on. With
    KCACHE_ALLOW_INSECURE=1 the same store is used. The store holds the first kernel (a real
    compile's store, copied)."""
    store = tmp_path / "store"
    specs = chaos.kernel_specs(2)
    shutil.copytree(compiled_store(1), store, symlinks=True)
    if how == "other_owner":
        chown_tree(store, NOBODY, NOBODY)
    else:
        os.chmod(store, {"group_writable": 0o770, "other_writable": 0o703, "world_writable": 0o777}[how])
    before = tree(store)
    out, r = compile_in_child(specs, kenv(tmp_path, store))
    assert not out["enabled"]
    assert out["kernels"] == {n: reference_kernels[n] for n in out["kernels"]}
    w = warning_lines(r.stderr)
    assert len(w) == 1 and ("owned by uid 65534" in w[0] or "writable by group or others" in w[0]), w
    assert "KCACHE_ALLOW_INSECURE" in w[0]
    assert tree(store) == before
    out, r = compile_in_child(specs, kenv(tmp_path, store, KCACHE_ALLOW_INSECURE="1"))
    assert out["enabled"] and out["counts"]["triton"]["hits"] == 1
    assert warning_lines(r.stderr) == []


ROOT_STORE_CHILD = """
import json, importlib.util, kcache
spec = importlib.util.spec_from_file_location("c", {chaos!r}); c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
ok = kcache.enable(dir={root!r}, triton=False, nvfuser=False)
out = {{"enabled": ok, "uid": __import__("os").geteuid()}}
if ok:
    st = kcache.active_store()
    out["readonly"] = st.readonly
    hits = [st.get(k, c.key_name(i)) for i in range(3) for k in c.KINDS]
    out["hits"] = sum(h is not None for h in hits)
    out["exact"] = all(h is None or c.check_hit(h.record.kind, h.record.key, h) is None for h in hits)
    out["put"] = st.put("chaos", "new", {{"a.bin": b"x"}}) is not None
    kcache.disable()
print(json.dumps(out))
"""


@pytest.mark.parametrize("readonly", [False, True])
def test_root_owned_store_only_read_only(
    readonly: bool, tmp_path: Path, nobody_dir: Path, chaos: Any
) -> None:
    """An unprivileged user (uid 65534) and a store baked by root (0755, root's): refused unless
    KCACHE_READONLY=1; then hits are served and nothing is written."""
    # Baked by root in a folder of root's (nobody can traverse it, not write it): a store inside
    # a folder of nobody's would be refused by root itself (nobody could swap it).
    root = nobody_dir.parent / "baked"
    fill(chaos, root, 3)
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    before = tree(root)
    env = base_env(nobody_dir, HOME=str(nobody_dir))
    if readonly:
        env["KCACHE_READONLY"] = "1"
    r = run_py(ROOT_STORE_CHILD.format(chaos=str(Path(chaos.HERE)), root=str(root)), env, user=NOBODY)
    no_traceback(r)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["uid"] == NOBODY
    if readonly:
        assert out["enabled"] and out["readonly"] and out["hits"] == 6 and out["exact"] and not out["put"]
        assert warning_lines(r.stderr) == []
    else:
        assert not out["enabled"]
        w = warning_lines(r.stderr)
        assert len(w) == 1 and "owned by uid 0" in w[0], w
    assert tree(root) == before


# ------------------------------------------------------------------------------ symlinks
@pytest.mark.parametrize("how", ["symlink_entry", "symlink_member", "symlink_record", "symlink_shard"])
def test_symlinks_refused_and_targets_untouched(how: str, tmp_path: Path, chaos: Any) -> None:
    """A symlink where an entry, a member, a record or a shard directory should be: never served
    (even though the bytes behind it are the right ones), reported by verify, and what it points
    to is never modified or deleted by a read, verify --fix, clear --all or eviction."""
    import random

    root = tmp_path / "store"
    outside = tmp_path / "outside"
    outside.mkdir()
    st = fill(chaos, root)
    st = chaos.open_store(root)
    kind, key = "chaos-group", chaos.key_name(2)
    ident = st.entry_id(kind, key)
    if how == "symlink_shard":
        shard = root / "entries" / ident[:2]
        shutil.copytree(shard, outside / "shard")
        shutil.rmtree(shard)
        os.symlink(outside / "shard", shard)
    else:
        chaos.corrupt_entry(st, kind, key, how, random.Random(1), str(outside))
    snap = tree(outside)
    st.close()
    v = chaos.verify(root, fix=False)
    assert ident in {p["id"] for p in v["problems"]} or how == "symlink_shard" and v["problems"], v
    st = chaos.open_store(root)
    assert st.get(kind, key) is None
    st.close()
    env = base_env(tmp_path)
    import kcache.store.tunables as local

    # Removal paths first, with the link still there: clear --all, then eviction of everything.
    # (one process for the three: attackers.run_cli; a traceback out of any fails it)
    run_cli(
        [[*args, "--dir", str(root)] for args in (["stats"], ["inspect", ident[:8]], ["clear", "--all"])], env
    )
    fill(chaos, root)
    st = chaos.open_store(root, max_size=1)
    saved, local.GRACE_S = local.GRACE_S, 0.0
    try:
        st.evict(0)
    finally:
        local.GRACE_S = saved
        st.close()
    chaos.verify(root, fix=True)
    assert chaos.verify(root, fix=False)["ok"]
    assert tree(outside) == snap


# ------------------------------------------------------------------------------ hostile index rows
def payload(marker: Path) -> bytes:
    """A protocol-0 pickle that runs ``touch marker`` when unpickled (written literally)."""
    return b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."


def add_row(db: Path, ident: Any, record: Any) -> None:
    """A row kcache did not write, straight into the index's database."""
    con = sqlite3.connect(db, isolation_level=None)
    try:
        con.execute(
            "INSERT INTO entries (id, kind, size, created, last_used, hits, record)"
            " VALUES (?, 'triton', 100, 1.0, 1.0, 0, ?)",
            (ident, record),
        )
    finally:
        con.close()


def everything_that_reads_the_index(root: Path, tmp_path: Path, chaos: Any) -> list[Any]:
    """Every command that reads the index, then the library, on ``root``. The commands run one
    after the other in one fresh process (attackers.run_cli, as tests/reliability/test_links.py
    runs them: the command line's own ``main``, each command's exit status and output apart): what
    is tested is what each does with the rows, not the process around it, and a traceback out of
    any of them fails that process."""
    env = base_env(tmp_path)
    commands = [
        ["stats"],
        ["stats", "--json"],
        ["inspect"],
        ["inspect", "--limit", "0", "--json"],
        ["inspect", "ab"],
        ["explain"],
        ["verify"],
        ["clear", "--older-than", "1s", "--dry-run"],
        ["clear", "--kind", "triton", "--dry-run"],
        ["verify", "--fix"],
        ["clear", "--all"],
    ]
    out: list[Any] = []
    for res in run_cli([[*args, "--dir", str(root)] for args in commands], env):
        assert "Traceback" not in res["stderr"], res
        assert res["rc"] in (0, 1), res
        out.append(res)
    # The library: stats, a put (index insert, eviction under a 1-byte bound), hits and misses.
    code = f"""
import json, kcache, importlib.util
import kcache.store.tunables as local
local.GRACE_S = 0.0
spec = importlib.util.spec_from_file_location("c", {str(chaos.HERE)!r}); c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
kcache.enable(dir={str(root)!r}, max_size=1, triton=False, nvfuser=False)
st = kcache.active_store()
st.put("chaos", "x", c.expected("chaos", "x"))
st.get("chaos", "x"); st.get("chaos", "y")
st.evict(0)
print(json.dumps(kcache.stats()["enabled"]))
"""
    r = run_py(code, kenv(tmp_path, root))
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    out.append(r)
    return out


def test_pickle_rows_are_never_unpickled(tmp_path: Path, chaos: Any) -> None:
    marker = tmp_path / "PWNED"
    root = tmp_path / "store"
    fill(chaos, root)
    db = root / "index" / "kcache.sqlite"
    p = payload(marker)
    add_row(db, "a" * 40, p)  # a pickle where the record goes, under a plausible entry id
    add_row(db, "b" * 40, p)
    add_row(db, p, b"x")  # an id that is a pickle (bytes, not text)
    add_row(db, p.decode(), p)  # the same as text
    results = everything_that_reads_the_index(root, tmp_path, chaos)
    assert not marker.exists()
    verify_out = json.loads(
        subprocess.run(
            [PYTHON, "-m", "kcache", "verify", "--json", "--dir", str(root)],
            capture_output=True,
            text=True,
            env=base_env(tmp_path),
        ).stdout
    )
    assert verify_out["ok"], verify_out  # the rows were removed by verify --fix / clear --all
    assert results and not marker.exists()


def test_pickle_payload_is_live(tmp_path: Path) -> None:
    """Control: the payload above does run when something unpickles it (so the test above means
    something). Unpickled here, in a throwaway process, never by kcache."""
    marker = tmp_path / "RAN"
    r = subprocess.run(
        [PYTHON, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
        input=payload(marker),
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == 0 and marker.exists()


def test_pickle_rows_refused_under_triton(tmp_path: Path, chaos: Any, compiled_store: Any) -> None:
    """The same rows in the index of a store a KCACHE=1 compile uses: compiles and hits work,
    nothing runs. The store holds the first kernel (a real compile's store, copied)."""
    marker = tmp_path / "PWNED"
    store = tmp_path / "store"
    specs = chaos.kernel_specs(2)
    shutil.copytree(compiled_store(1), store, symlinks=True)
    add_row(store / "index" / "kcache.sqlite", "d" * 40, payload(marker))
    out, r = compile_in_child(specs, kenv(tmp_path, store), after="st.evict(0)\nkcache.stats()")
    assert out["counts"]["triton"]["hits"] == 1
    assert not marker.exists()


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_row_filename_outside_the_store_is_never_read_or_deleted(
    where: str, tmp_path: Path, chaos: Any
) -> None:
    """Rows whose id names a path outside: a FIFO (opening it to read would hang the command,
    caught by the timeout) and a regular file (it must survive clear, verify --fix and eviction)."""
    root = tmp_path / "store"
    fill(chaos, root)
    victim_dir = tmp_path / "victims"
    victim_dir.mkdir()
    fifo = victim_dir / "fifo"
    os.mkfifo(fifo)
    precious = victim_dir / "precious"
    precious.write_bytes(b"keep me")

    def name(p: Path) -> str:
        return os.path.relpath(p, root / "index") if where == "relative" else str(p)

    db = root / "index" / "kcache.sqlite"
    add_row(db, name(fifo), b"x")
    add_row(db, name(precious), b"x")
    add_row(db, "e" * 40, name(fifo).encode())
    add_row(db, "f" * 40, 12345)
    everything_that_reads_the_index(root, tmp_path, chaos)
    assert precious.read_bytes() == b"keep me"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_crafted_row_ids_never_become_paths(tmp_path: Path, chaos: Any) -> None:
    """Raw text rows whose key is a path (../.., absolute) with a valid record: eviction and
    clear drop the rows and never touch those paths."""
    root = tmp_path / "store"
    fill(chaos, root)
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_bytes(b"k")
    st = chaos.open_store(root)
    rec = st.put("chaos", "template", chaos.expected("chaos", "template")).record
    st.close()
    db = root / "index" / "kcache.sqlite"
    for key in ("../../target", str(target), "../" * 8 + str(target).lstrip("/"), "ab/../../../target"):
        add_row(db, key, rec.encode())
    everything_that_reads_the_index(root, tmp_path, chaos)
    assert (target / "keep").read_bytes() == b"k"


def crafted_record(ident: str, member: str, size: int, blob: bytes) -> bytes:
    body = msgpack.packb(
        {
            "schema": 1,
            "kind": "chaos",
            "key": "crafted",
            "id": ident,
            "files": [[member, size, crc32(blob), "0" * 64]],
            "created": time.time(),
            "compile_s": 0.0,
            "components": {},
            "summary": {},
        },
        use_bin_type=True,
    )
    import struct

    return struct.pack(">4sI", MAGIC, crc32(body)) + body


@pytest.mark.parametrize("member", ["../../../outside/secret", "/etc/hostname", "a/../../b", "..", "sub/x"])
def test_records_naming_paths_outside_are_refused(
    member: str, tmp_path: Path, chaos: Any, kcache_warnings
) -> None:
    """A record (valid checksum) whose member name escapes the entry directory: never read,
    refused as corrupt (a miss, one warning), flagged by verify, and --fix removes only the entry."""
    root = tmp_path / "store"
    fill(chaos, root, 1)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_bytes(b"secret bytes")
    st = chaos.open_store(root)
    ident = st.entry_id("chaos", "crafted")
    d = Path(st.entry_dir(ident))
    d.mkdir(parents=True)
    (d / RECORD_NAME).write_bytes(crafted_record(ident, member, len(b"secret bytes"), b"secret bytes"))
    from kcache import log as klog

    klog._warned.clear()
    kcache_warnings.clear()
    assert st.get("chaos", "crafted") is None
    assert len(kcache_warnings) == 1 and ident[:12] in kcache_warnings[0]
    st.close()
    fill(chaos, root, 1)
    st = chaos.open_store(root)
    d.mkdir(parents=True, exist_ok=True)
    (d / RECORD_NAME).write_bytes(crafted_record(ident, member, 12, b"secret bytes"))
    st.close()
    v = chaos.verify(root, fix=False)
    assert ident in {p["id"] for p in v["problems"]}, v
    chaos.verify(root, fix=True)
    assert chaos.verify(root, fix=False)["ok"]
    assert secret.read_bytes() == b"secret bytes"
    assert Path("/etc/hostname").exists() or member != "/etc/hostname"


# ------------------------------------------------------------------------------ code from the store
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

LAUNCHER_CHILD = """
import json, os, sys
import triton
from triton.runtime import build
import kcache
src = {src!r}
out = {{"enabled": kcache.is_enabled()}}
if {plant!r}:
    # What an attacker with write access to the store would put there: a launcher with a payload,
    # under the very key Triton looks the real one up by.
    import hashlib, sysconfig
    from triton.runtime.cache import get_cache_manager
    key = hashlib.sha256((src + build.platform_key()).encode("utf-8")).hexdigest()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    get_cache_manager(key).put(open({evil!r}, "rb").read(), "kc_probe" + suffix, binary=True)
    out["planted"] = True
else:
    mod = build.compile_module_from_src(src, "kc_probe")
    out["f"] = mod.f()
print(json.dumps(out))
"""


def test_launcher_libraries_load_only_from_a_trusted_store(tmp_path: Path) -> None:
    """A launcher .so planted in the store under Triton's key for a module: loaded from a store
    that passed the ownership check (that is what the store is for: it is the user's own); refused
    from one owned by another user or writable by others (caching off: built locally, the planted
    library never loaded, its payload never run)."""
    build = pytest.importorskip("triton.runtime.build")
    if not hasattr(build, "compile_module_from_src") or not shutil.which("gcc"):
        cannot_run("needs Triton's compile_module_from_src and gcc")
    import sysconfig

    marker = tmp_path / "LOADED"
    good_src = PROBE_SRC % {"value": 42, "init": ""}
    evil_c = tmp_path / "evil.c"
    evil_c.write_text(
        PROBE_SRC % {"value": 666, "init": f'FILE* m = fopen("{marker}", "w"); if (m) fclose(m);'}
    )
    evil = tmp_path / "evil.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O0",
            f"-I{sysconfig.get_paths()['include']}",
            str(evil_c),
            "-o",
            str(evil),
        ],
        check=True,
        capture_output=True,
    )
    store = tmp_path / "store"
    env = kenv(tmp_path, store)

    def child(plant: bool) -> dict[str, Any]:
        r = run_py(LAUNCHER_CHILD.format(src=good_src, plant=plant, evil=str(evil)), env, timeout=300)
        no_traceback(r)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])

    assert child(plant=True)["planted"]
    assert len(store_entries(store)) >= 1
    for how in ("other_owner", "world_writable"):
        if how == "other_owner":
            chown_tree(store, NOBODY, NOBODY)
        else:
            chown_tree(store, 0, 0)
            os.chmod(store, 0o777)
        out = child(plant=False)
        assert not out["enabled"] and out["f"] == 42, (how, out)
        assert not marker.exists(), how
    chown_tree(store, 0, 0)
    os.chmod(store, 0o700)
    out = child(plant=False)  # the user's own store: its launcher is what Triton loads
    assert out["enabled"] and out["f"] == 666 and marker.exists()


def test_nothing_else_from_the_store_is_loaded(tmp_path: Path, chaos: Any, compiled_store: Any) -> None:
    """Python files, .pth files and shared objects put into a trusted store as entries of other
    kinds (or as stray files) are never imported or loaded by a KCACHE=1 process that compiles.
    The store holds the first kernel (a real compile's store, copied)."""
    store = tmp_path / "store"
    marker = tmp_path / "IMPORTED"
    shutil.copytree(compiled_store(1), store, symlinks=True)
    st = chaos.open_store(store)
    evil_py = f"open({str(marker)!r}, 'w').close()\n".encode()
    st.put(
        "chaos",
        "py",
        {"sitecustomize.py": evil_py, "usercustomize.py": evil_py, "x.pth": b"import os; " + evil_py},
    )
    st.close()
    for d in (store, store / "entries", store / "tmp"):
        (d / "sitecustomize.py").write_bytes(evil_py)
    out, r = compile_in_child(chaos.kernel_specs(2), kenv(tmp_path, store))
    assert out["enabled"] and not marker.exists()
