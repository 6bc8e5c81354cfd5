"""nvFuser KernelDb persistence: seeding, harvesting, dedupe, concurrency, corruption, fingerprints.

No nvFuser needed. Folders are built in nvFuser's own format (db.csv + kernel_N.cu/.cubin, as
kernel_db.cpp writes them) and read back with a Python copy of its reader. The end-to-end tests
build a small C++ stand-in for nvFuser's KernelDb (same class layout, same exported
``KernelDb::get``, the real ``std::filesystem::temp_directory_path``) and a fake
``nvfuser_direct`` module around it, and run real processes through kcache's import hook, in both
ways of pointing nvFuser at the private folder (``direct`` and ``tmpdir``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from kcache.nvfuser import kerneldb as kdb
from kcache.nvfuser.kerneldb import Fingerprint, Kernel
from kcache.store import Store

ARGS = "--std=c++17 --diag-suppress=177 --gpu-architecture=sm_90a -default-device --fmad=true -DNDEBUG"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def make_fp(**over: str | None) -> Fingerprint:
    comps: dict[str, str | None] = {
        "nvfuser_version": "nvfuser-cu130-torch210==0.2.36",
        "nvfuser_build": "0.2.36+git7e04d26 libnvfuser_codegen.so:111868961",
        "nvrtc": "13.0 (libnvrtc.so.13)",
        "arch": "sm_90a",
        "torch_version": "2.11.0+cu130",
        "cuda_runtime": "13.0",
        "nvfuser_enable": "",
        "nvfuser_disable": "",
        "nvfuser_env": "",
    }
    comps.update(over)
    return Fingerprint(comps)


def make_kernel(i: int, *, args: str = ARGS, salt: str = "") -> Kernel:
    """A kernel as nvFuser would produce it: mangled name, source, and a binary naming it. The
    binary has random bytes: the same kernel compiled in two processes differs there."""
    name = f"nvfuser_pointwise_f0_c1_r0_g{i}"
    sig = f"_ZN3nvf{len(name)}{name}ENS_6TensorIfLi2ELi2EEE"
    code = f"__global__ void {name}(Tensor<float, 2, 2> T0) {{ /* {i}{salt} */ }}\n".encode()
    cubin = b"\x7fELF\x02\x01\x01" + os.urandom(48) + sig.encode() + b"\0" + os.urandom(16)
    return Kernel(sig, args, code, cubin)


# -- nvFuser's KernelDb, in Python (kernel_db.cpp: open, query, write) ---------------------------
_NV_ROW = re.compile(r"^([\w-]+),([\w \+\-\=]+),([\w\-\/]+\.cu),([\w\-\/]+\.cubin)$", re.ASCII)


class NvKernelDb:
    """What nvFuser does with a folder: read it at open, then query and write as kernel_db.cpp."""

    def __init__(self, db_dir: Path) -> None:
        self.dir = Path(db_dir)
        self.map: dict[bytes, tuple[str, str, str, str]] = {}
        self.dir.mkdir(parents=True, exist_ok=True)
        csv = self.dir / "db.csv"
        if csv.is_file():
            lines = csv.read_bytes().decode().split("\n")
            if lines and lines[0] == kdb.HEADER:
                for line in lines[1:]:
                    m = _NV_ROW.match(line)
                    if m and (self.dir / m.group(3)).is_file():
                        self.map[(self.dir / m.group(3)).read_bytes()] = m.groups()
                return
        for p in self.dir.iterdir():
            if p.suffix in (".cu", ".cubin", ".csv"):
                p.unlink()
        csv.write_text(kdb.HEADER + "\n")

    def query(self, code: bytes, args: str) -> tuple[str, bytes] | None:
        e = self.map.get(code)
        if e is None or e[1] != args:
            return None
        return e[0], (self.dir / e[3]).read_bytes()

    def write(self, k: Kernel) -> None:
        if k.code in self.map:
            return
        n = len(self.map)
        cu, cubin = f"kernel_{n}.cu", f"kernel_{n}.cubin"
        (self.dir / cu).write_bytes(k.code)
        (self.dir / cubin).write_bytes(k.cubin)
        with open(self.dir / "db.csv", "a") as f:
            f.write(f"{k.signature},{k.compile_args},{cu},{cubin}\n")
        self.map[k.code] = (k.signature, k.compile_args, cu, cubin)


def nvfuser_folder(path: Path, kernels: list[Kernel]) -> Path:
    db = NvKernelDb(path)
    for k in kernels:
        db.write(k)
    return path


def nvfuser_entries(store: Store) -> dict[str, str]:
    """key -> entry id of every committed ``nvfuser`` entry (from the entries themselves)."""
    out = {}
    for ident in store.iter_entry_ids():
        hit, _problem = store.read_any(ident)
        if hit is not None and hit.record.kind == kdb.KIND:
            out[hit.record.key] = ident
    return out


def manifest(store: Store, fp: Fingerprint) -> list[str] | None:
    return kdb.entries.read_manifest(store, fp, count=False)


# -- folder format and fingerprint ----------------------------------------------------------------


def test_read_rows_of_an_nvfuser_folder(tmp_path: Path) -> None:
    ks = [make_kernel(i) for i in range(3)]
    nvfuser_folder(tmp_path / "db", ks)
    rows, bad = kdb.read_rows(tmp_path / "db")
    assert bad == 0
    assert [r.cubin_file for r in rows] == ["kernel_0.cubin", "kernel_1.cubin", "kernel_2.cubin"]
    loaded = [kdb.load_kernel(tmp_path / "db", r) for r in rows]
    assert loaded == ks  # every field, the binary included (the content hash leaves it out)


def test_content_hash_ignores_binary_but_not_source_or_args() -> None:
    a, b = make_kernel(1), make_kernel(1)
    assert a.cubin != b.cubin and a.content_hash == b.content_hash
    assert make_kernel(1, salt="x").content_hash != a.content_hash  # same signature, other source
    assert make_kernel(1, args=ARGS + " -lineinfo").content_hash != a.content_hash


def test_codegen_options_are_normalised() -> None:
    n = kdb.NEUTRAL_ENABLE
    assert kdb.codegen_options("kernel_db", n) == ""
    assert kdb.codegen_options("kernel_lineinfo,kernel_db", n) == "kernel_lineinfo"
    assert kdb.codegen_options("kernel_lineinfo, fast_math", n) == "fast_math,kernel_lineinfo"
    assert kdb.codegen_options("warn_register_spill(4),kernel_debug", n) == "kernel_debug"
    assert kdb.codegen_options("tma_pointwise(a,b),kernel_db", n) == "tma_pointwise(a,b)"
    assert kdb.codegen_options("kernel_debug", n) == "kernel_debug"


def test_fingerprint_reads_nvfuser_options_from_env() -> None:
    base = kdb.current_fingerprint(environ={})
    assert base.components["nvfuser_enable"] == "" and base.components["nvfuser_env"] == ""
    same = kdb.current_fingerprint(environ={"NVFUSER_ENABLE": "kernel_db", "NVFUSER_DUMP": "cuda_kernel"})
    assert same.hash == base.hash
    other = kdb.current_fingerprint(environ={"NVFUSER_ENABLE": "kernel_lineinfo"})
    assert other.hash != base.hash and other.components["nvfuser_enable"] == "kernel_lineinfo"
    other = kdb.current_fingerprint(environ={"NVFUSER_DISABLE": "fma"})
    assert other.hash != base.hash
    other = kdb.current_fingerprint(environ={"NVFUSER_USE_BLOCK_SYNC_ATOMIC": "1"})
    assert other.hash != base.hash
    assert kdb.current_fingerprint(environ={"NVFUSER_DISABLE": "parallel_compile"}).hash == base.hash


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed: no torch_version to read"
)
def test_fingerprint_names_the_installed_torch() -> None:
    import importlib.metadata

    comps = kdb.current_fingerprint(environ={}).components
    assert comps["torch_version"] == importlib.metadata.version("torch")


# -- seeding and harvesting -----------------------------------------------------------------------


def test_harvest_then_seed_roundtrip(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    ks = [make_kernel(i) for i in range(4)]
    nvfuser_folder(tmp_path / "p1", ks)
    r = kdb.harvest(store, tmp_path / "p1", fp)
    assert len(r.added) == 4 and r.bad == 0 and r.manifest
    assert len(nvfuser_entries(store)) == 4
    assert sorted(manifest(store, fp)) == sorted(k.content_hash for k in ks)

    s = kdb.seed(store, tmp_path / "p2", fp)
    assert len(s.seeded) == 4 and s.missing == [] and s.source == "manifest"
    db = NvKernelDb(tmp_path / "p2")  # nvFuser opening the seeded folder
    assert len(db.map) == 4
    for k in ks:
        sig, cubin = db.query(k.code, k.compile_args)
        assert sig == k.signature
        stored = store.get(kdb.KIND, f"{fp.hash}/{k.content_hash}", count=False)
        assert cubin == stored.read("kernel.cubin") == k.cubin
    assert all(name.startswith("seed_") for name in s.seeded.values())


def test_harvest_stores_only_new_kernels(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1", [make_kernel(i) for i in range(3)]), fp)
    seeded = kdb.seed(store, tmp_path / "p2", fp)
    db = NvKernelDb(tmp_path / "p2")
    for i in range(3):  # already there: nvFuser finds them and compiles nothing
        assert db.query(make_kernel(i).code, ARGS) is not None
    db.write(make_kernel(3))  # nvFuser numbers new files from its map size: kernel_3
    db.write(make_kernel(4))
    assert (tmp_path / "p2" / "kernel_3.cu").is_file()
    known = set(seeded.seeded)
    r = kdb.harvest(store, tmp_path / "p2", fp, known, seeded=seeded.seeded)
    assert len(r.added) == 2 and r.already == 0
    assert len(nvfuser_entries(store)) == 5 and len(manifest(store, fp)) == 5
    r = kdb.harvest(store, tmp_path / "p2", fp, known)  # again: nothing new
    assert r.added == [] and len(nvfuser_entries(store)) == 5


def test_seeded_names_never_collide_with_nvfuser_names(tmp_path: Path, store: Store) -> None:
    """Two stored kernels with one source: KernelDb keeps one per source, so its next file number
    is lower than the row count. Seeded files have names nvFuser never writes."""
    fp = make_fp()
    a, b = make_kernel(1), make_kernel(1, args=ARGS + " -lineinfo")  # same source, other args
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1", [a, make_kernel(2)]), fp)
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1b", [b]), fp)
    s = kdb.seed(store, tmp_path / "p2", fp)
    assert len(s.seeded) == 2 and s.shadowed == 1
    db = NvKernelDb(tmp_path / "p2")
    new = make_kernel(3)
    db.write(new)
    r = kdb.harvest(store, tmp_path / "p2", fp, set(s.seeded))
    assert r.added == [new.content_hash]
    assert (tmp_path / "p2" / "kernel_2.cu").read_bytes() == new.code  # numbered from the map size
    k2 = make_kernel(2)
    assert db.query(k2.code, ARGS)[0] == k2.signature
    assert db.query(b.code, b.compile_args)[1] == store.get(
        kdb.KIND, f"{fp.hash}/{b.content_hash}", count=False
    ).read("kernel.cubin")  # the newer of the two sharing a source, intact
    assert db.query(a.code, a.compile_args) is None


def test_same_kernel_from_two_processes_is_stored_once(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    k1, k2 = make_kernel(7), make_kernel(7)  # compiled twice: binaries differ
    r1 = kdb.harvest(store, nvfuser_folder(tmp_path / "a", [k1, make_kernel(1)]), fp)
    r2 = kdb.harvest(store, nvfuser_folder(tmp_path / "b", [k2, make_kernel(2)]), fp)
    assert len(r1.added) == 2 and len(r2.added) == 1 and r2.already == 1
    assert len(nvfuser_entries(store)) == 3
    assert len(manifest(store, fp)) == 3


def test_used_seeded_kernels_count_as_hits(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1", [make_kernel(i) for i in range(3)]), fp)
    s = kdb.seed(store, tmp_path / "p2", fp)
    db = NvKernelDb(tmp_path / "p2")
    assert db.query(make_kernel(1).code, ARGS) is not None  # nvFuser reads that one binary
    used: set[str] = set()
    r = kdb.harvest(store, tmp_path / "p2", fp, set(s.seeded), seeded=s.seeded, used=used)
    if os.stat(tmp_path / "p2" / s.seeded[make_kernel(1).content_hash]).st_atime_ns == 0:
        pytest.skip("this filesystem does not update access times")
    assert r.used == 1 and used == {make_kernel(1).content_hash}


def test_fingerprint_mismatch_is_not_seeded(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1", [make_kernel(i) for i in range(3)]), fp)
    for other in (
        make_fp(nvfuser_version="nvfuser-cu130-torch210==0.2.37"),
        make_fp(nvfuser_build="0.2.36+gitdeadbee libnvfuser_codegen.so:1"),
        make_fp(arch="sm_100a"),
        make_fp(nvrtc="12.9 (libnvrtc.so.12)"),
        make_fp(torch_version="2.10.0+cu130"),
        make_fp(nvfuser_enable="kernel_lineinfo"),
        make_fp(nvfuser_disable="fma"),
    ):
        d = tmp_path / f"other-{other.hash}"
        s = kdb.seed(store, d, other)
        assert s.seeded == {} and NvKernelDb(d).map == {}
    assert len(kdb.seed(store, tmp_path / "same", make_fp()).seeded) == 3


def test_corrupt_stored_cubin_is_not_seeded_and_leaves_the_manifest(
    tmp_path: Path, store: Store, kcache_warnings: list[str]
) -> None:
    fp = make_fp()
    ks = [make_kernel(i) for i in range(3)]
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1", ks), fp)
    hit = store.get(kdb.KIND, f"{fp.hash}/{ks[1].content_hash}", count=False)
    p = hit.paths["kernel.cubin"]
    os.chmod(p, 0o600)
    data = bytearray(Path(p).read_bytes())
    data[10] ^= 0xFF
    Path(p).write_bytes(bytes(data))

    s = kdb.seed(store, tmp_path / "p2", fp)
    assert sorted(s.seeded) == sorted([ks[0].content_hash, ks[2].content_hash])
    assert s.missing == [ks[1].content_hash]
    db = NvKernelDb(tmp_path / "p2")
    assert db.query(ks[1].code, ARGS) is None and db.query(ks[0].code, ARGS) is not None
    assert any("corrupt" in m for m in kcache_warnings)
    # the next harvest drops it from the manifest (confirmed gone under the lock)
    r = kdb.harvest(store, tmp_path / "p2", fp, set(s.seeded), missing=s.missing)
    assert r.manifest and sorted(manifest(store, fp)) == sorted(s.seeded)


def test_entry_that_disagrees_with_its_key_is_not_seeded(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    good, bad = make_kernel(1), make_kernel(2)
    kdb.entries.put_kernel(store, fp, good)
    # a well-formed entry whose content is not the kernel its key names
    store.put(
        kdb.KIND,
        f"{fp.hash}/{'0' * 40}",
        {"kernel.cu": bad.code, "kernel.cubin": bad.cubin, "meta.msgpack": b"\x80"},
    )
    kdb.update_manifest(store, fp, add=[good.content_hash, "0" * 40])
    s = kdb.seed(store, tmp_path / "p", fp)
    assert list(s.seeded) == [good.content_hash] and s.missing == ["0" * 40]


def test_corrupt_db_csv_is_skipped_not_fatal(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    d = tmp_path / "p"
    good = [make_kernel(i) for i in range(3)]
    nvfuser_folder(d, good)
    wrong_sig = make_kernel(5)
    (d / "kernel_5.cu").write_bytes(wrong_sig.code)
    (d / "kernel_5.cubin").write_bytes(b"\x7fELF no signature in here")
    with open(d / "db.csv", "a") as f:
        f.write("garbage line without commas\n")
        f.write(f"{make_kernel(3).signature},{ARGS},kernel_3.cu,kernel_3.cubin\n")  # files missing
        f.write(f"{make_kernel(4).signature},{ARGS},../../etc/passwd.cu,x.cubin\n")  # escapes
        f.write(f"{wrong_sig.signature},{ARGS},kernel_5.cu,kernel_5.cubin\n")  # cubin without it
        f.write("bad,sig,with,too,many,fields.cu\n")
        f.write("\xff\xfe,binary,junk.cu,junk.cubin\n")
        f.write(f"{make_kernel(6).signature},{ARGS},kernel_6.cu,kernel_6.cu")  # unfinished, no newline
    r = kdb.harvest(store, d, fp)
    assert sorted(r.added) == sorted(k.content_hash for k in good)
    assert r.bad >= 5
    assert len(nvfuser_entries(store)) == 3

    (d / "db.csv").write_bytes(b"not the header\n" + (d / "db.csv").read_bytes())
    assert kdb.harvest(store, d, fp).added == []
    (d / "db.csv").write_bytes(b"\x00\x01\x02")
    assert kdb.harvest(store, d, fp).added == []
    (d / "db.csv").unlink()
    assert kdb.harvest(store, d, fp).added == []
    assert kdb.harvest(store, tmp_path / "missing", fp).added == []


def test_manifest_missing_falls_back_to_the_index(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    ks = [make_kernel(i) for i in range(3)]
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1", ks), fp)
    store.remove([store.entry_id(kdb.MANIFEST_KIND, fp.hash)])
    members, source = kdb.list_members(store, fp)
    assert source == "index" and sorted(members) == sorted(k.content_hash for k in ks)
    assert len(kdb.seed(store, tmp_path / "p2", fp).seeded) == 3
    # the next harvest writes the manifest again, with every member
    db = NvKernelDb(tmp_path / "p2")
    db.write(make_kernel(9))
    kdb.harvest(store, tmp_path / "p2", fp, {k.content_hash for k in ks})
    assert len(manifest(store, fp)) == 4


def test_readonly_store_seeds_but_never_writes(tmp_path: Path, store_dir: Path) -> None:
    fp = make_fp()
    w = Store.open(store_dir, max_size=1 << 30)
    kdb.harvest(w, nvfuser_folder(tmp_path / "p1", [make_kernel(i) for i in range(2)]), fp)
    w.close()
    ro = Store.open(store_dir, max_size=1 << 30, readonly=True)
    assert len(kdb.seed(ro, tmp_path / "p2", fp).seeded) == 2
    NvKernelDb(tmp_path / "p2").write(make_kernel(5))
    r = kdb.harvest(ro, tmp_path / "p2", fp)
    assert r.added == [] and r.failed == 0  # not refused by the store: never tried
    assert len(nvfuser_entries(ro)) == 2
    ro.close()


def test_entries_are_visible_as_kind_nvfuser(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    kdb.harvest(store, nvfuser_folder(tmp_path / "p1", [make_kernel(0)]), fp)
    store.flush(force=True)
    rows = list(store.index().rows(kind=kdb.KIND))
    assert len(rows) == 1
    _ident, _at, _hits, _size, rec, _err = rows[0]  # the shape kerneldb's fallback listing reads
    assert rec.summary["kernel"] == "nvfuser_pointwise_f0_c1_r0_g0" and rec.summary["arch"] == "sm_90a"
    assert rec.components["compile_args"] == ARGS and rec.components["nvfuser_version"]
    assert sorted(f.name for f in rec.files) == ["kernel.cu", "kernel.cubin", "meta.msgpack"]
    assert len(list(store.index().rows(kind=kdb.MANIFEST_KIND))) == 1


def test_stale_folder_of_a_dead_process_is_adopted(tmp_path: Path, store: Store) -> None:
    fp = make_fp()
    base = tmp_path / "tmp"
    base.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    pid = int(dead.stdout)
    root = base / f"{kdb.ROOT_PREFIX}{pid}-abc"
    nvfuser_folder(root / kdb.DB_DIR, [make_kernel(1), make_kernel(2)])
    (root / kdb.SESSION_FILE).write_text(json.dumps({"pid": pid, "fingerprint": fp.hash}))
    live = base / f"{kdb.ROOT_PREFIX}{os.getppid()}-def"  # a live process's folder: left alone
    nvfuser_folder(live / kdb.DB_DIR, [make_kernel(3)])
    assert kdb.adopt_stale(store, fp, str(base)) == 2
    assert not root.exists() and live.exists()
    assert len(nvfuser_entries(store)) == 2


# -- concurrent processes -------------------------------------------------------------------------

_WORKER = """
import json, sys, time
sys.path.insert(0, {tests!r})
from test_kerneldb import make_fp, make_kernel, nvfuser_folder
from kcache.nvfuser import kerneldb as kdb
from kcache.store import Store
store_dir, folder, first, count, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
from pathlib import Path
nvfuser_folder(Path(folder), [make_kernel(i) for i in range(first, first + count)])
store = Store.open(store_dir, max_size=1 << 30)
while time.time() < start:
    time.sleep(0.001)
r = kdb.harvest(store, folder, make_fp())
store.close()
print(json.dumps({{"added": len(r.added), "already": r.already, "failed": r.failed, "manifest": r.manifest}}))
"""


def test_concurrent_processes_harvest_into_one_store(tmp_path: Path, store_dir: Path, clean_env) -> None:
    Store.open(store_dir, max_size=1 << 30).close()
    n, per = 6, 5  # process j compiles kernels j .. j+4: ten distinct kernels, most of them shared
    code = _WORKER.format(tests=str(HERE))
    env = dict(clean_env, PYTHONPATH=str(REPO))
    start = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                str(store_dir),
                str(tmp_path / f"p{j}"),
                str(j),
                str(per),
                str(start),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for j in range(n)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "Traceback" not in err and "warning" not in err.lower(), err
        results.append(json.loads(out))
    assert all(r["failed"] == 0 and r["manifest"] for r in results)
    total = n + per - 1
    assert sum(r["added"] for r in results) == total  # each kernel stored by exactly one process

    store = Store.open(store_dir, max_size=1 << 30)
    fp = make_fp()
    entries = nvfuser_entries(store)
    want = {f"{fp.hash}/{make_kernel(i).content_hash}" for i in range(total)}
    assert set(entries) == want
    for ident in entries.values():
        hit, problem = store.read_any(ident, full=True)
        assert hit is not None, problem
    assert sorted(manifest(store, fp)) == sorted(make_kernel(i).content_hash for i in range(total))
    assert len(list(store.index().rows(kind=kdb.KIND))) == total
    s = kdb.seed(store, tmp_path / "after", fp)
    assert len(s.seeded) == total and s.missing == []
    store.close()


# -- end to end: a C++ stand-in for nvFuser's KernelDb, through kcache's import hook --------------

_FAKE_CPP = r"""
// A stand-in for nvFuser's KernelDb: the class layout and the logic of kernel_db.cpp (get, open,
// query, write), with the same exported get() and std::filesystem::temp_directory_path().
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <unordered_map>
#include <vector>
#define API __attribute__((visibility("default")))
namespace fs = std::filesystem;
namespace nvfuser {
struct KernelDbEntry {
  std::string kernel_signature, compile_args, kernel_code_file, cubin_file;
};
class KernelDb {
  KernelDb(bool d) : disabled_(d), initialized_(false) {}
  bool open(const std::string& dir, const std::string& file, bool use_temp_dir);

 public:
  KernelDb(const KernelDb&) = delete;
  API static KernelDb& get(const std::string& dir, const std::string& file, bool use_temp_dir = true,
                           bool disabled = false, bool reset = false);
  bool enabled() const { return !disabled_ && initialized_; }
  bool query(const std::string& code, const std::string& args, std::string& sig, std::vector<char>& bin) const;
  bool write(const std::string& code, const std::string& args, const std::string& sig, const std::vector<char>& bin);
  std::string path() const { return kernel_db_path_.string(); }

 private:
  bool disabled_ = true;
  bool initialized_ = false;
  std::unordered_map<std::string, KernelDbEntry> kernel_map_;
  fs::path kernel_db_path_;
  fs::path kernel_db_txt_file_;
};
static std::mutex kernel_db_lock;
static bool slurp(const fs::path& p, std::string& out) {
  std::ifstream f(p, std::ios::in | std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}
KernelDb& KernelDb::get(const std::string& dir, const std::string& file, bool use_temp_dir, bool disabled,
                        bool reset) {
  std::lock_guard<std::mutex> guard(kernel_db_lock);
  static KernelDb singleton(disabled);
  if (reset) {
    singleton.disabled_ = true;
    singleton.initialized_ = false;
    singleton.kernel_map_.clear();
    singleton.kernel_db_path_.clear();
    singleton.kernel_db_txt_file_.clear();
  }
  singleton.disabled_ = disabled;
  if (!singleton.disabled_ && !singleton.initialized_) {
    bool ok = false;
    try {
      ok = singleton.open(dir, file, use_temp_dir);
    } catch (...) {
    }
    if (!ok) singleton.disabled_ = true;
    else singleton.initialized_ = true;
  }
  return singleton;
}
bool KernelDb::open(const std::string& dir, const std::string& file, bool use_temp_dir) {
  const std::string header("kernel_signature,compile_args,kernel_code_file,cubin_file");
  kernel_db_path_ = use_temp_dir ? fs::temp_directory_path() / dir : fs::path(dir);
  if (!fs::is_directory(kernel_db_path_)) fs::create_directory(kernel_db_path_);
  kernel_db_txt_file_ = kernel_db_path_ / file;
  if (fs::is_regular_file(kernel_db_txt_file_)) {
    std::ifstream in(kernel_db_txt_file_.c_str(), std::ios::in);
    if (in) {
      bool matched = false, read_ok = true;
      std::regex re(R"(^([\w-]+),([\w \+\-\=]+),([\w\-\/]+\.cu),([\w\-\/]+\.cubin)$)");
      for (std::string line; std::getline(in, line);) {
        if (!matched) {
          if (line == header) matched = true;
          else { read_ok = false; break; }
        } else {
          std::smatch m;
          if (std::regex_match(line, m, re)) {
            KernelDbEntry e{m[1], m[2], m[3], m[4]};
            std::string code;
            if (slurp(kernel_db_path_ / e.kernel_code_file, code)) kernel_map_[code] = e;
          }
        }
      }
      if (read_ok) return true;
    }
  }
  for (const auto& de : fs::directory_iterator(kernel_db_path_)) {
    auto ext = de.path().extension();
    if (fs::is_regular_file(de.path()) && (ext == ".cubin" || ext == ".cu" || ext == ".csv")) fs::remove(de.path());
  }
  std::ofstream(kernel_db_txt_file_, std::ios::out | std::ios::binary) << header << "\n";
  return true;
}
bool KernelDb::query(const std::string& code, const std::string& args, std::string& sig,
                     std::vector<char>& bin) const {
  auto it = kernel_map_.find(code);
  if (it == kernel_map_.end() || it->second.compile_args != args) return false;
  std::string data;
  if (!slurp(kernel_db_path_ / it->second.cubin_file, data)) return false;
  bin.assign(data.begin(), data.end());
  sig = it->second.kernel_signature;
  return true;
}
bool KernelDb::write(const std::string& code, const std::string& args, const std::string& sig,
                     const std::vector<char>& bin) {
  std::lock_guard<std::mutex> guard(kernel_db_lock);
  if (kernel_map_.count(code) > 0) return true;
  std::string n = std::to_string(kernel_map_.size());
  std::string cu = "kernel_" + n + ".cu", cubin = "kernel_" + n + ".cubin";
  std::ofstream(kernel_db_path_ / cu, std::ios::out | std::ios::binary) << code;
  std::ofstream(kernel_db_path_ / cubin, std::ios::out | std::ios::binary).write(bin.data(), bin.size());
  std::ofstream(kernel_db_txt_file_, std::ios::app | std::ios::binary) << sig << "," << args << "," << cu << ","
                                                                        << cubin << "\n";
  kernel_map_[code] = KernelDbEntry{sig, args, cu, cubin};
  return true;
}
}  // namespace nvfuser
// What a compile does (compiled_kernel.cpp getCudaExecutable): KernelDb::get(), query, else
// "compile" and write. Returns 1 when it compiled.
extern "C" API int fake_compile(const char* code, const char* args, const char* sig, int enabled) {
  auto& db = nvfuser::KernelDb::get("nvfuser_kernel_db", "db.csv", true, !enabled, false);
  std::string s;
  std::vector<char> bin;
  if (db.enabled() && db.query(code, args, s, bin)) return 0;
  std::string c = std::string("\x7f" "ELF fake cubin ") + sig + " " + std::to_string(std::rand());
  bin.assign(c.begin(), c.end());
  if (db.enabled()) db.write(code, args, sig, bin);
  return 1;
}
extern "C" API const char* fake_db_path() {
  static std::string p;
  p = nvfuser::KernelDb::get("nvfuser_kernel_db", "db.csv", true, true, false).path();
  return p.c_str();
}
"""

_FAKE_MODULE = r'''
"""A fake nvfuser_direct: FusionDefinition.execute compiles through the C++ KernelDb stand-in."""
import ctypes, os
_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib",
                                "libnvfuser_codegen.so"), mode=ctypes.RTLD_GLOBAL)
_lib.fake_compile.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
_lib.fake_compile.restype = ctypes.c_int
_lib.fake_db_path.restype = ctypes.c_char_p
ARGS = "--std=c++17 --gpu-architecture=sm_90a -default-device --fmad=true -DNDEBUG"
COMPILES = 0


class FusionDefinition:
    def __init__(self, name):
        self.name = name

    def execute(self, inputs, *, device=None, _enable_options=[], _disable_options=[]):
        global COMPILES
        enabled = "kernel_db" in _enable_options or "kernel_db" in os.environ.get("NVFUSER_ENABLE", "")
        name = "nvfuser_pointwise_f0_c1_r0_g%d" % len(inputs)
        sig = "_ZN3nvf%d%sEv" % (len(name), name)
        code = "__global__ void %s() { /* %s %d */ }\n" % (name, self.name, len(inputs))
        COMPILES += _lib.fake_compile(code.encode(), ARGS.encode(), sig.encode(), int(enabled))
        return [sum(inputs)]


def db_path():
    return _lib.fake_db_path().decode()


def version():
    return "0.0.1+gitfake"
'''

_DRIVER = r"""
import json, os, sys, tempfile
fake, store, mode, nfus = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, fake)
before = tempfile.gettempdir()
env_before = os.environ.get("TMPDIR")
import kcache
from kcache.nvfuser import kerneldb
from kcache.nvfuser.kerneldb import hooks
hooks.PREFER = mode
assert kcache.enable(dir=store, triton=False)
import nvfuser_direct as nd
env_during = []
orig = nd._lib.fake_compile
outs = []
for i in range(nfus):
    outs.append(nd.FusionDefinition("f%d" % i).execute(list(range(i + 1))))
    env_during.append(os.environ.get("TMPDIR"))
st = kerneldb.status()["nvfuser_direct"]
print(json.dumps({
    "compiles": nd.COMPILES, "db_path": nd.db_path(), "outs": outs, "before": before,
    "after": tempfile.gettempdir(), "env_before": env_before, "env_after": os.environ.get("TMPDIR"),
    "env_during": env_during, "status": st,
}))
"""


@pytest.fixture(scope="module")
def fake_nvfuser(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the KernelDb stand-in")
    root = tmp_path_factory.mktemp("fake_nvfuser")
    (root / "lib").mkdir()
    (root / "fake.cpp").write_text(_FAKE_CPP)
    r = subprocess.run(
        [
            cxx,
            "-std=c++17",
            "-O0",  # its speed is no test's point: 0.8 s less of g++ than -O1 (<regex> is most of it)
            "-shared",
            "-fPIC",
            "-o",
            str(root / "lib" / "libnvfuser_codegen.so"),
            str(root / "fake.cpp"),
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot build the KernelDb stand-in: {r.stderr[-500:]}")
    (root / "nvfuser_direct").mkdir()
    (root / "nvfuser_direct" / "__init__.py").write_text(_FAKE_MODULE)
    return root


def _run_driver(fake: Path, store: Path, mode: str, env: dict[str, str], nfus: int = 3) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(fake), str(store), mode, str(nfus)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_stand_in_exports_nvfusers_symbol(fake_nvfuser: Path) -> None:
    lib = ctypes.CDLL(str(fake_nvfuser / "lib" / "libnvfuser_codegen.so"))
    assert hasattr(lib, kdb.direct.GET_SYMBOL)


@pytest.mark.parametrize("mode", ["direct", "tmpdir"])
def test_end_to_end_through_the_import_hook(
    mode: str, fake_nvfuser: Path, tmp_path: Path, store_dir: Path, clean_env: dict[str, str]
) -> None:
    user_tmp = tmp_path / "user-tmp"
    user_tmp.mkdir()
    env = dict(clean_env, PYTHONPATH=str(REPO), TMPDIR=str(user_tmp))

    cold = _run_driver(fake_nvfuser, store_dir, mode, env)
    assert cold["compiles"] == 3 and cold["outs"] == [[0], [1], [3]]
    st = cold["status"]
    assert st["mode"] == mode and st["seeded"] == 0 and st["new_rows"] == 3
    # nvFuser used the private folder, never the user's temporary directory
    assert cold["db_path"] == os.path.join(st["root"], kdb.DB_DIR)
    assert st["root"].startswith(str(user_tmp) + os.sep)
    assert not (user_tmp / "nvfuser_kernel_db").exists()
    # Python's temporary directory and the environment are what they were
    assert cold["before"] == cold["after"] == str(user_tmp)
    assert cold["env_before"] == cold["env_after"] == str(user_tmp)
    assert all(v == str(user_tmp) for v in cold["env_during"])
    if mode == "direct":
        assert st["kerneldb"]["initialized"] is True and st["kerneldb"]["entries"] == 3

    warm = _run_driver(fake_nvfuser, store_dir, mode, env)
    assert warm["compiles"] == 0 and warm["outs"] == cold["outs"]
    assert warm["status"]["seeded"] == 3 and warm["status"]["new_rows"] == 0
    assert warm["status"]["root"] != st["root"]
    if mode == "direct":
        assert warm["status"]["kerneldb"]["entries"] == 3

    more = _run_driver(fake_nvfuser, store_dir, mode, env, nfus=5)
    assert more["compiles"] == 2 and more["status"]["seeded"] == 3

    # private folders are gone; the store has each kernel once
    assert not any(p.name.startswith(kdb.ROOT_PREFIX) for p in user_tmp.iterdir())
    store = Store.open(store_dir, max_size=1 << 30)
    assert len(nvfuser_entries(store)) == 5
    store.close()


def test_end_to_end_concurrent_processes(
    fake_nvfuser: Path, tmp_path: Path, store_dir: Path, clean_env: dict[str, str]
) -> None:
    env = dict(clean_env, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _DRIVER, str(fake_nvfuser), str(store_dir), mode, "4"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        for mode in ("direct", "tmpdir", "direct", "tmpdir")
    ]
    roots = set()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and "Traceback" not in err, err
        res = json.loads(out.strip().splitlines()[-1])
        assert res["outs"] == [[0], [1], [3], [6]]
        roots.add(res["status"]["root"])
    assert len(roots) == 4  # never one folder for two processes
    store = Store.open(store_dir, max_size=1 << 30)
    entries = nvfuser_entries(store)
    assert len(entries) == 4
    for ident in entries.values():
        assert store.read_any(ident, full=True)[0] is not None
    store.close()
    warm = _run_driver(fake_nvfuser, store_dir, "direct", env, nfus=4)
    assert warm["compiles"] == 0


def test_flush_stores_before_exit(fake_nvfuser: Path, tmp_path: Path, store_dir: Path, clean_env) -> None:
    code = textwrap.dedent(
        f"""
        import os, sys, json
        sys.path.insert(0, {str(fake_nvfuser)!r})
        import kcache, kcache.nvfuser
        assert kcache.enable(dir={str(store_dir)!r}, triton=False)
        import nvfuser_direct as nd
        nd.FusionDefinition("a").execute([1, 2])
        n1 = kcache.nvfuser.flush()
        n2 = kcache.nvfuser.flush()
        nd.FusionDefinition("b").execute([1, 2, 3])
        n3 = kcache.nvfuser.flush()
        print(json.dumps([n1, n2, n3]))
        os._exit(0)  # no atexit: only what flush() stored survives
        """
    )
    env = dict(clean_env, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [1, 0, 1]
    store = Store.open(store_dir, max_size=1 << 30)
    assert len(nvfuser_entries(store)) == 2
    store.close()
    # the folder left behind by os._exit is adopted (and removed) by the next process
    assert any(p.name.startswith(kdb.ROOT_PREFIX) for p in tmp_path.iterdir())
    warm = _run_driver(fake_nvfuser, store_dir, "direct", env, nfus=1)
    assert warm["status"]["seeded"] == 2
    assert not any(p.name.startswith(kdb.ROOT_PREFIX) for p in tmp_path.iterdir())


def test_import_alone_creates_nothing(fake_nvfuser: Path, tmp_path: Path, store_dir: Path, clean_env) -> None:
    """Nothing happens at import beyond wrapping execute (no fingerprint, so no CUDA driver
    initialisation, no folder); the session starts at the first execute."""
    code = textwrap.dedent(
        f"""
        import sys, json
        sys.path.insert(0, {str(fake_nvfuser)!r})
        import kcache
        from kcache.nvfuser import kerneldb
        assert kcache.enable(dir={str(store_dir)!r}, triton=False)
        import nvfuser_direct as nd
        before = kerneldb.status()
        nd.FusionDefinition("a").execute([1])
        print(json.dumps([before, sorted(kerneldb.status())]))
        """
    )
    env = dict(clean_env, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{}, ["nvfuser_direct"]]


def test_without_kcache_nothing_changes(fake_nvfuser: Path, tmp_path: Path, clean_env) -> None:
    code = textwrap.dedent(
        f"""
        import sys, json
        sys.path.insert(0, {str(fake_nvfuser)!r})
        import kcache.nvfuser.kerneldb  # imported, never enabled
        import nvfuser_direct as nd
        nd.FusionDefinition("a").execute([1])
        wrapped = hasattr(nd.FusionDefinition.execute, "__wrapped__")  # kcache's wrapper is named execute too
        print(json.dumps([nd.COMPILES, wrapped, kcache.nvfuser.kerneldb.status()]))
        """
    )
    env = dict(clean_env, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [1, False, {}]


# -- the ctypes std::string and the singleton's layout --------------------------------------------


def test_direct_state_reads_the_singleton_layout() -> None:
    buf = (ctypes.c_uint8 * 64)()
    buf[0], buf[1] = 0, 1
    ctypes.c_size_t.from_address(ctypes.addressof(buf) + 32).value = 7
    d = kdb.DirectKernelDb.__new__(kdb.DirectKernelDb)
    d.address = ctypes.addressof(buf)
    assert d.state() == {"disabled": False, "initialized": True, "entries": 7}


def test_std_string_layout() -> None:
    s, keep = kdb.direct.std_string(b"/tmp/some/long/path/nvfuser_kernel_db")
    assert s.size == 37 and ctypes.string_at(s.ptr, s.size) == b"/tmp/some/long/path/nvfuser_kernel_db"
    assert ctypes.sizeof(kdb.direct.StdString) == 32
    del keep


# -- tempfile stays put ---------------------------------------------------------------------------


def test_tmpdir_scope_leaves_python_tempdir_alone(tmp_path: Path, store: Store, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    s = kdb.Session.create(store, make_fp())
    try:
        assert tempfile.gettempdir() == str(tmp_path)
        s.point(None)  # no nvFuser library: the TMPDIR way
        assert s.mode == "tmpdir" and s.slow
        assert s.before_call()
        assert os.environ["TMPDIR"] == s.root and tempfile.gettempdir() == str(tmp_path)
        assert s.before_call()  # nested (another thread): restored only when the last one ends
        s.after_call()
        assert os.environ["TMPDIR"] == s.root
        s.after_call()
        assert os.environ["TMPDIR"] == str(tmp_path) and tempfile.gettempdir() == str(tmp_path)
        assert s.tmpdir_pending  # nvFuser never read the folder
        NvKernelDb(Path(s.db_dir))  # nvFuser opens it (reads db.csv)
        assert s.before_call()
        s.after_call()
        if os.stat(os.path.join(s.db_dir, kdb.DB_FILE)).st_atime_ns == 0:
            pytest.skip("this filesystem does not update access times")
        assert not s.tmpdir_pending and not s.slow and not s.before_call()
    finally:
        s.close()
    assert not os.path.exists(s.root)


# -- legacy frontend ------------------------------------------------------------------------------


class _FakeLegacyCache:
    blob: bytes | None = None
    inst: _FakeLegacyCache | None = None

    def __init__(self) -> None:
        self.fusions: list[str] = []

    @classmethod
    def get(cls, max_fusions=16384, selected_device=None, load_from_default_workspace=True):
        assert load_from_default_workspace is False
        if cls.inst is None:
            cls.inst = cls()
        return cls.inst

    @classmethod
    def reset(cls) -> None:
        cls.inst = None

    def num_fusions(self) -> int:
        return len(self.fusions)

    def serialize(self, path: str) -> None:
        Path(path).write_text("\n".join(self.fusions))

    def deserialize(self, path: str) -> None:
        assert not self.fusions
        self.fusions = Path(path).read_text().split("\n")


def test_legacy_fusion_cache_roundtrip(tmp_path: Path, store: Store) -> None:
    from types import ModuleType

    from kcache.nvfuser.legacy import KIND, LegacyFusionCache

    mod = ModuleType("nvfuser")
    mod.FusionCache = _FakeLegacyCache
    s = kdb.Session(store, make_fp(), str(tmp_path))
    _FakeLegacyCache.reset()
    lc = LegacyFusionCache.install(mod, s)
    assert lc is not None and _FakeLegacyCache.inst.fusions == []
    assert lc.save() is False  # empty: nothing to keep
    _FakeLegacyCache.inst.fusions = ["fusion a", "fusion b"]
    assert lc.save() is True and lc.save() is False  # unchanged: not written again
    assert store.get(KIND, lc.key, count=False) is not None

    _FakeLegacyCache.reset()  # a new process
    lc2 = LegacyFusionCache.install(mod, s)
    assert _FakeLegacyCache.inst.fusions == ["fusion a", "fusion b"]
    _FakeLegacyCache.inst.fusions.append("fusion c")
    assert lc2.save() is True
    _FakeLegacyCache.reset()
    LegacyFusionCache.install(mod, s)
    assert _FakeLegacyCache.inst.fusions == ["fusion a", "fusion b", "fusion c"]

    other = kdb.Session(store, make_fp(arch="sm_100a"), str(tmp_path))
    _FakeLegacyCache.reset()
    LegacyFusionCache.install(mod, other)
    assert _FakeLegacyCache.inst.fusions == []  # another fingerprint: not loaded
