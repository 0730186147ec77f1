"""Reference kernels in plain torch: the definition the fast paths are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def packed_lookup(weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, num_fields: int,
                  mean_pooled: torch.Tensor | None = None) -> torch.Tensor:
    """Pool one packed table over every (sample, field) bag in one call.

    ids: flat int64 rows; offsets: (N * num_fields,) bag starts (the last bag runs to the
    end of ids); mean_pooled: (num_fields,) bool, or None when every field sums.
    Returns (N, num_fields, dim). The gradient of `weight` is sparse: only touched rows.
    """
    offsets = offsets.to(ids.dtype)
    pooled = F.embedding_bag(ids, weight, offsets, mode="sum", sparse=True)
    pooled = pooled.view(-1, num_fields, weight.shape[1])
    if mean_pooled is not None and bool(mean_pooled.any()):
        ends = torch.cat([offsets[1:], offsets.new_tensor([ids.numel()])])
        lengths = (ends - offsets).view(-1, num_fields).clamp_min(1).to(pooled.dtype)
        divisor = torch.where(mean_pooled, lengths, torch.ones_like(lengths))
        pooled = pooled / divisor.unsqueeze(-1)
    return pooled
