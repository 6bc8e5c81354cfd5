"""Clock skew and a full disk (issue 18, points 4 and 5).

- A process whose clock runs an hour ahead (``time.time`` and ``time.time_ns`` shifted by a
  sitecustomize; the kernel's clock, and so the filesystem's, untouched) evicts under a tiny
  bound: what others used within the grace period stays, because last use and the grace period
  are judged by the filesystem's clock. Real Triton compiles in several processes go on while
  such a process evicts and removes entries: an entry removed under a reader is a miss.
- On a tmpfs filled to the last byte, ``kcache clear --kind`` and ``clear --all`` remove entries
  (folders first, the index after), free space and say so; ``verify --fix`` then leaves the store
  clean.
- A filesystem out of inodes is one warning for the store, its size count included, and the
  count comes back in the same process once there is room (2026-12-06).

Children import the kcache of this checkout (``PYTHONPATH``); run against the code before
efe2a87 every test here fails (see the docstrings).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import (
    base_env,
    compile_in_child,
    kenv,
    load_chaos,
    no_traceback,
    store_entries,
    tmpfs,
    warning_lines,
)

REPO = Path(__file__).resolve().parents[2]


def _load_inputs() -> Any:
    spec = importlib.util.spec_from_file_location("chaos_inputs", REPO / "tools" / "chaos_inputs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chaos_inputs", mod)
    spec.loader.exec_module(mod)
    return sys.modules["chaos_inputs"]


ci = _load_inputs()


# ============================================================================= 4. clock skew


def test_skew_site_shifts_the_clock(tmp_path: Path) -> None:
    """The control: the sitecustomize really moves time.time() and time.time_ns() an hour ahead
    (and leaves the filesystem's clock alone)."""
    env = ci.skewed_env(ci.child_env(tmp_path), tmp_path / "skew")
    code = "import os, time, json; f = os.open('f', os.O_CREAT | os.O_WRONLY); print(json.dumps([time.time(), time.time_ns() / 1e9, os.fstat(f).st_mtime]))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    t, tns, mtime = json.loads(r.stdout)
    now = time.time()
    assert abs(t - now - ci.SKEW_S) < 30 and abs(tns - now - ci.SKEW_S) < 30
    assert abs(mtime - now) < 30


def test_skewed_clock_never_evicts_entries_in_use(tmp_path: Path) -> None:
    """12 entries unused for 1,000 s, 8 in use by another process, and one prewarmed entry
    protected for half an hour (never used, and as old as the unused ones); a process an hour
    ahead evicts, over and over for 2 s, down to room for 9 entries: the 12 go, the 8
    and the protected one stay (every hit of the user is a hit, byte-exact). Last use and
    protection are judged by the filesystem's clock: judged by its own, the skewed process would
    find the protection run out (it did, before efe2a87, with the grace period then in use)."""
    env = ci.child_env(tmp_path)
    root = tmp_path / "store"
    old = [f"old/{i}" for i in range(12)]
    hot = [f"hot/{i}" for i in range(8)]
    kept = "prewarmed/0"
    res = ci.finish(ci.store_child(root, "fill", {"keys": old + hot + [kept], "protect": {kept: 1800}}, env))
    assert not res["errors"], res["errors"]
    ids = res["ids"]
    ci.age_entries(root, [ids[k] for k in old], 1000, env)
    ci.age_entries(root, [ids[kept]], 2000, env)  # the first in line, but for its protection
    # The user goes on until the eviction is over (a stop file; 60 s at most), not for a fixed
    # 4 s, of which the last second and more came after it.
    stop = tmp_path / "eviction-done"
    user = ci.store_child(root, "use", {"keys": hot, "seconds": 60, "stop": str(stop)}, env)
    time.sleep(0.5)  # the user's first hits land before the eviction starts
    skewed = ci.skewed_env(env, tmp_path / "skew")
    one = ci.entry_bytes(root, ids[hot[0]])  # its blocks on disk (the entries are alike)
    # The entries down to room for 9, not 10, by an explicit target of their blocks (the bound
    # is on the whole folder, whose index grows as the user's hits are written: not exact
    # enough to hold 9 entries and not 10; the bound itself is out of the way here).
    args = {"max_size": 1 << 40, "target": int(9.5 * one), "seconds": 2}
    try:
        ev = ci.finish(ci.store_child(root, "evict", args, skewed))
    finally:
        stop.touch()
    used = ci.finish(user)
    assert not ev["errors"] and not used["errors"], (ev["errors"], used["errors"])
    assert ev["clock"] - time.time() > ci.SKEW_S - 60, "the evicting process's clock was not ahead"
    on_disk = ci.entry_ids_on_disk(root)
    assert [k for k in hot if ids[k] not in on_disk] == [], "entries in use were evicted"
    assert ids[kept] in on_disk, "the protected entry was evicted"
    assert used["misses"] == [] and used["wrong"] == 0 and used["hits"] > 0, used
    assert ev["evicted"] == len(old) and not any(ids[k] in on_disk for k in old), ev


SKEWED_USER = r"""
import json, sys, time
from kcache.store import Store
s = Store.open(sys.argv[1])
out = {"clock": time.time()}
if sys.argv[2] == "hits":  # its first calls: nothing has set the store's clock yet
    out["hit"] = s.get("triton", "k") is not None
    s.get("triton", "missing", components={"x": 1})
else:
    out["created"] = s.put("triton", "k2", {"b.bin": b"B"}).record.created
s.close()
print(json.dumps(out))
"""


def test_skewed_clock_writes_the_filesystems_time(tmp_path: Path) -> None:
    """A process an hour ahead whose first calls are a hit and a miss (opening a store does not
    set the store's clock by the filesystem's: that waits for a time the store keeps) writes
    their times to the index in the filesystem's time, as a put's record is: last use is judged
    by it (eviction's order), and a process's own clock is an hour off."""
    from kcache.store import Store

    env = ci.child_env(tmp_path)
    root = tmp_path / "store"
    s = Store.open(root)
    s.put("triton", "k", {"a.bin": b"A"})
    s.close()
    skewed = ci.skewed_env(env, tmp_path / "skew")
    out = {}
    for what in ("hits", "put"):
        r = subprocess.run(
            [sys.executable, "-c", SKEWED_USER, str(root), what], env=skewed, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        out.update(json.loads(r.stdout))
    now = time.time()
    assert out["clock"] - now > ci.SKEW_S - 60, "the child's clock was not ahead"
    assert out["hit"] and abs(out["created"] - now) < 60, out
    s = Store.open(root)
    try:
        idx = s.index()
        last_use, hits = idx.last_uses()[s.entry_id("triton", "k")]
        assert hits == 1 and abs(last_use - now) < 60, (last_use - now, hits)
        (missed_at, _kind, key, _comps), *_ = idx.misses()
        assert key == "missing" and abs(missed_at - now) < 60, missed_at - now
    finally:
        s.close()


COMPILE_LOOP = r"""
import importlib.util, json, os, sys, traceback
spec = importlib.util.spec_from_file_location("kcache_chaos", {chaos!r})
chaos = importlib.util.module_from_spec(spec); sys.modules["kcache_chaos"] = chaos
spec.loader.exec_module(chaos)
import triton, kcache
ref = {ref!r}
out = {{"enabled": kcache.is_enabled(), "compiles": 0, "errors": [], "mismatches": 0}}
specs = [tuple(s) for s in {specs!r}]
def hits():
    st = kcache.active_store()
    return 0 if st is None else st.counts.process_totals().get("triton", {{}}).get("hits", 0)
# At least {count!r} compiles, and on (up to {cap!r}) until either compiler has had a hit: the
# lookup whose files the removals race with. Both start at the same kernel: while one compiles
# it, the other waits for it (single flight) and is served what it put, so hits come early.
# And on until the aggressor has removed an entry (or ended: it says so then too): on an idle
# box 12 compiles could be over before it had (its removals found the store emptied by the
# compilers' own bound).
flag, did, i = {flag!r}, {did!r}, 0
while i < {count!r} or (not (os.path.exists(flag) and os.path.exists(did)) and i < {cap!r}):
    spec = specs[i % len(specs)]; i += 1
    try:
        d = chaos.kernel_digest(chaos.compile_kernel(spec))
    except Exception:
        out["errors"].append(traceback.format_exc(limit=4)[-2000:])
        continue
    out["compiles"] += 1
    out["mismatches"] += d != ref["/".join(map(str, spec))]
    if hits():
        open(flag, "a").close()
st = kcache.active_store()
if st is not None:
    st.flush(force=True)
    out["counts"] = st.counts.process_totals().get("triton", {{}})
print(json.dumps(out))
"""


def test_compiles_go_on_while_a_skewed_process_evicts(tmp_path: Path, reference_kernels: dict) -> None:
    """Two processes compile four real kernels in a loop under KCACHE=1 with a 1 KB bound (one
    of them with its clock an hour ahead), while a third process, also an hour ahead, evicts
    every 50 ms and removes every entry every 0.5 s until they are done: no compile raises,
    every kernel is Triton's own, and entries are really removed under the compilers (hits,
    misses and evictions all happen), and no entry is quarantined for files that went before
    Triton read them. Before efe2a87 hits' files were removed between the lookup and Triton's
    open: FileNotFoundError out of triton.compile; since kcache guards triton.compile that is a
    quarantine, a warning and a compile, which this test now looks for. It is a race: with hits
    served by the entry's path name, nothing held, this test failed 4 runs of 10 (2026-12-06);
    test_a_hit_survives_its_entry_removed_before_triton_opens_it is its deterministic form.

    The loops count compiles, not seconds (they ran 20 s each, 100-200 compiles on an idle box,
    as much CPU as the box would give): the race is between a hit's lookup and Triton's open of
    the files it handed out, so what it needs is hits beside the removals, not time. Under a
    1 KB bound each put evicts what came before, so the hits are single-flight waits: both
    compilers start at the same kernel, one waits while the other compiles it and is then
    served its entry, which the bound, the other process and the aggressor are removing. Each
    compiles 12 times (three passes), and on until one of them has had a hit and the
    aggressor has removed an entry (at most 200: without the second, 5 runs of 21 on an idle
    box failed, the aggressor having removed nothing yet); the aggressor goes on until both
    have exited."""
    from .conftest import CHAOS_PATH, load_chaos

    chaos = load_chaos()
    specs = chaos.kernel_specs(4)
    compiles = 12  # each: three passes over the four kernels (the check below wants 8)
    root = tmp_path / "store"
    env = ci.child_env(tmp_path, KCACHE="1", KCACHE_DIR=str(root), KCACHE_MAX_SIZE="1KB")
    skewed = ci.skewed_env(env, tmp_path / "skew")
    ref = {n: reference_kernels[n] for n in ("/".join(map(str, s)) for s in specs)}
    workers = []
    for e in (env, skewed):
        code = COMPILE_LOOP.format(
            chaos=str(CHAOS_PATH),
            ref=ref,
            count=compiles,
            cap=200,
            flag=str(tmp_path / "a-hit"),
            did=str(tmp_path / "aggressor-removed"),
            specs=[list(s) for s in specs],
        )
        workers.append(
            subprocess.Popen(
                [sys.executable, "-c", code], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/"
            )
        )
    stop = tmp_path / "compilers-done"
    aggressor = ci.store_child(
        root,
        "aggressor",
        {
            "max_size": 1000,
            "seconds": 300,
            "remove_every": 10,
            "stop": str(stop),
            "did": str(tmp_path / "aggressor-removed"),
        },
        ci.skewed_env(ci.child_env(tmp_path), tmp_path / "skew2"),
    )
    results, errs = [], []
    try:
        for p in workers:
            out, err = p.communicate(timeout=300)
            errs.append((p.returncode, err))
            results.append(json.loads(out.decode().strip().splitlines()[-1]) if p.returncode == 0 else {})
    finally:
        stop.touch()
        for p in workers:  # (a timeout above: the compilers do not go on beside the other tests)
            if p.poll() is None:
                p.kill()
                p.wait()
        agg = ci.finish(aggressor)
    for rc, err in errs:
        assert b"Traceback" not in err, err.decode(errors="replace")[-3000:]
        assert rc == 0, err.decode(errors="replace")[-3000:]
        # A hit whose files went before Triton read them is not an error out of compile():
        # kcache's guard of triton.compile quarantines the entry, warns and compiles (a right
        # kernel, an entry blamed for a hole of the cache). That is what this race looks like.
        lost = [w for w in warning_lines(err.decode(errors="replace")) if "cannot be used" in w]
        assert lost == [], lost
    assert not agg["errors"], agg["errors"]
    # Entries were removed under the compilers: by eviction, or by the removal every tenth pass
    # (which on a loaded box can find the store already emptied by eviction: removed 0, evicted 47).
    assert agg["removed"] + agg["evicted"] > 0, agg
    for r in results:
        assert r["enabled"]
        assert r["errors"] == [], r["errors"][0]
        assert r["mismatches"] == 0, r
        assert r["compiles"] >= 8, r
        assert not r.get("counts", {}).get("quarantined"), r  # (see the warnings above)
    hits = sum(int(r.get("counts", {}).get("hits", 0)) for r in results)
    misses = sum(int(r.get("counts", {}).get("misses", 0)) for r in results)
    assert hits > 0 and misses > len(specs), (hits, misses)  # served, and recompiled after removals


# The attacker of the next test, in the compiling child. Triton's compile() (3.4-3.9) asks the
# cache manager's get_group for the kernel and, on an answer, builds its CompiledKernel, which
# opens and reads every file the answer names. Between the two, here, another process removes
# every entry of the store (``kcache clear --all``) and is waited for: once it has exited, only
# what the answer itself holds can still give Triton the kernel's files. (Hooked at the manager's
# method, Triton's interface, rather than in Triton's compile(): the same point in every Triton.)
REMOVE_AFTER_ANSWER = """
import os, subprocess, sys
import triton
from kcache.triton import manager as _manager

ROOT = {root!r}
removals = []
_answer = _manager.KcacheCacheManager.get_group

def _entries():
    e = os.path.join(ROOT, "entries")
    return sum(len(os.listdir(os.path.join(e, s))) for s in os.listdir(e))

def get_group(self, filename):
    group = _answer(self, filename)
    if group:
        env = {{k: v for k, v in os.environ.items() if not k.startswith("KCACHE") or k == "KCACHE_STRICT"}}
        before = _entries()
        r = subprocess.run(
            [sys.executable, "-m", "kcache", "clear", "--all", "--dir", ROOT],
            capture_output=True, text=True, env=env, timeout=120,
        )
        removals.append({{
            "rc": r.returncode, "err": r.stderr[-2000:], "before": before, "after": _entries(),
            "there": {{name: os.path.isfile(p) for name, p in group.items()}},
        }})
    return group

_manager.KcacheCacheManager.get_group = get_group
"""


def test_a_hit_survives_its_entry_removed_before_triton_opens_it(
    tmp_path: Path, compiled_store: Any, reference_kernels: dict
) -> None:
    """The deterministic form of the race above. A kernel in the store; a new process compiles
    it (a hit); between kcache's answer (the paths ``get_group`` hands to Triton) and Triton's
    reading of them (``CompiledKernel``), a second process removes every entry (``kcache clear
    --all``) and exits. The store is empty, yet every file the answer names is still there, and
    Triton loads the kernel it was served, byte for byte Triton's own: no warning, no
    quarantine, no compile (one hit, no miss).

    What it catches, every time: hits served by the entry's path name with nothing held (no held
    folder, no private links). The removal deletes the files; Triton's loader raises
    FileNotFoundError, which kcache's guard of ``triton.compile`` (kcache/triton/groupcheck.py)
    turns into a quarantine, a warning and a compile: the kernel is right, but it was compiled
    again and the entry was blamed for a hole of the cache. The race test above passed 6 runs
    of 6 with that mutation: its loop does hit the window (7 runs of 10), but it looked at
    neither warnings nor quarantines; it now does, and still misses when its loop does not."""
    store = tmp_path / "store"
    shutil.copytree(compiled_store(1), store, symlinks=True)
    (spec,) = load_chaos().kernel_specs(1)
    before = REMOVE_AFTER_ANSWER.format(root=str(store))
    out, r = compile_in_child(
        [spec], kenv(tmp_path, store), before=before, after='out["removals"] = removals'
    )
    assert out["enabled"], r.stderr[-2000:]
    (removal,) = out["removals"]  # one answer, with the store emptied under it
    assert removal["rc"] == 0 and removal["before"] > 0 and removal["after"] == 0, removal
    assert warning_lines(r.stderr) == [], r.stderr[-2000:]  # (a quarantine says why here)
    assert all(removal["there"].values()), removal["there"]  # what Triton then reads
    name = "/".join(map(str, spec))
    assert out["kernels"][name] == reference_kernels[name]  # every artifact: Triton's own
    counts = out["counts"]["triton"]
    assert counts.get("hits") == 1 and not counts.get("misses") and not counts.get("quarantined"), counts
    assert store_entries(store) == []  # nothing was put back: nothing was compiled


# ============================================================================= 5. full disk


def _clear(root: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    r = ci.cli(["clear", *args, "--dir", str(root)], env)
    assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")
    return r, r.stdout.decode(errors="replace").splitlines()


def test_clear_frees_a_full_disk(tmp_path: Path) -> None:
    """A 4 MiB tmpfs filled by a store (entries of two kinds) and then, to the last byte, by a
    filler file: ``clear --kind triton`` removes exactly the triton entries and frees space; the
    disk filled again, ``clear --all --json`` removes the rest; each says what it removed, and
    a second line if the index could not be updated. ``verify --fix`` then leaves the store
    clean. Before efe2a87 both exited 1 and deleted nothing (opening the index for writing
    needs space), with a message about the index."""
    with tmpfs(tmp_path / "mnt", "4m") as mnt:
        env = ci.child_env(tmp_path)
        root = mnt / "store"
        n = ci.fill_store(root, env)
        assert n["triton"] > 5 and n["nvfuser"] > 5, n
        ci.fill_to_the_last_byte(mnt / "filler")
        assert ci.free_bytes(mnt) == 0
        before = ci.entry_ids_on_disk(root)
        assert len(before) == n["triton"] + n["nvfuser"]

        r, out = _clear(root, env, "--kind", "triton")
        assert r.returncode == 0, (out, r.stderr)
        assert out[0].startswith(f"removed {n['triton']} entries, "), out
        assert all("index could not be updated" in line for line in out[1:]), out
        assert ci.free_bytes(mnt) > n["triton"] * 48 * 1024 // 2
        assert len(ci.entry_ids_on_disk(root)) == n["nvfuser"]

        ci.fill_to_the_last_byte(mnt / "filler")
        assert ci.free_bytes(mnt) == 0
        r, out = _clear(root, env, "--all", "--json")
        assert r.returncode == 0, (out, r.stderr)
        rep = json.loads("\n".join(out))
        assert rep["count"] == n["nvfuser"] and rep["bytes"] >= n["nvfuser"] * 48 * 1024, rep
        assert rep["index_updated"] or rep["index_problem"], rep
        assert ci.entry_ids_on_disk(root) == set()
        assert ci.free_bytes(mnt) > 0

        r = ci.cli(["verify", "--fix", "--dir", str(root)], env)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, (r.stdout, r.stderr)
        os.unlink(mnt / "filler")
        r = ci.cli(["verify", "--json", "--dir", str(root)], env)
        assert r.returncode == 0, r.stdout
        assert json.loads(r.stdout)["ok"]
        r = ci.cli(["stats", "--json", "--dir", str(root)], env)
        assert json.loads(r.stdout)["entries"] == 0


@pytest.mark.parametrize("what", ["clear --all", "verify --fix"])
def test_full_disk_of_leftovers_only(what: str, tmp_path: Path) -> None:
    """The disk is full of what a dead writer left in ``tmp/``: ``clear --all`` and ``verify
    --fix`` remove it first (that frees the space they need), and ``clear`` says so."""
    with tmpfs(tmp_path / "mnt", "2m") as mnt:
        env = ci.child_env(tmp_path)
        root = mnt / "store"
        res = ci.finish(ci.store_child(root, "fill", {"keys": ["one"]}, env))
        assert not res["errors"], res["errors"]
        dead = root / "tmp" / "0123456789abcdef0123456789abcdef01234567.999999999.0000000000000000"
        dead.mkdir()
        ci.fill_to_the_last_byte(dead / "m0.cubin")
        assert ci.free_bytes(mnt) == 0
        r = ci.cli([*what.split(), "--dir", str(root)], env)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, (r.stdout, r.stderr)
        assert not dead.exists()
        assert ci.free_bytes(mnt) > 0
        if what == "clear --all":
            assert r.stdout.startswith(b"removed 1 entry") and b"cleaned 1 leftover from tmp/" in r.stdout, (
                r.stdout
            )


#: A put on the full filesystem (fails), the count read as eviction reads it (on the flush
#: thread, at exit, here through ``evict``), then the inodes freed and another put: its count is
#: kept again.
FULL_CHILD = """
import json, os, shutil, sys
from kcache.store import Store
root, fill = sys.argv[1:3]
s = Store.open(root, max_size=1 << 30)
out = {"full_put": s.put("triton", "k2", {"a.bin": os.urandom(1000)}) is None}
out["evict"] = s.evict(target=1 << 30)  # reads the count, as the flush thread and exit do
shutil.rmtree(fill)
out["put_after"] = s.put("triton", "k3", {"a.bin": os.urandom(1000)}) is not None
s.close()
print(json.dumps(out))
"""

FULL_FIRST = """
import os, sys
from kcache.store import Store
s = Store.open(sys.argv[1], max_size=1 << 30)
assert s.put("triton", "k1", {"a.bin": os.urandom(1000)}) is not None
s.evict(target=1 << 30)  # evict.lock made, while there is room
s.close()
"""


def test_a_full_disk_is_one_warning_and_the_count_comes_back(tmp_path: Path) -> None:
    """A full filesystem is one warning for the whole store, its size count included: the count
    (``locks/usage.du``) warned on its own before (2026-12-06), a second line for the same cause,
    and gave up for the rest of the process, so that a long-running program kept no size bound
    once the space came back. Both fail on main before that."""
    with tmpfs(tmp_path / "mnt", "64m", inodes=200) as mnt:
        root = mnt / "store"
        env = base_env(tmp_path)
        r = subprocess.run(
            [sys.executable, "-c", FULL_FIRST, str(root)], env=env, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0 and not warning_lines(r.stderr), r.stderr
        count = root / "locks" / "usage.du"
        count.unlink()  # the count made anew by the next process that needs it (as after a reset)
        ci.fill_inodes(mnt / "fill")
        r = subprocess.run(
            [sys.executable, "-c", FULL_CHILD, str(root), str(mnt / "fill")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        no_traceback(r)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out == {"full_put": True, "evict": [0, 0], "put_after": True}, out
        w = warning_lines(r.stderr)
        assert len(w) == 1 and "full filesystem" in w[0], r.stderr  # not a second one for the count
        assert count.is_file()  # counted again once there was room, in the same process
