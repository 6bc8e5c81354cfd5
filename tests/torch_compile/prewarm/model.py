"""A two-layer MLP for the prewarm test of tests/test_inductor.py (its spec.toml, its serve.py).

The docs' example (docs/examples/torch_compile: a transformer encoder layer, tested as written
by tests/test_examples.py) is the same shape of program; this model has one C++ kernel a graph
where the encoder has two, and a fraction of its tracing: the test is about what a prewarm
stores when Inductor's folder is warm, not about the model, and runs four processes of it.

Defined at module level: Dynamo keys its profile of dynamic dimensions by code object.
"""

from __future__ import annotations

import torch


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return MLP().eval()


def make_inputs(B: int, device: str = "cpu") -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(B)
    return (torch.randn(B, 32, generator=g).to(device),)
