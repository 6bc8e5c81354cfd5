"""A torch.compile(dynamic=True) program whose first attempt Dynamo restarts (tests/test_inductor_restarts.py).

LayerNorm's ``eps`` here is the sum of ``--floats N`` float module attributes: with dynamic shapes
Dynamo makes each a symbol, and AOTAutograd's tensorify pass cannot keep them (the operator takes
a C++ double), so it raises ``TensorifyScalarRestartAnalysis`` and Dynamo traces the frame again
with all N specialised (BERT-base's restart specialises 65). Writes to ``argv[1]``: how often the
tensorify pass ran, the names torch specialised, Dynamo's restart reasons, torch's counters,
kcache's counts, the output (as hex, to compare bits). ``--fresh``: the call runs inside torch's
``fresh_cache()``; ``--reset``: then ``torch._dynamo.reset()`` and the same call again;
``--registered``: through Dynamo's registered backend (see below).
"""

from __future__ import annotations

import json
import sys

import torch
from torch._dynamo.symbolic_convert import TensorifyState
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd import graph_compile

passes: list[int] = []
own = graph_compile.tensorify_python_scalars


def counted(*a, **k):  # type: ignore[no-untyped-def]
    passes.append(1)
    return own(*a, **k)


graph_compile.tensorify_python_scalars = counted  # called by name from graph_compile


class M(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.eps = [1e-6 * (i + 1) for i in range(n)]  # a symbol each, all in one eps
        self.scale = 0.125

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (16,), eps=sum(self.eps)) * self.scale + x.mean()


torch.manual_seed(0)
m = M(int(sys.argv[sys.argv.index("--floats") + 1]))
x = torch.randn(4, 16)
# ``--registered``: Dynamo's registered ``inductor`` backend, as ``torch._dynamo.optimize("inductor")``
# gives it: it asks for Inductor's compile-worker pool first (``maybe_warm_pool``), as
# ``compile_fx`` does where the inputs are on a GPU (``torch.compile``'s own wrapper on a CPU does not)
BACKEND = torch._dynamo.lookup_backend("inductor") if "--registered" in sys.argv else "inductor"
compiled = torch.compile(m, dynamic=True, backend=BACKEND)
if "--fresh" in sys.argv:
    from torch._inductor.utils import fresh_cache

    with fresh_cache(), torch.no_grad():
        y = compiled(x)
else:
    with torch.no_grad():
        y = compiled(x)
if "--reset" in sys.argv:  # torch forgets its compiled frames and its names: a second start
    torch._dynamo.reset()
    compiled = torch.compile(m, dynamic=True, backend=BACKEND)
    with torch.no_grad():
        y = compiled(x)

import torch._inductor.async_compile as ac  # noqa: E402

kc = sys.modules.get("kcache")
workers = sys.modules.get("kcache.inductor.workers")
totals = kc.active_store().counts.process_totals() if kc is not None and kc.is_enabled() else {}
out = {
    "passes": len(passes),
    "names": sorted(TensorifyState.force_specializations),
    "counters": {k: dict(counters[k]) for k in ("aot_autograd", "inductor", "stats")},
    "output": [float(v).hex() for v in y.flatten().tolist()],
    "kcache": {k: v for k, v in totals.items() if k.startswith("inductor")},
    # Inductor's compile-worker pool: started, or asked for by torch and held by kcache
    "pool_started": bool(getattr(ac, "_pool_set", None)),
    "pool_held": bool(getattr(workers, "_wanted", None)),
}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
