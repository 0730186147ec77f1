"""Pooled lookups whose backward pass steps the tables: of one table, or of several tables
that index the same rows with the same ids (Wide&Deep's deep and wide tables, DeepFM's
embeddings and first-order weights), in one kernel call each way.

Several tables looked up together cost one kernels.lookup_many and, in the backward pass,
one kernels.fused_update_many, which de-duplicates the batch's rows and splits the work
once for all of them instead of once per table. Each table keeps its own optimizer,
hyper-parameters, slots and step, and comes out exactly as it would alone: the kernels
sum each row's gradient in the same order either way.

This module knows tables, not embeddings: which embeddings' tables are looked up together
is PackedEmbedding's to say (embedding.py: share_bags, lookup_together).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from picasso import kernels
from picasso.kernels import SparseOptimizer


@dataclass(frozen=True)
class GroupBags:
    """One packing group's bags in a batch: what every table over the group's rows is
    looked up by, and what its update may split the work by."""

    ids: torch.Tensor
    offsets: torch.Tensor
    num_fields: int
    mean: torch.Tensor
    max_len: torch.Tensor
    # Each field's row bounds in the table, or None on a hot-row cache's fast tier, whose
    # rows are not ordered by field (its ids are still each field's own: see disjoint_fields).
    field_rows: torch.Tensor | None

    @property
    def disjoint_fields(self) -> bool:
        return self.field_rows is None


@dataclass(frozen=True)
class SteppedTable:
    """A table, and what its backward pass steps it with."""

    weight: torch.Tensor
    slots: list[torch.Tensor]
    optimizer: SparseOptimizer
    step: int  # the global step, counting from 1 (Adam's bias correction)


class _SteppedLookup(torch.autograd.Function):
    """kernels.lookup_many forward; backward: kernels.fused_update_many, each table stepped
    in place by its optimizer (the tables are buffers and get no gradient)."""

    @staticmethod
    def forward(ctx, anchor, bags: GroupBags, tables: tuple[SteppedTable, ...]):
        # An output the loss does not use gets no gradient (None, not zeros), and its table
        # is not stepped: as when each table has its own lookup, whose backward never runs.
        ctx.set_materialize_grads(False)
        ctx.bags, ctx.tables = bags, tables
        return tuple(kernels.lookup_many([t.weight for t in tables], bags.ids, bags.offsets, bags.num_fields,
                                         bags.mean, bags.max_len))

    @staticmethod
    def backward(ctx, *grads):
        _step_tables(ctx.bags, ctx.tables, grads)
        return None, None, None


def _step_tables(bags: GroupBags, tables: Sequence[SteppedTable], grads: Sequence[torch.Tensor | None]) -> None:
    """The fused update of each table whose output got a gradient (None: unused, unstepped)."""
    stepped = [(table, grad) for table, grad in zip(tables, grads, strict=True) if grad is not None]
    if stepped:
        kernels.fused_update_many(
            [t.weight for t, _ in stepped], [t.slots for t, _ in stepped], bags.ids, bags.offsets,
            [grad for _, grad in stepped], bags.num_fields, [t.optimizer for t, _ in stepped],
            [t.step for t, _ in stepped], bags.mean, bags.max_len, bags.field_rows, bags.disjoint_fields)


def pooled_tables(bags: GroupBags, tables: Sequence[SteppedTable], training: bool) -> list[torch.Tensor]:
    """Each table's pooled bags, (N, fields of the group, dim); in training, with the
    backward pass that steps the tables."""
    if not training:
        return kernels.lookup_many([t.weight for t in tables], bags.ids, bags.offsets, bags.num_fields, bags.mean,
                                   bags.max_len)
    # A zero-size input that requires grad makes autograd call backward.
    anchor = torch.empty(0, requires_grad=True)
    return list(_SteppedLookup.apply(anchor, bags, tuple(tables)))


@dataclass(frozen=True)
class GroupLookup:
    """One group's tables in a lookup into a flat input (pooled_into_flat): per table, the
    column of the flat input its pooled bags start at, or None for an output of its own."""

    bags: GroupBags
    tables: tuple[SteppedTable, ...]
    columns: tuple[int | None, ...]


def _columns(flat: torch.Tensor, column: int, bags: GroupBags, table: SteppedTable) -> torch.Tensor:
    """The (N, fields, dim) view of the flat input's columns that hold a table's bags."""
    width = bags.num_fields * table.weight.shape[1]
    return flat[:, column:column + width].unflatten(1, (bags.num_fields, table.weight.shape[1]))


def _pool_into(flat: torch.Tensor, lookups: Sequence[GroupLookup]) -> list[torch.Tensor]:
    """Every table's pooled bags, those with a column written into `flat`; returns the
    others, in order."""
    own = []
    for look in lookups:
        bags = look.bags
        into = [None if column is None else _columns(flat, column, bags, table)
                for table, column in zip(look.tables, look.columns, strict=True)]
        outs = kernels.lookup_many([t.weight for t in look.tables], bags.ids, bags.offsets, bags.num_fields,
                                   bags.mean, bags.max_len, into)
        own += [out for out, column in zip(outs, look.columns) if column is None]
    return own


class _SteppedFlatLookup(torch.autograd.Function):
    """pooled_into_flat in training: its backward steps each table by the gradient of its
    columns of the flat input, read in place, or of its own output."""

    @staticmethod
    def forward(ctx, anchor, dense, lookups: tuple[GroupLookup, ...], width: int):
        ctx.set_materialize_grads(False)
        ctx.lookups = lookups
        flat = _flat_with(dense, width)
        return (flat, *_pool_into(flat, lookups))

    @staticmethod
    def backward(ctx, flat_grad, *own_grads):
        own = iter(own_grads)

        def grad_of(look: GroupLookup, table: SteppedTable, column: int | None) -> torch.Tensor | None:
            if column is None:
                return next(own)
            return None if flat_grad is None else _columns(flat_grad, column, look.bags, table)

        for look in ctx.lookups:
            _step_tables(look.bags, look.tables,
                         [grad_of(look, table, column) for table, column in zip(look.tables, look.columns)])
        return None, None, None, None


def _flat_with(dense: torch.Tensor, width: int) -> torch.Tensor:
    flat = torch.empty(dense.shape[0], width, dtype=torch.float32, device=dense.device)
    flat[:, : dense.shape[1]] = dense
    return flat


def pooled_into_flat(dense: torch.Tensor, lookups: Sequence[GroupLookup], width: int,
                     training: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A dense part's flat input, (N, width): the dense values, then the pooled bags of every
    table given a column, which the lookup writes there itself; and the pooled bags of the
    others (N, fields, dim), in order. In training, the backward pass steps the tables, each
    reading its columns of the flat input's gradient in place: no concatenation forward and
    no copy of its slices backward."""
    if not training:
        flat = _flat_with(dense, width)
        return flat, _pool_into(flat, lookups)
    anchor = torch.empty(0, requires_grad=True)  # as pooled_tables': autograd then calls backward
    flat, *own = _SteppedFlatLookup.apply(anchor, dense, tuple(lookups), width)
    return flat, own
