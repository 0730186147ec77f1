"""DeepFM (Guo et al., 2017): a factorization machine and an MLP over shared embeddings.

logit = first order (a weight per id, a linear map of the dense values)
      + second order (FM: Σ_{i<j} <v_i, v_j> over the field embeddings)
      + deep (an MLP over the concatenated embeddings and dense values).

The FM's dot products need one dim. With mixed dims each narrower group is projected to
the widest dim first (models.common.CommonDim); the deep part reads the embeddings at
their own dims, as the embeddings are laid out.
"""

from __future__ import annotations

import torch
from torch import nn

from picasso.embedding import PackedEmbedding
from picasso.models.common import CommonDim, PackedModel, add_first_order, flat_input, mlp
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec


def fm_interaction(v: torch.Tensor) -> torch.Tensor:
    """Σ_{i<j} <v_i, v_j> for v of shape (N, fields, dim), in O(fields × dim):
    0.5 × ((Σ_i v_i)² − Σ_i v_i²), summed over dim."""
    return 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)


class DeepFMDensePart(nn.Module):
    """pooled: the embeddings' groups, then the first-order (dim-1) embeddings' groups."""

    def __init__(self, num_dense: int, plan: PackingPlan, embedding_width: int, hidden: tuple[int, ...]):
        super().__init__()
        self.num_groups = len(plan.groups)
        self.first_order_dense = nn.Linear(num_dense, 1) if num_dense else None
        self.to_common_dim = CommonDim(plan)
        self.deep = mlp([num_dense + embedding_width, *hidden, 1])

    def forward(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        embedded, first_order = pooled[: self.num_groups], pooled[self.num_groups :]
        logit = self.deep(flat_input(dense, embedded)).squeeze(1)
        logit = logit + fm_interaction(self.to_common_dim(embedded))
        return add_first_order(logit, dense, first_order, self.first_order_dense)


class DeepFM(PackedModel):
    lookups = ("embedding", "first_order")
    wide_part = True  # the first order

    def __init__(self, spec: FeatureSpec, plan: PackingPlan, hidden: tuple[int, ...] = (256, 128)):
        super().__init__()
        deep = plan.for_part("deep")  # a cross may feed one part alone (packing)
        self.embedding = PackedEmbedding(deep)
        # Zero start, as Wide&Deep's wide part: the first-order weights grow from the data.
        self.first_order = PackedEmbedding(plan.for_part("wide"), dim=1, init_scale=0.0)
        self.dense_part = DeepFMDensePart(len(spec.dense), deep, self.embedding.output_dim(), hidden)
