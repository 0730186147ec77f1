"""What the models share: the lookup-then-dense-part split, the MLP, the flat input, the
first-order (linear) term and the projection of mixed embedding dims to one dim."""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from picasso.batch import TorchBatch
from picasso.sample_join.delayed_feedback import importance_weights
from picasso.dynamic_rows import RowResets, reset_new_rows
from picasso.embedding import FlatPooled, PackedEmbedding, lookup_together, share_bags
from picasso.packing import PackingPlan
from picasso.precision import DENSE_PRECISIONS, check_precision


class PackedModel(nn.Module):
    """A model in two parts: the embedding lookups, then `dense_part`.

    The split is where the work changes kind. Lookups go through PackedEmbedding, whose
    tables are buffers stepped by a fused sparse optimizer inside the backward pass;
    everything after is ordinary dense math on parameters (Adam's), which the trainer may
    wrap with torch.compile without the compiler ever meeting an embedding kernel.

    `dense_part(dense, pooled)` -> logits (N,): `dense` is (N, num_dense), possibly with 0
    columns; `pooled` is the output of every PackedEmbedding named in `lookups`, one after
    the other, each contributing one (N, fields of the group, width) tensor per group of
    its own plan, in that plan's order (an embedding's plan is the model's, or the part of
    it that feeds the deep or the wide part: PackingPlan.for_part).
    """

    lookups: tuple[str, ...] = ("embedding",)
    # Whether a weight per id enters the logit (Wide&Deep's wide part, DeepFM's first
    # order): where a cross that feeds only the wide part can go (models.build_model).
    wide_part: bool = False
    # Several lookups over one plan (Wide&Deep's deep and wide tables, DeepFM's first order)
    # share each group's ids: one kernel call per group looks them all up and, in the
    # backward pass, steps them all (stepped_lookup). Off: each embedding on its own, the
    # same arithmetic in more calls (the path the shared one is tested against).
    share_lookups: bool = True
    # Whether the dense part reads only its flat input (flat_input: the dense values, then
    # the first embedding's groups) of the first embedding's outputs: its lookup then writes
    # them into that input (embedding.FlatPooled), with share_lookups. Not for a dense part
    # that also reads the groups one by one (DeepFM's interaction): each group's gradient
    # would then be added into the whole input's.
    flat_lookup: bool = False
    dense_part: nn.Module
    precision: str = "fp32"  # the dense part's arithmetic (precision.DENSE_PRECISIONS); set by models.build_model

    def embeddings(self) -> list[PackedEmbedding]:
        """The PackedEmbedding modules, in the order their outputs enter `pooled`."""
        return [getattr(self, name) for name in self.lookups]

    def resolve(self, batch: TorchBatch, training: bool = False) -> tuple[TorchBatch, dict[str, RowResets]]:
        """The batch with its dynamic fields' keys mapped to rows (picasso.dynamic_rows),
        and, in training, the rows new keys took; a model without dynamic fields has
        nothing to map. Every batch goes through this before lookup or forward."""
        rows = self._modules.get("dynamic_rows")
        return (batch, {}) if rows is None else rows.resolve(batch, training)

    def reset_new_rows(self, ids: dict[str, torch.Tensor], resets: dict[str, RowResets]) -> None:
        """The first values of the rows new keys took, where `ids` (the step's) point."""
        reset_new_rows(self.embeddings(), ids, resets)

    def lookup(self, batch: TorchBatch) -> list[torch.Tensor]:
        embeddings = self.embeddings()
        if self.share_lookups and (self.flat_lookup or share_bags(embeddings)):
            return lookup_together(embeddings, batch.ids, batch.offsets, batch.dense if self.flat_lookup else None)
        return [p for embedding in embeddings for p in embedding(batch.ids, batch.offsets)]

    def forward(self, batch: TorchBatch) -> torch.Tensor:
        """Logits, shape (N,)."""
        return self.dense_logits(batch.dense, self.lookup(batch))

    def dense_logits(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        """The dense part's fp32 logits, computed in this model's precision."""
        with dense_autocast(self.precision, dense.device):
            return self.dense_part(dense, pooled).float()

    def backward(self, batch: TorchBatch, pooled: list[torch.Tensor], loss_batch: int | None = None) -> float:
        """The local step every mode takes: the batch's log loss from `pooled` (this
        model's lookups, or a GBA worker's of its pulled rows), and its backward pass,
        which leaves the dense gradients in .grad and sends the pooled embeddings' gradient
        through the fused kernels (a table stepped, or a worker's row gradients). Returns
        the loss summed over the batch's samples, before the update.

        The loss is the batch's mean, or with `loss_batch` its sum over loss_batch samples
        (the mean times num_samples / loss_batch), so that a short batch's samples weigh
        what a full one's do (see TrainConfig.loss_batch_size). A batch of loss_batch
        samples takes exactly the mean's step. GBA and sync workers send means, which
        their aggregation weighs by samples."""
        self.train()
        logits = self.dense_logits(batch.dense, pooled)
        # The batch's scores before this update: a GBA worker sends them with its push, for
        # the server's test-then-train evaluation, at no cost of a second forward pass.
        self.scores_before_update = torch.sigmoid(logits.detach().float())
        share = 1.0 if loss_batch is None else batch.num_samples / loss_batch
        if batch.late_share is None:
            loss = F.binary_cross_entropy_with_logits(logits, batch.label, reduction="mean")
            (loss if share == 1.0 else loss * share).backward()
            return float(loss.detach()) * batch.num_samples
        # A joined stream that corrects late labels: importance weights (delayed_feedback);
        # the summed loss reported is the unweighted one, comparable with other runs'.
        losses = F.binary_cross_entropy_with_logits(logits, batch.label, reduction="none")
        weights = importance_weights(torch.sigmoid(logits), batch.label, batch.late_share)
        weighted = (weights * losses).mean()
        (weighted if share == 1.0 else weighted * share).backward()
        return float(losses.detach().sum())


def dense_autocast(precision: str, device: torch.device):
    """Where the dense part runs: under bf16 autocast, or as it is (picasso.precision)."""
    check_precision(precision, DENSE_PRECISIONS)
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


class MLP(nn.Sequential):
    """Linear layers with ReLU between them, and dropout after each ReLU while training.

    Dropout is applied in forward rather than held as modules of its own, so the layers'
    state_dict keys are the same with or without it: a checkpoint trained without dropout
    warm-starts a run with it, and the other way round."""

    def __init__(self, *layers: nn.Module):
        super().__init__(*layers)
        self.dropout = 0.0  # set for the whole model by models.build_model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = layer(x)
            if self.dropout and isinstance(layer, nn.ReLU):
                x = F.dropout(x, self.dropout, self.training)
        return x


def mlp(sizes: list[int], last_relu: bool = False) -> MLP:
    """Linear layers with ReLU between them; `last_relu` when the output feeds another
    layer (DLRM's bottom MLP, DCN-v2's deep tower) rather than being a logit."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return MLP(*layers)


def flat_input(dense: torch.Tensor, pooled: list[torch.Tensor], groups: int | None = None) -> torch.Tensor:
    """(N, num_dense + Σ fields × width): dense values, then every field's embedding, of the
    first `groups` of `pooled` (None: all of them). A lookup that wrote them into such an
    input already (embedding.FlatPooled: a model with flat_lookup) gives that input itself,
    whose gradient the lookup's backward then reads in place."""
    if isinstance(pooled, FlatPooled):
        return pooled.flat
    embedded = pooled if groups is None else pooled[:groups]
    return torch.cat([dense] + [p.flatten(1) for p in embedded], dim=1)


def add_first_order(logit: torch.Tensor, dense: torch.Tensor, pooled_dim1: list[torch.Tensor],
                    dense_linear: nn.Linear | None) -> torch.Tensor:
    """logit + the linear term over every id (the dim-1 embeddings) and dense value: the
    wide part of Wide&Deep, the first-order part of FM."""
    for p in pooled_dim1:
        logit = logit + p.sum(dim=(1, 2))
    if dense_linear is not None:
        logit = logit + dense_linear(dense).squeeze(1)
    return logit


class CommonDim(nn.Module):
    """Every field's embedding at one dim, as (N, total fields, dim).

    FM and DLRM take dot products between fields, which needs one dim. When the plan's
    groups differ, each group narrower than the widest is mapped up to it by its own
    bias-free nn.Linear (learned with the dense part); a bias would add the same vector
    to every id of a field, which the embeddings can already learn. Groups already at the
    widest dim pass through untouched, so a single-dim plan (Criteo's) adds no weights
    and is exactly the model of the paper.
    """

    def __init__(self, plan: PackingPlan):
        super().__init__()
        self.dim = max(g.embedding_dim for g in plan.groups)
        self.num_fields = sum(g.num_fields for g in plan.groups)
        # A list in plan order, not a dict by group name: group names are the user's, and
        # one that is already a module attribute ("cuda", "training") cannot be a key.
        self.project = nn.ModuleList(
            nn.Identity() if g.embedding_dim == self.dim else nn.Linear(g.embedding_dim, self.dim, bias=False)
            for g in plan.groups
        )

    def forward(self, pooled: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([project(p) for project, p in zip(self.project, pooled)], dim=1)
