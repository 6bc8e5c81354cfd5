"""kcache's Triton cache manager in this process: what ``put`` writes (as FileCacheManager does),
override and dump managers, read-only and absent stores, and the per-kernel lock."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

# Triton is a dependency of kcache on Linux (pyproject.toml) and CI installs it (.ci/run): these
# tests skip only where Triton does not exist (other platforms), never in CI.
pytest.importorskip("triton")

from kernels.harness import MIN_META, PYTHON, clean_env  # noqa: E402
from triton.runtime.cache import FileCacheManager  # noqa: E402

import kcache  # noqa: E402
from kcache.store import cache as cache_mod  # noqa: E402
from kcache.triton import manager as mgr_mod  # noqa: E402
from kcache.triton.manager import KcacheCacheManager, kind_of  # noqa: E402

KEY = "A" * 52
KEY2 = "B" * 52
# An autotune result as Triton writes it (one config and its timing).
TUNED = json.dumps(
    {
        "key": [1],
        "configs_timings": [
            [
                {
                    "kwargs": {"BLOCK": 64},
                    "num_warps": 4,
                    "num_ctas": 1,
                    "num_stages": 3,
                    "maxnreg": None,
                    "pre_hook": None,
                    "ir_override": None,
                },
                0.01,
            ]
        ],
    }
)
# The least metadata Triton's loader and launcher take (kcache serves no group without it).
META = json.dumps(MIN_META)


class Textish:
    """Stands in for an MLIR module: Triton stores ``str(module)``."""

    def __str__(self) -> str:
        return "module {\n  tt.func @k() { tt.return }\n}\n"


@pytest.fixture(autouse=True)
def _no_gpu_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    # Asking Triton's driver for the device imports torch on a machine without a GPU (seconds).
    monkeypatch.setattr(mgr_mod, "_gpu_model", lambda: "Test GPU")


@pytest.fixture
def kstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """kcache enabled in this process on a fresh store (Triton not patched), disabled afterwards."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    for k in list(os.environ):
        if k.startswith("KCACHE") and k != "KCACHE_STRICT":
            monkeypatch.delenv(k)
    assert kcache.enable(dir=tmp_path / "store", triton=False, nvfuser=False)
    yield kcache.active_store()
    kcache.disable()


@pytest.mark.parametrize("filename", ["k.ttir", "k.json", "k.cubin", "k.autotune.json", "k.cpython-311.so"])
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize(
    "data", [b"\x00\x01bytes\xff", "text \u00e9", Textish()], ids=["bytes", "str", "obj"]
)
def test_put_writes_what_file_cache_manager_writes(
    kstore: Any, filename: str, binary: bool, data: Any
) -> None:
    ours = KcacheCacheManager(KEY).put(data, filename, binary=binary)
    theirs = FileCacheManager(KEY).put(data, filename, binary=binary)
    assert os.path.basename(ours) == filename  # Triton reads the artifact's type from the suffix
    assert os.path.isfile(ours) and not os.path.islink(ours)
    assert Path(ours).read_bytes() == Path(theirs).read_bytes()
    assert not ours.startswith(str(Path(theirs).parent))


def test_aux_and_autotune_files_are_entries_of_their_kind(kstore: Any) -> None:
    m = KcacheCacheManager(KEY)
    assert m.get_file("launcher.cpython-311-x86_64-linux-gnu.so") is None
    m.put(b"\x7fELF...", "launcher.cpython-311-x86_64-linux-gnu.so")
    m.put(TUNED, "k.autotune.json", binary=False)
    again = KcacheCacheManager(KEY)
    so = again.get_file("launcher.cpython-311-x86_64-linux-gnu.so")
    tuned = again.get_file("k.autotune.json")
    assert so and Path(so).read_bytes() == b"\x7fELF..."
    assert tuned and Path(tuned).read_text().startswith('{"key"')
    assert KcacheCacheManager(KEY2).get_file("k.autotune.json") is None
    kinds = kstore.counts.process_totals()
    assert kinds["triton-aux"]["puts"] == 1 and kinds["triton-autotune"]["puts"] == 1


def test_autotune_entries_are_keyed_by_the_gpu_model(kstore: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mgr_mod, "_gpu_model", lambda: "NVIDIA H100 80GB HBM3")
    KcacheCacheManager(KEY).put(TUNED, "k.autotune.json", binary=False)
    assert KcacheCacheManager(KEY).get_file("k.autotune.json")
    monkeypatch.setattr(mgr_mod, "_gpu_model", lambda: "NVIDIA H200")
    assert KcacheCacheManager(KEY).get_file("k.autotune.json") is None  # H100 timings never to an H200
    # compiled kernels stay keyed by the target only: a group made on one sm_90 GPU serves another
    m = KcacheCacheManager(KEY)
    assert m.get_group("k.json") is None
    p = m.put(META, "k.json", binary=False)
    m.put_group("k.json", {"k.json": p, "k.cubin": m.put(b"cubin", "k.cubin")})
    monkeypatch.setattr(mgr_mod, "_gpu_model", lambda: "NVIDIA H100 80GB HBM3")
    assert KcacheCacheManager(KEY).get_group("k.json") is not None


def test_group_roundtrip_and_members_are_real_files(kstore: Any) -> None:
    m = KcacheCacheManager(KEY)
    assert m.get_group("k.json") is None
    contents = {n: f"data of {n}" for n in ("k.source", "k.ttir", "k.cubin")}
    contents["k.json"] = META
    group = {n: m.put(text, n, binary=n != "k.json") for n, text in contents.items()}
    assert m.get_file("k.ttir") == group["k.ttir"]  # staged files are visible to their manager
    m.put_group("k.json", group)
    got = KcacheCacheManager(KEY).get_group("k.json")
    assert got is not None and set(got) == set(contents)
    for name, path in got.items():
        # Against what was put, not against the staged file: the store links that very file into
        # the entry, so reading it back would compare the served bytes with themselves.
        assert os.path.basename(path) == name and Path(path).read_text() == contents[name]
    assert KcacheCacheManager(KEY2).get_group("k.json") is None


def test_override_and_dump_managers_are_tritons(kstore: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    # dump: Triton writes each stage's IR there
    ours, theirs = KcacheCacheManager(KEY, dump=True), FileCacheManager(KEY, dump=True)
    assert isinstance(ours._file, FileCacheManager)
    p = ours.put("ir text", "k.ttir")
    assert p == theirs._make_path("k.ttir") == str(tmp_path / "dump" / KEY / "k.ttir")
    assert Path(p).read_text() == "ir text"
    assert ours.get_file("k.ttir") == theirs.get_file("k.ttir") == p
    ours.put_group("k.json", {"k.ttir": p})
    assert ours.get_group("k.json") == theirs.get_group("k.json") == {"k.ttir": p}
    # override: Triton only reads from it (the user's replacement IR files)
    ours, theirs = KcacheCacheManager(KEY, override=True), FileCacheManager(KEY, override=True)
    assert isinstance(ours._file, FileCacheManager)
    assert ours.get_file("k.ptx") is None
    (tmp_path / "override" / KEY).mkdir(parents=True)
    (tmp_path / "override" / KEY / "k.ptx").write_text("// my ptx")
    assert ours.get_file("k.ptx") == theirs.get_file("k.ptx") == str(tmp_path / "override" / KEY / "k.ptx")
    with pytest.raises(AssertionError):  # as Triton's own override manager: it has nowhere to write
        ours.put("x", "k.ttir")
    assert kstore.counts.process_totals() == {}  # nothing went to the store


def test_read_only_store_returns_real_files_outside_it(tmp_path: Path, monkeypatch: Any) -> None:
    for k in list(os.environ):
        if k.startswith("KCACHE") and k != "KCACHE_STRICT":
            monkeypatch.delenv(k)
    store_dir = tmp_path / "store"
    assert kcache.enable(dir=store_dir, triton=False, nvfuser=False)
    kcache.disable()
    assert kcache.enable(dir=store_dir, readonly=True, triton=False, nvfuser=False)
    try:
        m = KcacheCacheManager(KEY)
        assert m.get_group("k.json") is None and not (m._flight and m._flight.held)  # no lock: read-only
        group = {"k.cubin": m.put(b"\x01\x02", "k.cubin"), "k.json": m.put("{}", "k.json", binary=False)}
        so = m.put(b"ELF", "x.cpython-311.so")
        for p in [*group.values(), so]:
            assert os.path.isfile(p) and not p.startswith(str(store_dir))
        assert Path(group["k.cubin"]).read_bytes() == b"\x01\x02"
        m.put_group("k.json", group)  # nothing stored, no error
        assert KcacheCacheManager(KEY).get_group("k.json") is None
    finally:
        kcache.disable()


def test_kind_of() -> None:
    assert kind_of("add_kernel.json") is None and kind_of("add_kernel.cubin") is None
    assert kind_of("matmul.autotune.json") == "triton-autotune"
    assert kind_of("__triton_launcher.cpython-312-x86_64-linux-gnu.so") == "triton-aux"
    assert kind_of("cuda_utils.so") == "triton-aux"


# ----------------------------------------------------------------------------------- locks
def _record_waits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Every wait for a kernel's lock: (thread id, whether it ended holding the lock). Waiting on a
    lock this process holds would end without it after LOCK_TIMEOUT_S, shortened here so that such
    a regression fails in seconds: the outcome is checked, not the time (machines are shared)."""
    monkeypatch.setattr(cache_mod, "LOCK_TIMEOUT_S", 2.0)
    waits: list[tuple[int, bool]] = []
    real = cache_mod.TieredCache._wait_for

    def wait(self: Any, kind: str, key: str, files: bool) -> tuple[Any, Any]:
        got = real(self, kind, key, files)
        waits.append((threading.get_ident(), got[0] is not None))
        return got

    monkeypatch.setattr(cache_mod.TieredCache, "_wait_for", wait)
    return waits


def test_a_failed_compile_does_not_make_this_process_wait_on_itself(
    kstore: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = _record_waits(monkeypatch)
    me = threading.get_ident()
    failed = KcacheCacheManager(KEY)  # missed, took the lock, then its compile raised: still alive
    assert failed.get_group("k.json") is None and failed._flight.held
    again = KcacheCacheManager(KEY)
    assert again.get_group("k.json") is None
    assert not failed._flight.held  # this thread's next lookup let the stale lock go
    assert again._flight.held, "the next compile of the kernel did not get its lock"
    assert waits == [(me, True), (me, True)]  # each got the lock at once, none waited it out
    # another thread, while a compile of the same kernel is under way here, does not wait either
    busy = KcacheCacheManager(KEY2)
    assert busy.get_group("k.json") is None and busy._flight.held
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(KcacheCacheManager(KEY2).get_group("k.json")))
    t.start()
    t.join(120)  # a hang guard only
    assert not t.is_alive() and out == [None]
    assert [w for w in waits if w[0] != me] == [], "the other thread waited for this thread's lock"
    assert busy._flight.held  # still held by its own thread
    busy.put_group("k.json", {"k.json": busy.put("{}", "k.json", binary=False)})
    assert busy._flight is None and not kstore._flights


def test_compile_errors_twice_in_one_process_fail_fast(tmp_path: Path) -> None:
    # Each compile waits for the kernel's lock once and gets it at once: the failed compile before
    # it (kept alive by the traceback) holds the lock no longer. Waiting on itself would end after
    # LOCK_TIMEOUT_S (5 s here) without the lock; the outcome is checked, not the time.
    code = """
import json, triton
import kcache.triton.manager as mm
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.broken import broken_kernel
import kcache.store.cache as sc
sc.LOCK_TIMEOUT_S = 5.0
waits = []
real = sc.TieredCache._wait_for
def wait(self, kind, key, files):
    got = real(self, kind, key, files)
    waits.append(got[0] is not None)
    return got
sc.TieredCache._wait_for = wait
for i in range(3):
    try:
        triton.compile(ASTSource(broken_kernel, {"x_ptr": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 64}),
                       target=GPUTarget("cuda", 90, 32))
    except Exception as e:
        err = e  # keep the traceback (and the failed manager) alive, as a notebook would
        print("raised", type(e).__name__, json.dumps(waits))
        waits.clear()
"""
    env = clean_env(tmp_path, kcache_dir=tmp_path / "store")
    out = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=100)
    lines = [ln.split(maxsplit=2) for ln in out.stdout.splitlines() if ln.startswith("raised")]
    assert len(lines) == 3, out.stderr[-3000:]
    assert [(ln[1], json.loads(ln[2])) for ln in lines] == [("CompilationError", [True])] * 3, lines


def test_a_compile_folder_is_removed_through_the_scratch_folder_that_holds_it(
    kstore: Any, tmp_path: Path
) -> None:
    """Review m10: a compile's folder (in this process's scratch folder in the store's tmp/) goes
    once no path into it lives. It was removed by ``shutil.rmtree`` of its ``/proc/self/fd/N/..``
    path in the collector's callback: where the scratch folder had been removed by hand and
    replaced, N named another folder by then, and a folder of the same name there went instead.
    It is now removed through the scratch folder's own object, only while that is still this
    process's folder."""
    import gc
    import shutil

    m = KcacheCacheManager(KEY)
    p = m.put(b"cubin", "k.cubin")
    stage_path = os.path.dirname(p)
    stage, scratch = os.path.basename(stage_path), os.path.dirname(stage_path)
    assert scratch.startswith("/proc/self/fd/"), "a path through the scratch folder's descriptor"
    n = int(os.path.basename(scratch))
    shutil.rmtree(os.readlink(scratch))  # removed by hand
    other = KcacheCacheManager(KEY2)
    q = other.put(b"x", "other.cubin")  # kcache notices, lets go of it, makes another
    # Number N names another folder now: kcache's new scratch folder, else one of the program's.
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    if not os.path.dirname(os.path.dirname(q)) == scratch:
        with pytest.raises(OSError):
            os.readlink(scratch)  # free: the program's next folder takes it
        fd = os.open(victim_dir, os.O_RDONLY | os.O_DIRECTORY)
        os.dup2(fd, n)
        os.close(fd)
    os.mkdir(os.path.join(scratch, stage))
    victim = os.path.realpath(os.path.join(scratch, stage, "keep"))
    Path(victim).write_bytes(b"not kcache's")
    del m, p
    gc.collect()
    kstore.disk._flush_turn()
    assert os.path.exists(victim), "a folder that was not kcache's was removed"
    # the compile folders of the scratch folder in use still go with their paths
    mine = os.path.realpath(os.path.dirname(q))
    assert os.path.isdir(mine)
    del other, q
    gc.collect()
    kstore.disk._flush_turn()
    assert not os.path.exists(mine)


def test_a_compile_folder_outside_the_store_is_not_removed_in_the_collector_s_callback(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Review m10: with a read-only store, compile files go to a private temporary folder; a
    compile's folder there is queued when its last path goes, and removed when the next one is
    made (never by the collector's callback, wherever it runs)."""
    import gc

    for k in list(os.environ):
        if k.startswith("KCACHE") and k != "KCACHE_STRICT":
            monkeypatch.delenv(k)
    store_dir = tmp_path / "store"
    assert kcache.enable(dir=store_dir, triton=False, nvfuser=False)
    kcache.disable()
    assert kcache.enable(dir=store_dir, readonly=True, triton=False, nvfuser=False)
    try:
        m = KcacheCacheManager(KEY)
        folder = os.path.dirname(m.put(b"cubin", "k.cubin"))
        assert not folder.startswith(str(store_dir)) and os.path.isdir(folder)
        del m
        gc.collect()
        assert os.path.isdir(folder), "removed in the collector's callback"
        KcacheCacheManager(KEY2).put(b"x", "other.cubin")  # the next compile folder
        assert not os.path.exists(folder)
    finally:
        kcache.disable()
