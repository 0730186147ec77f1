"""Triton GPU kernels for the two packed-table ops; reference.py is their definition.

- `lookup`: one program per bag. It finds the bag's extent (start, length truncated to the
  field's max_len), gathers its rows a tile of BLOCK_L ids at a time, sums them in float32
  and scales mean-pooled bags by 1 / length.
- `fused_update`: a tagging kernel (one program per bag) writes the row id and the bag of
  every kept occurrence; one stable sort on the device groups the occurrences by row (CSR);
  then one program per unique row sums that row's bag gradients and applies the optimizer
  to the row and its slots. No dense (rows, dim) gradient ever exists.
- `row_gradients`: fused_update itself, as plain SGD at lr = -1 on a zero table (see
  reference.row_gradients_by_sgd_step).

A whole row lives in one program (BLOCK_D = dim rounded up to a power of two, masked):
row-wise Adagrad needs the mean of g² over the full row before it can move any of it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from picasso.kernels.reference import SparseOptimizer, row_gradients_by_sgd_step

# Sorts after every real id, so truncated positions (and ids before the first bag) form the
# last group after sorting, where they are cut off.
_DROPPED = torch.iinfo(torch.int64).max
# Elements of one gathered (BLOCK_L, BLOCK_D) tile: enough ids in flight to hide the
# latency of the row gathers, few enough to stay in registers.
_TILE_ELEMENTS = 4096
# Bags are short (max_len is a few ids): longer tiles would mostly be masked off.
_MAX_BLOCK_L = 16


@triton.jit
def _bag_extent(offsets_ptr, max_len_ptr, bag, num_bags, num_ids, num_fields, HAS_MAX_LEN: tl.constexpr):
    """(start, length) of a bag, the length truncated to its field's max_len."""
    start = tl.load(offsets_ptr + bag).to(tl.int64)
    # offsets hold bag starts only: the last bag ends where the ids end.
    end = tl.load(offsets_ptr + bag + 1, mask=bag + 1 < num_bags, other=num_ids).to(tl.int64)
    length = end - start
    if HAS_MAX_LEN:
        length = tl.minimum(length, tl.load(max_len_ptr + bag % num_fields))
    return start, length


@triton.jit
def _bag_scale(mean_ptr, bag, num_fields, length, HAS_MEAN: tl.constexpr):
    """What a bag's rows are multiplied by when pooled: 1 / length for mean fields, else 1."""
    scale = tl.full([], 1.0, tl.float32)
    if HAS_MEAN:
        is_mean = tl.load(mean_ptr + bag % num_fields) != 0
        # An empty bag pools to zeros whatever its scale; max() only avoids dividing by 0.
        scale = tl.where(is_mean, 1.0 / tl.maximum(length, 1).to(tl.float32), scale)
    return scale


@triton.jit
def _gather_rows(base_ptr, rows, row_stride, col_stride, cols, row_mask, col_mask):
    """A (BLOCK_L, BLOCK_D) float32 tile of the given rows; masked entries read as 0."""
    ptrs = base_ptr + rows[:, None] * row_stride + cols[None, :] * col_stride
    return tl.load(ptrs, mask=row_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _lookup_kernel(
    weight_ptr, ids_ptr, offsets_ptr, max_len_ptr, mean_ptr, out_ptr,
    w_row_stride, w_col_stride, num_bags, num_ids, num_fields, dim,
    HAS_MAX_LEN: tl.constexpr, HAS_MEAN: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
):
    bag = tl.program_id(0).to(tl.int64)
    start, length = _bag_extent(offsets_ptr, max_len_ptr, bag, num_bags, num_ids, num_fields, HAS_MAX_LEN)
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < dim
    pooled = tl.zeros([BLOCK_D], dtype=tl.float32)
    for first in range(0, length, BLOCK_L):
        idx = first + tl.arange(0, BLOCK_L)
        in_bag = idx < length
        rows = tl.load(ids_ptr + start + idx, mask=in_bag, other=0).to(tl.int64)
        pooled += tl.sum(_gather_rows(weight_ptr, rows, w_row_stride, w_col_stride, cols, in_bag, in_row), axis=0)
    pooled *= _bag_scale(mean_ptr, bag, num_fields, length, HAS_MEAN)
    tl.store(out_ptr + bag * dim + cols, pooled.to(out_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def _tag_occurrences_kernel(
    ids_ptr, offsets_ptr, max_len_ptr, mean_ptr, keys_ptr, bag_of_ptr, scale_ptr,
    num_bags, num_ids, num_fields,
    HAS_MAX_LEN: tl.constexpr, HAS_MEAN: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """For one bag: its kept positions get their row as sort key and the bag as owner;
    the bag's pooling scale goes to scale_ptr. Positions past max_len keep _DROPPED."""
    bag = tl.program_id(0).to(tl.int64)
    start, length = _bag_extent(offsets_ptr, max_len_ptr, bag, num_bags, num_ids, num_fields, HAS_MAX_LEN)
    tl.store(scale_ptr + bag, _bag_scale(mean_ptr, bag, num_fields, length, HAS_MEAN))
    for first in range(0, length, BLOCK_L):
        idx = first + tl.arange(0, BLOCK_L)
        in_bag = idx < length
        rows = tl.load(ids_ptr + start + idx, mask=in_bag, other=0).to(tl.int64)
        tl.store(keys_ptr + start + idx, rows, mask=in_bag)
        tl.store(bag_of_ptr + start + idx, bag, mask=in_bag)


@triton.jit
def _adagrad_step(g, state_ptr, row, state_stride, dim, lr, eps):
    """Row-wise Adagrad: one accumulator per row, s += mean(g²)."""
    state_ptr += row * state_stride
    s = tl.load(state_ptr).to(tl.float32) + tl.sum(g * g, axis=0) / dim
    tl.store(state_ptr, s.to(state_ptr.dtype.element_ty))
    return lr * g / (tl.sqrt(s) + eps)


@triton.jit
def _elementwise_adagrad_step(g, state_ptrs, in_row, lr, eps):
    """torch.optim.Adagrad's step: one accumulator per value, s += g²."""
    s = tl.load(state_ptrs, mask=in_row, other=0.0).to(tl.float32) + g * g
    tl.store(state_ptrs, s.to(state_ptrs.dtype.element_ty), mask=in_row)
    return lr * g / (tl.sqrt(s) + eps)


@triton.jit
def _adam_step(g, m_ptrs, v_ptrs, in_row, lr, eps, beta1, beta2, bias1, bias2):
    """Lazy Adam on one row; bias1/bias2 = 1 - beta^step, computed once on the host."""
    m = beta1 * tl.load(m_ptrs, mask=in_row, other=0.0).to(tl.float32) + (1 - beta1) * g
    v = beta2 * tl.load(v_ptrs, mask=in_row, other=0.0).to(tl.float32) + (1 - beta2) * g * g
    tl.store(m_ptrs, m.to(m_ptrs.dtype.element_ty), mask=in_row)
    tl.store(v_ptrs, v.to(v_ptrs.dtype.element_ty), mask=in_row)
    return lr * (m / bias1) / (tl.sqrt(v / bias2) + eps)


@triton.jit
def _update_rows_kernel(
    weight_ptr, slot0_ptr, slot1_ptr, grad_ptr,
    unique_ptr, row_starts_ptr, counts_ptr, order_ptr, bag_of_ptr, scale_ptr,
    w_row_stride, w_col_stride, s0_row_stride, s0_col_stride, s1_row_stride, s1_col_stride,
    g_row_stride, g_col_stride, dim,
    lr, eps, beta1, beta2, weight_decay, bias1, bias2,
    OPTIMIZER: tl.constexpr, HAS_WEIGHT_DECAY: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One unique row: sum its occurrences' scaled bag gradients, then one optimizer step
    (L2 decay first folded into the gradient)."""
    u = tl.program_id(0)
    row = tl.load(unique_ptr + u)
    first = tl.load(row_starts_ptr + u)
    count = tl.load(counts_ptr + u)
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < dim
    g = tl.zeros([BLOCK_D], dtype=tl.float32)
    for k in range(0, count, BLOCK_L):
        idx = k + tl.arange(0, BLOCK_L)
        mine = idx < count
        position = tl.load(order_ptr + first + idx, mask=mine, other=0)
        bags = tl.load(bag_of_ptr + position, mask=mine, other=0)
        scale = tl.load(scale_ptr + bags, mask=mine, other=0.0)
        tile = _gather_rows(grad_ptr, bags, g_row_stride, g_col_stride, cols, mine, in_row)
        g += tl.sum(tile * scale[:, None], axis=0)

    w_ptrs = weight_ptr + row * w_row_stride + cols * w_col_stride
    w = tl.load(w_ptrs, mask=in_row, other=0.0).to(tl.float32)
    # Compiled out when off, as the other backends skip it: 0 * w is not 0 for an inf w.
    if HAS_WEIGHT_DECAY:
        g += weight_decay * w
    if OPTIMIZER == "sgd":
        w -= lr * g
    elif OPTIMIZER == "adagrad":
        w -= _adagrad_step(g, slot0_ptr, row, s0_row_stride, dim, lr, eps)
    elif OPTIMIZER == "adagrad_elementwise":
        state_ptrs = slot0_ptr + row * s0_row_stride + cols * s0_col_stride
        w -= _elementwise_adagrad_step(g, state_ptrs, in_row, lr, eps)
    else:
        m_ptrs = slot0_ptr + row * s0_row_stride + cols * s0_col_stride
        v_ptrs = slot1_ptr + row * s1_row_stride + cols * s1_col_stride
        w -= _adam_step(g, m_ptrs, v_ptrs, in_row, lr, eps, beta1, beta2, bias1, bias2)
    tl.store(w_ptrs, w.to(w_ptrs.dtype.element_ty), mask=in_row)


def _block_sizes(dim: int) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_D): a whole row per program, and as many rows per tile as fit."""
    block_d = triton.next_power_of_2(max(dim, 1))
    return max(1, min(_MAX_BLOCK_L, _TILE_ELEMENTS // block_d)), block_d


def _num_warps(block_l: int, block_d: int) -> int:
    # About 16 tile elements per thread. A first guess: not yet measured on a GPU.
    return max(1, min(8, block_l * block_d // 512))


def _strides(t: torch.Tensor) -> tuple[int, int]:
    """(row stride, column stride); a per-row vector has no columns."""
    return (t.stride(0), t.stride(1) if t.dim() > 1 else 0)


def _field_table(values: torch.Tensor | None, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """A per-field table on the kernel's device, or any valid pointer when the option is off
    (the kernel never reads it then: HAS_MAX_LEN / HAS_MEAN are False)."""
    if values is None:
        return like
    return values.to(device=like.device, dtype=dtype).contiguous()


def _bag_args(ids, offsets, num_fields, mean_pooled, max_len):
    """The arguments every per-bag kernel starts with, and their compile-time flags."""
    ids = ids.contiguous()
    offsets = offsets.contiguous()
    tensors = (
        ids,
        offsets,
        _field_table(max_len, torch.int64, offsets),
        _field_table(mean_pooled, torch.int32, offsets),
    )
    flags = {"HAS_MAX_LEN": max_len is not None, "HAS_MEAN": mean_pooled is not None}
    return tensors, (offsets.numel(), ids.numel(), num_fields), flags


def lookup(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    num_fields: int,
    mean_pooled: torch.Tensor | None = None,
    max_len: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pool every bag of one packed table; returns (num_samples, num_fields, dim)."""
    num_bags, dim = offsets.numel(), weight.shape[1]
    out = torch.empty(num_bags, dim, dtype=weight.dtype, device=weight.device)
    if num_bags:
        (ids, offsets, max_len_t, mean_t), sizes, flags = _bag_args(ids, offsets, num_fields, mean_pooled, max_len)
        block_l, block_d = _block_sizes(dim)
        _lookup_kernel[(num_bags,)](
            weight, ids, offsets, max_len_t, mean_t, out, *_strides(weight), *sizes, dim,
            **flags, BLOCK_L=block_l, BLOCK_D=block_d, num_warps=_num_warps(block_l, block_d),
        )
    return out.view(-1, num_fields, dim)


def _rows_csr(ids, offsets, num_fields, mean_pooled, max_len):
    """Group the kept occurrences by row.

    Returns (unique rows, start and count of each row's run in `order`, order: positions in
    ids sorted by row, bag_of: each position's bag, scale: each bag's pooling scale)."""
    num_bags = offsets.numel()
    keys = torch.full((ids.numel(),), _DROPPED, dtype=torch.int64, device=ids.device)
    bag_of = torch.empty(ids.numel(), dtype=torch.int64, device=ids.device)
    scale = torch.empty(num_bags, dtype=torch.float32, device=ids.device)
    (ids, offsets, max_len_t, mean_t), sizes, flags = _bag_args(ids, offsets, num_fields, mean_pooled, max_len)
    _tag_occurrences_kernel[(num_bags,)](
        ids, offsets, max_len_t, mean_t, keys, bag_of, scale, *sizes, **flags, BLOCK_L=128
    )
    # Stable, so each row sums its occurrences in the same order on every run.
    sorted_keys, order = torch.sort(keys, stable=True)
    unique, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
    if unique.numel() and unique[-1] == _DROPPED:
        unique, counts = unique[:-1], counts[:-1]
    row_starts = torch.cumsum(counts, 0) - counts
    return unique, row_starts, counts, order, bag_of, scale


def _slot_pointers(optimizer: SparseOptimizer, slots: list[torch.Tensor], weight: torch.Tensor):
    """The two slot tensors the update kernel takes; unused ones point at weight (never read)."""
    expected = len(optimizer.slot_shapes(1, 1))
    if len(slots) != expected:
        raise ValueError(f"{optimizer.name} needs {expected} slot tensors, got {len(slots)}")
    return list(slots) + [weight] * (2 - expected)


def _bias_corrections(optimizer: SparseOptimizer, step: int) -> tuple[float, float]:
    """Adam's 1 - beta^t, in double precision on the host; unused by the other optimizers."""
    if optimizer.name != "adam":
        return 1.0, 1.0
    return 1 - optimizer.beta1**step, 1 - optimizer.beta2**step


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

    field_rows (a promise that each field's ids stay in its own rows) is not needed here:
    the device sort groups occurrences by row whatever the fields.
    """
    if offsets.numel() == 0 or ids.numel() == 0:
        return
    slot0, slot1 = _slot_pointers(optimizer, slots, weight)
    unique, row_starts, counts, order, bag_of, scale = _rows_csr(ids, offsets, num_fields, mean_pooled, max_len)
    if unique.numel() == 0:
        return
    dim = weight.shape[1]
    grad_bags = grad.reshape(-1, dim)
    block_l, block_d = _block_sizes(dim)
    _update_rows_kernel[(unique.numel(),)](
        weight, slot0, slot1, grad_bags, unique, row_starts, counts, order, bag_of, scale,
        *_strides(weight), *_strides(slot0), *_strides(slot1), *_strides(grad_bags), dim,
        optimizer.lr, optimizer.eps, optimizer.beta1, optimizer.beta2, optimizer.weight_decay,
        *_bias_corrections(optimizer, step), OPTIMIZER=optimizer.name, HAS_WEIGHT_DECAY=optimizer.weight_decay != 0,
        BLOCK_L=block_l, BLOCK_D=block_d, num_warps=_num_warps(block_l, block_d),
    )


row_gradients = row_gradients_by_sgd_step(fused_update)
