"""The Triton kernels against the reference, on randomized packed batches.

Without a GPU the kernels run under Triton's interpreter on CPU tensors. @triton.jit reads
TRITON_INTERPRET when a kernel is decorated, i.e. when triton_kernels is imported, so it is
set before any import below. With a GPU they are compiled and run on it.
"""

import os

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"

import importlib  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("triton", reason="triton is missing: it comes with the `test` extra (pip install -e '.[test]')")

from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from picasso.kernels import reference, triton_kernels  # noqa: E402

if not ON_GPU and not isinstance(triton_kernels._lookup_kernel, InterpretedFunction):
    # Another module imported the kernels before TRITON_INTERPRET was set: redecorate them.
    triton_kernels = importlib.reload(triton_kernels)

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Shape:
    """How a random batch is drawn. Small: the interpreter runs one Python call per program."""

    samples: int = 32
    num_fields: int = 3
    rows: int = 60
    dim: int = 13
    max_bag: int = 6  # bag lengths are drawn from 0..max_bag (0..1 when one_hot)
    one_hot: bool = False
    truncate: bool = True  # draw a max_len per field below max_bag
    mean: bool = True  # alternate mean- and sum-pooled fields
    offsets_dtype: torch.dtype = torch.int32
    ids_dtype: torch.dtype = torch.int64


SHAPES = {
    "multi_hot_mean_truncated": Shape(),
    "multi_hot_sum": Shape(num_fields=4, dim=8, max_bag=4, truncate=False, mean=False, offsets_dtype=torch.int64),
    "one_hot": Shape(samples=64, num_fields=4, dim=1, one_hot=True, ids_dtype=torch.int32),
    "heavy_repeats": Shape(num_fields=2, rows=3, dim=5, max_bag=8, offsets_dtype=torch.int64),
    "wide_row": Shape(samples=16, num_fields=2, rows=200, dim=130, max_bag=3),
}


@dataclass
class Batch:
    """One packed batch of a table, in the argument layout both ops share."""

    ids: torch.Tensor
    offsets: torch.Tensor
    num_fields: int
    mean_pooled: torch.Tensor | None
    max_len: torch.Tensor | None

    def lookup(self, backend, weight):
        """`backend.lookup` of this batch (backend: a kernels module)."""
        return backend.lookup(weight, self.ids, self.offsets, self.num_fields, self.mean_pooled, self.max_len)

    def update(self, backend, weight, slots, grad, optimizer, step):
        """`backend.fused_update` with this batch."""
        backend.fused_update(
            weight, slots, self.ids, self.offsets, grad, self.num_fields, optimizer, step, self.mean_pooled, self.max_len
        )


def random_batch(shape: Shape, gen: torch.Generator) -> Batch:
    """Bags of random lengths (empty ones included) over a small vocabulary, so ids repeat
    within and across bags."""
    bags = shape.samples * shape.num_fields
    high = 2 if shape.one_hot else shape.max_bag + 1
    lengths = torch.randint(0, high, (bags,), generator=gen)
    ids = torch.randint(0, shape.rows, (int(lengths.sum()),), generator=gen, dtype=shape.ids_dtype)
    max_len = torch.randint(1, max(shape.max_bag, 2), (shape.num_fields,), generator=gen) if shape.truncate else None
    mean = torch.arange(shape.num_fields) % 2 == 0 if shape.mean else None
    return Batch(
        ids=ids.to(DEVICE),
        offsets=(torch.cumsum(lengths, 0) - lengths).to(shape.offsets_dtype).to(DEVICE),
        num_fields=shape.num_fields,
        mean_pooled=None if mean is None else mean.to(DEVICE),
        max_len=None if max_len is None else max_len.to(DEVICE),
    )


def random_table(rows: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, dim, generator=gen).to(DEVICE)


def slots_for(optimizer: reference.SparseOptimizer, weight: torch.Tensor) -> list[torch.Tensor]:
    return [torch.zeros(shape, device=weight.device) for shape in optimizer.slot_shapes(*weight.shape)]


def assert_same_update(weight, slots, batch, grad, optimizer, step):
    """Apply one step with both backends to copies of the same state, then compare all of it."""
    ours_w, ours_s = weight.clone(), [s.clone() for s in slots]
    batch.update(triton_kernels, ours_w, ours_s, grad, optimizer, step)
    batch.update(reference, weight, slots, grad, optimizer, step)
    torch.testing.assert_close(ours_w, weight, **TOLERANCE)
    for ours, theirs in zip(ours_s, slots, strict=True):
        torch.testing.assert_close(ours, theirs, **TOLERANCE)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", SHAPES)
def test_lookup_matches_reference(name, seed):
    shape, gen = SHAPES[name], torch.Generator().manual_seed(seed)
    weight = random_table(shape.rows, shape.dim, gen)
    batch = random_batch(shape, gen)
    torch.testing.assert_close(batch.lookup(triton_kernels, weight), batch.lookup(reference, weight), **TOLERANCE)


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("optimizer", reference.OPTIMIZERS)
@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_update_matches_reference_over_steps(name, optimizer, seed, weight_decay):
    """A fresh batch every step; the slots carry over, so errors in them would compound."""
    shape, gen = SHAPES[name], torch.Generator().manual_seed(seed)
    opt = reference.SparseOptimizer(optimizer, weight_decay=weight_decay)
    weight = random_table(shape.rows, shape.dim, gen)
    slots = slots_for(opt, weight)
    for step in (1, 2, 3):
        batch = random_batch(shape, gen)
        grad = torch.randn(shape.samples, shape.num_fields, shape.dim, generator=gen).to(DEVICE)
        assert_same_update(weight, slots, batch, grad, opt, step)


def empty_bags_batch(samples: int, num_fields: int = 2) -> Batch:
    return Batch(
        ids=torch.zeros(0, dtype=torch.int64, device=DEVICE),
        offsets=torch.zeros(samples * num_fields, dtype=torch.int32, device=DEVICE),
        num_fields=num_fields,
        mean_pooled=(torch.arange(num_fields) == 0).to(DEVICE),
        max_len=None,
    )


@pytest.mark.parametrize("samples", [0, 3])
def test_empty_bags_pool_to_zeros(samples):
    weight = random_table(10, 6, torch.Generator().manual_seed(0))
    batch = empty_bags_batch(samples)
    got = batch.lookup(triton_kernels, weight)
    assert got.shape == (samples, 2, 6)
    assert not got.any()


@pytest.mark.parametrize("samples", [0, 3])
@pytest.mark.parametrize("optimizer", reference.OPTIMIZERS)
def test_no_ids_leave_table_and_slots_untouched(samples, optimizer):
    opt = reference.SparseOptimizer(optimizer)
    weight = random_table(10, 6, torch.Generator().manual_seed(0))
    slots = slots_for(opt, weight)
    batch = empty_bags_batch(samples)
    before = [t.clone() for t in [weight, *slots]]
    grad = torch.ones(samples, 2, 6, device=DEVICE)
    batch.update(triton_kernels, weight, slots, grad, opt, 1)
    for after, original in zip([weight, *slots], before, strict=True):
        assert torch.equal(after, original)


def test_truncated_ids_do_not_move_their_rows():
    """Truncated positions are grouped apart by the sort and cut off; nothing may leak from them."""
    weight = random_table(10, 4, torch.Generator().manual_seed(0))
    batch = Batch(
        ids=torch.tensor([7, 3, 9, 5], device=DEVICE),  # bags [7, 3, 9] and [5]
        offsets=torch.tensor([0, 3], device=DEVICE),
        num_fields=2,
        mean_pooled=None,
        max_len=torch.tensor([1, 1], device=DEVICE),
    )
    before = weight.clone()
    grad = torch.ones(1, 2, 4, device=DEVICE)
    batch.update(triton_kernels, weight, [], grad, reference.SparseOptimizer("sgd"), 1)
    moved = (weight != before).any(dim=1).nonzero().flatten().tolist()
    assert moved == [5, 7]


def strided(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A random tensor of `shape` that is every other element of a wider one (a strided view)."""
    wide = torch.rand(*shape[:-1], 2 * shape[-1], generator=gen).to(DEVICE)
    return wide[..., ::2]


@pytest.mark.parametrize("optimizer", reference.OPTIMIZERS)
def test_strided_tables(optimizer):
    """Tables and slots that are views with gaps: the kernels follow strides and update the
    views in place, leaving the elements between them alone."""
    gen = torch.Generator().manual_seed(3)
    opt = reference.SparseOptimizer(optimizer)
    shape = Shape(samples=8, num_fields=2, rows=20, dim=5, max_bag=4)
    weight = strided((shape.rows, shape.dim), gen)
    slots = [strided(s, gen) for s in opt.slot_shapes(shape.rows, shape.dim)]
    batch = random_batch(shape, gen)
    torch.testing.assert_close(batch.lookup(triton_kernels, weight), batch.lookup(reference, weight), **TOLERANCE)
    expected = [t._base.clone() for t in [weight, *slots]]
    grad = torch.randn(shape.samples, shape.num_fields, shape.dim, generator=gen).to(DEVICE)
    expected_views = [t[..., ::2] for t in expected]
    batch.update(reference, expected_views[0], expected_views[1:], grad, opt, 1)
    batch.update(triton_kernels, weight, slots, grad, opt, 1)
    for ours, theirs in zip([weight, *slots], expected, strict=True):
        torch.testing.assert_close(ours._base, theirs, **TOLERANCE)


def test_wrong_slot_count_is_refused():
    weight = random_table(4, 2, torch.Generator().manual_seed(0))
    ids, offsets = torch.tensor([1], device=DEVICE), torch.tensor([0], device=DEVICE)
    with pytest.raises(ValueError, match="adam needs 2 slot tensors"):
        triton_kernels.fused_update(
            weight, [], ids, offsets, torch.ones(1, 1, 2, device=DEVICE), 1, reference.SparseOptimizer("adam"), 1
        )
