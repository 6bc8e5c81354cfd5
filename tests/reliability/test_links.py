"""Links (issue 16): nothing outside the store is ever written, truncated or deleted through a
link, whoever planted it.

The report: a store whose ``trash/`` or ``tmp/`` was a link to a folder outside it, and
``kcache clear --kind nosuchkind`` deleted every file in the linked folders; and ``kcache export
FILE`` wrote through a predictable temporary name (``.FILE.tmp``) that another user had planted
as a link to a victim's file in a sticky world-writable folder.

What is shown here, as this user and (where the test runs as root, as CI does) with a second
user, uid 65534, planting the links:

- every internal folder of the store (``entries/``, ``tmp/``, ``trash/``, ``locks/``,
  ``index/``) and its marker replaced by a link to a folder of victim files: every command
  (``clear`` with every selector, ``verify [--fix]``, ``stats [--zero]``, ``inspect``,
  ``explain``, ``import``, ``export``) refuses the store with one line that says why, a
  ``KCACHE=1`` compile goes on uncached with one warning, and no victim file changes;
- links planted inside those folders, at the names the store creates, removes or writes (stale
  leftovers, trash, ``clock``, ``evict.lock``, the index's files, shards and entries): every
  command, a compile and an eviction run, and no victim file changes;
- ``kcache export`` with links planted at its temporary name and at the file's own name: the
  victim's file is untouched, and the export either writes a new file or fails with one line;
- the other places that write a file at a path a user or a setting names: the ``KCACHE_RECORD``
  file (a link, a hard link or another user's file at the name) and the Inductor mirror in
  ``TRITON_CACHE_DIR`` (a link at a kernel's folder); the node-local index folder on a network
  filesystem.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kcache.store.records import entry_id

from .attackers import (
    every_command,
    fingerprint,
    make_victims,
    needs_root,
    plant,
    private_tmp,
    run_cli,
    shared_folder,
)
from .conftest import (
    NOBODY,
    base_env,
    compile_in_child,
    kenv,
    no_traceback,
    run_py,
    warning_lines,
)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """This module's ``tmp_path``: one the second user can reach (see attackers.private_tmp)."""
    yield from private_tmp()


INTERNAL = ("entries", "tmp", "trash", "locks", "index")
PLANTERS = ("self", "nobody")
EXPORTED = ("triton", "triton-autotune")


def fill(chaos: Any, root: Path, n: int = 4, kinds: tuple[str, ...] = ()) -> None:
    """Entries of the chaos tool's content; ``kinds``: of those kinds instead (real kinds are
    exported, the chaos tool's are not)."""
    st = chaos.open_store(root)
    for i in range(n):
        for kind in kinds or chaos.KINDS:
            st.put(kind, chaos.key_name(i), chaos.expected(kind, chaos.key_name(i)))
    st.close()


@pytest.fixture
def inputs(tmp_path: Path, chaos: Any) -> dict[str, Path]:
    """A bundle and a Triton cache folder to import, and a path to export to."""
    from kcache.bundle import export_bundle

    src = tmp_path / "bundle-source"
    fill(chaos, src, 2, EXPORTED)
    st = chaos.open_store(src)
    try:
        export_bundle(st, tmp_path / "in.kcb")
    finally:
        st.close()
    tc = tmp_path / "triton-cache"
    tc.mkdir(mode=0o700)
    return {"bundle": tmp_path / "in.kcb", "triton_cache": tc, "export_to": tmp_path / "out" / "x.kcb"}


def setup_store(tmp_path: Path, chaos: Any, planter: str) -> tuple[Path, dict]:
    """A filled store and the environment to use it with. Planted by another user, the store is
    a shared one (root and internal folders 0777) used with KCACHE_ALLOW_INSECURE=1: the only
    way another user can put anything into it. Planted by this user, it is a private one."""
    root = tmp_path / "shared" / "store"
    root.parent.mkdir()
    fill(chaos, root)
    extra = {}
    if planter == "nobody":
        for sub in ("", *INTERNAL, *(f"entries/{s}" for s in os.listdir(root / "entries"))):
            os.chmod(root / sub, 0o777)
        extra["KCACHE_ALLOW_INSECURE"] = "1"
    return root, extra


def relink(root: Path, sub: str, target: Path) -> None:
    """Replace ``root/sub`` by a link to ``target`` (moved aside first, as a planter would)."""
    os.rename(root / sub, root / f".{sub}.moved")
    os.symlink(target, root / sub)


# ------------------------------------------------------------------------------ internal folders
@pytest.mark.parametrize("planter", PLANTERS)
@pytest.mark.parametrize("sub", [*INTERNAL, "KCACHE_STORE"])
def test_internal_folder_linked_outside_is_refused(
    sub: str,
    planter: str,
    tmp_path: Path,
    chaos: Any,
    inputs: dict[str, Path],
    reference_kernels: dict,
) -> None:
    """An internal folder (or the marker) replaced by a link to a folder of victim files: every
    command refuses the store (exit 1, one line naming the link; an unknown --kind exits 2
    first), a KCACHE=1 compile goes on uncached with one warning, no victim file changes, and
    nothing is exported."""
    needs_root(planter)
    root, extra = setup_store(tmp_path, chaos, planter)
    victims = make_victims(tmp_path / "victims")
    before = fingerprint(victims)
    plant(planter, lambda: relink(root, sub, victims))
    env = base_env(tmp_path, **extra)
    inputs["export_to"].parent.mkdir()
    results = run_cli(every_command(root, **inputs), env)
    for res in results:
        args = res["args"]
        if args[0] == "config":  # reports; opens nothing
            assert res["rc"] == 0, res
            continue
        if "nosuchkind" in args:
            assert res["rc"] == 2 and "unknown kind" in res["stderr"], res
            continue
        assert res["rc"] == 1, res
        lines = res["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kcache: error:"), res
        if sub == "KCACHE_STORE":
            assert "symbolic link" in lines[0], res
        else:
            assert f"{root}/{sub} is a link or not a folder: refusing the store" in lines[0], res
    assert not inputs["export_to"].exists()
    assert os.listdir(inputs["export_to"].parent) == []
    # A program with KCACHE=1 on that store: compiles, uncached, one warning saying why.
    spec = chaos.kernel_specs(1)
    out, r = compile_in_child(spec, kenv(tmp_path, root, **extra))
    assert not out["enabled"]
    assert out["kernels"] == {n: reference_kernels[n] for n in out["kernels"]}
    w = warning_lines(r.stderr)
    assert len(w) == 1 and "caching is off" in w[0], w
    assert ("symbolic link" if sub == "KCACHE_STORE" else f"{sub} is a link") in w[0], w
    assert fingerprint(victims) == before


# ------------------------------------------------------------------------------ links inside
def plant_inside(root: Path, victims: Path, ident: str) -> list[str]:
    """Links at the names the store itself creates, removes or writes inside its folders."""
    old = time.time() - 3 * 86400
    planted = {
        "tmp/scratch.999999999.0123456789abcdef": victims,  # a dead writer's leftover
        "tmp/old-leftover": victims,  # an old one
        "tmp/served.1.0000000000000000": victims,
        "trash/" + "ab" * 20 + ".999999999.00": victims,  # an entry being deleted
        "trash/stray.1.00": victims / "precious",
        "locks/evict.lock": victims / "evict.lock",
        "locks/clock": victims / "clock",
        f"locks/{ident}.lock": victims / "precious",
        "index/kcache.sqlite-shm": victims / "kcache.sqlite-shm",
        "entries/ee": victims,  # a shard
        f"entries/{ident[:2]}/{ident[:2]}{'9' * 38}": victims,  # an entry folder
    }
    for rel, target in planted.items():
        p = root / rel
        if os.path.lexists(p):
            os.rename(p, str(p) + ".moved")
        os.symlink(target, p)
        os.utime(p, (old, old), follow_symlinks=False)
    return list(planted)


@pytest.mark.parametrize("planter", PLANTERS)
def test_links_inside_internal_folders_are_never_followed(
    planter: str, tmp_path: Path, chaos: Any, inputs: dict[str, Path]
) -> None:
    """Links planted inside tmp/, trash/, locks/, index/ and entries/ at the names the store
    uses: every command, a KCACHE=1 compile, and eviction of everything run; links are removed
    or refused, never followed: no victim file changes."""
    needs_root(planter)
    root, extra = setup_store(tmp_path, chaos, planter)
    victims = make_victims(tmp_path / "victims")
    before = fingerprint(victims)
    ident = entry_id("chaos", chaos.key_name(0), "")
    plant(planter, lambda: plant_inside(root, victims, ident))
    env = base_env(tmp_path, **extra)
    inputs["export_to"].parent.mkdir()
    commands = every_command(root, **inputs)
    # The commands that remove things (verify --fix, clear --all) last: the others meet the links.
    commands.sort(key=lambda a: a[:2] in (["verify", "--fix"], ["clear", "--all"]))
    for res in run_cli(commands, env):
        assert res["rc"] in (0, 1, 2), res
        assert "Traceback" not in res["stderr"], res
    assert fingerprint(victims) == before
    plant(planter, lambda: plant_inside(root, victims, ident))
    out, r = compile_in_child(
        chaos.kernel_specs(1),
        kenv(tmp_path, root, **extra),
        after="st.evict(0); st.clean_tmp(0)",
    )
    assert out["enabled"], r.stderr
    code = f"""
import importlib.util, kcache, kcache.store.tunables as local
local.GRACE_S = 0.0
spec = importlib.util.spec_from_file_location("c", {str(chaos.HERE)!r}); c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
kcache.enable(dir={str(root)!r}, max_size=1, triton=False, nvfuser=False)
st = kcache.active_store()
for i in range(6):
    st.put("chaos", f"n{{i}}", c.expected("chaos", f"n{{i}}"))
    st.get("chaos", c.key_name(i))
st.evict(0); st.clean_tmp(0); st.rebuild_index(); st.close()
print("done")
"""
    r = run_py(code, kenv(tmp_path, root, **extra))
    no_traceback(r)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-3000:]
    assert fingerprint(victims) == before


# ------------------------------------------------------------------------------ export
EXPORT_CHILD = """
import sys
import kcache.store.fs as fs
real, calls = fs.unique_name, []
def predictable(prefix):
    calls.append(prefix)
    # The first temporary name is the one the planter guessed; later ones are random again.
    return prefix + ".guessed" if len(calls) == 1 else real(prefix)
fs.unique_name = predictable
import kcache.cli
sys.exit(kcache.cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("planter", PLANTERS)
@pytest.mark.parametrize("where", ["final", "temporary", "both"])
def test_export_never_writes_through_a_planted_link(
    where: str, planter: str, tmp_path: Path, chaos: Any
) -> None:
    """``kcache export /shared/bundle.kcb`` into a sticky world-writable folder where the planter
    made the export's names links to a victim's file (0600): at the file's own name, at the old
    predictable temporary name (``.bundle.kcb.tmp``) and at the temporary name this export picks
    (the planter's guess made right). The victim's file is untouched, and the export either wrote
    a new, readable bundle at the name (the link replaced, not followed) or failed with one line."""
    from kcache.bundle import open_bundle

    needs_root(planter)
    root = tmp_path / "store"
    fill(chaos, root, 2, EXPORTED)
    victims = make_victims(tmp_path / "victims")
    victim = victims / "precious"
    before = fingerprint(victims)
    # Sticky and world-writable, like /tmp; the planter's own (so that fs.protected_symlinks,
    # where it is on, does not hide a write through the link: it lets the folder's owner's
    # links be followed).
    shared = shared_folder(tmp_path / "shared", 0o1777, owner=NOBODY if planter == "nobody" else None)
    out = shared / "bundle.kcb"
    names = {"final": ["bundle.kcb"], "temporary": [".bundle.kcb.tmp", ".bundle.kcb.guessed.tmp"]}
    names["both"] = names["final"] + names["temporary"]
    plant(planter, lambda: [os.symlink(victim, shared / n) for n in names[where]])
    r = run_py(
        f"import sys; sys.argv[1:] = {['export', str(out), '--dir', str(root)]!r}\n" + EXPORT_CHILD,
        base_env(tmp_path),
    )
    no_traceback(r)
    assert fingerprint(victims) == before
    if r.returncode == 0:
        assert os.path.isfile(out) and not os.path.islink(out)
        b = open_bundle(out)
        try:
            assert len(b.records) == 2 * len(EXPORTED)
        finally:
            b.close()
    else:
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("kcache: error:"), r.stderr
    for n in names[where]:
        if n != "bundle.kcb" or r.returncode != 0:
            assert os.readlink(shared / n) == str(victim)  # the planter's links: left alone
    leftovers = [n for n in os.listdir(shared) if n not in names[where] and n != "bundle.kcb"]
    assert leftovers == []  # no temporary file left behind


# ------------------------------------------------------------------------------ KCACHE_RECORD
@pytest.mark.parametrize("how", ["symlink", "hardlink", "foreign_file"])
def test_record_file_never_written_through_a_planted_name(
    how: str, tmp_path: Path, kcache_warnings: list[str]
) -> None:
    """``KCACHE_RECORD=/shared/spec.toml`` where another name was planted first: a link to the
    victim's file, a hard link to it (what another user can make where fs.protected_hardlinks is
    off; made here by root), or another user's own file. Nothing is appended to any of them; the
    program is told once, and goes on."""
    from kcache.prewarm.record import Recorder

    if how != "hardlink":
        needs_root()
    victims = make_victims(tmp_path / "victims")
    victim = victims / "precious"
    shared = shared_folder(tmp_path / "shared", 0o1777, owner=NOBODY if os.geteuid() == 0 else None)
    spec = shared / "spec.toml"
    if how == "symlink":
        plant("nobody", lambda: os.symlink(victim, spec))
    elif how == "hardlink":
        os.link(victim, spec)
    else:
        plant("nobody", lambda: spec.write_text("# nobody's\n"))
    before = fingerprint(victims)
    theirs = spec.read_bytes()
    rec = Recorder(str(spec))
    # What a kernel launch does (capture, then commit after the compile), with an entry to write.
    rec._pending[(id(None), "None")] = ("0" * 16, {"kernel": "m:f", "args": {"n": 1}}, None)
    rec.commit({})
    assert rec.recorded == 0
    assert fingerprint(victims) == before
    assert spec.read_bytes() == theirs
    w = [m for m in kcache_warnings if "KCACHE_RECORD" in m]
    assert len(w) == 1 and str(spec) in w[0], kcache_warnings


def test_record_file_is_written_when_it_is_ours(tmp_path: Path, kcache_warnings: list[str]) -> None:
    """Control for the test above: a file of our own (new, or existing) is appended to."""
    from kcache.prewarm.record import Recorder

    spec = tmp_path / "spec.toml"
    rec = Recorder(str(spec))
    rec._pending[(id(None), "None")] = ("0" * 16, {"kernel": "m:f", "args": {"n": 1}}, None)
    rec.commit({})
    assert rec.recorded == 1 and "m:f" in spec.read_text()
    assert not [m for m in kcache_warnings if "KCACHE_RECORD" in m]


# ------------------------------------------------------------------------------ the Inductor mirror
MIRROR_CHILD = """
import json, os, sys
import kcache.log
from kcache.triton.manager import _mirror_for_inductor
_mirror_for_inductor({key!r}, "k.json", {paths!r})
print(json.dumps({{"done": True}}))
"""


@pytest.mark.parametrize("how", ["kernel_folder", "group_file", "member"])
def test_inductor_mirror_never_writes_through_a_link(how: str, tmp_path: Path) -> None:
    """``TRITON_CACHE_DIR/<key>/`` (Triton's layout, which kcache fills for Inductor) where a link
    was planted: at the kernel's folder, at its ``__grp__`` file, at a member's name. Nothing is
    written through it; a refused folder is said once."""
    triton = pytest.importorskip("triton")  # noqa: F841
    victims = make_victims(tmp_path / "victims")
    before = fingerprint(victims)
    src = tmp_path / "served"
    src.mkdir()
    paths = {}
    for n in ("k.json", "k.cubin"):
        (src / n).write_bytes(b"kernel file " + n.encode())
        paths[n] = str(src / n)
    tc = tmp_path / "triton-cache"
    tc.mkdir(mode=0o700)
    key = "A" * 52
    if how == "kernel_folder":
        os.symlink(victims, tc / key)
    else:
        (tc / key).mkdir(mode=0o700)
        name = "__grp__k.json" if how == "group_file" else "k.cubin"
        os.symlink(victims / "precious", tc / key / name)
    env = base_env(tmp_path, TRITON_CACHE_DIR=str(tc))
    r = run_py(MIRROR_CHILD.format(key=key, paths=paths), env)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert fingerprint(victims) == before
    if how == "kernel_folder":
        w = warning_lines(r.stderr)
        assert len(w) == 1 and "link" in w[0] and str(tc) in w[0], r.stderr


# ------------------------------------------------------------------------------ node-local index
def test_node_local_index_folder_through_a_link_is_refused(tmp_path: Path, chaos: Any) -> None:
    """The store on a network filesystem keeps its index in ``$XDG_CACHE_HOME/kcache-index/<hash>``.
    With ``kcache-index`` a link to a folder of victim files, nothing may be created or written in
    that folder (the store is refused, or its index kept elsewhere)."""
    victims = make_victims(tmp_path / "victims")
    before = fingerprint(victims)
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    os.symlink(victims, xdg / "kcache-index")
    code = f"""
import json, os
from kcache.store import Store, StoreError
try:
    st = Store.open({str(tmp_path / "store")!r}, network_fs=True)
    st.put("chaos", "k", {{"a.bin": b"x"}}); st.flush(force=True); st.index(); st.close()
    print(json.dumps("opened"))
except StoreError as e:
    print(json.dumps(str(e)))
"""
    r = run_py(code, base_env(tmp_path, XDG_CACHE_HOME=str(xdg)))
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    assert fingerprint(victims) == before


def test_helpers_see_a_write_through_a_link(tmp_path: Path) -> None:
    """Control: a write through one of the links these tests plant does change the victims'
    fingerprint (so 'unchanged' above means nothing was written)."""
    victims = make_victims(tmp_path / "victims")
    before = fingerprint(victims)
    link = tmp_path / "link"
    os.symlink(victims / "precious", link)
    with open(link, "ab") as f:
        f.write(b"x")
    assert fingerprint(victims) != before
    before = fingerprint(victims)
    os.symlink(victims, tmp_path / "dirlink")
    shutil.rmtree(tmp_path / "dirlink" / "0123456789abcdef0123456789abcdef01234567.999999999.00")
    assert fingerprint(victims) != before


@pytest.mark.parametrize("node", ["fifo", "device"])
def test_export_never_replaces_a_device_or_a_pipe(node: str, tmp_path: Path, chaos: Any) -> None:
    """``kcache export /dev/full`` (as root) replaced the device node with the bundle: a name
    that is not a regular file, a link or absent is refused, one line, the node left as it was."""
    root = tmp_path / "store"
    fill(chaos, root, 1, EXPORTED)
    target = tmp_path / "node"
    if node == "fifo":
        os.mkfifo(target)
    else:
        needs_root("root")
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers
    before = os.lstat(target)
    r = run_py(
        f"import sys; sys.argv[1:] = {['export', str(target), '--dir', str(root)]!r}\n" + EXPORT_CHILD,
        base_env(tmp_path),
    )
    no_traceback(r)
    assert r.returncode == 1 and "not a regular file" in r.stderr, r.stderr
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".node")], "a temporary file left"
