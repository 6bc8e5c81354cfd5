"""What a serving process does: compile the model the same way and answer at the prewarmed
shapes. Run with KCACHE=1 after `kcache prewarm spec.toml`: every first call is warm.

    KCACHE=1 TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python serve.py
"""

import json
import time

import torch
from model import make_inputs, make_model

model = torch.compile(make_model(), dynamic=False)
report = {}
for B, S in ((1, 16), (4, 32)):
    (ids,) = make_inputs(B, S)
    t = time.perf_counter()
    with torch.no_grad():
        model(ids)
    report[f"{B}x{S}"] = round(time.perf_counter() - t, 3)
from torch._dynamo.utils import counters  # noqa: E402

report["fxgraph_cache"] = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
print(json.dumps(report))
