"""Reference kernels in plain torch: the definition every fast path is tested against.

A packed table holds the rows of several fields. One batch touches it through bags: bag
b = sample * num_fields + field holds ids[offsets[b] : offsets[b + 1]] (the last bag runs
to the end of ids), truncated to the field's max_len when one is given. A bag pools its
rows by sum, or by mean for mean-pooled fields (an empty bag pools to zeros). Callers
guarantee ids in [0, rows), non-decreasing offsets and steps counted from 1; the fast
kernels do not check them (PackedBatch and PackedEmbedding hold to them by construction).

The backward pass is fused with the optimizer: the gradient of each touched row is summed
over its occurrences and applied at once, so no dense gradient of the table ever exists.
`row_gradients` is that backward pass without the step, for a table of just the rows a
batch touches (a GBA worker's pulled rows), whose gradients are what the worker sends.
The hot-row cache's bookkeeping is here too (see picasso/cache.py): `map_to_slots` turns a
batch's ids into fast-tier indices, `copy_rows` moves rows between tiers, `sketch_add`
counts rows in a count-min sketch.

Optimizers (all with the rows' own slots):
- sgd:     w -= lr * g
- adagrad: row-wise, one slot per row: s += mean(g²); w -= lr * g / (sqrt(s) + eps)
- adagrad_elementwise: torch.optim.Adagrad's, one slot per value: s += g²;
           w -= lr * g / (sqrt(s) + eps); dim times the state of row-wise, for runs that
           must match a torch.optim.Adagrad model exactly
- adam:    lazy, only touched rows move: m = b1·m + (1-b1)·g; v = b2·v + (1-b2)·g²;
           w -= lr · (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), t the global step.
- weight_decay (any of them): coupled L2, lazy. Each row a step touches first takes
           g += weight_decay · w (w its float32 value before the step), so the slots see
           the decayed gradient too (row-wise adagrad: s += mean((g + wd·w)²)); rows not in
           the batch are not decayed. FBGEMM's WeightDecayMode.L2, TF's sparse L2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

OPTIMIZERS = ("sgd", "adagrad", "adagrad_elementwise", "adam")


@dataclass(frozen=True)
class SparseOptimizer:
    name: str = "adagrad"
    lr: float = 0.05
    eps: float = 1e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"sparse optimizer must be one of {OPTIMIZERS}, got {self.name!r}")
        decay = self.weight_decay
        # bool is an int: True would pass silently as a decay of 1.
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not (math.isfinite(decay) and decay >= 0):
            raise ValueError(f"weight_decay must be a finite float >= 0, got {decay!r}")

    def slot_shapes(self, rows: int, dim: int) -> list[tuple[int, ...]]:
        """Shapes of the per-row optimizer slots of a (rows, dim) table."""
        return {"sgd": [], "adagrad": [(rows,)], "adagrad_elementwise": [(rows, dim)],
                "adam": [(rows, dim), (rows, dim)]}[self.name]


def bag_lengths(ids: torch.Tensor, offsets: torch.Tensor, num_fields: int, max_len: torch.Tensor | None) -> torch.Tensor:
    """(num_bags,) effective lengths, after truncation to max_len."""
    ends = torch.cat([offsets[1:], offsets.new_tensor([ids.numel()])])
    lengths = (ends - offsets).to(torch.int64)
    if max_len is not None:
        lengths = torch.minimum(lengths.view(-1, num_fields), max_len.to(torch.int64)).reshape(-1)
    return lengths


def _occurrences(ids, offsets, num_fields, mean_pooled, max_len):
    """For every id kept after truncation: its row, its bag, and the bag's pooling scale."""
    offsets = offsets.to(torch.int64)
    lengths = bag_lengths(ids, offsets, num_fields, max_len)
    bags = torch.repeat_interleave(torch.arange(offsets.numel(), device=ids.device), lengths)
    starts = torch.repeat_interleave(offsets, lengths)
    first_of_bag = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    positions = starts + torch.arange(bags.numel(), device=ids.device) - first_of_bag
    scale = torch.ones(offsets.numel(), device=ids.device)
    if mean_pooled is not None:
        mean = mean_pooled.to(torch.bool).repeat(offsets.numel() // num_fields)
        scale = torch.where(mean & (lengths > 0), 1.0 / lengths.clamp_min(1).to(torch.float32), scale)
    return ids[positions], bags, scale


def lookup(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    num_fields: int,
    mean_pooled: torch.Tensor | None = None,
    max_len: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool every bag of one packed table; returns (num_samples, num_fields, dim)."""
    rows, bags, scale = _occurrences(ids, offsets, num_fields, mean_pooled, max_len)
    pooled = torch.zeros(offsets.numel(), weight.shape[1], dtype=weight.dtype, device=weight.device)
    pooled.index_add_(0, bags, weight[rows] * scale[bags].unsqueeze(1).to(weight.dtype))
    return pooled.view(-1, num_fields, weight.shape[1])


def _summed_row_gradients(ids, offsets, grad, dim, num_fields, mean_pooled, max_len):
    """The distinct rows the kept ids touch (sorted), and each one's float32 gradient: the
    gradients of its bags, scaled by their pooling, summed over its occurrences."""
    rows, bags, scale = _occurrences(ids, offsets, num_fields, mean_pooled, max_len)
    unique, inverse = torch.unique(rows, return_inverse=True)
    grad_bags = grad.reshape(-1, dim)
    g = torch.zeros(unique.numel(), dim, dtype=torch.float32, device=grad.device)
    g.index_add_(0, inverse, grad_bags[bags].float() * scale[bags].unsqueeze(1))
    return unique, g


def fused_update(
    weight: torch.Tensor,
    slots: list[torch.Tensor],
    ids: torch.Tensor,
    offsets: torch.Tensor,
    grad: torch.Tensor,
    num_fields: int,
    optimizer: SparseOptimizer,
    step: int,
    mean_pooled: torch.Tensor | None = None,
    max_len: torch.Tensor | None = None,
    field_rows: torch.Tensor | None = None,
    disjoint_fields: bool = False,
) -> None:
    """Backward of `lookup` and the optimizer step in one: updates weight and slots in place.

    grad: (num_samples, num_fields, dim), the gradient of lookup's output. step: the global
    step, counting from 1 (Adam's bias correction). field_rows: optionally, num_fields + 1
    row bounds with field f's ids in [field_rows[f], field_rows[f + 1]) (true of every
    PackedBatch); it changes no result, and lets fast kernels split the work by field.
    disjoint_fields: the weaker promise that no id occurs in two fields (true of a hot-row
    cache's fast tier); it too changes no result, and lets fast kernels split by field.
    """
    unique, g = _summed_row_gradients(ids, offsets, grad, weight.shape[1], num_fields, mean_pooled, max_len)
    if unique.numel() == 0:
        return
    w = weight[unique].float()
    if optimizer.weight_decay:  # coupled L2 (see the module docstring); g is this call's own sum
        g.add_(w, alpha=optimizer.weight_decay)
    if optimizer.name == "sgd":
        w -= optimizer.lr * g
    elif optimizer.name == "adagrad":
        (state,) = slots
        s = state[unique] + g.pow(2).mean(dim=1)
        state[unique] = s
        w -= optimizer.lr * g / (s.sqrt().unsqueeze(1) + optimizer.eps)
    elif optimizer.name == "adagrad_elementwise":
        (state,) = slots
        s = state[unique] + g.pow(2)
        state[unique] = s
        w -= optimizer.lr * g / (s.sqrt() + optimizer.eps)
    else:
        m_slot, v_slot = slots
        m = optimizer.beta1 * m_slot[unique] + (1 - optimizer.beta1) * g
        v = optimizer.beta2 * v_slot[unique] + (1 - optimizer.beta2) * g.pow(2)
        m_slot[unique], v_slot[unique] = m, v
        m_hat = m / (1 - optimizer.beta1**step)
        v_hat = v / (1 - optimizer.beta2**step)
        w -= optimizer.lr * m_hat / (v_hat.sqrt() + optimizer.eps)
    weight[unique] = w.to(weight.dtype)


def row_gradients(
    num_rows: int,
    dim: int,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    grad: torch.Tensor,
    num_fields: int,
    mean_pooled: torch.Tensor | None = None,
    max_len: torch.Tensor | None = None,
    field_rows: torch.Tensor | None = None,
    disjoint_fields: bool = False,
) -> torch.Tensor:
    """Backward of `lookup` alone: the (num_rows, dim) float32 gradient of a table of
    num_rows rows, each row's summed over its occurrences, zero where no kept id falls.

    Arguments as fused_update's; the table is typically compact (ids index the distinct
    rows a batch touches), so this dense gradient is the size of the batch, not the table.
    """
    out = torch.zeros(num_rows, dim, dtype=torch.float32, device=grad.device)
    unique, g = _summed_row_gradients(ids, offsets, grad, dim, num_fields, mean_pooled, max_len)
    out[unique] = g
    return out


# A fast backend's row_gradients is its own fused_update, stepping plain SGD at lr = -1 on a
# zero table: w -= lr * g then leaves exactly g (negating is exact, and so is 0 + g, fused
# or not). So a GBA worker's row gradients come out of the very kernel that steps the
# tables in local training, with its truncation, pooling and split of the work, and no
# second kernel has to be kept in step with it.
_ADD_GRADIENT = SparseOptimizer("sgd", lr=-1.0)


def row_gradients_by_sgd_step(fused_update):
    """row_gradients for a backend, from that backend's fused_update."""

    def row_gradients(num_rows, dim, ids, offsets, grad, num_fields, mean_pooled=None, max_len=None,
                      field_rows=None, disjoint_fields=False):
        """See reference.row_gradients."""
        out = torch.zeros(num_rows, dim, dtype=torch.float32, device=grad.device)
        fused_update(out, [], ids, offsets, grad, num_fields, _ADD_GRADIENT, 1, mean_pooled, max_len, field_rows,
                     disjoint_fields)
        return out

    return row_gradients



# Several tables over the same rows, ids and offsets (Wide&Deep's deep and wide tables):
# the ops of one table, table by table. That is the definition of lookup_many and
# fused_update_many (each table's result is exactly that of a call of its own), and the
# many-table ops of a backend that has no fused ones.
def lookup_each(lookup):
    """lookup_many from a backend's lookup: one (num_samples, num_fields, dim) per table."""

    def lookup_many(weights, ids, offsets, num_fields, mean_pooled=None, max_len=None):
        return [lookup(weight, ids, offsets, num_fields, mean_pooled, max_len) for weight in weights]

    return lookup_many


def fused_update_each(fused_update):
    """fused_update_many from a backend's fused_update: per table, its slots, the gradient of
    its lookup output, its optimizer and its step."""

    def fused_update_many(weights, slots, ids, offsets, grads, num_fields, optimizers, steps, mean_pooled=None,
                          max_len=None, field_rows=None, disjoint_fields=False):
        for weight, table_slots, grad, optimizer, step in zip(weights, slots, grads, optimizers, steps, strict=True):
            fused_update(weight, table_slots, ids, offsets, grad, num_fields, optimizer, step, mean_pooled, max_len,
                         field_rows, disjoint_fields)

    return fused_update_many


lookup_many = lookup_each(lookup)
fused_update_many = fused_update_each(fused_update)

def map_to_slots(ids: torch.Tensor, slot_of_row: torch.Tensor, capacity: int):
    """De-duplicate ids and map them to fast-tier indices.

    Returns (local_ids, miss_rows, miss_counts, hit_slots, hit_counts): local_ids[i] is the
    fast-tier index of ids[i], the row's hot slot (slot_of_row) or, for the k-th distinct
    row that is not hot, capacity + k. miss_rows are those rows and miss_counts how often
    each occurs; hit_slots are the hot slots used and hit_counts how often. Rows are taken
    in order of first occurrence.
    """
    rows, inverse, counts = torch.unique(ids, sorted=True, return_inverse=True, return_counts=True)
    first = torch.full((rows.numel(),), ids.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(ids.numel()), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    rows, counts, inverse = rows[order], counts[order], rank[inverse]
    slots = slot_of_row[rows].to(torch.int64)
    miss = slots < 0
    local = slots.clone()
    local[miss] = capacity + torch.arange(int(miss.sum()))
    return local[inverse], rows[miss], counts[miss], slots[~miss], counts[~miss]


def positions_in(rows: torch.Tensor, among: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Positions i where rows[i] is one of `among` (rows of a table of num_rows)."""
    return torch.nonzero(torch.isin(rows, among)).flatten()


def copy_rows(dst: torch.Tensor, dst_index: torch.Tensor, src: torch.Tensor, src_index: torch.Tensor) -> None:
    """dst[dst_index[i]] = src[src_index[i]] for every i; an empty index means 0, 1, 2, ...
    The rows are picked on src's device and placed on dst's (host and GPU tiers)."""
    rows = src.index_select(0, src_index.to(src.device)) if src_index.numel() else src[: dst_index.numel()]
    rows = rows.to(dst.device, non_blocking=True)
    if dst_index.numel():
        dst.index_copy_(0, dst_index.to(dst.device), rows)
    else:
        dst[: rows.shape[0]] = rows


_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # as a signed int64


def sketch_cells(rows: torch.Tensor, multipliers: torch.Tensor, bits: int) -> torch.Tensor:
    """(depth, n) flat counter indices: multiply-shift hashing (odd multipliers, the top
    `bits` bits of the 64-bit product) of each row, premixed so that ids differing only in
    high bits spread too. multipliers: (depth,) int64."""
    mixed = rows.to(torch.int64).unsqueeze(0) * _GOLDEN
    mixed = mixed ^ (mixed >> 29)
    hashed = (mixed * multipliers.view(-1, 1)) >> (64 - bits)
    row_base = torch.arange(multipliers.numel(), dtype=torch.int64).unsqueeze(1) << bits
    return (hashed & ((1 << bits) - 1)) + row_base


def sketch_add(counters: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor, multipliers: torch.Tensor,
               bits: int) -> torch.Tensor:
    """Conservative count-min update of `counters` (depth x 2^bits, flat), in place: each
    row's estimate (its least counter) rises by its count, and its counters rise to at
    most that. Estimates are all read before any counter moves. Returns the new estimates."""
    cells = sketch_cells(rows, multipliers, bits)
    raised = counters[cells].amin(dim=0) + counts.to(torch.float32)
    counters.scatter_reduce_(0, cells.reshape(-1), raised.repeat(multipliers.numel()), reduce="amax")
    return raised
