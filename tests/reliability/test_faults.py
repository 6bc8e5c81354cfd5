"""Faults (issue 10, point 4): a full disk, a read-only store, permission denied, the index
locked by another process for longer than any timeout. The program's compile (a real Triton
compile through the manager) proceeds, with at most one warning, no crash, and no wait beyond the
bound: 0.25 s per index attempt (SQLite's busy timeout), then the index is left alone for 0.5 s,
1, 2, 4, then 5 s while it stays locked; and LOCK_TIMEOUT_S (120 s) for another process compiling
the same kernel. Those bounds are checked by counting and ordering attempts, not by timing whole
operations (machines are shared).

How each fault is made here (we run as root, where permission bits do not stop writes):
- full disk: a 2 MiB (store API) or 600 KiB (Triton) tmpfs mounted for the test; also
  RLIMIT_FSIZE with SIGXFSZ ignored, which works without root;
- read-only: a read-only bind mount of the store over itself (EROFS even for root), and
  ``KCACHE_READONLY=1``;
- permission denied: a child that drops to uid 65534 ("nobody") after its imports, on a store it
  owns but whose entries or files it cannot write or read;
- locked index: a process holding ``BEGIN EXCLUSIVE`` on index/kcache.sqlite.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    CHAOS_PATH,
    NOBODY,
    PYTHON,
    REPO,
    base_env,
    chown_tree,
    compile_in_child,
    kenv,
    no_traceback,
    read_only_bind,
    run_py,
    tmpfs,
    tree,
    warning_lines,
)


def full_disk_child(chaos: Any, root: Path, fsize: int, n: int = 60) -> dict[str, Any]:
    code = chaos.FULL_DISK_CHILD.format(
        repo=str(REPO), here=str(CHAOS_PATH), fsize=fsize, root=str(root), n=n
    )
    r = subprocess.run(
        [PYTHON, "-c", code], capture_output=True, text=True, timeout=300, env=base_env(root.parent)
    )
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_full_tmpfs_store(tmp_path: Path, chaos: Any) -> None:
    """Puts into a 2 MiB tmpfs until it is full and beyond: every put returns an entry or None,
    every hit is exact, one warning; verify --fix cleans up what the failed writes left."""
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        res = full_disk_child(chaos, mnt / "store", 0, n=120)
        assert res["errors"] == [] and res["wrong"] == 0
        assert res["none"] > 0 and res["puts"] - res["none"] > 0  # it filled up, and wrote before
        assert res["hits"] > 0
        assert len(res["warnings"]) == 1, res["warnings"]
        # Still full: verify --fix answers (rc 0 or 1, JSON) though it may not rebuild an index
        # that the full disk kept from being written.
        full = chaos.verify(mnt / "store", fix=True)
        assert "error" not in full and full["rc"] in (0, 1), full
        # Room made: --fix leaves a clean store with every entry the full disk let through.
        chaos._grow_tmpfs(str(mnt), "4m")
        fixed = chaos.verify(mnt / "store", fix=True)
        after = chaos.verify(mnt / "store", fix=False)
        assert after["ok"], (fixed, after)
        assert after["good"] == res["puts"] - res["none"]


def test_file_size_limit(tmp_path: Path, chaos: Any) -> None:
    """The same with RLIMIT_FSIZE (64 KiB, SIGXFSZ ignored): EFBIG on the larger members (and on
    the index once it outgrows the limit) instead of ENOSPC; works without root."""
    res = full_disk_child(chaos, tmp_path / "store", 64 * 1024)
    assert res["errors"] == [] and res["wrong"] == 0
    assert res["none"] > 0 and res["hits"] > 0
    # SQLite reports EFBIG as "disk I/O error", not as a full disk: that is a second, distinct
    # warning (a real full disk, above, gives one).
    assert 1 <= len(res["warnings"]) <= 2, res["warnings"]


def test_full_disk_triton_compile(tmp_path: Path, chaos: Any, reference_kernels: dict) -> None:
    """Real compiles with KCACHE=1 on a 600 KiB tmpfs: the store fills up after a few kernels;
    every compile still succeeds with Triton's exact output, and one warning is printed."""
    specs = chaos.kernel_specs(12)
    with tmpfs(tmp_path / "mnt", "600k") as mnt:
        out, r = compile_in_child(specs, kenv(tmp_path, mnt / "store"))
        assert r.returncode == 0
        assert out["kernels"] == {n: reference_kernels[n] for n in out["kernels"]}
        assert len(out["kernels"]) == 12
        assert len(warning_lines(r.stderr)) == 1, r.stderr
        assert "full" in r.stderr
        # A second run: what was stored is served, the rest compiles, still no crash.
        out2, r2 = compile_in_child(specs, kenv(tmp_path, mnt / "store"))
        assert out2["counts"]["triton"]["hits"] >= 1
        assert out2["kernels"] == out["kernels"]
        assert len(warning_lines(r2.stderr)) <= 1


def test_read_only_mount_triton_compile(tmp_path: Path, chaos: Any, reference_kernels: dict) -> None:
    """The store on a read-only mount: cached kernels are served, new ones compile, nothing is
    written, one warning (the store is used read-only)."""
    store = tmp_path / "store"
    specs = chaos.kernel_specs(4)
    compile_in_child(specs[:2], kenv(tmp_path, store))
    with read_only_bind(store):
        before = tree(store)
        out, r = compile_in_child(specs, kenv(tmp_path, store))
        assert out["kernels"] == {n: reference_kernels[n] for n in out["kernels"]}
        assert len(out["kernels"]) == len(specs)
        assert out["counts"]["triton"]["hits"] == 2
        assert len(warning_lines(r.stderr)) == 1, r.stderr
        assert "read-only" in r.stderr
        assert tree(store) == before


def test_kcache_readonly_triton_compile(tmp_path: Path, chaos: Any, reference_kernels: dict) -> None:
    """KCACHE_READONLY=1: hits served, misses compiled, the store not changed, no warning."""
    store = tmp_path / "store"
    specs = chaos.kernel_specs(4)
    compile_in_child(specs[:2], kenv(tmp_path, store))
    before = tree(store)
    out, r = compile_in_child(specs, kenv(tmp_path, store, KCACHE_READONLY="1"))
    assert out["counts"]["triton"]["hits"] == 2
    assert out["kernels"] == {n: reference_kernels[n] for n in out["kernels"]}
    assert len(out["kernels"]) == len(specs)
    assert warning_lines(r.stderr) == []
    assert tree(store) == before


PERMISSION_CHILD = """
import json, importlib.util
spec = importlib.util.spec_from_file_location("c", {chaos!r}); c = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c)
st = c.open_store({root!r})
out = {{"readonly": st.readonly, "hits": 0, "misses": 0, "wrong": 0}}
for i in range(6):
    for k in c.KINDS:
        h = st.get(k, c.key_name(i))
        if h is None:
            out["misses"] += 1
        elif c.check_hit(k, c.key_name(i), h):
            out["wrong"] += 1
        else:
            out["hits"] += 1
out["put"] = st.put("chaos", "new", c.expected("chaos", "new")) is not None
st.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize("denied", ["entries_dir", "member_file", "whole_store"])
def test_permission_denied(denied: str, tmp_path: Path, nobody_dir: Path, chaos: Any) -> None:
    """A child running as an unprivileged user on its own store, part of which it may not write
    or read: no crash, no wrong bytes, at most one warning; what it can read is served."""
    root = nobody_dir / "store"
    # Filled by root in a folder of its own (root refuses a store in a folder another user owns:
    # that user could swap it), then given to the user.
    st = chaos.open_store(tmp_path / "filling")
    for i in range(6):
        for k in chaos.KINDS:
            st.put(k, chaos.key_name(i), chaos.expected(k, chaos.key_name(i)))
    st.close()
    shutil.move(str(tmp_path / "filling"), str(root))
    st = chaos.open_store(tmp_path / "names")  # entry ids only (same key tag)
    st.close()
    chown_tree(root, NOBODY, NOBODY)
    if denied == "entries_dir":
        os.chmod(root / "entries", 0o500)  # its own, but it may not create entries there
    elif denied == "member_file":
        ident = st.entry_id("chaos", chaos.key_name(2))
        d = root / "entries" / ident[:2] / ident
        m = next(p for p in d.iterdir() if p.name != "__kcache__.rec")
        os.chown(m, 0, 0)
        os.chmod(m, 0o600)
    else:
        os.chmod(root, 0o500)
    code = PERMISSION_CHILD.format(chaos=str(CHAOS_PATH), root=str(root))
    r = run_py(code, base_env(nobody_dir), user=NOBODY)
    no_traceback(r)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["wrong"] == 0
    assert len(warning_lines(r.stderr)) <= 1, r.stderr
    if denied == "member_file":
        assert out["hits"] == 11 and out["put"]  # that entry is a miss (it cannot be checked)
    else:
        assert out["readonly"] and out["hits"] == 12 and not out["put"]


def index_probe(setattr_: Any = setattr) -> list[dict[str, Any]]:
    """Record every attempt on a store's index from now on (in this process; its source also runs
    in a child): one dict per attempt, made once past the back-off gate, with the monotonic time
    it started, whether the index was found locked ("busy"), whether a forced flush made it
    (forced flushes try at once, by design), the store's id and its busy timeout. The flush thread
    is not started: only the calling thread touches the index, so attempts come one after another
    in the order recorded. ``setattr_``: monkeypatch.setattr in a test, setattr in a child."""
    import time

    from kcache.store.catalogue import Catalogue

    attempts: list[dict[str, Any]] = []
    state = {"forced": False}
    real_index, real_call, real_flush = Catalogue.index, Catalogue.call, Catalogue.flush

    def index(self: Any) -> Any:
        start = time.monotonic()
        attempts.append({"start": start, "busy": None, "forced": state["forced"], "store": id(self)})
        attempts[-1]["timeout"] = self.index_timeout
        return real_index(self)

    def index_call(self: Any, fn: Any) -> Any:
        n, before = len(attempts), self._busy_count
        try:
            return real_call(self, fn)
        finally:
            if len(attempts) > n:
                attempts[-1]["busy"] = self._busy_count > before

    def flush(self: Any, force: bool = False) -> None:
        state["forced"] = force
        try:
            real_flush(self, force)
        finally:
            state["forced"] = False

    setattr_(Catalogue, "index", index)
    setattr_(Catalogue, "call", index_call)
    setattr_(Catalogue, "flush", flush)
    setattr_(Catalogue, "maybe_flush", lambda self: None)
    return attempts


# index_probe in a child (compile_in_child's ``before``): the list is ``_attempts`` there.
INDEX_PROBE_CHILD = (
    "from typing import Any\n" + inspect.getsource(index_probe) + "\n_attempts = index_probe()\n"
)

BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 5.0)  # after the 1st, 2nd, 3rd... attempt in a row found it locked


def assert_backed_off(attempts: list[dict[str, Any]]) -> None:
    """The locked index was met, every attempt was given the 0.25 s busy timeout, and no attempt
    (but a forced flush's) came before the back-off the previous one set. Measured from
    the start of the attempt that found it locked (the back-off counts from its end), so a slow
    machine can only widen the gaps, never fail this."""
    assert any(a["busy"] for a in attempts), "the index was never found locked"
    assert {a["timeout"] for a in attempts} == {0.25}, attempts
    in_a_row = 0
    for a, b in zip(attempts, attempts[1:]):
        if a["store"] != b["store"] or not a["busy"]:
            in_a_row = 0
            continue
        in_a_row += 1
        back = BACKOFF_S[min(in_a_row, len(BACKOFF_S)) - 1]
        if not b["forced"]:
            assert b["start"] - a["start"] >= back - 1e-6, (in_a_row, back, a, b)


LOCK_HOLDER = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
print("LOCKED", flush=True)
time.sleep(600)
"""


def test_index_locked_for_longer_than_any_timeout(
    tmp_path: Path, chaos: Any, reference_kernels: dict
) -> None:
    """Another process holds BEGIN EXCLUSIVE on the index for the whole run: cached kernels are
    hits (they never read the index), new kernels compile and are stored, one warning, and the
    index costs the process at most one 0.25 s attempt per back-off period (0.5 s, then 1, 2, 4
    and 5 s): each attempt is recorded in the child and the gaps checked (index_probe)."""
    store = tmp_path / "store"
    specs = chaos.kernel_specs(6)
    env = kenv(tmp_path, store)
    compile_in_child(specs[:3], env)
    holder = subprocess.Popen(
        [PYTHON, "-c", LOCK_HOLDER, str(store / "index" / "kcache.sqlite")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        out, r = compile_in_child(
            specs, env, before=INDEX_PROBE_CHILD, after="out['index_attempts'] = _attempts"
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    assert out["counts"]["triton"]["hits"] == 3
    assert out["kernels"] == {n: reference_kernels[n] for n in out["kernels"]}
    assert len(out["kernels"]) == len(specs)
    assert len(warning_lines(r.stderr)) == 1 and "index" in r.stderr, r.stderr
    assert_backed_off(out["index_attempts"])
    # The new kernels were stored (entries need no index), and the next process hits them all.
    out2, r2 = compile_in_child(specs, env)
    assert out2["counts"]["triton"]["hits"] == 6, out2["counts"]
    assert warning_lines(r2.stderr) == []


def test_index_locked_store_operations_bounded(
    tmp_path: Path, chaos: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Store API with the index held exclusively (the chaos tool's phase, in this process): every
    operation (put + get + flush) is served, one warning, and the index is tried at most once per
    back-off period, each try bounded by the 0.25 s busy timeout (index_probe: counted and
    ordered, not timed)."""
    attempts = index_probe(monkeypatch.setattr)
    res = chaos.phase_faults(tmp_path, 1, seed=14, log=lambda m: None)
    li = res["locked_index"]
    assert li["errors"] == 0 and li["wrong_or_missed"] == 0
    assert li["operations"] >= 20  # the 20 operations (and opening and closing the store)
    assert li["warnings"] == 1
    assert res["failures"] == [], res["failures"]
    assert_backed_off(attempts)
