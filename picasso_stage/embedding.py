"""PackedEmbedding: one table per packing group, one fused lookup and one fused update per
group per step.

The tables and their optimizer slots are buffers, not parameters: autograd never builds a
gradient for them. The backward pass of the lookup applies the sparse optimizer directly
to the rows the batch touched (see stepped_lookup), the way FBGEMM's table-batched
embeddings do. So a training step is: forward, loss.backward() (which also steps every
embedding table), then the dense optimizer's step. A GBA worker, which steps nothing, takes
the rows' gradients from the same backward instead (lookup_with_row_gradients).

Several embeddings over one plan (a model's deep and wide parts) may be looked up together,
one kernel call per group for all of them (share_bags, lookup_together).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from picasso import big_tier, kernels
from picasso.kernels import SparseOptimizer
from picasso.packing import PackedGroup, PackingPlan
from picasso.stepped_lookup import GroupBags, GroupLookup, SteppedTable, pooled_into_flat, pooled_tables


class _RowGradientLookup(torch.autograd.Function):
    """kernels.lookup forward; backward: the table's gradient, each row's, from
    kernels.row_gradients, the same fused backward that steps the tables in local training
    (stepped_lookup). So every update mode takes its step's arithmetic from the same kernels."""

    @staticmethod
    def forward(ctx, weight, bags: GroupBags):
        ctx.bags, ctx.table_shape = bags, weight.shape
        return kernels.lookup(weight, bags.ids, bags.offsets, bags.num_fields, bags.mean, bags.max_len)

    @staticmethod
    def backward(ctx, grad):
        b = ctx.bags
        return kernels.row_gradients(*ctx.table_shape, b.ids, b.offsets, grad, b.num_fields, b.mean, b.max_len,
                                     b.field_rows, False), None


def lookup_with_row_gradients(weight: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, num_fields: int,
                              mean_pooled: torch.Tensor, max_len: torch.Tensor,
                              field_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Pooled bags of `weight`, a leaf that requires grad, as (N, num_fields, dim): the
    backward pass leaves each row's gradient in weight.grad, summed by the fused kernels.
    For a GBA worker, whose table is a compact leaf of the rows it pulled.
    field_rows: as kernels.fused_update's, row bounds of each field's ids in `weight`."""
    return _RowGradientLookup.apply(weight, GroupBags(ids, offsets, num_fields, mean_pooled, max_len, field_rows))


class PackedEmbedding(nn.Module):
    """Embedding tables laid out by a PackingPlan, trained by a fused sparse optimizer.

    `dim` overrides every group's embedding dim (the wide part of a model uses dim=1 over
    the same rows). `optimizer` is the default for groups whose fields name none.
    """

    def __init__(self, plan: PackingPlan, dim: int | None = None, init_scale: float = 0.05,
                 optimizer: SparseOptimizer = SparseOptimizer()):
        super().__init__()
        self.plan = plan
        self.init_scale = init_scale  # also a dynamic table's new rows' (kernels.id_map_reset_rows)
        self.group_dims = {g.name: dim or g.embedding_dim for g in plan.groups}
        for group in plan.groups:
            width = self.group_dims[group.name]
            # In memory on huge pages, or a file of the cache's big tier (big_tier).
            table = big_tier.uniform(group.num_rows, width, -init_scale, init_scale, f"table_{group.name}")
            self.register_buffer(f"table_{group.name}", table)
            self.register_buffer(f"mean_{group.name}", torch.tensor(group.mean_pooled), persistent=False)
            self.register_buffer(f"max_len_{group.name}", torch.tensor(group.max_len), persistent=False)
            # Each field's ids stay in its own rows (packing adds the row offsets), which
            # lets the update kernel split its work by field.
            bounds = torch.tensor([*group.row_offsets, group.num_rows], dtype=torch.int64)
            self.register_buffer(f"field_rows_{group.name}", bounds, persistent=False)
        # Training steps taken (Adam's bias correction counts them); checkpointed with the tables.
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.configure_optimizer(optimizer)
        # Set by a HotCache (picasso.cache): per group, the fast tier that lookups then read
        # and update, with ids given as fast-tier indices. The tables stay the big tier.
        self.fast_tiers: dict = {}

    def configure_optimizer(self, default: SparseOptimizer) -> None:
        """Set each group's sparse optimizer (its fields' choice, else `default`, with
        default's hyper-parameters) and give it fresh, zeroed slots."""
        self.optimizers: dict[str, SparseOptimizer] = {}
        for group in self.plan.groups:
            optimizer = replace(default, name=group.optimizer or default.name)
            self.optimizers[group.name] = optimizer
            for i in range(2):  # drop the slots of a previous optimizer
                dropped = self._buffers.pop(f"slot{i}_{group.name}", None)
                if dropped is not None:
                    big_tier.discard(dropped)
            table = getattr(self, f"table_{group.name}")
            for i, shape in enumerate(optimizer.slot_shapes(*table.shape)):
                name = f"slot{i}_{group.name}"
                slot = big_tier.zeros(shape, name) if table.device.type == "cpu" else torch.zeros(
                    shape, device=table.device)
                self.register_buffer(name, slot)

    def has_group(self, group: str) -> bool:
        """Whether this embedding has a table of `group` (a model's part, packing.for_part)."""
        return group in self.group_dims

    @property
    def tables(self) -> dict[str, torch.Tensor]:
        return {g.name: getattr(self, f"table_{g.name}") for g in self.plan.groups}

    def slots(self, group: str) -> list[torch.Tensor]:
        count = len(self.optimizers[group].slot_shapes(0, 0))
        return [getattr(self, f"slot{i}_{group}") for i in range(count)]

    def _apply(self, fn, recurse=True):
        """Module.to() and friends; with a cache, the tables (the big tier) stay on the host."""
        if not self.fast_tiers:
            return super()._apply(fn, recurse)
        order = list(self._buffers)
        held = {name: self._buffers.pop(name) for name in order if name.startswith(("table_", "slot"))}
        try:
            return super()._apply(fn, recurse)
        finally:
            self._buffers.update(held)
            self._buffers = {name: self._buffers[name] for name in order}

    def _storage(self, group: str) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
        """The weight and slots lookups use, and the field row bounds (None on a fast tier,
        whose slots are not ordered by field)."""
        tier = self.fast_tiers.get(group)
        if tier is not None:
            return tier.fast[0], tier.fast[1:], None
        return getattr(self, f"table_{group}"), self.slots(group), getattr(self, f"field_rows_{group}")

    def reset_rows(self, group: str, targets: torch.Tensor, keys: torch.Tensor) -> None:
        """Give the rows at `targets` (of the table, or of its fast tier with a cache) the
        first values of a dynamic table's new rows for `keys`, and zero their slots."""
        weight, slots, _ = self._storage(group)
        kernels.id_map_reset_rows(weight, slots, targets, keys, self.init_scale)

    def output_dim(self) -> int:
        return sum(g.num_fields * self.group_dims[g.name] for g in self.plan.groups)

    def forward(self, ids: dict[str, torch.Tensor], offsets: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Per group, the pooled embeddings as (N, fields of the group, dim).

        In training mode with autograd on, the backward pass steps the tables.
        """
        training = self.start_step()
        return [self.lookup_group(g, ids[g.name], offsets[g.name], training) for g in self.plan.groups]

    def start_step(self) -> bool:
        """Whether a lookup now trains (training mode, autograd on); if it does, count the step."""
        training = self.training and torch.is_grad_enabled()
        if training:
            self.steps += 1
        return training

    def lookup_group(self, group: PackedGroup, ids: torch.Tensor, offsets: torch.Tensor,
                     training: bool) -> torch.Tensor:
        """One group's pooled embeddings; in training (the step counted), with the backward
        pass that steps its table."""
        return pooled_tables(self.group_bags(group, ids, offsets), [self.stepped_table(group)], training)[0]

    def group_bags(self, group: PackedGroup, ids: torch.Tensor, offsets: torch.Tensor) -> GroupBags:
        _, _, field_rows = self._storage(group.name)
        return GroupBags(ids, offsets, group.num_fields, getattr(self, f"mean_{group.name}"),
                         getattr(self, f"max_len_{group.name}"), field_rows)

    def stepped_table(self, group: PackedGroup) -> SteppedTable:
        weight, slots, _ = self._storage(group.name)
        return SteppedTable(weight, slots, self.optimizers[group.name], int(self.steps))


def share_bags(embeddings: Sequence[PackedEmbedding]) -> bool:
    """Whether the embeddings can be looked up together: several, over one plan or parts
    of one plan (so one batch's ids index the same rows of each group they share), in one
    mode."""
    first = embeddings[0]
    return len(embeddings) > 1 and all(e.plan.root is first.plan.root and e.training == first.training
                                       for e in embeddings)


class FlatPooled(list):
    """What lookup_together gives with a flat input: the pooled outputs as ever, with
    `flat`, the dense part's input (N, dense values + the first embedding's widths), which
    holds the dense values and then the first embedding's groups. Those groups' outputs are
    views of it, and the lookup wrote them there: models.common.flat_input takes it as it is."""

    def __init__(self, pooled: list[torch.Tensor], flat: torch.Tensor):
        super().__init__(pooled)
        self.flat = flat


def lookup_together(embeddings: Sequence[PackedEmbedding], ids: dict[str, torch.Tensor],
                    offsets: dict[str, torch.Tensor], flat_dense: torch.Tensor | None = None) -> list[torch.Tensor]:
    """What each embedding's forward gives, one embedding after the other (see share_bags
    for when it applies), with one kernel call per group for all the embeddings that have
    it (a cross may feed one part of a model alone: packing); a group that a hot-row cache
    holds in fast tiers (one per embedding, each with its own rows) takes each embedding's
    own lookup.

    flat_dense: the batch's dense values, for a model whose dense part starts from the
    dense values and the first embedding's groups side by side (models.common.flat_input):
    the lookup then writes those groups into that input and returns a FlatPooled. Not with
    a hot-row cache's fast tiers, whose lookups are each embedding's own."""
    training = [e.start_step() for e in embeddings][0]
    groups = embeddings[0].plan.root.groups
    fast = any(e.fast_tiers.get(g.name) is not None for e in embeddings for g in groups)
    if flat_dense is not None and not fast:
        return _lookup_into_flat(embeddings, ids, offsets, flat_dense, training)
    pooled: list[dict[str, torch.Tensor]] = [{} for _ in embeddings]
    for group in groups:
        having = [i for i, e in enumerate(embeddings) if e.has_group(group.name)]
        group_ids, group_offsets = ids[group.name], offsets[group.name]
        if any(embeddings[i].fast_tiers.get(group.name) is not None for i in having):
            outs = [embeddings[i].lookup_group(group, group_ids, group_offsets, training) for i in having]
        else:
            bags = embeddings[having[0]].group_bags(group, group_ids, group_offsets)
            outs = pooled_tables(bags, [embeddings[i].stepped_table(group) for i in having], training)
        for i, out in zip(having, outs):
            pooled[i][group.name] = out
    return [pooled[i][g.name] for i, e in enumerate(embeddings) for g in e.plan.groups]


def _lookup_into_flat(embeddings: Sequence[PackedEmbedding], ids: dict[str, torch.Tensor],
                      offsets: dict[str, torch.Tensor], dense: torch.Tensor, training: bool) -> FlatPooled:
    first = embeddings[0]
    columns, width = {}, dense.shape[1]  # where each of the first embedding's groups starts
    for group in first.plan.groups:
        columns[group.name] = width
        width += group.num_fields * first.group_dims[group.name]
    lookups, order = [], []  # order: (embedding, group) of each output pooled_into_flat returns
    for group in first.plan.root.groups:
        having = [i for i, e in enumerate(embeddings) if e.has_group(group.name)]
        bags = embeddings[having[0]].group_bags(group, ids[group.name], offsets[group.name])
        lookups.append(GroupLookup(bags, tuple(embeddings[i].stepped_table(group) for i in having),
                                   tuple(columns[group.name] if i == 0 else None for i in having)))
        order += [(i, group.name) for i in having if i != 0]
    flat, own = pooled_into_flat(dense, lookups, width, training)
    pooled: list[dict[str, torch.Tensor]] = [{} for _ in embeddings]
    pooled[0] = {g.name: flat[:, columns[g.name]:columns[g.name] + g.num_fields * first.group_dims[g.name]]
                 .unflatten(1, (g.num_fields, first.group_dims[g.name])) for g in first.plan.groups}
    for (i, name), out in zip(order, own, strict=True):
        pooled[i][name] = out
    return FlatPooled([pooled[i][g.name] for i, e in enumerate(embeddings) for g in e.plan.groups], flat)
