"""The many-table kernels (several tables over the same rows, ids and offsets: Wide&Deep's
deep and wide tables) agree with the reference, which looks each table up and steps it on
its own, and each table comes out of a shared call exactly as from a call of its own."""

from __future__ import annotations

import threading

import pytest
import torch

from picasso import kernels
from picasso.kernels import SparseOptimizer, load_backend

from test_kernels import field_rows_of, random_bags

reference = load_backend("reference")
cpu = load_backend("cpu")
FIELDS, ROWS, SAMPLES = 4, 200, 64


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dims", [(16, 1), (5, 8, 1), (3, 3)])
@pytest.mark.parametrize("truncate", [False, True])
def test_lookup_many_agrees_with_reference(seed, dims, truncate):
    g, ids, offsets, mean_pooled = random_bags(seed, offsets_dtype=torch.int64 if seed % 2 else torch.int32)
    max_len = torch.randint(1, 4, (FIELDS,), generator=g) if truncate else None
    weights = [torch.randn(ROWS, dim, generator=g) for dim in dims]
    expected = reference.lookup_many(weights, ids, offsets, FIELDS, mean_pooled, max_len)
    got = cpu.lookup_many(weights, ids, offsets, FIELDS, mean_pooled, max_len)
    for table, (out, want) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        # A table looked up with others is the table looked up alone, bit for bit.
        assert torch.equal(out, cpu.lookup(weights[table], ids, offsets, FIELDS, mean_pooled, max_len))


def test_lookup_many_gives_each_output_a_buffer_of_its_own():
    """Two tables of one shape never share an output buffer, nor take one still held,
    call after call (the CPU lookup recycles its outputs' buffers)."""
    g, ids, offsets, mean_pooled = random_bags(0)
    weights = [torch.randn(ROWS, 4, generator=g) for _ in range(3)]
    held = []
    for _ in range(3):
        outs = cpu.lookup_many(weights, ids, offsets, FIELDS, mean_pooled)
        held.extend(outs)
        assert len({out.data_ptr() for out in held}) == len(held)
    del held, outs
    for out, weight in zip(cpu.lookup_many(weights, ids, offsets, FIELDS, mean_pooled), weights):
        torch.testing.assert_close(out, reference.lookup(weight, ids, offsets, FIELDS, mean_pooled))


OPTIMIZER_PAIRS = [(a, b) for a in reference.OPTIMIZERS for b in reference.OPTIMIZERS if a <= b]


@pytest.mark.parametrize("optimizers", OPTIMIZER_PAIRS)
@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("split", ["by owner", "by field rows", "by disjoint fields"])
def test_fused_update_many_agrees_with_reference(optimizers, truncate, split):
    seed = OPTIMIZER_PAIRS.index(optimizers)
    g, ids, offsets, mean_pooled = random_bags(seed, offsets_dtype=torch.int64 if seed % 2 else torch.int32)
    max_len = torch.randint(1, 4, (FIELDS,), generator=g) if truncate else None
    field_rows = field_rows_of(ids, offsets, FIELDS, ROWS) if split != "by owner" else None
    if split == "by disjoint fields":  # each field its own rows, scattered over the table (a fast tier)
        ids.copy_(torch.randperm(ROWS, generator=g)[ids])
        field_rows = None
    dims = (16, 1)
    # Each table its own optimizer and hyper-parameters (and decay), as each embedding has.
    specs = [SparseOptimizer(name, lr=lr, weight_decay=decay)
             for name, lr, decay in zip(optimizers, (0.1, 0.03), (0.0, 0.1))]
    weights = [torch.randn(ROWS, dim, generator=g) for dim in dims]
    slots = [[torch.rand(shape, generator=g) for shape in spec.slot_shapes(ROWS, dim)]
             for spec, dim in zip(specs, dims)]

    def copies():
        return [w.clone() for w in weights], [[s.clone() for s in table] for table in slots]

    (want_w, want_s), (alone_w, alone_s) = copies(), copies()
    for step in range(1, 4):
        grads = [torch.randn(SAMPLES, FIELDS, dim, generator=g) for dim in dims]
        steps = [step, step + 5]  # each table its own step count
        reference.fused_update_many(want_w, want_s, ids, offsets, grads, FIELDS, specs, steps, mean_pooled, max_len)
        cpu.fused_update_many(weights, slots, ids, offsets, grads, FIELDS, specs, steps, mean_pooled, max_len,
                              field_rows, disjoint_fields=split == "by disjoint fields")
        for table in range(len(dims)):
            cpu.fused_update(alone_w[table], alone_s[table], ids, offsets, grads[table], FIELDS, specs[table],
                             steps[table], mean_pooled, max_len, field_rows,
                             disjoint_fields=split == "by disjoint fields")
    for table in range(len(dims)):
        torch.testing.assert_close(weights[table], want_w[table], atol=1e-5, rtol=1e-5)
        # Sharing a call changes nothing in a table's arithmetic: bit for bit its own call's.
        assert torch.equal(weights[table], alone_w[table])
        for got, want, alone in zip(slots[table], want_s[table], alone_s[table], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            assert torch.equal(got, alone)


def test_fused_update_many_refuses_tables_of_different_rows():
    g, ids, offsets, _ = random_bags(0)
    weights = [torch.randn(ROWS, 4), torch.randn(ROWS + 1, 1)]
    grads = [torch.zeros(SAMPLES, FIELDS, 4), torch.zeros(SAMPLES, FIELDS, 1)]
    with pytest.raises(RuntimeError, match="same rows"):
        cpu.fused_update_many(weights, [[], []], ids, offsets, grads, FIELDS, [SparseOptimizer("sgd")] * 2, [1, 1])


def test_a_backend_without_many_table_ops_runs_its_own_table_by_table(monkeypatch):
    """The dispatch composes lookup_many and fused_update_many from a backend's one-table
    ops where it has no fused ones (the Triton backend)."""
    calls = []

    class OneTableBackend:
        @staticmethod
        def lookup(weight, *args):
            calls.append("lookup")
            return reference.lookup(weight, *args)

        @staticmethod
        def fused_update(*args):
            calls.append("fused_update")
            reference.fused_update(*args)

    monkeypatch.setattr(kernels, "backend_for", lambda device: OneTableBackend)
    g, ids, offsets, mean_pooled = random_bags(1)
    weights = [torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, 1, generator=g)]
    outs = kernels.lookup_many(weights, ids, offsets, FIELDS, mean_pooled)
    assert [out.shape[-1] for out in outs] == [8, 1]
    kernels.fused_update_many(weights, [[], []], ids, offsets, [torch.ones_like(o) for o in outs], FIELDS,
                              [SparseOptimizer("sgd")] * 2, [1, 1], mean_pooled)
    assert calls == ["lookup", "lookup", "fused_update", "fused_update"]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_pooled_bags_land_in_and_step_from_columns_of_a_flat_input(monkeypatch, backend):
    """A lookup into some columns of a dense part's flat input (samples, width) writes them
    in place (the C++ kernels; another backend copies them there) and nothing else; the
    update reads its gradient from such columns in place; both exactly as contiguous ones."""
    monkeypatch.setattr(kernels, "backend_for", lambda device: load_backend(backend))
    g, ids, offsets, mean_pooled = random_bags(2)
    max_len = torch.randint(1, 4, (FIELDS,), generator=g)
    weights = [torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, 1, generator=g)]
    flat = torch.full((SAMPLES, 3 + FIELDS * 8 + 5), 7.0)
    columns = flat[:, 3:3 + FIELDS * 8].unflatten(1, (FIELDS, 8))
    outs = kernels.lookup_many(weights, ids, offsets, FIELDS, mean_pooled, max_len, into=[columns, None])
    alone = kernels.lookup_many(weights, ids, offsets, FIELDS, mean_pooled, max_len)
    assert outs[0].data_ptr() == columns.data_ptr() and outs[0].stride() == columns.stride()
    assert torch.equal(columns, alone[0]) and torch.equal(outs[1], alone[1])
    assert (flat[:, :3] == 7.0).all() and (flat[:, 3 + FIELDS * 8:] == 7.0).all()

    specs = [SparseOptimizer("adagrad", lr=0.1), SparseOptimizer("adam", lr=0.03)]
    slots = [[torch.rand(shape, generator=g) for shape in spec.slot_shapes(ROWS, w.shape[1])]
             for spec, w in zip(specs, weights)]
    flat_grad = torch.randn(SAMPLES, 3 + FIELDS * 8 + 5, generator=g)
    grads = [flat_grad[:, 3:3 + FIELDS * 8].unflatten(1, (FIELDS, 8)), torch.randn(SAMPLES, FIELDS, 1, generator=g)]
    strided_w, strided_s = [w.clone() for w in weights], [[s.clone() for s in t] for t in slots]
    kernels.fused_update_many(strided_w, strided_s, ids, offsets, grads, FIELDS, specs, [1, 1], mean_pooled, max_len)
    kernels.fused_update_many(weights, slots, ids, offsets, [grad.contiguous() for grad in grads], FIELDS, specs,
                              [1, 1], mean_pooled, max_len)
    for got, want in zip([*strided_w, *sum(strided_s, [])], [*weights, *sum(slots, [])], strict=True):
        assert torch.equal(got, want)


def test_lookups_in_two_threads_never_write_into_one_buffer():
    """Two models scoring side by side (a server's threads, an evaluation beside another)
    each get their own rows: the lookup releases the GIL, and the buffers it recycles are
    per thread. Many rounds of same-shaped lookups of different tables, each checked."""
    fields, rows = 8, 10_000
    g, ids, offsets, mean_pooled = random_bags(0, samples=4_096, fields=fields, rows=rows)
    tables = [torch.randn(rows, 16, generator=g) for _ in range(2)]
    expected = [cpu.lookup(table, ids, offsets, fields, mean_pooled).clone() for table in tables]
    start, wrong = threading.Barrier(2), []

    def score(table: int) -> None:
        start.wait()
        for _ in range(100):
            out = cpu.lookup(tables[table], ids, offsets, fields, mean_pooled)
            if not torch.equal(out, expected[table]):
                wrong.append(table)
            del out  # its buffer is free again: the next lookup (either thread's) may take it

    threads = [threading.Thread(target=score, args=(table,)) for table in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
