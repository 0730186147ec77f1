"""Wide & Deep (Cheng et al., 2016): a linear model over every id and dense value, plus
an MLP over the concatenated embeddings and dense values."""

from __future__ import annotations

import torch
from torch import nn

from picasso.batch import TorchBatch
from picasso.embedding import PackedEmbedding
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class WideDeep(nn.Module):
    def __init__(self, spec: FeatureSpec, plan: PackingPlan, hidden: tuple[int, ...] = (256, 128)):
        super().__init__()
        num_dense = len(spec.dense)
        self.embedding = PackedEmbedding(plan)
        self.wide_embedding = PackedEmbedding(plan, dim=1, init_scale=0.0)
        self.wide_dense = nn.Linear(num_dense, 1) if num_dense else None
        self.deep = mlp([num_dense + self.embedding.output_dim(), *hidden, 1])

    def forward(self, batch: TorchBatch) -> torch.Tensor:
        """Logits, shape (N,)."""
        n = batch.num_samples
        pooled = self.embedding(batch.ids, batch.offsets)
        deep_in = torch.cat([batch.dense] + [p.reshape(n, -1) for p in pooled], dim=1)
        logit = self.deep(deep_in).squeeze(1)
        for p in self.wide_embedding(batch.ids, batch.offsets):
            logit = logit + p.sum(dim=(1, 2))
        if self.wide_dense is not None:
            logit = logit + self.wide_dense(batch.dense).squeeze(1)
        return logit
