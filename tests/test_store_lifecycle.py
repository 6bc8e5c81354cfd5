"""The store across a process's life: forks, threads, clean-ups by other processes, a store
closed under its hits, an index of a newer kcache, served files and the bytes they hold.

Each test here was a defect found in review (a hang, a lost or doubled count, a file served that
was not the one verified). Each failed on the code before its fix, except two of the second
review's, which guard the same paths: two threads forking at once (old code: passed in 3 runs
here, slowed down or hung in the reviewer's) and a linked TMPDIR (the reviewer's escape was through
the shared tier's path).
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kcache.store import Store, fs
from kcache.store import served as served_mod
from kcache.store.index import DB_NAME

PYTHON = sys.executable


def wait_child(pid: int, timeout: float = 60.0) -> int:
    """The exit status of a forked child; a child still running after ``timeout`` (hung) is
    killed and the test fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung")


def child_uses_store(store: Store, out: Path) -> None:
    """In a forked child: a lookup, a put, files of a hit; the result as JSON; never returns."""
    code = 1
    try:
        hit = store.get("triton", "k", files=True)
        put = store.put("triton", f"child-{os.getpid()}", {"c.bin": b"child"})
        ok = (
            hit is not None
            and Path(hit.paths["a.bin"]).read_bytes() == b"A" * 100
            and put is not None
            and Path(put.paths["c.bin"]).read_bytes() == b"child"
        )
        store.close()
        out.write_text(json.dumps({"ok": ok}))
        code = 0
    finally:
        os._exit(code)


@pytest.mark.parametrize("hold_s", [0.3, 4.0], ids=["held-briefly", "held-past-the-fork-wait"])
def test_fork_while_another_thread_holds_the_stores_locks(tmp_path: Path, hold_s: float) -> None:
    # A thread in the middle of a store operation when another thread forks: the child must
    # not inherit a held lock (its first lookup would wait for ever).
    s = Store.open(tmp_path / "store")
    assert s.put("triton", "k", {"a.bin": b"A" * 100}) is not None
    taken = threading.Event()

    def hold() -> None:
        with s.disk.catalogue._index_lock, s.disk.catalogue._lock, s.counts._lock:
            taken.set()
            time.sleep(hold_s)

    t = threading.Thread(target=hold)
    t.start()
    assert taken.wait(10)
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        child_uses_store(s, out)
    assert wait_child(pid) == 0
    t.join()
    assert json.loads(out.read_text()) == {"ok": True}
    assert s.get("triton", "k") is not None  # the parent's locks work too
    s.close()


def test_counts_are_not_doubled_by_a_fork(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    assert s.put("triton", "k", {"a.bin": b"A"}) is not None
    for _ in range(5):
        assert s.get("triton", "k") is not None  # counted in memory, not yet written
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            assert s.get("triton", "k") is not None  # the child's own hit
            s.close()  # writes the child's counts (not its parent's, which the parent writes)
            code = 0
        finally:
            os._exit(code)
    assert wait_child(pid) == 0
    s.close()
    s = Store.open(tmp_path / "store")
    assert s.index().counters()["triton"]["hits"] == 6
    s.close()


def test_a_forked_child_gets_its_own_files_and_leaves_its_parents(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"a.bin": b"A" * 100})
    hit = s.get("triton", "k", files=True)
    parent_path = hit.paths["a.bin"]
    out = tmp_path / "child.json"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            p = hit.paths["a.bin"]  # the same Hit object, in the child
            out.write_text(json.dumps({"path": p, "bytes": Path(p).read_bytes().decode()}))
            s.close()
            code = 0
        finally:
            os._exit(code)
    assert wait_child(pid) == 0
    child = json.loads(out.read_text())
    assert child["bytes"] == "A" * 100
    assert child["path"] != parent_path  # /proc/self/fd/N of the parent means nothing in the child
    # The child's exit removed its own folders, not its parent's.
    assert Path(parent_path).read_bytes() == b"A" * 100
    s.close()


def test_fork_during_the_gluon_import_does_not_hang_the_child(tmp_path: Path) -> None:
    # The warm-up thread imports a module (here one that takes a second, in place of gluon);
    # the program forks meanwhile; the child imports it too. Without the fork hook, the child
    # inherits the module's import lock held by a thread it does not have, and waits for ever.
    mod = tmp_path / "slow_gluon_stand_in.py"
    mod.write_text("import time\ntime.sleep(1.0)\nVALUE = 42\n")
    code = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {str(tmp_path)!r})
        from kcache.triton import warmup
        warmup.ENTRY = warmup.FALLBACK = "slow_gluon_stand_in"
        warmup.start_gluon_import()
        time.sleep(0.2)  # the import is under way
        pid = os.fork()
        if pid == 0:
            import slow_gluon_stand_in
            os._exit(0 if slow_gluon_stand_in.VALUE == 42 else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "KCACHE_NO_TRITON_WARMUP"}
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "child 0" in r.stdout


def test_thread_transactions_never_mix(tmp_path: Path, kcache_warnings) -> None:
    # One SQLite connection per process: threads putting, hitting and flushing at once must
    # take turns, or one's transaction swallows (or rolls back) another's.
    s = Store.open(tmp_path / "store")
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                assert s.put("triton", f"t{t}-{i}", {"a.bin": os.urandom(64)}) is not None
                assert s.get("triton", f"t{t}-{i}") is not None
                if i % 8 == 0:
                    s.flush(force=True)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s.flush(force=True)
    idx = s.index()
    assert len(idx.ids()) == 240 == len(list(s.iter_entry_ids()))
    c = idx.counters()["triton"]
    assert c["puts"] == 240 and c["hits"] == 240
    assert not [w for w in kcache_warnings if "index" in w], kcache_warnings
    s.close()


def test_an_index_of_a_newer_kcache_is_left_alone(tmp_path: Path, kcache_warnings) -> None:
    root = tmp_path / "store"
    s = Store.open(root)
    s.put("triton", "k", {"a.bin": b"a"})
    s.close()
    db = root / "index" / DB_NAME
    with sqlite3.connect(db) as conn:
        assert conn.execute("UPDATE meta SET value = '99' WHERE name = 'schema'").rowcount == 1
    before = db.read_bytes()
    s = Store.open(root)
    assert s.get("triton", "k") is not None  # entries are used
    assert s.put("triton", "k2", {"a.bin": b"b"}) is not None
    s.flush(force=True)
    s.close()
    assert db.exists() and db.read_bytes() == before, "never rewritten nor replaced"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'schema'").fetchone() == ("99",)
    assert any("newer kcache" in w for w in kcache_warnings), kcache_warnings


def test_clear_in_another_process_leaves_a_live_processs_files(tmp_path: Path) -> None:
    # A long-running process has handed Triton files; an operator runs `kcache clear --all`.
    root = tmp_path / "store"
    s = Store.open(root)
    s.put("triton", "k", {"a.bin": b"A" * 100})
    hit = s.get("triton", "k", files=True)
    scratch = Path(s.scratch_dir())
    (scratch / "x").write_bytes(b"x")
    env = dict(os.environ, KCACHE_DIR=str(root))
    r = subprocess.run(
        [PYTHON, "-m", "kcache", "clear", "--all", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["count"] == 1
    assert Path(hit.paths["a.bin"]).read_bytes() == b"A" * 100
    assert (scratch / "x").read_bytes() == b"x"
    assert s.get("triton", "k") is None  # the entry itself is gone
    s.close()
    # Once this process is done with them, the next clean-up takes nothing of its (it removed
    # its own folders at close), and a dead process's folders go.
    dead = root / "tmp" / "served.999999.dead"
    dead.mkdir()
    s = Store.open(root)  # cleans folders nobody holds, off its first hit's path (here: at close)
    s.close()
    assert not dead.exists()


# A process with private folders in the store's tmp/ (a served one and a scratch one, each held
# by an flock as kcache holds them), which says their names and waits until its stdin closes.
HOLDER = textwrap.dedent(
    """
    import json, sys
    from kcache.store import Store
    s = Store.open(sys.argv[1])
    with s.disk.served._lock:
        names = [s.disk.served.folder(role).name for role in ("served", "scratch")]
    print(json.dumps(names), flush=True)
    sys.stdin.read()
    """
)


def private_folders(root: Path) -> tuple[subprocess.Popen, list[Path]]:
    p = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    names = json.loads(p.stdout.readline())
    return p, [root / "tmp" / n for n in names]


def test_dead_processes_folders_go_off_the_first_hits_path(tmp_path: Path) -> None:
    # Opening a store and its first hit list nothing in tmp/ (a process's first hit pays no
    # clean-up); the private folders of a process that was killed go at the flush thread's first
    # turn, or at close when it had none; a live process's folders are never taken. (Before:
    # removed when the store was opened.)
    root = tmp_path / "store"
    s = Store.open(root)
    s.put("triton", "k", {"a.bin": b"A" * 100})
    s.close()
    live, live_dirs = private_folders(root)
    try:
        for ends_with in ("the flush thread", "close"):
            dead, dead_dirs = private_folders(root)
            dead.kill()
            dead.wait()
            dead.stdout.close()
            dead.stdin.close()
            assert all(d.is_dir() for d in dead_dirs + live_dirs)
            s = Store.open(root)
            hit = s.get("triton", "k", files=True)
            assert hit is not None and Path(hit.paths["a.bin"]).read_bytes() == b"A" * 100
            assert all(d.is_dir() for d in dead_dirs), "the first hit paid for a clean-up"
            if ends_with == "the flush thread":
                assert s.put("triton", "k2", {"b.bin": b"B"}) is not None  # starts the thread
                deadline = time.monotonic() + 60  # its first turn: within a second, unless the box is loaded
                while any(d.exists() for d in dead_dirs) and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert not any(d.exists() for d in dead_dirs), (
                    "the flush thread left a dead process's folders"
                )
            s.close()
            assert not any(d.exists() for d in dead_dirs), f"{ends_with}: a dead process's folders stayed"
            assert all(d.is_dir() for d in live_dirs), f"{ends_with}: a live process's folders were taken"
        assert live.poll() is None
    finally:
        live.stdin.close()
        live.wait(timeout=60)
        live.stdout.close()
    assert not any(d.exists() for d in live_dirs)  # its own, at its exit


def test_served_bytes_are_the_verified_ones_even_if_replaced_in_between(tmp_path: Path) -> None:
    # Another process replaces the entry after this one verified it and before its files are
    # made: the files hold what was verified (the same inodes, linked through descriptors).
    root = tmp_path / "store"
    a = Store.open(root)
    other = Store.open(root)
    a.put("triton", "k", {"a.bin": b"1" * 4096})
    real_serve = a.disk.served.serve_held

    def serve_after_a_swap(hit, fds=None, dfd=None, dst=None):  # noqa: ANN001, ANN202
        assert other.replace("triton", "k", {"a.bin": b"2" * 4096}) is not None
        return real_serve(hit, fds, dfd, dst)

    a.disk.served.serve_held = serve_after_a_swap  # type: ignore[method-assign]
    hit = a.get("triton", "k", files=True)
    a.disk.served.serve_held = real_serve  # type: ignore[method-assign]
    assert hit is not None and hit.read("a.bin") == b"1" * 4096
    assert Path(hit.paths["a.bin"]).read_bytes() == b"1" * 4096
    fresh = a.get("triton", "k", files=True)
    assert fresh.read("a.bin") == b"2" * 4096
    assert Path(fresh.paths["a.bin"]).read_bytes() == b"2" * 4096
    a.close()
    other.close()


def test_a_hit_whose_files_cannot_be_made_is_a_miss(tmp_path: Path, monkeypatch, kcache_warnings) -> None:
    # A full disk everywhere (the store's tmp/ and the system's temporary folder).
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"a.bin": b"A" * 100})

    def full(*_a, **_k):  # noqa: ANN002, ANN003, ANN202
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(served_mod.os, "link", full)
    monkeypatch.setattr(served_mod.fs, "write_new_at", full)
    monkeypatch.setattr(served_mod.Served, "_pin", lambda *a: None)  # no entry folder to hold either
    assert s.get("triton", "k", files=True) is None
    assert s.counts.process_totals()["triton"]["errors"] == 1
    assert any("cannot make the files" in w for w in kcache_warnings), kcache_warnings
    monkeypatch.undo()
    hit = s.get("triton", "k", files=True)  # space again: a hit
    assert Path(hit.paths["a.bin"]).read_bytes() == b"A" * 100
    s.close()


def test_paths_after_close_raise_and_lookups_miss(tmp_path: Path) -> None:
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"a.bin": b"A"})
    hit = s.get("triton", "k")
    s.close()
    with pytest.raises(OSError):
        _ = hit.paths
    assert s.get("triton", "k", files=True) is None  # never raises


def test_without_proc_files_are_named_by_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(fs, "_proc_ok", False)
    s = Store.open(tmp_path / "store")
    s.put("triton", "k", {"a.bin": b"A" * 10})
    p = s.get("triton", "k", files=True).paths["a.bin"]
    assert not p.startswith("/proc/") and p.startswith(str(tmp_path / "store" / "tmp"))
    assert Path(p).read_bytes() == b"A" * 10
    assert not s.scratch_dir().startswith("/proc/")
    with pytest.raises(OSError):
        fs.fd_path(3, "x")  # no fallback: said, never a guess
    s.close()


def test_removing_a_deep_and_wide_tree_follows_no_link(tmp_path: Path) -> None:
    # A crafted tree deeper than Python's recursion limit and wider than the fd limit allows
    # to keep open, with a link to a folder outside.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep")
    top = tmp_path / "t"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(2000):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.symlink(victim, "link", dir_fd=fd)
    os.close(fd)
    for i in range(3000):
        (top / f"w{i}").mkdir()
    pfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert fs.rmtree_at(pfd, "t")
    finally:
        os.close(pfd)
    assert not top.exists()
    assert (victim / "keep").read_text() == "keep"


def test_a_folder_being_removed_cannot_be_held(tmp_path: Path) -> None:
    # The clean-up's lock and a writer's hold exclude each other: a writer that opened a folder
    # a moment before the clean-up removed it is told so (and makes another).
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (tmp_path / "f").mkdir()
        fd = os.open("f", os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)
        assert fs.remove_unheld_at(parent, "f")  # nobody held it yet
        assert not fs.hold(fd, parent, "f")  # gone: not held
        os.close(fd)
        (tmp_path / "g").mkdir()
        fd = os.open("g", os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)
        assert fs.hold(fd, parent, "g")
        assert not fs.remove_unheld_at(parent, "g") and (tmp_path / "g").exists()
        os.close(fd)
    finally:
        os.close(parent)


def test_autotune_results_are_not_kept_when_the_gpu_is_unknown(monkeypatch) -> None:
    from kcache import inductor
    from kcache.inductor import declare as kinds

    monkeypatch.setattr(inductor.entries, "_gpu", [None])
    with pytest.raises(inductor.NoGpuModel):
        inductor.store_key(kinds.INDUCTOR_AUTOTUNE, "pt2:autotune::abc")
    monkeypatch.setattr(inductor.entries, "_gpu", ["NVIDIA H200"])
    key, comps = inductor.store_key(kinds.INDUCTOR_AUTOTUNE, "pt2:autotune::abc")
    assert key.endswith("|gpu=NVIDIA H200") and comps["gpu_name"] == "NVIDIA H200"
    assert (
        inductor.store_key(kinds.INDUCTOR_FX, "pt2:fx::abc")[0] == "pt2:fx::abc|form=pickle"
    )  # no GPU in it


# ---------------------------------------------------------------- a second review's findings


def test_two_threads_forking_at_once_leave_no_lock_held(tmp_path: Path) -> None:
    # The fork handlers of two threads interleave (CPython runs them before its own lock): one
    # thread's after-fork must let go of its own locks only, never the other's.
    from kcache.store import forks

    s = Store.open(tmp_path / "store")
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list[BaseException] = []

    def forker() -> None:
        try:
            for _ in range(2000):
                forks._before()
                forks._after_parent()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    try:
        threads = [threading.Thread(target=forker) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors
    for lk in s.fork_locks() + s.disk.fork_locks():
        assert lk.acquire(timeout=1), "a lock stayed held by a thread that has finished"
        lk.release()
    assert s.put("triton", "k", {"a.bin": b"a"}) is not None and s.get("triton", "k") is not None
    s.close()


def test_a_fork_does_not_wait_for_a_long_eviction(tmp_path: Path) -> None:
    # The flush thread holds the index lock through SQLite work and eviction (seconds on a big
    # store); a DataLoader worker forked meanwhile must not wait for it: the child gets new locks.
    s = Store.open(tmp_path / "store")
    assert s.put("triton", "k", {"a.bin": b"A" * 100}) is not None
    taken = threading.Event()

    def evicting() -> None:
        with s.disk.catalogue._flush_lock, s.disk.catalogue._index_lock:
            taken.set()
            time.sleep(3.0)

    t = threading.Thread(target=evicting)
    t.start()
    assert taken.wait(10)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forked_in = time.monotonic() - t0
    assert wait_child(pid) == 0
    t.join()
    # Not a timing assertion on speed: the fork either waited for the 3 s hold or it did not.
    assert forked_in < 2.5, f"the fork waited {forked_in:.1f} s for the index lock"
    s.close()


def test_rows_of_a_process_that_ended_early_are_added(tmp_path: Path) -> None:
    # A pool worker ends with os._exit: its flush thread never wrote its entries' rows. The next
    # reconcile (by any process, at most hourly store-wide) adds them.
    root = tmp_path / "store"
    s = Store.open(root)
    assert s.put("triton", "parent", {"a.bin": b"p"}) is not None
    s.flush(force=True)
    pid = os.fork()
    if pid == 0:
        ok = all(s.put("triton", f"w{i}", {"a.bin": bytes([i]) * 10}) is not None for i in range(3))
        os._exit(0 if ok else 1)  # no atexit, no flush
    assert wait_child(pid) == 0
    s.flush(force=True)
    assert len(s.index().ids()) == 1, "the worker's rows were never written"
    assert s.reconcile(force=True) == 3
    assert len(s.index().ids()) == 4
    assert s.reconcile() == 0  # done: not due again for an hour, store-wide
    s.close()
    # And without being asked: a new process's flush thread finds it due.
    db = sqlite3.connect(root / "index" / DB_NAME)
    db.execute("DELETE FROM entries WHERE id != (SELECT MIN(id) FROM entries)")
    db.execute("DELETE FROM meta WHERE name = 'reconciled_at'")
    db.commit()
    db.close()
    s2 = Store.open(root)
    s2.put("triton", "another", {"a.bin": b"x"})  # starts the flush thread
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(s2.index().ids()) < 5:
        time.sleep(0.2)
    assert len(s2.index().ids()) == 5
    s2.close()


def test_no_thread_for_the_flush_is_not_an_error(tmp_path: Path, monkeypatch) -> None:
    # A pids limit reached: the flush thread cannot start. put and get must not raise, and the
    # thread is tried again later.
    s = Store.open(tmp_path / "store")
    real_start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        if self.name == "kcache-flush":
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    assert s.put("triton", "a", {"a.bin": b"a"}) is not None
    assert s.get("triton", "missing") is None
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert s.put("triton", "b", {"a.bin": b"b"}) is not None
    assert s.disk.catalogue._flusher_pid == os.getpid(), "the flush thread was started at the next put"
    s.close()
    r = Store.open(tmp_path / "store", readonly=True)
    assert len(r.index().ids()) == 2
    r.close()


def test_a_linked_tmpdir_is_a_miss_not_an_exception(tmp_path: Path, monkeypatch, kcache_warnings) -> None:
    # A read-only store serves files from the system's temporary folder; a TMPDIR that is a link
    # is refused (fs.UnsafePath), which must reach the caller as a miss, never as an exception.
    import tempfile

    root = tmp_path / "store"
    s = Store.open(root)
    assert s.put("triton", "k", {"a.bin": b"a"}) is not None
    s.close()
    real = tmp_path / "realtmp"
    real.mkdir(mode=0o700)
    link = tmp_path / "linktmp"
    link.symlink_to(real)
    monkeypatch.setattr(tempfile, "tempdir", str(link))
    r = Store.open(root, readonly=True)
    assert r.get("triton", "k", files=True) is None
    assert r.get("triton", "k") is not None  # the bytes alone are still served
    r.close()
    assert any("temporary folder" in w for w in kcache_warnings), kcache_warnings


def _no_flock(monkeypatch) -> None:
    import fcntl

    def flock(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def test_a_filesystem_without_flock_still_caches(tmp_path: Path, monkeypatch, kcache_warnings) -> None:
    # Lustre without -o flock, some FUSE filesystems, NFS on folders: flock fails with ENOLCK or
    # ENOSYS. Puts must still work, served files must come from somewhere no clean-up takes, and
    # a fresh folder in tmp/ must not be cleaned up (its age is the only clue left).
    _no_flock(monkeypatch)
    root = tmp_path / "store"
    s = Store.open(root)
    h = s.put("triton", "k", {"a.bin": b"A" * 10})
    assert h is not None
    hit = s.get("triton", "k", files=True)
    assert hit is not None and Path(hit.paths["a.bin"]).read_bytes() == b"A" * 10
    assert not str(Path(os.path.realpath(hit.paths["a.bin"]))).startswith(str(root)), (
        "served from the store's tmp/, where locks cannot protect it"
    )
    fresh = root / "tmp" / "writer-on-another-node.123"
    fresh.mkdir()
    assert s.clean_tmp() == 0 and fresh.exists()
    assert s.clean_tmp(min_age=-1) >= 1 and not fresh.exists()  # old enough: it goes
    assert not [p for p in (root / "tmp").iterdir()], "a put left folders behind"
    s.close()
    assert not [w for w in kcache_warnings if "being cleaned" in w], kcache_warnings


def test_a_network_filesystem_keeps_served_files_on_the_node(tmp_path: Path, monkeypatch) -> None:
    # On NFS with node-local locks, another node's clean-up sees this node's folders unheld:
    # served and scratch folders stay off the shared tmp/, and the shared tmp/ is cleaned by age.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the node-local index goes there
    root = tmp_path / "store"
    s = Store.open(root, network_fs=True)
    assert s.put("triton", "k", {"a.bin": b"A"}) is not None
    hit = s.get("triton", "k", files=True)
    assert hit is not None and Path(hit.paths["a.bin"]).read_bytes() == b"A"
    assert not [p for p in (root / "tmp").iterdir() if p.name.startswith(("served.", "scratch."))]
    other = root / "tmp" / "served.999999.abc"  # another node's live folder: nobody here holds it
    other.mkdir()
    s2 = Store.open(root, network_fs=True)  # opening does not clean the shared tmp/
    assert other.exists()
    assert s2.clean_tmp() == 0 and other.exists()
    s2.close()
    s.close()


def test_close_lets_go_of_the_flights_it_holds(tmp_path: Path) -> None:
    """A flight still held when its store is closed (a make that never put nor released) is let
    go: its lock file closed and free for another process at once, not at the holder's exit."""
    import fcntl

    s = Store.open(tmp_path / "store")
    flight = s.single_flight("triton", "k")  # (kept referenced: its finaliser would release it)
    assert flight.hit is None and flight.held
    lock = tmp_path / "store" / "locks" / f"{s.entry_id('triton', 'k')}.lock"
    s.close()
    assert not flight.held
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while anyone holds it
    finally:
        os.close(fd)
