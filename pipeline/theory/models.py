"""The lab's two torch models, each with an exact analytic forward-mode JVP.

``Table``: z_i = E[i] (a free lookup row). ``Encoder``: z_i = W2 tanh(W1 E[i]) — tanh and no biases on
centred rows, the combination docs/theory.md section 6 found to behave (no shared offset that moves every norm
at once). ``jvp`` gives the first-order change of z along a parameter displacement in closed form; a test
checks it against ``torch.func.jvp``, and it is about ten times cheaper, which matters because the lab
evaluates it for every item at every measured step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Encoder", "Table"]


class Table(nn.Module):
    """A float64 lookup table; rows start with norm about ``init_scale``."""

    def __init__(self, n_items: int, dim: int, init_scale: float = 1.0) -> None:
        super().__init__()
        rows = torch.randn(n_items, dim, dtype=torch.float64)
        self.table = nn.Parameter(rows * init_scale / math.sqrt(dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table)

    def jvp(self, ids: torch.Tensor, delta: dict[str, torch.Tensor],
            at: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """d z[ids] along the parameter displacement ``delta`` (name -> tensor), taken at the parameter
        values ``at`` (default: the current ones)."""
        return F.embedding(ids, delta["table"])


class Encoder(Table):
    """Table + bias-free tanh MLP: z = W2 tanh(W1 E[i])."""

    def __init__(self, n_items: int, dim: int, hidden: int, out_dim: int, init_scale: float = 1.0) -> None:
        super().__init__(n_items, dim, init_scale)
        self.w1 = nn.Linear(dim, hidden, bias=False, dtype=torch.float64)
        self.w2 = nn.Linear(hidden, out_dim, bias=False, dtype=torch.float64)
        nn.init.normal_(self.w1.weight, std=1.0 / math.sqrt(dim))
        nn.init.normal_(self.w2.weight, std=1.0 / math.sqrt(hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.tanh(self.w1(F.embedding(ids, self.table))))

    def jvp(self, ids: torch.Tensor, delta: dict[str, torch.Tensor],
            at: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """d z[ids] along ``delta`` at ``at``: the chain rule through W2, tanh, W1 and the table row."""
        p = at if at is not None else dict(self.named_parameters())
        e = F.embedding(ids, p["table"])
        h = torch.tanh(e @ p["w1.weight"].T)
        da = e @ delta["w1.weight"].T + F.embedding(ids, delta["table"]) @ p["w1.weight"].T
        return h @ delta["w2.weight"].T + ((1.0 - h * h) * da) @ p["w2.weight"].T
