"""The serving process of spec.toml's model (tests/test_inductor.py's prewarm test): compiled as
the spec compiles it, called at the prewarmed shapes; prints the FX graph cache counters."""

import json

import torch
from model import make_inputs, make_model

model = torch.compile(make_model(), dynamic=False)
for B in (1, 4):
    (x,) = make_inputs(B)
    with torch.no_grad():
        model(x)
from torch._dynamo.utils import counters  # noqa: E402

print(
    json.dumps(
        {"fxgraph_cache": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}}
    )
)
