"""Swaps (issue 17): no kcache process loads a launcher library that another user wrote.

The report: two ways to make a process load a launcher ``.so`` of another user's (its code ran,
``f() == 666``):

1. swap after the check: a private store in a folder others can write (0777, not sticky); the
   other user renamed the store away after the victim's process had opened it, and put a folder
   of their own with a planted launcher in its place; the next compile loaded it;
2. a writable subfolder: the root (0755) passes the check, but ``entries/`` is 0777; the other
   user wrote a ``triton-aux`` entry (a ``.so`` under Triton's key for that module) into it.

What is shown here, with the launcher probe (a C extension that Triton's own
``build.compile_module_from_src`` builds and loads the way it does a kernel's launcher; the
planted one creates a marker file and returns 666), the second user being uid 65534:

- (1) a process opens the store, the store is swapped for another folder holding the planted
  launcher under the right key in a valid store layout, the process builds: the planted launcher
  is not loaded (its descriptors still reach the store it opened), ``f() == 42``, no marker,
  and the module Triton loaded was reached through ``/proc/self/fd/`` (a private file of the
  verified bytes, never a path resolved again). Done in-process by this user (only pinning stands
  between the process and the planted launcher), and by the second user through a folder it can
  write: refused at open, used under ``KCACHE_ALLOW_INSECURE=1`` without taking launchers from
  it, and a folder that became writable only after the store was opened;
- (2) ``entries/``, a shard or the entry's own files writable by others, planted or rewritten by
  the second user: refused with a warning that says why, ``f() == 42``, no marker; with the
  modes put right the very same planted bytes are loaded (the control: only the check stood in
  the way);
- the parent-folder rule (ssh's StrictModes): a store under a folder another user can write
  without the sticky bit is refused with one warning naming ``KCACHE_ALLOW_INSECURE``; with it,
  the store is used but launchers never come from it;
- the same rules for ``TRITON_CACHE_DIR``, where kcache writes Triton's layout for Inductor.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .attackers import (
    Probe,
    Waiting,
    as_nobody,
    fingerprint,
    load_probe,
    needs_root,
    plant_launcher,
    private_tmp,
    shared_folder,
)
from .conftest import (
    NOBODY,
    base_env,
    cannot_run,
    chown_tree,
    kenv,
    no_traceback,
    run_py,
    store_entries,
    tree,
    warning_lines,
)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """This module's ``tmp_path``: one the second user can reach (see attackers.private_tmp)."""
    yield from private_tmp()


PROC_FD = "/proc/self/fd/"


@pytest.fixture(scope="module")
def module_probe() -> Iterator[Probe]:
    """The probe, built once for the module (gcc: the evil library), and a store holding that
    library planted under the good source's key (one child that plants it, as before for each
    test), as ``planted_template``: both are the same for every test, which copies the store
    (:func:`planted_store`). Its marker is one file, removed before and after each test
    (:func:`probe`): the tests here run one after the other in one process."""
    tmp = private_tmp()
    d = next(tmp)
    try:
        probe = Probe(d)
        template = d / "planted-template"
        plant_launcher(probe, kenv(d, template))
        assert len(store_entries(template)) == 1
        probe.planted_template = template  # type: ignore[attr-defined]
        yield probe
    finally:
        tmp.close()


@pytest.fixture
def probe(module_probe: Probe) -> Iterator[Probe]:
    """The module's probe, its marker absent (a control that loaded the planted library made it)."""
    module_probe.marker.unlink(missing_ok=True)
    yield module_probe
    module_probe.marker.unlink(missing_ok=True)


def planted_store(probe: Probe, tmp_path: Path, where: Path, owner: int = 0) -> Path:
    """A valid store at ``where`` whose only entry is the evil launcher under the good source's
    key (what an attacker would build in a store of their own), owned by ``owner``: a copy of
    the module's planted store (modes kept), made by a real plant once (see :func:`module_probe`)."""
    shutil.copytree(probe.planted_template, where, symlinks=True)  # type: ignore[attr-defined]
    assert len(store_entries(where)) == 1
    if owner:
        chown_tree(where, owner, owner)
    return where


def make_store(root: Path) -> None:
    from kcache.store import Store

    Store.open(root).close()


# ------------------------------------------------------------------------------ (1) swapped store
def test_store_swapped_under_an_open_process_is_not_followed(probe: Probe, tmp_path: Path) -> None:
    """In-process: the store is opened, then renamed away and replaced by a folder of this user's
    holding the planted launcher (a valid store, owner and modes right: it passes every check);
    the process builds the module: the pinned descriptors still reach the store it opened, the
    planted launcher is never loaded, ``f() == 42``; the launcher it built went into the store it
    opened, and Triton loaded it through /proc/self/fd. Control: a new process on the swapped-in
    folder loads the planted launcher (it is a valid store of this user's)."""
    store = tmp_path / "store"
    planted = planted_store(probe, tmp_path, tmp_path / "planted")
    before = tree(planted)
    env = kenv(tmp_path, store)
    waiting = Waiting(probe, env)
    try:
        os.rename(store, tmp_path / "store.moved")
        os.rename(planted, store)
        out, err = waiting.go()
    finally:
        waiting.kill()
    assert out["opened"] and out["trust_host_code"], out
    assert out["f"] == 42 and not probe.marker.exists(), out
    assert out["file"].startswith(PROC_FD), out
    assert warning_lines(err) == [], err
    assert tree(store) == before  # the swapped-in folder: nothing written into it
    assert len(store_entries(tmp_path / "store.moved")) == 1  # the launcher built, stored where it belongs
    # Control: the swapped-in folder is a store this user would trust: its launcher is live.
    out, _ = load_probe(probe, env)
    assert out["f"] == 666 and probe.marker.exists()


@pytest.mark.parametrize("when", ["writable_at_open", "allow_insecure", "writable_after_open"])
def test_store_swapped_by_another_user(when: str, probe: Probe, tmp_path: Path) -> None:
    """The report's attack: the store in a folder the second user can write (0777, not sticky);
    after the victim's process opened it, the second user renames it away and puts a store of its
    own with the planted launcher in its place. ``writable_at_open``: the store is refused when
    opened (one warning naming the folder and KCACHE_ALLOW_INSECURE); ``allow_insecure``: used
    with KCACHE_ALLOW_INSECURE=1, but launchers are never taken from it (one warning saying so);
    ``writable_after_open``: the folder was safe when the store was opened (it passed), made
    writable later: the process keeps the store it opened. Always: ``f() == 42``, no marker."""
    needs_root()
    shared = shared_folder(tmp_path / "shared", 0o755)
    store = shared / "store"
    make_store(store)
    evil = planted_store(probe, tmp_path, shared / "theirs", owner=NOBODY)
    extra = {"KCACHE_ALLOW_INSECURE": "1"} if when == "allow_insecure" else {}
    if when != "writable_after_open":
        os.chmod(shared, 0o777)
    waiting = Waiting(probe, kenv(tmp_path, store, **extra))
    try:
        if when == "writable_after_open":
            os.chmod(shared, 0o777)

        def swap() -> None:
            os.rename(store, shared / "store.old")
            os.rename(evil, store)

        as_nobody(swap)
        out, err = waiting.go()
    finally:
        waiting.kill()
    assert out["f"] == 42 and not probe.marker.exists(), out
    w = warning_lines(err)
    if when == "writable_at_open":
        assert not out["opened"], out
        assert len(w) == 1 and "another user can replace the store" in w[0], w
        assert f"{shared} is writable by group or others without the sticky bit" in w[0], w
        assert "KCACHE_ALLOW_INSECURE" in w[0], w
    elif when == "allow_insecure":
        assert out["opened"] and out["trust_host_code"] is False, out
        assert len(w) == 1 and "not loading launchers" in w[0] and "KCACHE_ALLOW_INSECURE" in w[0], w
    else:
        assert out["opened"] and out["trust_host_code"], out
        assert out["file"].startswith(PROC_FD), out
        assert w == [], w
        assert len(store_entries(shared / "store.old")) == 1


# ------------------------------------------------------------------------------ (2) writable subfolder
def open_up(paths: list[Path], mode: int) -> None:
    for p in paths:
        os.chmod(p, mode)


@pytest.mark.parametrize("how", ["entries", "shard", "files"])
def test_launcher_planted_through_a_writable_subfolder(how: str, probe: Probe, tmp_path: Path) -> None:
    """The root is 0755 (it passes), but ``entries/`` (or the entry's shard) is 0777, or the
    entry's files are 0666; the second user writes the planted launcher's entry into it (or over
    the real entry's files). The victim's next build: refused with a warning saying why, never
    loaded, ``f() == 42``, no marker. Control: the same store with the modes put right (and the
    files made the victim's) serves the planted launcher: f() == 666."""
    needs_root()
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    out, _ = load_probe(probe, env)  # the victim's own store, with the real launcher in it
    assert out["f"] == 42 and out["file"].startswith(PROC_FD)
    (ident,) = store_entries(store)
    shard = store / "entries" / ident[:2]
    evil = planted_store(probe, tmp_path, tmp_path / "theirs", owner=NOBODY)
    evil_entry = evil / "entries" / ident[:2] / ident
    open_up([evil, evil / "entries", evil_entry.parent, evil_entry], 0o755)  # the planter reads them
    os.chmod(store, 0o755)
    if how == "entries":
        os.chmod(store / "entries", 0o777)

        def attack() -> None:
            os.rename(shard, store / "entries" / "old")
            shutil.copytree(evil_entry.parent, shard)

    elif how == "shard":
        open_up([store / "entries"], 0o755)
        os.chmod(shard, 0o777)

        def attack() -> None:
            os.rename(shard / ident, shard / "old")
            shutil.copytree(evil_entry, shard / ident)

    else:
        open_up([store / "entries", shard, shard / ident], 0o755)
        for f in (shard / ident).iterdir():
            os.chmod(f, 0o666)

        def attack() -> None:
            for f in evil_entry.iterdir():
                with open(shard / ident / f.name, "r+b") as dst:
                    dst.write(f.read_bytes())
                    dst.truncate()

    as_nobody(attack)
    out, r = load_probe(probe, env)
    assert out["f"] == 42 and not probe.marker.exists(), out
    w = warning_lines(r.stderr)
    why = {
        "entries": f"{store}/entries is writable by group or others (mode 777)",
        "shard": f"entries/{ident[:2]} is writable by group or others (mode 777)",
        "files": "(mode 666)",
    }[how]
    assert w and why in w[0], w
    # Control: only the check stood between the planted bytes and the victim's process.
    chown_tree(store, 0, 0)
    for dirpath, _dirnames, filenames in os.walk(store):
        os.chmod(dirpath, 0o700)
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o600)
    out, _ = load_probe(probe, env)
    assert out["f"] == 666 and probe.marker.exists()


def test_a_refused_launcher_is_one_warning(probe: Probe, tmp_path: Path) -> None:
    """A refused entry (a shard others can write, holding another user's launcher) is one
    warning, not one for the lookup and another for the store that follows the build."""
    store = tmp_path / "store"
    env = kenv(tmp_path, store)
    load_probe(probe, env)
    (ident,) = store_entries(store)
    os.chmod(store / "entries" / ident[:2], 0o777)
    out, r = load_probe(probe, env)
    assert out["f"] == 42
    w = warning_lines(r.stderr)
    assert len(w) == 1, w


# ------------------------------------------------------------------------------ parent folders
PARENTS = {
    # name: (mode of the store's parent, its owner (None: this user), mode of the grandparent, refused?)
    "parent_0755": (0o755, None, 0o755, False),
    "parent_1777_sticky": (0o1777, None, 0o755, False),
    "parent_0777": (0o777, None, 0o755, True),
    "parent_0770_group": (0o770, None, 0o755, True),
    "parent_0703_others": (0o703, None, 0o755, True),
    "grandparent_0777": (0o755, None, 0o777, True),
    "parent_owned_by_another_user": (0o755, NOBODY, 0o755, True),
}


@pytest.mark.parametrize("case", list(PARENTS))
def test_store_under_a_folder_others_can_write_is_refused(case: str, tmp_path: Path) -> None:
    """As ssh's StrictModes: every folder above the store must be root's or this user's, and
    not writable by group or others unless sticky. Refused (nothing opened) with a message naming
    the folder and KCACHE_ALLOW_INSECURE; with it, opened with ``trust_host_code`` False."""
    from kcache.store import Store, StoreError

    mode, owner, gmode, refused = PARENTS[case]
    if owner and os.geteuid() != 0:
        cannot_run("a folder of another user's needs root")
    grand = tmp_path / "g"
    parent = grand / "p"
    parent.mkdir(parents=True)
    root = parent / "store"
    make_store(root)
    if owner is not None:
        os.chown(parent, owner, owner)
    os.chmod(parent, mode)
    os.chmod(grand, gmode)
    if refused:
        with pytest.raises(StoreError) as e:
            Store.open(root)
        msg = str(e.value)
        assert "another user can replace the store" in msg and "KCACHE_ALLOW_INSECURE" in msg, msg
        assert str(grand if case.startswith("grand") else parent) in msg, msg
        st = Store.open(root, allow_insecure=True)
        assert not st.trust_host_code
    else:
        st = Store.open(root)
        assert st.trust_host_code
    st.close()


@pytest.mark.parametrize("setting", ["none", "allow_insecure"])
def test_launcher_in_a_store_under_a_writable_folder(setting: str, probe: Probe, tmp_path: Path) -> None:
    """The user's own store (its launcher planted in it, as a stand-in for whatever another user
    could put there) under a folder others can write: without the setting, refused with one
    warning; with KCACHE_ALLOW_INSECURE=1, used but its launcher never loaded, one warning.
    ``f() == 42`` either way. Control: under a safe folder, that launcher is what loads."""
    shared = shared_folder(tmp_path / "shared", 0o755)
    store = planted_store(probe, tmp_path, shared / "store")
    os.chmod(shared, 0o777)
    extra = {"KCACHE_ALLOW_INSECURE": "1"} if setting == "allow_insecure" else {}
    out, r = load_probe(probe, kenv(tmp_path, store, **extra))
    assert out["f"] == 42 and not probe.marker.exists(), out
    w = warning_lines(r.stderr)
    assert len(w) == 1 and "KCACHE_ALLOW_INSECURE" in w[0], w
    if setting == "none":
        assert not out["enabled"] and "another user can replace the store" in w[0], w
    else:
        assert out["enabled"] and out["store"] == str(store) and "not loading launchers" in w[0], w
    os.chmod(shared, 0o755)
    out, _ = load_probe(probe, kenv(tmp_path, store))
    assert out["f"] == 666 and probe.marker.exists()


def test_store_path_that_is_a_link_planted_by_another_user(tmp_path: Path) -> None:
    """``KCACHE_DIR=/shared/store`` with /shared 0777: the second user made ``store`` a link to a
    folder of the victim's (here: another store of the victim's). The named path's folder is
    one others can write, so the store is refused as a store in it would be."""
    needs_root()
    from kcache.store import Store, StoreError

    shared = shared_folder(tmp_path / "shared", 0o777)
    elsewhere = tmp_path / "private" / "store"
    make_store(elsewhere)
    as_nobody(lambda: os.symlink(elsewhere, shared / "store"))
    with pytest.raises(StoreError):
        Store.open(shared / "store").close()


# ------------------------------------------------------------------------------ TRITON_CACHE_DIR
MIRROR_CHILD = """
import json
from kcache.triton.manager import _mirror_for_inductor
_mirror_for_inductor({key!r}, "k.json", {paths!r})
print(json.dumps({{"done": True}}))
"""

MIRRORS = {
    # name: (how TRITON_CACHE_DIR is made, written?)
    "private": True,
    "created_by_kcache": True,
    "sticky_world_writable": False,
    "world_writable": False,
    "parent_world_writable": False,
    "owned_by_another_user": False,
    "link_planted_by_another_user": False,
}


@pytest.mark.parametrize("case", list(MIRRORS))
def test_inductor_mirror_folder_rules(case: str, tmp_path: Path) -> None:
    """kcache writes Triton's layout (``<TRITON_CACHE_DIR>/<key>/``) for Inductor only into a
    folder held to the store's rules: this user's, writable by nobody else, no parent another
    user could swap, not reached through a link another user planted. Otherwise one warning and
    nothing written anywhere."""
    needs_root()
    pytest.importorskip("triton")
    src = tmp_path / "served"
    src.mkdir()
    paths = {}
    for n in ("k.json", "k.cubin"):
        (src / n).write_bytes(b"kernel file " + n.encode())
        paths[n] = str(src / n)
    key = "B" * 52
    shared = shared_folder(tmp_path / "shared", 0o755)
    tc = shared / "tc"
    target = tc
    if case == "private":
        tc.mkdir(mode=0o700)
    elif case == "sticky_world_writable":
        shared_folder(tc, 0o1777)
    elif case == "world_writable":
        shared_folder(tc, 0o777)
    elif case == "parent_world_writable":
        tc.mkdir(mode=0o700)
        os.chmod(shared, 0o777)
    elif case == "owned_by_another_user":
        shared_folder(tc, 0o755, owner=NOBODY)
    elif case == "link_planted_by_another_user":
        target = tmp_path / "victims-folder"
        target.mkdir(mode=0o700)
        os.chmod(shared, 0o1777)
        as_nobody(lambda: os.symlink(target, tc))
    before = fingerprint(target) if target.exists() else None
    r = run_py(MIRROR_CHILD.format(key=key, paths=paths), base_env(tmp_path, TRITON_CACHE_DIR=str(tc)))
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    w = warning_lines(r.stderr)
    if MIRRORS[case]:
        assert w == [], w
        grp = json.loads((tc / key / "__grp__k.json").read_text())
        assert set(grp["child_paths"]) == {"k.json", "k.cubin"}
    else:
        assert len(w) == 1 and "not writing Inductor's copy" in w[0], w
        assert before is not None and fingerprint(target) == before


# ------------------------------------------------------------------------------ import --triton-cache
IMPORT_CHILD = """
import json, os, sys
import kcache
from kcache.store import Store
from kcache.triton.importer import import_triton_cache
SWAP = {swap!r}
done = []
real_get = Store.get
def get(self, kind, key, *a, **k):
    # The moment the importer has checked the launcher and is about to take it: the second user
    # swaps the Triton cache folder (its parent is 0777) for one of its own.
    if kind == "triton-aux" and not done:
        done.append(1)
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([]); os.setgid({uid}); os.setuid({uid})
                os.rename(SWAP[0], SWAP[0] + ".old"); os.rename(SWAP[1], SWAP[0])
                os._exit(0)
            except BaseException:
                os._exit(1)
        os.waitpid(pid, 0)
    return real_get(self, kind, key, *a, **k)
Store.get = get
st = Store.open({store!r})
rep = import_triton_cache(st, SWAP[0])
st.close()
print(json.dumps({{"aux": rep["aux"], "skipped": rep["skipped"], "swapped": bool(done)}}))
"""


def test_triton_cache_import_takes_no_launcher_swapped_in(probe: Probe, tmp_path: Path) -> None:
    """``kcache import --triton-cache /shared/tc`` (``/shared`` 0777, ``tc`` the victim's own,
    holding the real launcher): the second user swaps ``tc`` for a folder of its own with the
    planted launcher after the importer checked it. The launcher must not come into the store;
    the next build loads the real one: ``f() == 42``, no marker."""
    needs_root()
    shared = shared_folder(tmp_path / "shared", 0o777)
    tc, theirs = shared / "tc", shared / "theirs"
    # The victim's real launcher, built by Triton alone into the victim's own cache folder; the
    # planted one, in Triton's own layout, in a folder of the second user's.
    tc.mkdir(mode=0o700)
    code = f"from triton.runtime import build; print(build.compile_module_from_src({probe.good!r}, 'kc_probe').f())"
    r = run_py(code, base_env(tmp_path, TRITON_CACHE_DIR=str(tc)))
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
    plant_launcher(probe, base_env(tmp_path, TRITON_CACHE_DIR=str(theirs)))
    chown_tree(theirs, NOBODY, NOBODY)
    (key,) = os.listdir(tc)
    assert os.listdir(theirs) == [key] and os.listdir(theirs / key) == [probe.filename()]
    store = tmp_path / "store"
    r = run_py(
        IMPORT_CHILD.format(swap=[str(tc), str(theirs)], uid=NOBODY, store=str(store)), base_env(tmp_path)
    )
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    rep: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    # Either the launcher was refused before anything was taken (the cache folder's parent is
    # 0777: another user could swap it), or it was swapped after the check and not taken.
    refused_up_front = (
        not rep["swapped"]
        and rep["aux"] == 0
        and any("another user can change" in s["why"] for s in rep["skipped"])
    )
    assert rep["swapped"] or refused_up_front, rep
    out, _ = load_probe(probe, kenv(tmp_path, store))
    assert out["f"] == 42 and not probe.marker.exists(), (out, rep)
