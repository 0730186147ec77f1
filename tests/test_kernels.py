"""The C++ CPU kernels agree with the plain-torch reference, and the dispatch picks them."""

from __future__ import annotations

import importlib
import os
import re

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    # The Triton row-gradient tests then run under Triton's interpreter, which has to be on
    # when triton is first imported (its own library kernels are decorated then), as in
    # test_kernels_triton.py: set at collection, before any test can import it.
    os.environ["TRITON_INTERPRET"] = "1"

from picasso import kernels
from picasso.kernels import SparseOptimizer, load_backend

reference = load_backend("reference")
cpu = load_backend("cpu")


def random_bags(seed: int, samples: int = 64, fields: int = 4, rows: int = 200, max_bag: int = 4,
                offsets_dtype=torch.int32):
    """Bags with empty ones, repeated ids within and across bags, and mixed pooling."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_bag + 1, (samples * fields,), generator=g)
    ids = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    offsets = (torch.cumsum(lengths, 0) - lengths).to(offsets_dtype)
    mean_pooled = torch.rand(fields, generator=g) < 0.5
    return g, ids, offsets, mean_pooled


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dim", [1, 5, 16])
@pytest.mark.parametrize("truncate", [False, True])
def test_lookup_agrees_with_reference(seed, dim, truncate):
    g, ids, offsets, mean_pooled = random_bags(seed, offsets_dtype=torch.int64 if seed % 2 else torch.int32)
    max_len = torch.randint(1, 4, (4,), generator=g) if truncate else None
    weight = torch.randn(200, dim, generator=g)
    expected = reference.lookup(weight, ids, offsets, 4, mean_pooled, max_len)
    torch.testing.assert_close(cpu.lookup(weight, ids, offsets, 4, mean_pooled, max_len), expected, atol=1e-5, rtol=1e-5)


def field_rows_of(ids: torch.Tensor, offsets: torch.Tensor, fields: int, rows: int) -> torch.Tensor:
    """Move each field's ids into its own quarter of the rows (as packing does); returns
    the field row bounds."""
    width = rows // fields
    bags = torch.repeat_interleave(torch.arange(offsets.numel()), torch.diff(offsets.long(), append=torch.tensor([ids.numel()])))
    ids.copy_(ids % width + (bags % fields) * width)
    return torch.arange(fields + 1, dtype=torch.int64) * width


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("optimizer", reference.OPTIMIZERS)
@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("split", ["by owner", "by field rows", "by disjoint fields"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_update_agrees_with_reference(seed, optimizer, truncate, split, weight_decay):
    g, ids, offsets, mean_pooled = random_bags(seed)
    max_len = torch.randint(1, 4, (4,), generator=g) if truncate else None
    field_rows = field_rows_of(ids, offsets, 4, 200) if split != "by owner" else None
    if split == "by disjoint fields":  # each field its own rows, scattered over the table (a fast tier)
        ids.copy_(torch.randperm(200, generator=g)[ids])
        field_rows = None
    dim = (3, 8, 16, 33)[seed]
    spec = SparseOptimizer(optimizer, lr=0.1, weight_decay=weight_decay)
    weight = torch.randn(200, dim, generator=g)
    slots = [torch.rand(shape, generator=g) for shape in spec.slot_shapes(200, dim)]
    expected_weight, expected_slots = weight.clone(), [s.clone() for s in slots]
    for step in range(1, 4):
        grad = torch.randn(64, 4, dim, generator=g)
        reference.fused_update(expected_weight, expected_slots, ids, offsets, grad, 4, spec, step, mean_pooled, max_len)
        cpu.fused_update(weight, slots, ids, offsets, grad, 4, spec, step, mean_pooled, max_len, field_rows,
                         disjoint_fields=split == "by disjoint fields")
    torch.testing.assert_close(weight, expected_weight, atol=1e-5, rtol=1e-5)
    for got, want in zip(slots, expected_slots):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_update_touches_only_rows_in_the_batch():
    g, ids, offsets, mean_pooled = random_bags(0, rows=1000)
    weight = torch.randn(1000, 8, generator=g)
    slots = [torch.zeros(1000)]
    before = weight.clone()
    cpu.fused_update(weight, slots, ids, offsets, torch.randn(64, 4, 8, generator=g), 4, SparseOptimizer(), 1, mean_pooled)
    touched = torch.zeros(1000, dtype=torch.bool)
    touched[ids] = True
    assert torch.equal(weight[~touched], before[~touched])
    assert not torch.equal(weight[touched], before[touched])
    assert torch.equal(slots[0] > 0, touched)


def test_an_empty_batch_changes_nothing():
    weight = torch.randn(10, 4)
    before = weight.clone()
    empty_ids, offsets = torch.zeros(0, dtype=torch.int64), torch.zeros(6, dtype=torch.int32)
    assert torch.equal(cpu.lookup(weight, empty_ids, offsets, 3), torch.zeros(2, 3, 4))
    cpu.fused_update(weight, [torch.zeros(10)], empty_ids, offsets, torch.ones(2, 3, 4), 3, SparseOptimizer(), 1)
    assert torch.equal(weight, before)


def test_an_id_outside_its_field_rows_is_refused_before_anything_moves():
    g, ids, offsets, mean_pooled = random_bags(1)
    field_rows = field_rows_of(ids, offsets, 4, 200)
    ids[-1] = 0  # the last bag belongs to field 3, whose rows start at 150
    weight = torch.randn(200, 8, generator=g)
    before = weight.clone()
    with pytest.raises(RuntimeError, match="outside its field's rows"):
        cpu.fused_update(weight, [torch.zeros(200)], ids, offsets, torch.ones(64, 4, 8), 4, SparseOptimizer(), 1,
                         mean_pooled, None, field_rows)
    assert torch.equal(weight, before)


def test_bad_inputs_are_clear_errors():
    weight = torch.randn(10, 4)
    with pytest.raises(RuntimeError, match="int64"):
        cpu.lookup(weight, torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), 3)
    with pytest.raises(RuntimeError, match="samples x fields"):
        cpu.lookup(weight, torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int32), 3)
    with pytest.raises(ValueError, match="sparse optimizer"):
        SparseOptimizer("rmsprop")
    with pytest.raises(ValueError, match="unknown kernel backend"):
        load_backend("cuda-magic")


@pytest.mark.parametrize("weight_decay", [-0.1, float("nan"), float("inf"), True, "0.1"])
def test_a_bad_weight_decay_is_refused(weight_decay):
    with pytest.raises(ValueError, match=rf"weight_decay .*got {re.escape(repr(weight_decay))}"):
        SparseOptimizer("sgd", 0.1, weight_decay=weight_decay)


def test_dispatch_uses_the_cpu_kernels_on_cpu_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("PICASSO_KERNELS", raising=False)
    assert kernels.backend_for(torch.device("cpu")) is cpu
    monkeypatch.setenv("PICASSO_KERNELS", "reference")
    assert kernels.backend_for(torch.device("cpu")) is reference


def test_lookup_reuses_its_output_only_once_nothing_holds_it():
    """The CPU lookup recycles its last output buffer (no fresh pages each step), but
    never while the caller, a view of it, or autograd still holds that buffer."""
    g, ids, offsets, _ = random_bags(3)
    weight = torch.randn(200, 4, generator=g)
    expected = reference.lookup(weight, ids, offsets, 4)

    held = cpu.lookup(weight, ids, offsets, 4)
    second = cpu.lookup(weight, ids, offsets, 4)
    assert second.data_ptr() != held.data_ptr()
    view, address = held.view(-1), held.data_ptr()
    del held, second
    assert cpu.lookup(weight, ids, offsets, 4).data_ptr() != address  # the view keeps it
    del view

    scale = torch.ones(4, requires_grad=True)
    pooled = cpu.lookup(weight, ids, offsets, 4)
    address = pooled.data_ptr()
    loss = (pooled * scale).sum()  # autograd saves pooled for scale's gradient
    del pooled
    after = cpu.lookup(weight, ids, offsets, 4)
    assert after.data_ptr() != address
    loss.backward()
    torch.testing.assert_close(scale.grad, expected.sum(dim=(0, 1)))

    address = after.data_ptr()
    del after
    reused = cpu.lookup(weight, ids, offsets, 4)
    assert reused.data_ptr() == address
    torch.testing.assert_close(reused, expected, atol=1e-5, rtol=1e-5)


# -- row gradients: the fused backward without the optimizer step ----------------------------


@pytest.fixture(params=["reference", "cpu", "triton"])
def backend(request):
    """(a backend's module, the device its tensors go on); without a GPU, Triton's kernels
    run under its interpreter on CPU tensors."""
    if request.param != "triton":
        return load_backend(request.param), torch.device("cpu")
    pytest.importorskip("triton", reason="triton is missing: it comes with the `test` extra")
    module = load_backend("triton")
    if ON_GPU:
        return module, torch.device("cuda")
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(module._lookup_kernel, InterpretedFunction):  # imported before the variable was set
        module = importlib.reload(module)
    return module, torch.device("cpu")


def row_gradients_by_autograd(num_rows, dim, ids, offsets, grad, fields, mean_pooled, max_len):
    """The oracle: autograd through the reference lookup (linear in the table, so the
    table's values do not matter)."""
    table = torch.zeros(num_rows, dim, requires_grad=True)
    reference.lookup(table, ids, offsets, fields, mean_pooled, max_len).backward(grad)
    return table.grad


def test_row_gradients_of_a_small_batch_by_hand(backend):
    """Two samples, two fields: a mean-pooled field cut to 2 ids with a repeated id and an
    empty bag, a summed field cut to 3 ids with a repeated id; rows shared across bags."""
    module, device = backend
    ids = torch.tensor([1, 1, 3,  0, 2, 2,  2, 3, 0, 1])  # bags [1 1 3] [0 2 2] [] [2 3 0 1]
    offsets = torch.tensor([0, 3, 6, 6], dtype=torch.int32)
    mean_pooled, max_len = torch.tensor([True, False]), torch.tensor([2, 3])
    grad = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
    got = module.row_gradients(5, 2, *(t.to(device) for t in (ids, offsets)), grad.to(device), 2,
                               mean_pooled.to(device), max_len.to(device))
    expected = torch.tensor([
        [3.0 + 7.0, 4.0 + 8.0],  # once in each summed bag
        [1.0, 2.0],  # twice in a bag of 2 (mean): 2 x 1/2; its id past max_len counts nothing
        [2 * 3.0 + 7.0, 2 * 4.0 + 8.0],  # twice in one summed bag, once in the other
        [7.0, 8.0],  # its id in the mean bag is past max_len
        [0.0, 0.0],  # untouched; so is the empty bag's gradient, (5, 6)
    ])
    assert got.dtype == torch.float32 and got.shape == (5, 2)
    torch.testing.assert_close(got.cpu(), expected, atol=0.0, rtol=0.0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("split", ["by owner", "by field rows", "by disjoint fields"])
def test_row_gradients_are_the_lookups_gradient(backend, seed, truncate, split):
    """Random multi-hot bags (empty ones, ids repeated within and across bags, mixed sum and
    mean pooling) over a compact table, under each split of the work fused_update knows."""
    module, device = backend
    rows, fields, dim = 60, 4, (1, 5, 16)[seed]
    g, ids, offsets, mean_pooled = random_bags(seed, samples=32, fields=fields, rows=rows, max_bag=5)
    max_len = torch.randint(1, 5, (fields,), generator=g) if truncate else None
    field_rows = field_rows_of(ids, offsets, fields, rows) if split != "by owner" else None
    if split == "by disjoint fields":  # each field its own rows, scattered over the table
        ids.copy_(torch.randperm(rows, generator=g)[ids])
        field_rows = None
    grad = torch.randn(32, fields, dim, generator=g)
    expected = row_gradients_by_autograd(rows, dim, ids, offsets, grad, fields, mean_pooled, max_len)
    on_device = lambda t: None if t is None else t.to(device)  # noqa: E731
    got = module.row_gradients(rows, dim, on_device(ids), on_device(offsets), on_device(grad), fields,
                               on_device(mean_pooled), on_device(max_len), on_device(field_rows),
                               disjoint_fields=split == "by disjoint fields")
    torch.testing.assert_close(got.cpu(), expected, atol=1e-6, rtol=1e-6)


def test_row_gradients_of_no_ids_are_zeros(backend):
    module, device = backend
    offsets = torch.zeros(6, dtype=torch.int32, device=device)
    got = module.row_gradients(3, 4, torch.zeros(0, dtype=torch.int64, device=device), offsets,
                               torch.ones(2, 3, 4, device=device), 3)
    assert torch.equal(got.cpu(), torch.zeros(3, 4))


def test_row_gradients_dispatch_to_the_cpu_kernels(monkeypatch):
    """On CPU the dispatch runs the C++ fused backward; its scratch, sized by the first
    table, serves the smaller compact tables after it."""
    monkeypatch.delenv("PICASSO_KERNELS", raising=False)
    calls = []
    monkeypatch.setattr(cpu, "_ops", _Recording(cpu._ops, calls))
    for rows in (200, 120, 60):
        g, ids, offsets, mean_pooled = random_bags(rows, rows=rows)
        grad = torch.randn(64, 4, 3, generator=g)
        got = kernels.row_gradients(rows, 3, ids, offsets, grad, 4, mean_pooled)
        expected = row_gradients_by_autograd(rows, 3, ids, offsets, grad, 4, mean_pooled, None)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert calls == ["fused_update_many"] * 3  # the one-table update is a call of one


class _Recording:
    """The C++ ops, recording the name of each one called."""

    def __init__(self, ops, calls):
        self._ops, self._calls = ops, calls

    def __getattr__(self, name):
        self._calls.append(name)
        return getattr(self._ops, name)


# -- the hot-row cache's bookkeeping ------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_map_to_slots_cpu_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    rows_in_table, capacity = 500, 40
    slot_of_row = torch.full((rows_in_table,), -1, dtype=torch.int32)
    hot = torch.randperm(rows_in_table, generator=g)[:capacity]
    slot_of_row[hot] = torch.randperm(capacity, generator=g).to(torch.int32)
    ids = torch.randint(0, rows_in_table, (3000,), generator=g) ** 2 % rows_in_table  # repeats, skew
    expected = reference.map_to_slots(ids, slot_of_row, capacity)
    actual = cpu.map_to_slots(ids, slot_of_row, capacity)
    for e, a in zip(expected, actual):
        assert torch.equal(e, a)
    local, miss_rows, miss_counts, hit_slots, hit_counts = actual
    # the contract: every id maps to its hot slot, or to capacity + its miss's position
    is_hot = slot_of_row[ids] >= 0
    assert is_hot.any() and (~is_hot).any()
    assert torch.equal(local[is_hot], slot_of_row[ids][is_hot].long())
    assert torch.equal(miss_rows[local[~is_hot] - capacity], ids[~is_hot])
    assert torch.equal(miss_rows.sort().values, torch.unique(ids[~is_hot]))
    assert torch.equal(hit_slots.sort().values, torch.unique(slot_of_row[ids][is_hot]).long())
    assert int(miss_counts.sum()) == int((~is_hot).sum()) and int(hit_counts.sum()) == int(is_hot.sum())
    # the scratch is left all -1, so the next call starts clean
    assert torch.equal(cpu.map_to_slots(ids, slot_of_row, capacity)[0], local)


@pytest.mark.parametrize("shape", [(50,), (50, 1), (50, 16)])
def test_copy_rows_cpu_matches_reference(shape):
    g = torch.Generator().manual_seed(0)
    src = torch.randn(*shape, generator=g)
    picked = torch.randperm(50, generator=g)[:20]
    placed = torch.randperm(30, generator=g)[:20]
    none = torch.zeros(0, dtype=torch.int64)
    for dst_index, src_index, rows in ((placed, picked, 30), (none, picked, 20), (placed, none, 30)):
        expected, actual = torch.zeros(rows, *shape[1:]), torch.zeros(rows, *shape[1:])
        reference.copy_rows(expected, dst_index, src, src_index)
        cpu.copy_rows(actual, dst_index, src, src_index)
        assert torch.equal(expected, actual) and actual.abs().sum() > 0
    with pytest.raises(RuntimeError, match="out of range"):
        cpu.copy_rows(torch.zeros(5, *shape[1:]), torch.tensor([7]), src, torch.tensor([0]))
    empty = torch.zeros(0, *shape[1:])  # a batch with no misses gathers nothing
    cpu.copy_rows(empty, none, src, none)
    cpu.copy_rows(src, none, empty, none)


def test_map_to_slots_refuses_ids_outside_the_table():
    with pytest.raises(RuntimeError, match="outside the table"):
        cpu.map_to_slots(torch.tensor([3, 10]), torch.full((10,), -1, dtype=torch.int32), 4)


def test_sketch_add_cpu_matches_reference():
    g = torch.Generator().manual_seed(0)
    multipliers = torch.randint(-(1 << 62), 1 << 62, (4,), generator=g, dtype=torch.int64) * 2 + 1
    expected_counters, actual_counters = torch.zeros(4 * 256), torch.zeros(4 * 256)
    for _ in range(20):
        rows = torch.unique(torch.randint(-(1 << 40), 1 << 40, (300,), generator=g))  # wide ids hash too
        counts = torch.randint(1, 5, (rows.numel(),), generator=g)
        expected = reference.sketch_add(expected_counters, rows, counts, multipliers, 8)
        actual = cpu.sketch_add(actual_counters, rows, counts, multipliers, 8)
        assert torch.equal(expected, actual)
    assert torch.equal(expected_counters, actual_counters)


def test_sgd_weight_decay_on_one_row_by_hand(backend):
    """Coupled L2 on the one row in the batch, w - lr * (g + wd * w), and on no other row
    (lazy decay). Powers of two throughout, so every backend must be exact."""
    module, device = backend
    weight = torch.tensor([[1.0, 1.0], [2.0, -4.0], [8.0, 8.0]], device=device)
    grad = torch.tensor([[[1.0, 0.5]]], device=device)
    ids, offsets = torch.tensor([1], device=device), torch.tensor([0], dtype=torch.int32, device=device)
    module.fused_update(weight, [], ids, offsets, grad, 1, SparseOptimizer("sgd", 0.25, weight_decay=0.5), 1)
    expected = torch.tensor([[1.0, 1.0], [2.0 - 0.25 * (1.0 + 1.0), -4.0 - 0.25 * (0.5 - 2.0)], [8.0, 8.0]])
    torch.testing.assert_close(weight.cpu(), expected, atol=0.0, rtol=0.0)


def test_elementwise_adagrad_is_torch_adagrad():
    """Same math as torch.optim.Adagrad on a sparse EmbeddingBag: a model ported from one
    trains identically on the other."""
    g, ids, offsets, _ = random_bags(3, fields=1)
    weight = torch.randn(200, 8, generator=g)
    bag = torch.nn.EmbeddingBag(200, 8, mode="sum", sparse=True)
    bag.weight.data.copy_(weight)
    adagrad = torch.optim.Adagrad(bag.parameters(), lr=0.05, eps=1e-8)
    state = torch.zeros(200, 8)
    optimizer = SparseOptimizer("adagrad_elementwise", lr=0.05, eps=1e-8)
    for _ in range(3):
        grad = torch.randn(offsets.numel(), 1, 8, generator=g)
        adagrad.zero_grad()
        bag(ids, offsets.long()).backward(grad.squeeze(1))
        adagrad.step()
        cpu.fused_update(weight, [state], ids, offsets, grad, 1, optimizer, 1)
    torch.testing.assert_close(weight, bag.weight.detach(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state, adagrad.state[bag.weight]["sum"], atol=1e-6, rtol=1e-6)


def test_positions_in_cpu_matches_reference():
    g = torch.Generator().manual_seed(1)
    rows = torch.randperm(1000, generator=g)[:300]
    among = torch.randint(0, 1000, (200,), generator=g)
    expected = reference.positions_in(rows, among, 1000)
    assert expected.numel() > 0
    assert torch.equal(cpu.positions_in(rows, among, 1000), expected)
    assert torch.equal(cpu.positions_in(rows, among, 1000), expected)  # the scratch came back clean
    with pytest.raises(RuntimeError, match="outside the table"):
        cpu.positions_in(rows, torch.tensor([1000]), 1000)
