"""PackedEmbedding: one table per packing group, one lookup per group."""

from __future__ import annotations

import torch
from torch import nn

from picasso.kernels import packed_lookup
from picasso.packing import PackingPlan


class PackedEmbedding(nn.Module):
    """Embedding tables laid out by a PackingPlan.

    `dim` overrides every group's embedding dim; the wide (linear) part of a model uses
    dim=1 over the same rows.
    """

    def __init__(self, plan: PackingPlan, dim: int | None = None, init_scale: float = 0.05):
        super().__init__()
        self.plan = plan
        self.tables = nn.ParameterDict()
        for group in plan.groups:
            width = dim or group.embedding_dim
            weight = torch.empty(group.num_rows, width).uniform_(-init_scale, init_scale)
            self.tables[group.name] = nn.Parameter(weight)
            self.register_buffer(f"mean_{group.name}", torch.tensor(group.mean_pooled), persistent=False)

    def output_dim(self) -> int:
        return sum(g.num_fields * self.tables[g.name].shape[1] for g in self.plan.groups)

    def forward(self, ids: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Per group, the pooled embeddings as (N, fields of the group, dim)."""
        return [
            packed_lookup(self.tables[g.name], ids[g.name], offsets[g.name], g.num_fields, getattr(self, f"mean_{g.name}"))
            for g in self.plan.groups
        ]
