"""DLRM (Naumov et al., 2019): dense values and field embeddings meet as vectors of one
dim d, and only through their pairwise dot products.

- bottom MLP: dense values -> a d-vector (absent when the spec has no dense fields);
- interaction: the dot product of every pair among [bottom output, each field's
  embedding] (the strict upper triangle of their Gram matrix), concatenated with the
  bottom output;
- top MLP: that -> the logit.

d is the embedding dim; with mixed dims, the widest one, narrower groups projected up to
it (models.common.CommonDim). `hidden` sizes both MLPs: the bottom one is
num_dense -> *hidden -> d, the top one interaction -> *hidden -> 1.
"""

from __future__ import annotations

import torch
from torch import nn

from picasso.embedding import PackedEmbedding
from picasso.models.common import CommonDim, PackedModel, mlp
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec


class DLRMDensePart(nn.Module):
    def __init__(self, num_dense: int, plan: PackingPlan, hidden: tuple[int, ...]):
        super().__init__()
        self.to_common_dim = CommonDim(plan)
        dim = self.to_common_dim.dim
        # The bottom output is one more vector in the interaction, so it ends in a ReLU
        # like the embeddings' layers before it (as in the paper's reference code).
        self.bottom = mlp([num_dense, *hidden, dim], last_relu=True) if num_dense else None
        vectors = self.to_common_dim.num_fields + (1 if self.bottom is not None else 0)
        if vectors < 2:
            raise ValueError("dlrm: needs at least two vectors to interact (dense fields, or two sparse fields)")
        # Flat positions of the Gram matrix's strict upper triangle (i < j).
        upper = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pairs", upper[0] * vectors + upper[1], persistent=False)
        top_in = len(self.pairs) + (dim if self.bottom is not None else 0)
        self.top = mlp([top_in, *hidden, 1])

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        vectors = self.to_common_dim(pooled)  # (N, fields, d)
        if self.bottom is not None:
            bottom = self.bottom(dense)
            vectors = torch.cat([bottom.unsqueeze(1), vectors], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)[:, self.pairs]
        top_in = dots if self.bottom is None else torch.cat([bottom, dots], dim=1)
        return self.top(top_in).squeeze(1)


class DLRM(PackedModel):
    def __init__(self, spec: FeatureSpec, plan: PackingPlan, hidden: tuple[int, ...] = (256, 128)):
        super().__init__()
        deep = plan.for_part("deep")
        self.embedding = PackedEmbedding(deep)
        self.dense_part = DLRMDensePart(len(spec.dense), deep, hidden)
