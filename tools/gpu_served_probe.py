#!/usr/bin/env python3
"""What a served torch.compile process still does that a cache could have done (issue 33).

    python3 tools/gpu_served_probe.py [--device cuda|cpu]

Three fresh processes per layout on one kcache store (``KCACHE=1``), each with a NEW empty
Inductor folder: the first fills the store, the next two are served. Each compiles and calls a
small pointwise function; an audit hook in the child records every ``open()`` of libtriton (what
``triton_key()`` hashes) and every program it starts (``subprocess.Popen``: the C compiler that
builds Triton's ``cuda_utils``, ``ptxas``, ``nvcc --version``, compile workers), each with the
thread and the stack that did it. Two layouts: ``TRITON_CACHE_DIR=<Inductor folder>/triton``
given at launch (what ``tools/gpu_compile_check.py`` gives its processes) and
``TRITON_CACHE_DIR`` unset. Counts, not times (the first call's time is printed for orientation).

Seen on an H100 (torch 2.11.0+cu130, Triton 3.6.0, 2026-12-06) before issue 33's fixes: the
served processes read libtriton 0 times in both layouts; with the Inductor-shaped folder each
ran gcc for ``cuda_utils`` (kcache stepped aside for a folder of that shape), unset none.
Writes ``$OUT/gpu_served_probe.json`` when ``OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, threading, time, traceback
ev = {"libtriton": [], "programs": []}
def stack():
    return [f"{f.filename.split('-packages/')[-1]}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[-24:-2]]
def audit(name, args):
    try:
        if name == "open" and isinstance(args[0], str) and "libtriton" in os.path.basename(args[0]):
            ev["libtriton"].append({"thread": threading.current_thread().name, "stack": stack()})
        elif name == "subprocess.Popen":
            argv = [str(a) for a in (args[1] or [])]
            ev["programs"].append({"argv": [os.path.basename(argv[0]) if argv else "?", *argv[1:2]],
                                   "thread": threading.current_thread().name, "stack": stack()[-12:]})
    except Exception:
        pass
sys.addaudithook(audit)
import torch
dev = sys.argv[1]
f = torch.compile(lambda x: (x * 2 + 1).sin())
x = torch.randn(4096, device=dev)
t = time.perf_counter()
f(x)
if dev == "cuda":
    torch.cuda.synchronize()
out = {"first_call_s": round(time.perf_counter() - t, 3), "events": ev}
k = sys.modules.get("kcache")
out["kcache"] = k.stats()["process"] if k is not None and k.is_enabled() else None
print("RESULT " + json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="served-probe-"))
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("KCACHE", "TORCHINDUCTOR", "TRITON_CACHE"))
    }
    results: dict[str, list] = {}
    for layout in ("inductor-shaped", "unset"):
        store = work / layout / "store"
        for i in range(3):
            ind = work / layout / f"inductor{i}"
            env = dict(base, KCACHE="1", KCACHE_DIR=str(store), TORCHINDUCTOR_CACHE_DIR=str(ind))
            if layout == "inductor-shaped":
                env["TRITON_CACHE_DIR"] = str(ind / "triton")
            p = subprocess.run([sys.executable, "-c", CHILD, args.device], env=env, capture_output=True, text=True,
                               timeout=600)  # fmt: skip
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            res = json.loads(lines[-1][7:]) if lines else {"error": p.stderr[-3000:]}
            results.setdefault(layout, []).append(res)
            ev = res.get("events", {})
            print(f"{layout} #{i} ({'fills the store' if i == 0 else 'served'}): first call {res.get('first_call_s')} s, "
                  f"libtriton reads {len(ev.get('libtriton', []))}, programs "
                  f"{[e['argv'] for e in ev.get('programs', [])]}")  # fmt: skip
    text = json.dumps(results, indent=1).replace(str(work), "<work>")
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "gpu_served_probe.json").write_text(text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
