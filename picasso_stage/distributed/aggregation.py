"""Local-batch gradients summed into one global batch: the math of GBA, no networking.

A `Contribution` is what one worker pushes after one local batch: the dense gradients,
the row-sparse gradients of the embedding tables it touched, the batch's sample count and
the token it pulled with. `aggregate` turns the M contributions of a global batch into the
one gradient the optimizer steps with. By default (row gradient "global-mean"):

- dense:  g   = sum_i n_i w_i g_i / B
- a row:  g_r = sum_{i touching r} n_i w_ir g_ir / B

n_i is contribution i's sample count, w its staleness weight (staleness.py; per row for
rows), and B the global batch's size: the sum over the M contributions of their configured
local batch size b_i (Contribution.batch_size), or of n_i where a worker says none. Each
local gradient g_i is the gradient of its batch's *mean* loss, as the Trainer computes it,
so n_i g_i is its summed loss's gradient, and g is the gradient of the global batch's loss
summed over its samples and divided by B: with fresh gradients (w = 1) exactly one Trainer
step on the M local batches concatenated (with loss_batch_size B), which is what
synchronous training is, for the dense weights and the rows alike. A short batch (a
source's last) weighs each of its samples 1 / B, as a short batch of local training does
(TrainConfig.loss_batch_size), rather than more.

The option "touched-mean" divides a row's sum by the sizes of only the contributions that
touched it (sum_{i touching r} b_i) instead of B: a rare id seen by one worker of M then
steps as if that worker's batch were the whole global batch, up to M times the gradient
one big batch would give it. It is what this project did before it followed one big batch,
kept for jobs tuned with it; the dense weights are the same under both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from picasso.train_choices import ROW_GRADIENTS  # how a row's summed gradient is divided


def check_batch_size(batch_size: object, whose: str) -> int:
    """A configured local batch size as pushes carry it: an integer >= 0 (0: unsaid)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise ValueError(f"{whose} batch_size must be an integer >= 0 (0: unsaid), got {batch_size!r}")
    return batch_size


def check_row_gradient(rule: str) -> str:
    if rule not in ROW_GRADIENTS:
        raise ValueError(f"row gradient must be one of {', '.join(ROW_GRADIENTS)}, got {rule!r}")
    return rule


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
    # range at most once (applied_ranges.py). Empty: the batch's sources say no starts, and it is
    # trained as it comes.
    ranges: dict[str, tuple[int, int] | list[tuple[int, int]]] = field(default_factory=dict)
    # Sent to shard 0 only, for the server's prequential evaluation (an endless job's
    # versions): the batch's labels and the scores the worker gave it before training on
    # it (test-then-train), and the event time of its newest event. None: not sent.
    labels: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    event_time_ms: int | None = None
    # The local batch size the worker is configured with: what this contribution adds to the
    # global batch's size B, short or full. 0: not said, and its samples count instead.
    batch_size: int = 0

    def __post_init__(self):
        if self.samples <= 0:
            raise ValueError(f"a contribution needs samples > 0, got {self.samples} (worker {self.worker!r})")
        check_batch_size(self.batch_size, f"worker {self.worker!r}: a contribution's")

    @property
    def weight_samples(self) -> int:
        """What this contribution adds to the global batch's size B."""
        return self.batch_size or self.samples


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


def aggregate(batch: list[Weighted], row_gradient: str = "global-mean") -> GlobalGradient:
    if not batch:
        raise ValueError("cannot aggregate an empty global batch")
    check_row_gradient(row_gradient)
    total = sum(w.contribution.samples for w in batch)
    size = float(sum(w.contribution.weight_samples for w in batch))  # B
    dense: dict[str, torch.Tensor] = {}
    for weighted in batch:
        c = weighted.contribution
        for name, grad in c.dense.items():
            scaled = grad.float() * (c.samples * weighted.dense_weight / size)
            dense[name] = dense[name] + scaled if name in dense else scaled
    tables = sorted({table for w in batch for table in w.contribution.sparse})
    touched = row_gradient == "touched-mean"
    sparse = {table: _aggregate_rows([w for w in batch if table in w.contribution.sparse], table,
                                     None if touched else size)
              for table in tables}
    scored = [w.contribution for w in batch if w.contribution.labels is not None]
    times = [w.contribution.event_time_ms for w in batch if w.contribution.event_time_ms is not None]
    return GlobalGradient(dense, sparse, total, tuple(w.contribution.worker for w in batch),
                          torch.cat([c.labels for c in scored]) if scored else None,
                          torch.cat([c.scores for c in scored]) if scored else None,
                          max(times, default=None))


def _aggregate_rows(batch: list[Weighted], table: str, size: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """size: B, what every row's sum is divided by; None: each row's own touching batches' sizes."""
    if len(batch) == 1 and _strictly_increasing(batch[0].contribution.sparse[table].rows):
        return _rows_of_one(batch[0], table, size)
    rows = torch.cat([w.contribution.sparse[table].rows for w in batch])
    grads = torch.cat([w.contribution.sparse[table].grads.float() * (w.row_weights[table] * w.contribution.samples)
                       .unsqueeze(1) for w in batch])
    distinct, inverse = torch.unique(rows, return_inverse=True)
    summed = torch.zeros(distinct.shape[0], grads.shape[1]).index_add_(0, inverse, grads)
    if size is not None:
        return distinct, summed / size
    sizes = torch.cat([torch.full((w.contribution.sparse[table].rows.shape[0],), float(w.contribution.weight_samples))
                       for w in batch])
    touched = torch.zeros(distinct.shape[0]).index_add_(0, inverse, sizes)
    return distinct, summed / touched.unsqueeze(1)


def _strictly_increasing(rows: torch.Tensor) -> bool:
    return rows.numel() < 2 or bool((rows[1:] > rows[:-1]).all())


def _rows_of_one(weighted: Weighted, table: str, size: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One contribution of distinct sorted rows (a worker's, from torch.unique): what the
    general path computes, with the same arithmetic (so the same bits), without its sort and
    scatter: each row is its own distinct row, touched by this contribution alone."""
    part = weighted.contribution.sparse[table]
    grads = part.grads.float() * (weighted.row_weights[table] * weighted.contribution.samples).unsqueeze(1)
    if size is not None:
        return part.rows, grads / size
    return part.rows, grads / torch.full((part.rows.shape[0], 1), float(weighted.contribution.weight_samples))
