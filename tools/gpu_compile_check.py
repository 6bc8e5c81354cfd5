"""torch.compile through kcache on the GPU machine: per-shape first-call times in fresh processes.

    python3 tools/gpu_compile_check.py [--model bert|gpt2|tiny] [--device cuda|cpu] [--budget S]

A model (BERT-base or GPT-2 small from transformers' default configs, random weights, fp16, eval;
or the small encoder of docs/examples/torch_compile on any machine) is torch.compile'd and called
at the shape sequence (1, 64), (8, 256), (8, 256), (1, 64), (8, 256), (8, 64), one fresh process
per condition, each with its own directories:

- ``plain-cold``: no kcache, an empty ``TORCHINDUCTOR_CACHE_DIR``;
- ``kcache-cold``: ``KCACHE=1`` on an empty store, an empty Inductor folder (does kcache slow a
  cold compile?);
- ``kcache-warm-store``: ``KCACHE=1`` on that store, a NEW empty Inductor folder (a new node or
  replica: only kcache's store carries over) — the case issue 14 is about;
- ``plain-warm``: no kcache, the folder of ``plain-cold`` (Inductor's own warm cache);
- ``kcache-both-warm``: ``KCACHE=1`` and the folder of ``kcache-cold``;
- ``bundle``: the store exported (signed) and imported at another path, an empty Inductor folder;
- then ``kcache-warm-store`` and ``plain-warm`` again, alternately, while the budget lasts.

Each process: first-call time of every call (the call and a synchronize; imports, the model and
its inputs are made before the clock starts), a steady-state time per shape, the largest
difference from eager, and Inductor's and kcache's cache counters. Results are written after
every process to ``$OUT/gpu_compile.json`` (or ``--out``): a run cut short keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SEQUENCE = [(1, 64), (8, 256), (8, 256), (1, 64), (8, 256), (8, 64)]
SECRET = "gpu-compile-check"


# ------------------------------------------------------------------------------ the child
def build(model_name: str, device: str) -> tuple[Any, Any]:
    """(model, make_inputs(B, S) -> kwargs)."""
    import torch

    torch.manual_seed(0)
    if model_name in ("bert", "gpt2"):
        import transformers

        if model_name == "bert":
            model = transformers.BertModel(transformers.BertConfig())
        else:
            model = transformers.GPT2Model(transformers.GPT2Config())
        vocab = model.config.vocab_size
        dtype = torch.float16 if device == "cuda" else torch.float32
        model = model.eval().to(device=device, dtype=dtype)

        def make(b: int, s: int) -> dict[str, Any]:
            g = torch.Generator().manual_seed(b * 1000 + s)
            return {"input_ids": torch.randint(0, vocab, (b, s), generator=g).to(device)}

        return model, make
    sys.path.insert(0, str(REPO / "docs" / "examples" / "torch_compile"))
    from model import make_inputs, make_model

    model = make_model().to(device)
    return model, lambda b, s: {"ids": make_inputs(b, s, device=device)[0]}


def first_tensor(out: Any) -> Any:
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def child(model_name: str, device: str, mode: str | None) -> dict[str, Any]:
    t_import = time.perf_counter()
    import torch

    model, make = build(model_name, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    inputs = [make(b, s) for b, s in SEQUENCE]
    with torch.no_grad():
        eager = [first_tensor(model(**x)).float().cpu() for x in inputs]
    sync()
    compiled = torch.compile(model, mode=mode) if mode else torch.compile(model)
    setup_s = time.perf_counter() - t_import
    first_ms, diffs = [], []
    with torch.no_grad():
        for x, ref in zip(inputs, eager):
            sync()
            t = time.perf_counter()
            y = compiled(**x)
            sync()
            first_ms.append(round(1e3 * (time.perf_counter() - t), 2))
            diffs.append(float((first_tensor(y).float().cpu() - ref).abs().max()))
        steady = {}
        for b, s in dict.fromkeys(SEQUENCE):
            x = make(b, s)
            times = []
            for _ in range(10):
                sync()
                t = time.perf_counter()
                compiled(**x)
                sync()
                times.append(1e3 * (time.perf_counter() - t))
            steady[f"{b}x{s}"] = round(statistics.median(times), 3)
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {
        "setup_s": round(setup_s, 2),
        "first_ms": first_ms,
        "steady_ms": steady,
        "max_abs_diff": max(diffs),
        "inductor": {
            k: v for k, v in counters["inductor"].items() if "cache" in k and not k.startswith("triton")
        },
        "aot": {k: v for k, v in counters["aot_autograd"].items() if "cache" in k},
        "unique_graphs": counters["stats"]["unique_graphs"],
    }
    kcache = sys.modules.get("kcache")
    if kcache is not None and kcache.is_enabled():
        proc = kcache.stats()["process"]
        out["kcache"] = {k: {n: round(v, 3) for n, v in d.items() if n in ("hits", "misses", "puts", "saved_s")}
                         for k, d in proc.items()}  # fmt: skip
    return out


# ------------------------------------------------------------------------------ the parent
class Check:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.deadline = time.monotonic() + args.budget
        self.result: dict[str, Any] = {"model": args.model, "device": args.device, "mode": args.mode,
                                       "sequence": SEQUENCE, "runs": []}  # fmt: skip
        self.out = (
            Path(args.out)
            if args.out
            else (Path(os.environ["OUT"]) / "gpu_compile.json" if os.environ.get("OUT") else None)
        )

    def env(self, store: Path | None, inductor_dir: Path, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_CACHE"))
        }
        env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_dir)
        env["TRITON_CACHE_DIR"] = str(inductor_dir / "triton")
        env["TORCH_COMPILE_JOB_ID"] = "gpu-compile-check"  # so that Dynamo's PGO profile is kept
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if store is not None:
            env.update(KCACHE="1", KCACHE_DIR=str(store))
        env.update(extra)
        return env

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, env: dict[str, str], expect_s: float) -> dict[str, Any] | None:
        if self.left() < expect_s:
            self.result["runs"].append({"name": name, "skipped": f"budget: {self.left():.0f} s left"})
            self.save()
            return None
        t = time.monotonic()
        cmd = [sys.executable, __file__, "--child", "--model", self.args.model, "--device", self.args.device]
        if self.args.mode:
            cmd += ["--mode", self.args.mode]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(30.0, self.left()))
            res = (
                json.loads(p.stdout.strip().splitlines()[-1])
                if p.returncode == 0
                else {"error": p.stderr[-3000:]}
            )
        except subprocess.TimeoutExpired:
            res = {"error": "timed out"}
        except (ValueError, IndexError):
            res = {"error": f"no result: {p.stderr[-3000:]}"}
        res = {"name": name, "wall_s": round(time.monotonic() - t, 1), **res}
        self.result["runs"].append(res)
        self.save()
        first = res.get("first_ms")
        print(f"{name:20s} {res['wall_s']:6.1f} s  first calls (ms): {first if first else res.get('error', '')[:200]}",
              flush=True)  # fmt: skip
        return res

    def save(self) -> None:
        if self.out is not None:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(json.dumps(self.result, indent=1))

    def kcache_cli(self, *args: str, env: dict[str, str]) -> dict[str, Any]:
        p = subprocess.run([sys.executable, "-m", "kcache", *args, "--json"], env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
        return json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-1000:]}

    def main(self) -> None:
        w = self.work
        store = w / "store"
        self.run("plain-cold", self.env(None, w / "ind-plain"), 20)
        self.run("kcache-cold", self.env(store, w / "ind-kcache"), 20)
        self.run("kcache-warm-store", self.env(store, w / "ind-fresh-1"), 10)
        self.run("plain-warm", self.env(None, w / "ind-plain"), 10)
        self.run("kcache-both-warm", self.env(store, w / "ind-kcache"), 10)
        if self.left() > 20:
            env = self.env(store, w / "x", KCACHE_SECRET=SECRET)
            bundle = w / "compile.kcb"
            exp = self.kcache_cli("export", str(bundle), env=env)
            imp = self.kcache_cli(
                "import", str(bundle), env={**env, "KCACHE_DIR": str(w / "other" / "store")}
            )
            self.result["bundle"] = {"export": {k: exp.get(k) for k in ("entries", "bytes", "by_kind", "signed")},
                                     "import": {k: imp.get(k) for k in ("imported", "skipped", "signed")}}  # fmt: skip
            self.run("bundle", self.env(w / "other" / "store", w / "ind-bundle"), 10)
        for i in range(2, 6):
            if self.run(f"kcache-warm-store#{i}", self.env(store, w / f"ind-fresh-{i}"), 15) is None:
                break
            if self.run(f"plain-warm#{i}", self.env(None, w / "ind-plain"), 15) is None:
                break
        self.result["stats"] = self.kcache_cli("stats", env=self.env(store, w / "x"))
        self.summarize()
        self.save()

    def summarize(self) -> None:
        by: dict[str, list[list[float]]] = {}
        for r in self.result["runs"]:
            if r.get("first_ms"):
                by.setdefault(r["name"].split("#")[0], []).append(r["first_ms"])
        med = {k: [round(statistics.median(col), 1) for col in zip(*v)] for k, v in by.items()}
        self.result["median_first_ms"] = med
        if "kcache-warm-store" in med and "plain-warm" in med:
            self.result["ratio_kcache_store_to_inductor_warm"] = [
                round(a / b, 3) if b else None for a, b in zip(med["kcache-warm-store"], med["plain-warm"])
            ]
        if "kcache-cold" in med and "plain-cold" in med:
            self.result["ratio_kcache_cold_to_plain_cold"] = [
                round(a / b, 3) if b else None for a, b in zip(med["kcache-cold"], med["plain-cold"])
            ]
        print(json.dumps({k: self.result.get(k) for k in ("median_first_ms", "ratio_kcache_store_to_inductor_warm",
                                                          "ratio_kcache_cold_to_plain_cold")}, indent=1))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert", choices=("bert", "gpt2", "tiny"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--mode", default=None, help="torch.compile mode (default: Inductor's default)")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds for everything")
    ap.add_argument("--out", default=None, help="where the JSON goes (default $OUT/gpu_compile.json)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.device, args.mode)))
        return 0
    work = Path(tempfile.mkdtemp(prefix="kcache-gpu-compile-"))
    try:
        Check(args, work).main()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
