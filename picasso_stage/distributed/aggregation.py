"""Local-batch gradients summed into one global batch: the math of GBA, no networking.

A `Contribution` is what one worker pushes after one local batch: the dense gradients,
the row-sparse gradients of the embedding tables it touched, the batch's sample count and
the token it pulled with. `aggregate` turns the M contributions of a global batch into the
one gradient the optimizer steps with:

- dense:  g = sum_i n_i w_i g_i / sum_i n_i
- a row:  g_r = sum_{i touching r} n_i w_ir g_ir / sum_{i touching r} n_i

n_i is contribution i's sample count and w its staleness weight (staleness.py; per row
for rows). With fresh gradients (w = 1) and equal local batches the dense part is the mean
of the local gradients: exactly synchronous all-reduce's gradient of the global batch's
mean loss. A row is averaged only over the contributions whose batches held its id: a row
seen by one worker of M is not shrunk M-fold, which would make rare ids learn M times more
slowly than in one process.

Each local gradient is the gradient of its batch's *mean* loss, as the Trainer computes
it, so weighting by n_i recovers the global batch's mean when batch sizes differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class RowGradient:
    """Gradients of some rows of one table: rows (k,) distinct int64, grads (k, dim)
    float32, and each row's version (how many times the shard had updated it) when the
    worker pulled it, which gives the row's own staleness."""

    rows: torch.Tensor
    grads: torch.Tensor
    versions: torch.Tensor

    def __post_init__(self):
        k = self.rows.shape[0]
        if self.rows.dim() != 1 or self.grads.dim() != 2 or self.grads.shape[0] != k or self.versions.shape != (k,):
            raise ValueError(f"row gradient shapes disagree: rows {tuple(self.rows.shape)}, "
                             f"grads {tuple(self.grads.shape)}, versions {tuple(self.versions.shape)}")


@dataclass(frozen=True)
class Contribution:
    """One worker's gradients of one local batch."""

    worker: str
    token: int  # the shard's global step when the worker pulled
    samples: int  # the local batch's size (> 0)
    dense: dict[str, torch.Tensor] = field(default_factory=dict)  # parameter name -> gradient
    sparse: dict[str, RowGradient] = field(default_factory=dict)  # table name -> row gradients
    # Where the batch ends in its sources (source -> next row/offset), sent to shard 0 only:
    # a checkpoint records a batch's positions once its gradient is applied (or dropped as too stale).
    positions: dict[str, int] = field(default_factory=dict)
    # The worker's count of its pushes before this one (-1: not numbered). Pushes of one
    # worker may reach a shard out of order; shard 0 records positions in this order.
    sequence: int = -1
    # Per source, the batch's [start, end), or a list of ranges where the batch is a set of
    # positions (a joined stream's samples: picasso.sample_identity): every shard trains a
    # range at most once (ledger.py). Empty: the batch's sources say no starts, and it is
    # trained as it comes.
    ranges: dict[str, tuple[int, int] | list[tuple[int, int]]] = field(default_factory=dict)
    # Sent to shard 0 only, for the server's prequential evaluation (an endless job's
    # versions): the batch's labels and the scores the worker gave it before training on
    # it (test-then-train), and the event time of its newest event. None: not sent.
    labels: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    event_time_ms: int | None = None

    def __post_init__(self):
        if self.samples <= 0:
            raise ValueError(f"a contribution needs samples > 0, got {self.samples} (worker {self.worker!r})")


@dataclass(frozen=True)
class Weighted:
    """A contribution accepted into the global batch, with its staleness weights."""

    contribution: Contribution
    dense_weight: float
    row_weights: dict[str, torch.Tensor]  # table -> (k,) float32, one per row of its RowGradient


@dataclass(frozen=True)
class GlobalGradient:
    """The gradient one optimizer step applies."""

    dense: dict[str, torch.Tensor]
    sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]  # table -> (distinct rows, (k, dim) grads)
    samples: int  # summed over the contributions
    workers: tuple[str, ...]  # who contributed, one entry per contribution
    # The contributions' labels and scores (those that sent them), in their order, and the
    # newest event time among them: what this step adds to the server's prequential window.
    labels: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    event_time_ms: int | None = None


def aggregate(batch: list[Weighted]) -> GlobalGradient:
    if not batch:
        raise ValueError("cannot aggregate an empty global batch")
    total = sum(w.contribution.samples for w in batch)
    dense: dict[str, torch.Tensor] = {}
    for weighted in batch:
        c = weighted.contribution
        for name, grad in c.dense.items():
            scaled = grad.float() * (c.samples * weighted.dense_weight / total)
            dense[name] = dense[name] + scaled if name in dense else scaled
    tables = sorted({table for w in batch for table in w.contribution.sparse})
    sparse = {table: _aggregate_rows([w for w in batch if table in w.contribution.sparse], table) for table in tables}
    scored = [w.contribution for w in batch if w.contribution.labels is not None]
    times = [w.contribution.event_time_ms for w in batch if w.contribution.event_time_ms is not None]
    return GlobalGradient(dense, sparse, total, tuple(w.contribution.worker for w in batch),
                          torch.cat([c.labels for c in scored]) if scored else None,
                          torch.cat([c.scores for c in scored]) if scored else None,
                          max(times, default=None))


def _aggregate_rows(batch: list[Weighted], table: str) -> tuple[torch.Tensor, torch.Tensor]:
    if len(batch) == 1 and _strictly_increasing(batch[0].contribution.sparse[table].rows):
        return _rows_of_one(batch[0], table)
    rows = torch.cat([w.contribution.sparse[table].rows for w in batch])
    grads = torch.cat([w.contribution.sparse[table].grads.float() * (w.row_weights[table] * w.contribution.samples)
                       .unsqueeze(1) for w in batch])
    samples = torch.cat([torch.full((w.contribution.sparse[table].rows.shape[0],), float(w.contribution.samples))
                         for w in batch])
    distinct, inverse = torch.unique(rows, return_inverse=True)
    summed = torch.zeros(distinct.shape[0], grads.shape[1]).index_add_(0, inverse, grads)
    touched = torch.zeros(distinct.shape[0]).index_add_(0, inverse, samples)
    return distinct, summed / touched.unsqueeze(1)


def _strictly_increasing(rows: torch.Tensor) -> bool:
    return rows.numel() < 2 or bool((rows[1:] > rows[:-1]).all())


def _rows_of_one(weighted: Weighted, table: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One contribution of distinct sorted rows (a worker's, from torch.unique): what the
    general path computes, with the same arithmetic (so the same bits), without its sort and
    scatter: each row is its own distinct row, touched by this contribution's samples."""
    part, samples = weighted.contribution.sparse[table], float(weighted.contribution.samples)
    grads = part.grads.float() * (weighted.row_weights[table] * weighted.contribution.samples).unsqueeze(1)
    return part.rows, grads / torch.full((part.rows.shape[0], 1), samples)
