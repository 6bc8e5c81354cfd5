"""A small model for ``kcache prewarm`` of torch.compile (see README.md and spec.toml).

``make_model`` builds the model once; ``make_inputs`` gives the example inputs at one sizes
binding of the spec (its symbols as keyword arguments, and ``device``). A serving process that
imports the same module and compiles the same way finds every graph and kernel in kcache.

Defined at module level, as a real model is: Dynamo keys its profile of dynamic dimensions by
code object, and a method that closes over a local variable gets a new key in every process.
"""

from __future__ import annotations

import torch


class TinyEncoder(torch.nn.Module):
    """Embedding, one transformer encoder layer and a pooled head: the shape of a BERT, small."""

    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layer = torch.nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, batch_first=True)
        self.head = torch.nn.Linear(dim, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(ids)).mean(dim=1))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return TinyEncoder().eval()


def make_inputs(B: int, S: int, device: str = "cpu") -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(B * 1000 + S)
    return (torch.randint(0, 1000, (B, S), generator=g).to(device),)
