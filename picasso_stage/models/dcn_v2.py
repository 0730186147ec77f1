"""DCN-v2 (Wang et al., 2021), parallel structure: a cross network and an MLP side by
side over x0 = [dense values, every field's embedding], then one linear head over both.

Cross layer l (full-rank W_l): x_{l+1} = x0 ⊙ (W_l x_l + b_l) + x_l. Each layer raises the
degree of feature crosses by one while the residual keeps the lower ones. Embeddings of
mixed dims are simply concatenated: nothing here needs one dim.
"""

from __future__ import annotations

import torch
from torch import nn

from picasso.embedding import PackedEmbedding
from picasso.models.common import PackedModel, flat_input, mlp
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec


class DCNv2DensePart(nn.Module):
    def __init__(self, num_dense: int, embedding_width: int, hidden: tuple[int, ...], cross_layers: int):
        super().__init__()
        width = num_dense + embedding_width
        self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(cross_layers))
        self.deep = mlp([width, *hidden], last_relu=True) if hidden else None
        self.head = nn.Linear(width + (hidden[-1] if hidden else 0), 1)

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        x0 = flat_input(dense, pooled)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        towers = [x] if self.deep is None else [x, self.deep(x0)]
        return self.head(torch.cat(towers, dim=1)).squeeze(1)


class DCNv2(PackedModel):
    flat_lookup = True
    def __init__(self, spec: FeatureSpec, plan: PackingPlan, hidden: tuple[int, ...] = (256, 128),
                 cross_layers: int = 3):
        super().__init__()
        self.embedding = PackedEmbedding(plan.for_part("deep"))
        self.dense_part = DCNv2DensePart(len(spec.dense), self.embedding.output_dim(), hidden, cross_layers)
