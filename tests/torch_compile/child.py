"""A torch.compile run in a fresh process (the tests' child): a small MLP on the CPU, compiled by
Inductor, called at the shapes given; prints one JSON line with Inductor's and kcache's counters.

    python child.py [BATCH ...]      (default: 8)

With ``CHILD_SAVE_ARTIFACTS=1`` it calls ``torch.compiler.save_cache_artifacts()`` at the end (as
a program using caching precompile does). With ``CHILD_BREAK_INSTALL=1``, torch fails to install
a caching-precompile package the way torch 2.11 did on the H200 (a ``TypeError`` while unpickling
the package's guards, inside ``CompilePackage.install``). With ``CHILD_SWITCHES=1`` the line also
holds, under ``switches``, the cache switches of torch's config as they are after the run (and
whether kcache's parts are in torch): see :func:`switches`.

The model is defined at module level: Dynamo's profile of dynamic dimensions (PGO) is keyed by
code object, and a method that closes over a local (``torch`` imported inside a function) gets
a different key in every process.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One C++ kernel a graph (the relu; the linears are extern addmm calls): each kernel is
        # a g++ run (~1 s of CPU) in every cold child, and the tests need one kernel to store.
        return self.b(torch.relu(self.a(x)))


def break_install() -> None:
    import torch._dynamo.package as package

    def load_guards_state(guards_state: bytes) -> None:
        raise TypeError("DefaultsSource.__init__() takes from 3 to 4 positional arguments but 6 were given")

    package.load_guards_state = load_guards_state  # install() looks it up when it runs


PROBES: list[str] = []


def count_isa_probes(event: str, args: tuple) -> None:
    """Inductor's CPU vector-ISA probe: a new Python that dlopens a tiny library (see
    kcache/inductor/vecisa.py); counted in this process."""
    if event == "subprocess.Popen":
        argv = args[1]
        if (
            isinstance(argv, (list, tuple))
            and len(argv) == 3
            and argv[1] == "-c"
            and "LoadLibrary" in str(argv[2])
        ):
            PROBES.append(str(argv[2]))


def switches() -> dict:
    """torch's remote-cache switches, which of Inductor's remote caches have a backend put in
    their place, and whether kcache wrapped the autotuner's recheck (tests/test_inductor.py:
    the switches the user set are left alone)."""
    import torch._dynamo.config as dc
    import torch._functorch._aot_autograd.autograd_cache as ac
    import torch._functorch.config as fc
    import torch._inductor.config as ic
    import torch._inductor.remote_cache as rc
    import torch._inductor.runtime.triton_heuristics as th

    caches = ("RemoteFxGraphCache", "RemoteAutotuneCache", "RemoteAOTAutogradCache", "RemoteDynamoPGOCache")
    return {
        "recheck_wrapped": hasattr(th.CachingAutotuner.recheck_autotune_cache, "__wrapped__"),
        "fx": ic.fx_graph_remote_cache,
        "autotune": ic.autotune_remote_cache,
        "aot": fc.enable_remote_autograd_cache,
        # kcache leaves that switch unset and answers torch's decision instead (it is in the key)
        "aot_decided": ac.should_use_remote_autograd_cache(),
        "pgo": dc.automatic_dynamic_remote_pgo,
        "bundled": ic.bundled_autotune_remote_cache,
        "override": {c: rc.__dict__[c].backend_override_cls is not None for c in caches},
    }


def main(argv: list[str]) -> int:
    sys.addaudithook(count_isa_probes)
    if os.environ.get("CHILD_BREAK_INSTALL"):
        break_install()
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torch.compile(model)
    out: dict = {"first_call_s": [], "ok": True}
    for batch in [int(a) for a in argv] or [8]:
        x = torch.randn(batch, 32)
        t = time.perf_counter()
        with torch.no_grad():
            y = compiled(x)
        out["first_call_s"].append(round(time.perf_counter() - t, 3))
        out["ok"] = out["ok"] and bool(torch.allclose(y, model(x), atol=1e-5))
    from torch._dynamo.utils import counters

    if os.environ.get("CHILD_SAVE_ARTIFACTS"):  # what a program using caching precompile calls
        torch.compiler.save_cache_artifacts()
    out["caching_precompile"] = bool(getattr(torch._dynamo.config, "caching_precompile", False))
    out["dynamo_cache"] = dict(counters["dynamo_cache"])
    out["inductor"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    out["aot"] = {k: v for k, v in counters["aot_autograd"].items() if "cache" in k}
    out["unique_graphs"] = counters["stats"]["unique_graphs"]
    out["isa_probes"] = len(PROBES)
    kcache = sys.modules.get("kcache")
    out["kcache"] = bool(kcache is not None and kcache.is_enabled())
    if out["kcache"]:
        out["process"] = kcache.stats()["process"]
    if os.environ.get("CHILD_SWITCHES"):  # read last: the counters above are the run's alone
        out["switches"] = switches()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
