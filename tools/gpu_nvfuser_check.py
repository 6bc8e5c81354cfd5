"""nvFuser kernels through kcache on the GPU machine: cold vs warm first execute, NVRTC counted.

    python3 tools/gpu_nvfuser_check.py [--workdir DIR] [--timeout 150] [--budget 290]

Run from the repository root with ``.gpukit/`` carried (``nvfuser-boxkit.tgz`` and
``wheels/diskcache-*.whl``). The script sets itself up (unpacks the boxkit to /tmp/boxkit, puts
diskcache in /tmp/site when it is missing) and runs fresh processes, one after the other:

1. ``cold``: no kcache, no KernelDb. First-execute time of each fusion at two shapes.
2. ``populate``: kcache on an empty store, with ``NVFUSER_TRACE`` (the NVRTC counter's control).
3. ``warm``: kcache on the store ``populate`` filled: first-execute times (the figures).
4. ``pair``: two kcache processes at once on that store, with a third shape (new kernels that
   both compile and both store at exit).
5. store check: every entry verified, each kernel stored once, the manifest complete.
6. ``warm-traced``: kcache, all three shapes, with ``NVFUSER_TRACE``: it must compile nothing.

Fusions: pointwise plus reduction, bf16 softmax, layer norm, and one taking a permuted-stride
input (its descriptor from ``kcache.nvfuser.descriptors.compute_tensor_descriptor``), each checked
against torch. Plain ``nvfuser_direct.FusionDefinition``s: the point is the kernels that persist. A small
untimed warm-up fusion runs first in every process: it absorbs nvFuser's one-time start (and, with
kcache, kcache's start: fingerprint, seeding, pointing nvFuser at the folder, reported as
``start_ms``), so that each timed first execute is that fusion's own cost.

How NVRTC compiles are counted (the warm processes must show 0):
- ``nvrtc_compiles``: ``executor_utils::Nvrtc::CompileProgram`` begin events in nvFuser's own
  trace (``NVFUSER_TRACE=file``). nvFuser opens that scope around every ``nvrtcCompileProgram``
  call and nowhere else (``compiled_kernel.cpp``); ``kernel_loads`` counts
  ``executor_utils::NVRTC`` scopes, entered for every kernel nvFuser loads, from KernelDb or not.
  Traced processes are not timed for the figures (the trace writes every scope to a file).
- ``new_rows``: rows nvFuser appended to the process's private KernelDb folder, i.e. kernels it
  compiled and wrote there (every process, traced or not). A compile whose source is in the
  KernelDb under other NVRTC arguments writes no row: the trace counter is the one to trust.
- ``kerneldb_entries``: the size of nvFuser's in-memory KernelDb (``direct`` mode only), equal to
  ``seeded`` when nothing was added.

Prints a compact table; writes JSON to ``$OUT/gpu_nvfuser.json`` when ``OUT`` is set. Failures are
reported, not raised; on a machine without a GPU or nvFuser it says so and exits 0.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BOXKIT = Path("/tmp/boxkit")
TREE = BOXKIT / "tree"
SITE = Path("/tmp/site")
DEVICE = "cuda"
MARK = "KCACHE_CHECK_RESULT "
TARGET = 0.45

SHAPES = {"A": [1024, 4096], "B": [2048, 1536], "C": [512, 8192]}
FUSIONS = ["pointwise_reduction", "softmax_bf16", "layer_norm", "permuted_input"]

CHILD = r"""
import json, os, sys, time, tempfile, traceback
cfg = json.loads(sys.argv[1])
out = {"tag": cfg["tag"], "ok": False, "errors": [], "runs": {}}


def emit():
    sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")
    sys.stdout.flush()


try:
    t0 = time.perf_counter()
    sys.path.insert(0, cfg["boxkit"])
    import nvf_boot
    nvf_boot.setup(cfg["tree"])
    import torch
    dev = cfg["device"]
    if dev == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible to torch " + torch.__version__)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    out["tempdir_before"] = tempfile.gettempdir()
    out["env_tmpdir_before"] = os.environ.get("TMPDIR")
    if cfg["kcache"]:
        import kcache
        out["kcache_enabled"] = kcache.enable(dir=cfg["store"], triton=False)
    import nvfuser_direct
    from nvfuser_direct import DataType, FusionDefinition
    from kcache.nvfuser.descriptors import compute_tensor_descriptor
    out["import_s"] = round(time.perf_counter() - t0, 3)
    out["nvfuser"] = str(nvfuser_direct.version())
    out["torch"] = torch.__version__
    out["gpu"] = torch.cuda.get_device_name(0) if dev == "cuda" else dev
    torch.ones(8, device=dev).sum().item()  # CUDA context, not charged to a fusion

    def build(name, sample):
        with FusionDefinition() as fd:
            if name == "warmup":
                a = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
                fd.add_output(fd.ops.neg(a))
            elif name == "pointwise_reduction":
                a = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
                b = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
                c = fd.ops.relu(fd.ops.add(a, b))
                fd.add_output(c)
                fd.add_output(fd.ops.sum(c, dims=[1]))
            elif name == "softmax_bf16":
                x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16)
                xf = fd.ops.cast(x, dtype=DataType.Float)
                m = fd.ops.max(xf, dims=[1], keepdim=True)
                e = fd.ops.exp(fd.ops.sub(xf, m))
                s = fd.ops.sum(e, dims=[1], keepdim=True)
                fd.add_output(fd.ops.cast(fd.ops.div(e, s), dtype=DataType.BFloat16))
            elif name == "layer_norm":
                x = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
                w = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
                b = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
                var, mean = fd.ops.var_mean(x, dims=[1], correction=0, keepdim=True)
                eps = fd.define_scalar(1e-5, dtype=DataType.Double)
                y = fd.ops.mul(fd.ops.sub(x, mean), fd.ops.rsqrt(fd.ops.add(var, eps)))
                y = fd.ops.mul(y, fd.ops.broadcast_in_dim(w, x.shape(), [1]))
                y = fd.ops.add(y, fd.ops.broadcast_in_dim(b, x.shape(), [1]))
                fd.add_output(y)
            elif name == "permuted_input":
                xt = sample[0]
                contig, order = compute_tensor_descriptor(tuple(xt.shape), tuple(xt.stride()))
                x = fd.define_tensor(shape=[-1, -1], contiguity=list(contig), dtype=DataType.Float,
                                     stride_order=list(order))
                y = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
                t = fd.ops.mul(fd.ops.add(x, y), x)
                fd.add_output(t)
                fd.add_output(fd.ops.sum(t, dims=[0]))
        return fd

    def inputs(name, shape):
        g = torch.Generator(device=dev).manual_seed(hash((name, tuple(shape))) % (1 << 31))
        r, c = shape
        if name == "warmup":
            return [torch.randn(64, device=dev, generator=g)]
        if name == "pointwise_reduction":
            return [torch.randn(r, c, device=dev, generator=g), torch.randn(r, c, device=dev, generator=g)]
        if name == "softmax_bf16":
            return [torch.randn(r, c, device=dev, generator=g).bfloat16()]
        if name == "layer_norm":
            return [torch.randn(r, c, device=dev, generator=g), torch.randn(c, device=dev, generator=g),
                    torch.randn(c, device=dev, generator=g)]
        if name == "permuted_input":  # x is a transposed view: strides (1, r)
            return [torch.randn(c, r, device=dev, generator=g).t(), torch.randn(r, c, device=dev, generator=g)]

    def reference(name, ins):
        if name == "warmup":
            return [-ins[0]], 0, 0
        if name == "pointwise_reduction":
            c = torch.relu(ins[0] + ins[1])
            return [c, c.sum(1)], 1e-4, 1e-2
        if name == "softmax_bf16":
            return [torch.softmax(ins[0].float(), dim=1).bfloat16()], 1.6e-2, 1e-2
        if name == "layer_norm":
            x, w, b = ins
            return [torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, eps=1e-5)], 1e-3, 1e-3
        if name == "permuted_input":
            t = (ins[0] + ins[1]) * ins[0]
            return [t, t.sum(0)], 1e-4, 1e-1

    ok = True
    for name in ["warmup"] + cfg["fusions"]:
        fd = None
        for sk in (["A"] if name == "warmup" else cfg["shapes"]):
            shape = cfg["shape_sizes"][sk]
            rec = {}
            try:
                ins = inputs(name, shape)
                if fd is None:
                    tb = time.perf_counter()
                    fd = build(name, ins)
                    rec["define_ms"] = round((time.perf_counter() - tb) * 1e3, 3)
                sync()
                t1 = time.perf_counter()
                res = fd.execute(ins)
                sync()
                rec["first_ms"] = round((time.perf_counter() - t1) * 1e3, 3)
                t2 = time.perf_counter()
                fd.execute(ins)
                sync()
                rec["second_ms"] = round((time.perf_counter() - t2) * 1e3, 3)
                refs, rtol, atol = reference(name, ins)
                assert len(res) == len(refs), f"{len(res)} outputs, expected {len(refs)}"
                for o, ref in zip(res, refs):
                    torch.testing.assert_close(o, ref, rtol=rtol, atol=atol)
                rec["correct"] = True
            except Exception as e:
                rec["correct"] = False
                rec["error"] = (type(e).__name__ + ": " + str(e))[:600]
                ok = False
            out["runs"][name + "/" + sk] = rec
    if cfg["kcache"]:
        from kcache.nvfuser import kerneldb
        st = kerneldb.status().get("nvfuser_direct")
        out["kerneldb"] = st
        if st is None:
            ok = False
            out["errors"].append("kcache did not attach to nvfuser_direct")
    out["tempdir_after"] = tempfile.gettempdir()
    out["env_tmpdir_after"] = os.environ.get("TMPDIR")
    out["ok"] = ok
except Exception:
    out["errors"].append(traceback.format_exc()[-3000:])
emit()
""".replace("MARK + ", repr(MARK) + " + ")


def _log(msg: str) -> None:
    print(f"[gpu_nvfuser_check] {msg}", flush=True)


# -------------------------------------------------------------------------------------- set-up
def _find(*cands: Path | str) -> Path | None:
    for c in cands:
        for p in sorted(glob.glob(str(c))):
            if os.path.exists(p):
                return Path(p)
    return None


def setup() -> dict[str, Any]:
    """Unpack the boxkit and make diskcache importable; returns what was done (never raises)."""
    info: dict[str, Any] = {}
    try:
        if not (TREE / "nvfuser_direct" / "__init__.py").exists():
            tgz = _find(
                REPO / ".gpukit" / "nvfuser-boxkit.tgz", REPO.parent / "shared" / "gpu" / "nvfuser-boxkit.tgz"
            )
            if tgz is None:
                info["boxkit"] = "missing (.gpukit/nvfuser-boxkit.tgz not carried)"
            else:
                t = time.perf_counter()
                subprocess.run(["tar", "xzf", str(tgz), "-C", "/tmp"], check=True, timeout=300)
                TREE.mkdir(parents=True, exist_ok=True)
                subprocess.run(
                    ["tar", "xJf", str(BOXKIT / "nvfuser_cu130_torch210_slim.tar.xz"), "-C", str(TREE)],
                    check=True,
                    timeout=300,
                )
                info["boxkit"] = f"unpacked from {tgz} in {time.perf_counter() - t:.1f}s"
        else:
            info["boxkit"] = "already unpacked"
    except Exception as e:
        info["boxkit"] = f"failed: {e}"
    try:
        import diskcache  # noqa: F401

        info["diskcache"] = "present"
    except ImportError:
        whl = _find(
            REPO / ".gpukit" / "wheels" / "diskcache-*.whl",
            REPO.parent / "shared" / "gpu" / "wheels" / "diskcache-*.whl",
        )
        if whl is None:
            info["diskcache"] = "missing (no wheel)"
        else:
            r = subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                 "--disable-pip-version-check", "--target", str(SITE), str(whl)],
                capture_output=True,
                text=True,
                timeout=120,
            )  # fmt: skip
            info["diskcache"] = (
                "installed to /tmp/site" if r.returncode == 0 else f"failed: {r.stderr[-300:]}"
            )
    if str(SITE) not in sys.path and SITE.exists():
        sys.path.insert(0, str(SITE))
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return info


# -------------------------------------------------------------------------------------- children
def child_env(tmpdir: Path, trace: Path | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KCACHE", "NVFUSER_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PYTHONPATH")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(SITE)) if p)
    env["TMPDIR"] = str(tmpdir)
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    if trace is not None:
        env["NVFUSER_TRACE"] = str(trace)
    return env


def start_child(
    tag: str, work: Path, *, kcache: bool, shapes: list[str], trace: bool = False
) -> dict[str, Any]:
    tmpdir = work / f"tmp-{tag}"
    tmpdir.mkdir(parents=True, exist_ok=True)
    tpath = work / f"trace-{tag}.json" if trace else None
    cfg = {
        "tag": tag,
        "kcache": kcache,
        "store": str(work / "store"),
        "shapes": shapes,
        "shape_sizes": SHAPES,
        "fusions": FUSIONS,
        "boxkit": str(BOXKIT),
        "tree": str(BOXKIT / "tree"),
        "device": DEVICE,
    }
    t = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(tmpdir, tpath),
        cwd=str(work),
    )
    return {"tag": tag, "proc": p, "t0": t, "tmpdir": tmpdir, "trace": tpath}


def finish_child(h: dict[str, Any], timeout: float) -> dict[str, Any]:
    p = h["proc"]
    try:
        out, err = p.communicate(timeout=max(timeout, 1.0))
        timed_out = False
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        timed_out = True
    res: dict[str, Any] = {"tag": h["tag"], "ok": False, "errors": []}
    for line in out.splitlines():
        if line.startswith(MARK):
            try:
                res = json.loads(line[len(MARK) :])
            except ValueError as e:
                res["errors"].append(f"bad result line: {e}")
    res["rc"] = p.returncode
    res["wall_s"] = round(time.perf_counter() - h["t0"], 2)
    if timed_out:
        res["ok"] = False
        res["errors"].append(f"timed out after {timeout:.0f}s")
    if p.returncode != 0:
        res["ok"] = False
        res["errors"].append(f"exit status {p.returncode}")
    tail = [ln for ln in err.splitlines() if ln.strip()][-12:]
    res["stderr_tail"] = tail
    if any("kcache: WARNING" in ln or "Traceback" in ln for ln in err.splitlines()):
        res.setdefault(
            "warnings", [ln for ln in err.splitlines() if "kcache:" in ln or "Traceback" in ln][:10]
        )
    if h["trace"] is not None:
        res["trace"] = count_trace(h["trace"])
    names = sorted(x.name for x in h["tmpdir"].iterdir()) if h["tmpdir"].exists() else []
    # what kcache or nvFuser's KernelDb would leave in the process's TMPDIR: nothing
    res["tmpdir_leftovers"] = [n for n in names if n.startswith(("kcache-nvfuser-", "nvfuser_kernel_db"))]
    res["tmpdir_other"] = [n for n in names if n not in res["tmpdir_leftovers"]][:10]
    return res


def count_trace(path: Path) -> dict[str, Any]:
    """NVRTC compiles and kernel loads in an nvFuser trace (Chrome trace lines, one per event)."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return {"error": str(e)}
    return {
        "nvrtc_compiles": text.count('"name": "executor_utils::Nvrtc::CompileProgram", "ph": "B"'),
        "kernel_loads": text.count('"name": "executor_utils::NVRTC", "ph": "B"'),
        "events": text.count('"ph": "B"'),
    }


def run_one(tag: str, work: Path, timeout: float, **kw: Any) -> dict[str, Any]:
    _log(f"{tag}: starting")
    r = finish_child(start_child(tag, work, **kw), timeout)
    _log(f"{tag}: ok={r.get('ok')} wall={r.get('wall_s')}s errors={len(r.get('errors', []))}")
    return r


# -------------------------------------------------------------------------------------- store check
def check_store(store_dir: Path) -> dict[str, Any]:
    """Every entry intact; each nvFuser kernel once; manifests list exactly the stored kernels."""
    out: dict[str, Any] = {"ok": False}
    try:
        from kcache.nvfuser import kerneldb as kdb
        from kcache.store import Store

        store = Store.open(store_dir, max_size=1 << 40, readonly=True)
    except Exception as e:
        out["error"] = f"cannot open the store: {e}"
        return out
    try:
        try:
            from kcache.maintenance import verify

            v = verify(store)
            out["verify"] = {
                "ok": v.get("ok"),
                "entries": v.get("entries"),
                "problems": list(v.get("problems") or [])[:5],
            }
        except ImportError:
            out["verify"] = "kcache.maintenance.verify not available"
        kinds: dict[str, int] = {}
        kernels: dict[str, set[str]] = {}
        manifests: dict[str, set[str]] = {}
        bad = []
        for ident in store.iter_entry_ids():
            hit, problem = store.read_any(ident, full=True)
            if hit is None:
                bad.append(f"{ident[:12]}: {problem}")
                continue
            kind, key = hit.record.kind, hit.record.key
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind == kdb.KIND:
                fph, _, h = key.partition("/")
                if kdb.entries.kernel_from_hit(hit, h) is None:
                    bad.append(f"{ident[:12]}: content does not match its key")
                kernels.setdefault(fph, set()).add(h)
            elif kind == kdb.MANIFEST_KIND:
                members = kdb.entries.read_manifest(store, kdb.Fingerprint({}, hash=key), count=False) or []
                if len(members) != len(set(members)):
                    bad.append(f"manifest {key[:12]} lists a kernel twice")
                manifests[key] = set(members)
        out["kinds"] = kinds
        out["fingerprints"] = len(kernels)
        out["kernels"] = {k[:12]: len(v) for k, v in kernels.items()}
        mismatch = {
            fph[:12]: {"missing_from_manifest": len(ks - manifests.get(fph, set())),
                       "listed_not_stored": len(manifests.get(fph, set()) - ks)}
            for fph, ks in kernels.items()
            if manifests.get(fph) != ks
        }  # fmt: skip
        out["manifest_mismatch"] = mismatch
        out["bad"] = bad[:10]
        vok = out["verify"].get("ok", True) if isinstance(out["verify"], dict) else True
        out["ok"] = not bad and not mismatch and bool(kernels) and vok is not False
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        store.close()
    return out


# -------------------------------------------------------------------------------------- report
def summarize(results: dict[str, Any]) -> dict[str, Any]:
    runs = {r["tag"]: r for r in results["processes"]}
    cold, warm = runs.get("cold", {}), runs.get("warm", {})
    rows = []
    all_pass = True
    for f in FUSIONS:
        row: dict[str, Any] = {"fusion": f}
        for sk in ("A", "B"):
            c = cold.get("runs", {}).get(f"{f}/{sk}", {}).get("first_ms")
            w = warm.get("runs", {}).get(f"{f}/{sk}", {}).get("first_ms")
            row[f"cold_{sk}_ms"], row[f"warm_{sk}_ms"] = c, w
            row[f"ratio_{sk}"] = round(w / c, 3) if c and w else None
        row["target_met"] = row["ratio_A"] is not None and row["ratio_A"] <= TARGET
        all_pass &= row["target_met"]
        row["correct"] = all(
            r.get("runs", {}).get(f"{f}/{sk}", {}).get("correct", False)
            for r in results["processes"]
            for sk in ("A", "B", "C")
            if f"{f}/{sk}" in r.get("runs", {})
        )
        rows.append(row)
    s: dict[str, Any] = {"fusions": rows, "target": TARGET, "all_targets_met": all_pass}
    s["nvrtc_compiles"] = {
        t: r.get("trace", {}).get("nvrtc_compiles") for t, r in runs.items() if "trace" in r
    }
    s["kernel_loads"] = {t: r.get("trace", {}).get("kernel_loads") for t, r in runs.items() if "trace" in r}
    s["new_rows"] = {
        t: (r.get("kerneldb") or {}).get("new_rows") for t, r in runs.items() if r.get("kerneldb")
    }
    s["seeded"] = {t: (r.get("kerneldb") or {}).get("seeded") for t, r in runs.items() if r.get("kerneldb")}
    s["mode"] = {t: (r.get("kerneldb") or {}).get("mode") for t, r in runs.items() if r.get("kerneldb")}
    s["kerneldb_entries"] = {
        t: ((r.get("kerneldb") or {}).get("kerneldb") or {}).get("entries")
        for t, r in runs.items()
        if r.get("kerneldb")
    }
    s["seed_ms"] = {t: (r.get("kerneldb") or {}).get("seed_ms") for t, r in runs.items() if r.get("kerneldb")}
    s["start_ms"] = {
        t: (r.get("kerneldb") or {}).get("start_ms") for t, r in runs.items() if r.get("kerneldb")
    }
    s["tempdir_unchanged"] = all(
        r.get("tempdir_before") == r.get("tempdir_after")
        and r.get("env_tmpdir_before") == r.get("env_tmpdir_after")
        for r in runs.values()
        if "tempdir_after" in r
    )
    s["no_leftovers_in_tmpdir"] = all(not r.get("tmpdir_leftovers") for r in runs.values())
    s["processes_ok"] = {t: bool(r.get("ok")) for t, r in runs.items()}
    wt = runs.get("warm-traced", {}).get("trace", {})
    s["warm_compiles_nothing"] = (
        wt.get("nvrtc_compiles") == 0
        and (runs.get("warm", {}).get("kerneldb") or {}).get("new_rows") == 0
        and (runs.get("populate", {}).get("trace", {}).get("nvrtc_compiles") or 0) > 0
    )
    s["store_ok"] = bool(results.get("store", {}).get("ok"))
    return s


def print_table(s: dict[str, Any]) -> None:
    def f(v: Any) -> str:
        return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))

    print()
    print(
        f"{'fusion':<22}{'cold A ms':>10}{'warm A ms':>10}{'ratio':>7}{'cold B ms':>10}{'warm B ms':>10}{'ratio':>7}  target  correct"
    )
    for r in s["fusions"]:
        print(
            f"{r['fusion']:<22}{f(r['cold_A_ms']):>10}{f(r['warm_A_ms']):>10}{f(r['ratio_A']):>7}"
            f"{f(r['cold_B_ms']):>10}{f(r['warm_B_ms']):>10}{f(r['ratio_B']):>7}  "
            f"{'PASS' if r['target_met'] else 'FAIL':<6}  {r['correct']}"
        )
    print(
        f"target: warm first execute <= {s['target']}x cold (shape A, a new fusion); all met: {s['all_targets_met']}"
    )
    print(f"NVRTC compiles (trace): {s['nvrtc_compiles']}   kernel loads: {s['kernel_loads']}")
    print(f"rows added to the private KernelDb: {s['new_rows']}   seeded: {s['seeded']}")
    print(
        f"KernelDb entries (direct mode): {s['kerneldb_entries']}   mode: {s['mode']}\n"
        f"kcache start, in the first execute (the untimed warm-up fusion), ms: {s['start_ms']}"
        f"   of which seeding: {s['seed_ms']}"
    )
    print(
        f"warm compiles nothing: {s['warm_compiles_nothing']}   store consistent: {s['store_ok']}   "
        f"tempfile.gettempdir()/TMPDIR unchanged: {s['tempdir_unchanged']}   "
        f"no leftovers in TMPDIR: {s['no_leftovers_in_tmpdir']}"
    )
    print(f"processes ok: {s['processes_ok']}")


# -------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", help="where stores, temporary dirs and traces go (default: a new /tmp dir)")
    ap.add_argument("--timeout", type=float, default=150.0, help="per process, seconds")
    ap.add_argument("--budget", type=float, default=290.0, help="whole run, seconds")
    ap.add_argument("--boxkit", help=argparse.SUPPRESS)  # a stand-in kit (flow checks without a GPU)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global BOXKIT, TREE, DEVICE
    if args.boxkit:
        BOXKIT, TREE = Path(args.boxkit), Path(args.boxkit) / "tree"
    DEVICE = args.device
    t_start = time.perf_counter()
    results: dict[str, Any] = {"processes": [], "started": time.time()}
    out_dir = os.environ.get("OUT")

    def left() -> float:
        return args.budget - (time.perf_counter() - t_start)

    def save() -> None:
        if out_dir:
            try:
                Path(out_dir).mkdir(parents=True, exist_ok=True)
                with open(os.path.join(out_dir, "gpu_nvfuser.json"), "w") as fh:
                    json.dump(results, fh, indent=1, default=str)
            except OSError as e:
                _log(f"cannot write $OUT/gpu_nvfuser.json: {e}")

    results["setup"] = setup()
    _log(f"setup: {results['setup']}")
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="kcache-nvf-check-"))
    work.mkdir(parents=True, exist_ok=True)
    results["workdir"] = str(work)

    # 1. cold (also the probe: without nvFuser or a GPU, stop here)
    cold = run_one("cold", work, min(args.timeout, left()), kcache=False, shapes=["A", "B"])
    results["processes"].append(cold)
    if not cold.get("runs"):
        why = " | ".join(e.strip().splitlines()[-1] for e in cold.get("errors", []) if e.strip()) or "unknown"
        print(f"no GPU/nvFuser here ({why}); nothing measured")
        results["skipped"] = why
        save()
        return 0

    # 2. populate (traced: the counter must see compiles here), 3. warm (timed)
    for tag, trace in (("populate", True), ("warm", False)):
        if left() < 30:
            results.setdefault("not_run", []).append(tag)
            continue
        results["processes"].append(
            run_one(tag, work, min(args.timeout, left()), kcache=True, shapes=["A", "B"], trace=trace)
        )

    # 4. two processes at once, a third shape each must compile and store
    if left() > 40:
        _log("pair: starting two processes at once")
        hs = [start_child(f"pair-{i}", work, kcache=True, shapes=["A", "B", "C"]) for i in (1, 2)]
        for h in hs:
            r = finish_child(h, min(args.timeout, left()))
            _log(f"{r['tag']}: ok={r.get('ok')} wall={r.get('wall_s')}s")
            results["processes"].append(r)
    else:
        results.setdefault("not_run", []).append("pair")

    # 5. the store after all that
    results["store"] = check_store(work / "store")
    _log(f"store: {results['store']}")

    # 6. warm, traced, all shapes: nothing compiled
    if left() > 25:
        results["processes"].append(
            run_one(
                "warm-traced",
                work,
                min(args.timeout, left()),
                kcache=True,
                shapes=["A", "B", "C"],
                trace=True,
            )
        )
    else:
        results.setdefault("not_run", []).append("warm-traced")

    results["summary"] = s = summarize(results)
    results["total_s"] = round(time.perf_counter() - t_start, 1)
    for r in results["processes"]:
        if not r.get("ok"):
            _log(f"{r['tag']} FAILED: {r.get('errors')} {r.get('stderr_tail')}")
            for k, v in r.get("runs", {}).items():
                if not v.get("correct"):
                    _log(f"  {k}: {v.get('error')}")
    print_table(s)
    print(f"total {results['total_s']}s; workdir {work}")
    save()
    if not args.workdir:
        shutil.rmtree(work / "store", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
