"""The size bound as a disk quota sees it (issue 34, point 6): the store's whole folder, counted
as ``du`` counts it (every file's and folder's blocks, each inode once: entries, the index and
its log, trash, what live processes hold), stays within 1.5x ``KCACHE_MAX_SIZE`` while writers
write and within 1.25x once the last has exited; a process keeps what it still uses, not every
entry it ever touched.

On 36acaa2 four processes compiling distinct Triton kernels took the folder to 7.3x its bound
while they ran (every kernel's scratch files, and every entry a process had put or read, kept
until it exited) and left it at 1.87x (the bound counted member sizes: a 300-byte file takes a
4 KiB block).

The checks after the writers are about bytes, not time: nothing runs once the last writer has
exited (each one's exit evicts and lets go of what it held before it goes), so what the last
one left is measured as soon as it is gone, without waiting.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kernels.harness import clean_env

from kcache.store import Store
from kcache.store.footprint import measure

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def du(root: Path) -> int:
    """The folder's bytes on disk as ``du`` counts them: st_blocks x 512 of every file and folder
    under it (and itself), each inode once, following no link."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(root)]
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as it:
                items = list(it)
        except OSError:
            continue
        for e in items:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    try:
        total += os.lstat(root).st_blocks * 512
    except OSError:
        pass
    return total


class Sampler:
    """Walks the folder over and over on a thread while the writers run: the largest du seen."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self.samples = root, 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.root.exists():
                self.peak = max(self.peak, du(self.root))
                self.samples += 1
            self._stop.wait(0.02)


# ---------------------------------------------------------------------------------- puts
def test_four_writers_keep_the_folder_within_the_bound(tmp_path: Path) -> None:
    """tools/bench_evict.py: four processes put Triton-sized groups (25-320 KB in seven files)
    into a store bounded at 8 MiB, 4 times its bound in all, each looking up (and half the time
    opening the files of) a random entry after every put. Before: 2.0-2.2x while they wrote
    (blocks; the folders of removed entries kept whole by every process that had read them) and
    1.1-1.2x at the last exit, where the members alone were at 0.9x."""
    out = tmp_path / "r.json"
    cmd = [PYTHON, str(REPO / "tools" / "bench_evict.py"), "--writers", "4", "--bound", "8MB"]
    # Work, not time, decides how much is written; the exit eviction's time limit is lifted for
    # the same reason (2 s by default: a loaded box may need more).
    cmd += ["--puts", "100", "--sample-ms", "10", "--exit-budget", "60", "--json", str(out)]
    cmd += ["--dir", str(tmp_path / "work")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.exists(), r.stdout + r.stderr
    run = json.loads(out.read_text())["runs"][0]
    assert run["errors"] == [] and run["writers_ok"] == 4, run["errors"]
    assert run["wrong_bytes"] == 0, run["wrong_examples"]
    bound = 8 << 20
    assert run["bytes_put"] > 3 * bound, run["bytes_put"]
    assert run["samples"] > 10 and run["hits"] > 0, run
    # On failure, the samples around the peak: [s, committed, in flight, held (members' sizes), du].
    trace = run["trace"]
    at = max(range(len(trace)), key=lambda i: trace[i][4]) if trace else 0
    assert run["peak_du_ratio"] <= 1.5, (run["peak_du_ratio"], trace[max(0, at - 6) : at + 4])
    assert run["at_exit_du_ratio"] <= 1.25, run["at_exit_du_ratio"]


# ---------------------------------------------------------------------------------- Triton
KERNEL = """
import triton
import triton.language as tl


@triton.jit
def scale_add_{me}(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, C: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * C + y, mask=mask)
"""

COMPILER = r"""
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
me, n, src = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
spec = importlib.util.spec_from_file_location(f"quota_kernels_{me}", src)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
fn = getattr(mod, f"scale_add_{me}")
sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr", "C": "constexpr"}
names = []
for i in range(n):  # distinct kernels, each dropped when the next is compiled (as a compile server does)
    k = triton.compile(ASTSource(fn, sig, {"BLOCK": 128, "C": i + 1}), target=GPUTarget("cuda", 90, 32))
    names.append(k.name)
import kcache
print(json.dumps({"compiled": len(names), "stats": kcache.stats()}))
"""


def test_four_processes_compiling_triton_kernels_keep_the_folder_within_the_bound(tmp_path: Path) -> None:
    """The issue's case: four processes compile distinct Triton kernels (real compiles, sm_90,
    no GPU needed) into a store bounded at 2 MiB, 3-4 times its bound in all. Before: 4.4x while
    they compiled (every kernel's scratch files kept by its process until it exited: 3.2 MB in
    tmp/), 2.4x after (blocks). (At 1 MiB and 16 kernels each, the four compiles in flight, each
    with its scratch files and its entry in tmp/, are close to half the bound by themselves: the
    peak was 1.40-1.46x on a quiet box and 1.64x once under load. At 2 MiB: 1.04-1.31x.)"""
    root = tmp_path / "store"
    bound = 2 << 20
    env = clean_env(tmp_path, kcache_dir=root, KCACHE_MAX_SIZE=str(bound))
    n = 32
    procs = []
    with Sampler(root) as sampler:
        for me in range(4):
            src = tmp_path / f"kernels_{me}.py"
            src.write_text(KERNEL.format(me=me))
            procs.append(
                subprocess.Popen(
                    [PYTHON, "-c", COMPILER, str(me), str(n), str(src)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=600) for p in procs]
    at_exit = du(root)  # what the last one left: every writer's exit is over
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1])["compiled"] == n, out
    assert sampler.samples > 10
    assert sampler.peak <= 1.5 * bound, f"{sampler.peak / bound:.2f}x the bound while compiling"
    assert at_exit <= 1.25 * bound, f"{at_exit / bound:.2f}x the bound after the last exit"
    assert os.listdir(root / "trash") == []
    assert [x for x in os.listdir(root / "tmp")] == []  # nothing held by anyone now


# ---------------------------------------------------------------------------------- a server
def test_a_long_lived_process_holds_only_what_it_still_uses(tmp_path: Path) -> None:
    """One process (a compile server) puts an entry, opens its files, and reads an older one
    again, 240 times, under a bound of 1 MiB that keeps a few dozen: what it holds beyond the
    store's entries (removed entries whose folders it held, private links) stays bounded by
    what it still keeps (here: the last few hits), and the folder stays within 1.5x its bound.
    Before, every entry it had read stayed held until it exited: the trash grew by one entry
    per eviction (9 MB here)."""
    root = tmp_path / "store"
    bound = 1 << 20
    s = Store.open(root, max_size=bound)
    kept = []  # the hits it still uses: the last four
    worst_held = worst_du = 0
    size = 30_000
    try:
        for i in range(240):
            assert s.put("triton", f"k{i}", {"k.cubin": bytes([i % 251]) * size, "k.json": b"{}"})
            for key in (f"k{i}", f"k{max(0, i - 7)}"):
                hit = s.get("triton", key, files=True)
                if hit is not None:
                    assert Path(hit.paths["k.cubin"]).read_bytes()[:1] == bytes([int(key[1:]) % 251])
                    kept = [*kept[-3:], hit]
            if i % 8 == 7:
                time.sleep(0.05)  # the flush thread's turns come (a server is not always busy)
                worst_held = max(worst_held, measure(s.disk.folders).held)
                worst_du = max(worst_du, du(root))
        # What it still holds stays readable, whatever eviction did meanwhile.
        for hit in kept:
            for name, p in hit.paths.items():
                assert Path(p).read_bytes() == hit.read(name)
    finally:
        kept.clear()
        s.close()
    assert worst_held <= 8 * 40_000 + bound // 5, f"{worst_held} bytes held beside the entries"
    assert worst_du <= 1.5 * bound, f"{worst_du / bound:.2f}x"
    assert du(root) <= 1.25 * bound


def test_a_process_whose_turns_do_not_come_still_lets_go_of_removed_entries(
    tmp_path: Path, monkeypatch
) -> None:
    """A loaded box starves the flush thread that lets go of what other processes removed: a
    process that read 24 entries (its holds idle, kept while the entries are committed) keeps
    their folders whole in trash/ once another process clears the store, until that thread's
    turn. Its own puts then took the folder past 1.5x its bound: they counted only the entries and
    what the last turn saw beside them (nothing, here). Now a put walks what is beside the
    entries again, and one that finds the folder past HELP_OVER lets go of them and sweeps.
    Before: 2.25x (the folder reached 1.6x its bound once in CI with four writers,
    tests/test_store_quota.py's first test)."""
    from kcache.store import tunables

    # A put walks and lets go at every put: how often it may (every REMEASURE_S, at most
    # REMEASURE_SHARE of its CPU) is not the subject, and would make what it sees depend on time.
    monkeypatch.setattr(tunables, "REMEASURE_S", 0.0)
    monkeypatch.setattr(tunables, "REMEASURE_SHARE", 1e9)
    root = tmp_path / "store"
    bound = 2 << 20
    s = Store.open(root, max_size=bound)
    disk = s.disk
    disk.catalogue.on_turn = lambda: None  # the flush thread's turns never come (a starved thread)
    size = 60_000
    try:
        for i in range(24):
            assert s.put("triton", f"old{i}", {"k.cubin": bytes([i]) * size, "k.json": b"{}"})
            hit = s.get("triton", f"old{i}", files=True)
            assert hit is not None and Path(hit.paths["k.cubin"]).read_bytes()[:1] == bytes([i])
            del hit  # its paths gone: the hold is idle, kept while the entry is committed
        gc.collect()
        env = clean_env(tmp_path, KCACHE_DIR=str(root))  # another process clears the store
        r = subprocess.run(
            [PYTHON, "-m", "kcache", "clear", "--all"], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stdout + r.stderr
        held = du(root / "trash")
        assert held > 24 * size, held  # every folder this process holds stays whole in trash/
        worst = 0
        for i in range(48):
            assert s.put("triton", f"new{i}", {"k.cubin": bytes([i]) * size, "k.json": b"{}"})
            worst = max(worst, du(root))
        assert worst <= 1.5 * bound, f"{worst / bound:.2f}x the bound ({du(root / 'trash')} bytes in trash/)"
        # Nothing in trash/ is held any more: whatever a sweep has not reached yet (each put's is
        # 20 ms at most), the next one deletes.
        still = []
        for name in os.listdir(root / "trash"):
            fd = os.open(root / "trash" / name, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                still.append(name)
            finally:
                os.close(fd)
        assert still == [], f"{len(still)} removed entries still held"
    finally:
        s.close()


def test_a_path_kept_keeps_its_files_and_goes_with_its_last_holder(tmp_path: Path) -> None:
    """A library that keeps one path (Proton keeps a kernel's metadata path) and drops the rest
    still reads it after the entry was evicted; once that path goes too, the folder it held is
    deleted at the holder's next flush turn, without waiting for the process to exit."""
    root = tmp_path / "store"
    reader = Store.open(root)
    other = Store.open(root)
    try:
        reader.put("triton", "k", {"k.ttgir": b"T" * 5000, "k.json": b'{"a": 1}'})
        hit = reader.get("triton", "k", files=True)
        assert hit is not None and hit._pin is not None
        kept = hit.paths["k.json"]
        del hit
        gc.collect()
        assert other.evict(target=0)[0] == 1  # removed from the store, its folder held
        assert Path(kept).read_bytes() == b'{"a": 1}'
        assert len(os.listdir(root / "trash")) == 1
        assert str(kept) == kept and type(str(kept)) is str  # a plain path in every use
        del kept
        gc.collect()
        reader.disk._flush_turn()  # its next turn: let go, and the removed folder deleted
        assert os.listdir(root / "trash") == []
        # A new lookup holds again (the memo's entry of the let-go hold is not used).
        reader.put("triton", "k", {"k.ttgir": b"U" * 5000, "k.json": b'{"a": 2}'})
        again = reader.get("triton", "k", files=True)
        assert again is not None and Path(again.paths["k.json"]).read_bytes() == b'{"a": 2}'
        assert reader.get("triton", "k", files=True).paths == again.paths  # the memo, while held
    finally:
        reader.close()
        other.close()


def test_private_links_go_with_their_paths(tmp_path: Path, monkeypatch) -> None:
    """Where no hold can be taken (past the held folders' share of descriptors, here none), a
    hit's files are private links in this process's folder under tmp/: they go when the paths
    handed out go, not at exit."""
    from kcache.store import served as served_mod

    monkeypatch.setattr(served_mod, "MAX_PINS", 0)
    root = tmp_path / "store"
    s = Store.open(root)
    try:
        s.put("triton", "k", {"a.bin": b"N" * 10_000})
        hit = s.get("triton", "k", files=True)
        assert hit is not None and hit._pin is None
        p = hit.paths["a.bin"]
        served = [n for n in os.listdir(root / "tmp") if n.startswith("served.")]
        assert len(served) == 1 and os.listdir(root / "tmp" / served[0]) != []
        del hit
        gc.collect()
        assert Path(p).read_bytes() == b"N" * 10_000  # still kept by the path
        del p
        gc.collect()
        s.disk._flush_turn()
        assert os.listdir(root / "tmp" / served[0]) == []
    finally:
        s.close()


@pytest.mark.parametrize("when", ["hit", "miss"])
def test_a_compiled_kernel_keeps_its_files_while_it_lives(tmp_path: Path, when: str) -> None:
    """Triton keeps the paths it was given in each CompiledKernel (``metadata_group``) and its
    load hooks read them at the kernel's first launch (Proton parses the .ttgir then): the
    files stay while the kernel object lives, whatever eviction does, and go when it goes."""
    root = tmp_path / "store"
    code = r"""
import gc, json, os, sys
import kcache, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.elementwise import add_kernel
src = ASTSource(add_kernel, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n_elements": "i32", "BLOCK": "constexpr"}, {"BLOCK": 64})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
store = kcache.active_store()
group = k.metadata_group
store.evict(target=0)  # every entry removed (a held one waits in trash/)
ttgir = next(p for n, p in group.items() if n.endswith(".ttgir"))
readable = open(ttgir).read().startswith("#") or len(open(ttgir).read()) > 0
del k, group, ttgir
gc.collect()
store.disk._flush_turn()
root = sys.argv[1]
print(json.dumps({"readable": readable, "trash": os.listdir(root + "/trash"),
                  "tmp": [sorted(os.listdir(root + "/tmp/" + d)) for d in os.listdir(root + "/tmp")]}))
"""
    env = clean_env(tmp_path, kcache_dir=root)
    if when == "hit":  # compiled and stored once before: this process's kernel is a hit
        warm = subprocess.run([PYTHON, "-c", code.replace("store.evict(target=0)", "pass"), str(root)],
                              env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
        assert warm.returncode == 0, warm.stderr[-3000:]
    r = subprocess.run([PYTHON, "-c", code, str(root)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["readable"], got
    assert got["trash"] == [], got  # let go with the kernel, and deleted
    assert all(files == [] for files in got["tmp"]), got  # no scratch or private files left
