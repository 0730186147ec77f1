"""Wide & Deep (Cheng et al., 2016): a linear model over every id and dense value, plus
an MLP over the concatenated embeddings and dense values."""

from __future__ import annotations

import torch
from torch import nn

from picasso.embedding import PackedEmbedding
from picasso.models.common import PackedModel, add_first_order, flat_input, mlp
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec


class WideDeepDensePart(nn.Module):
    """pooled: the embeddings' groups, then the wide (dim-1) embeddings' groups."""

    def __init__(self, num_dense: int, num_groups: int, embedding_width: int, hidden: tuple[int, ...]):
        super().__init__()
        self.num_groups = num_groups
        self.wide_dense = nn.Linear(num_dense, 1) if num_dense else None
        self.deep = mlp([num_dense + embedding_width, *hidden, 1])

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        deep = self.deep(flat_input(dense, pooled, self.num_groups)).squeeze(1)
        return add_first_order(deep, dense, pooled[self.num_groups :], self.wide_dense)


class WideDeep(PackedModel):
    lookups = ("embedding", "wide_embedding")
    wide_part = True
    flat_lookup = True

    def __init__(self, spec: FeatureSpec, plan: PackingPlan, hidden: tuple[int, ...] = (256, 128)):
        super().__init__()
        # Built in the order of the model before the dense part was split out, so the
        # same seed still gives the same initial weights.
        deep = plan.for_part("deep")  # a cross may feed one part alone (packing)
        self.embedding = PackedEmbedding(deep)
        self.wide_embedding = PackedEmbedding(plan.for_part("wide"), dim=1, init_scale=0.0)
        self.dense_part = WideDeepDensePart(len(spec.dense), len(deep.groups), self.embedding.output_dim(), hidden)
