"""A worker's half of GBA: one local batch's gradients, computed against pulled parameters.

A worker holds no tables. For each batch it asks the parameter server for the distinct
rows the batch touches (per table) and the dense parameters, then:
- looks the bags up in a compact table of just those rows, a leaf that requires grad,
  through the fused kernels local training runs (embedding.lookup_with_row_gradients):
  kernels.lookup forward, and the fused backward, which here fills the table's gradient
  with each row's instead of stepping an optimizer;
- runs the model's dense part and takes the gradient of the batch's mean log loss, as the
  Trainer does;
and returns the dense gradients and, per table, the gradients of the rows it pulled.

The rows of a bag are all looked up: the decoders refuse bags longer than max_len, so no
id of a PackedBatch is cut by truncation (an id that were cut would still be pulled, and
add nothing to its row's gradient, as in a Trainer's step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from picasso.batch import TorchBatch
from picasso.distributed.aggregation import check_batch_size
from picasso.embedding import lookup_with_row_gradients
from picasso.models.common import PackedModel


@dataclass(frozen=True)
class Lookup:
    key: str  # the table's state-dict key
    prefix: str  # the PackedEmbedding's attribute name in the model
    group: str
    num_fields: int


@dataclass(frozen=True)
class LocalGradient:
    loss_sum: float  # summed per-sample log loss of the batch, before the update
    samples: int
    dense: dict[str, torch.Tensor]  # parameter name -> gradient of the batch's mean loss
    rows: dict[str, torch.Tensor]  # table key -> the distinct rows the batch touched
    row_grads: dict[str, torch.Tensor]  # table key -> (k, dim) their gradients
    scores: torch.Tensor | None = None  # the batch's predictions before the update
    batch_size: int = 0  # the worker's configured local batch (aggregation.Contribution.batch_size); 0: unsaid


class GradientComputer:
    def __init__(self, model: PackedModel, batch_size: int = 0):
        """batch_size: the local batch the worker is configured with, which its gradients
        carry to the aggregation (so that a short batch's samples weigh what a full one's
        do); 0: unsaid, each batch counts its own samples."""
        self.model, self.batch_size = model, check_batch_size(batch_size, "a worker's")
        self.lookups = [Lookup(f"{prefix}.table_{g.name}", prefix, g.name, g.num_fields)
                        for prefix in model.lookups for g in getattr(model, prefix).plan.groups]
        self.params = dict(model.named_parameters())

    def rows_needed(self, batch: TorchBatch) -> dict[str, torch.Tensor]:
        """Per table, the distinct rows the batch touches (sorted)."""
        return {lookup.key: torch.unique(batch.ids[lookup.group]) for lookup in self.lookups}

    def compute(self, batch: TorchBatch, dense: dict[str, torch.Tensor], rows: dict[str, torch.Tensor],
                values: dict[str, torch.Tensor]) -> LocalGradient:
        """rows: rows_needed(batch); values: each table's pulled values of those rows."""
        with torch.no_grad():
            for name, value in dense.items():
                self.params[name].copy_(value)
        compact = {key: values[key].detach().contiguous().requires_grad_(True) for key in rows}
        pooled = []
        for lookup in self.lookups:
            embedding = getattr(self.model, lookup.prefix)
            pulled_rows = rows[lookup.key]
            # An id's index in the compact table is its place among the sorted pulled rows.
            # Packing keeps each field's ids in a run of rows of its own, so a field's compact
            # ids form a run too, and the kernels may split their work by field as in a Trainer.
            local_ids = torch.searchsorted(pulled_rows, batch.ids[lookup.group])
            field_rows = torch.searchsorted(pulled_rows, getattr(embedding, f"field_rows_{lookup.group}"))
            pooled.append(lookup_with_row_gradients(
                compact[lookup.key], local_ids, batch.offsets[lookup.group], lookup.num_fields,
                getattr(embedding, f"mean_{lookup.group}"), getattr(embedding, f"max_len_{lookup.group}"), field_rows))
        self.model.zero_grad(set_to_none=True)
        loss_sum = self.model.backward(batch, pooled)  # the Trainer's step, the optimizer's update left to the server
        dense_grads = {name: p.grad.detach().clone() for name, p in self.params.items() if p.grad is not None}
        row_grads = {key: t.grad if t.grad is not None else torch.zeros_like(t) for key, t in compact.items()}
        return LocalGradient(loss_sum, batch.num_samples, dense_grads, rows, row_grads,
                             self.model.scores_before_update, self.batch_size)
