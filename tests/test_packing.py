"""pack(): the vectorised packer against a per-row reference; to_torch() without copies;
source positions in the schema metadata; sliced batches."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch

from picasso.batch import POSITIONS_KEY, PackedBatch, pack
from picasso.kernels import SparseOptimizer, load_backend
from picasso.packing import PackingPlan
from picasso.spec import parse_spec
from picasso.spec_refs import load_spec

from helpers import canonical_table, reference_pack, reference_pool, small_spec

# Several groups: two by dim, one explicit group, one-hot and multi-hot, sum and mean.
MIXED = parse_spec(
    {
        "name": "mixed",
        "label": "label",
        "dense": ["d1", "d2", "d3"],
        "sparse": [
            {"name": "a", "embedding_dim": 4, "hash_buckets": 13},
            {"name": "b", "embedding_dim": 4, "vocab_size": 7, "max_len": 4, "pooling": "mean"},
            {"name": "c", "embedding_dim": 8, "hash_buckets": 11},
            {"name": "d", "embedding_dim": 4, "hash_buckets": 5, "max_len": 3},
            {"name": "e", "embedding_dim": 8, "vocab_size": 3, "max_len": 2, "pooling": "mean"},
            {"name": "f", "embedding_dim": 4, "hash_buckets": 9, "group": "solo"},
        ],
    }
)
ONE_HOT = parse_spec(
    {
        "label": "label",
        "dense": ["x"],
        "sparse": [
            {"name": "a", "embedding_dim": 4, "hash_buckets": 13},
            {"name": "b", "embedding_dim": 4, "vocab_size": 7},
            {"name": "c", "embedding_dim": 2, "hash_buckets": 3},
        ],
    }
)


def one_hot_table(spec, rows: int, seed: int) -> pa.Table:
    """Every bag has exactly one id: the packer's fast path."""
    return canonical_table(spec, rows, seed, empty_rate=0.0)


def assert_matches_reference(batch: PackedBatch, table: pa.Table, spec, plan) -> None:
    expected = reference_pack(table, spec, plan)
    data = batch.data
    assert batch.num_samples == table.num_rows
    assert data.schema.field("label").type == pa.float32()
    assert data.column("label").to_pylist() == expected["label"]
    if spec.dense:
        assert data.column("dense").type == pa.list_(pa.float32(), len(spec.dense))
        assert data.column("dense").to_pylist() == expected["dense"]
    else:  # Arrow has no fixed-size list of size 0: the column is left out
        assert "dense" not in data.schema.names
    tensors = batch.to_torch()
    assert tensors.num_samples == table.num_rows
    assert tensors.label.dtype == torch.float32 and tensors.label.tolist() == expected["label"]
    assert tensors.dense.dtype == torch.float32
    assert tensors.dense.shape == (table.num_rows, len(spec.dense))
    assert tensors.dense.tolist() == expected["dense"]
    assert set(tensors.ids) == set(tensors.offsets) == {g.name for g in plan.groups}
    for g in plan.groups:
        ids_column, offsets_column = data.column(f"{g.name}.ids"), data.column(f"{g.name}.offsets")
        assert ids_column.type == pa.list_(pa.int64())
        assert offsets_column.type == pa.list_(pa.int32(), g.num_fields)
        # per sample: that sample's ids of every field of the group, field after field
        assert ids_column.to_pylist() == expected["per_sample_ids"][g.name]
        # flat: the CSR over samples x fields
        assert tensors.ids[g.name].dtype == torch.int64
        assert tensors.ids[g.name].tolist() == expected["ids"][g.name]
        assert tensors.offsets[g.name].dtype == torch.int32
        assert tensors.offsets[g.name].shape == (table.num_rows * g.num_fields,)
        assert tensors.offsets[g.name].tolist() == expected["offsets"][g.name]
        # every id is a row of the group's table
        if tensors.ids[g.name].numel():
            assert 0 <= int(tensors.ids[g.name].min()) and int(tensors.ids[g.name].max()) < g.num_rows


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_pack_matches_reference_multi_hot(seed, rows):
    plan = PackingPlan.from_spec(MIXED)
    assert len(plan.groups) == 3
    table = canonical_table(MIXED, rows, seed)
    assert_matches_reference(pack(table, MIXED, plan), table, MIXED, plan)


@pytest.mark.parametrize("seed", [0, 1])
def test_pack_matches_reference_one_hot(seed):
    plan = PackingPlan.from_spec(ONE_HOT)
    table = one_hot_table(ONE_HOT, 50, seed)
    assert_matches_reference(pack(table, ONE_HOT, plan), table, ONE_HOT, plan)


def test_pack_matches_reference_all_bags_empty():
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 9, 4, empty_rate=1.0)
    batch = pack(table, MIXED, plan)
    assert_matches_reference(batch, table, MIXED, plan)
    for g in plan.groups:
        assert batch.to_torch().ids[g.name].numel() == 0


def test_pack_matches_reference_empty_bags_at_the_edges():
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 5, 9, empty_rate=0.0)
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    for name in MIXED.sparse_names:  # first and last samples: nothing at all
        columns[name][0] = []
        columns[name][-1] = []
    table = pa.table({name: pa.array(v, table.schema.field(name).type) for name, v in columns.items()})
    assert_matches_reference(pack(table, MIXED, plan), table, MIXED, plan)


def test_pack_one_hot_mixed_with_one_empty_bag():
    # One missing value among one-hot fields: the packer must leave its fast path.
    plan = PackingPlan.from_spec(ONE_HOT)
    table = one_hot_table(ONE_HOT, 6, 3)
    bags = table.column("b").to_pylist()
    bags[2] = []
    table = table.set_column(table.schema.get_field_index("b"), "b", pa.array(bags, pa.list_(pa.int64())))
    assert_matches_reference(pack(table, ONE_HOT, plan), table, ONE_HOT, plan)


def test_pack_zero_rows():
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 0, 0)
    batch = pack(table, MIXED, plan)
    assert batch.num_samples == 0
    tensors = batch.to_torch()
    assert tensors.dense.shape == (0, 3)
    for g in plan.groups:
        assert tensors.ids[g.name].numel() == 0 and tensors.offsets[g.name].numel() == 0


def test_pack_a_slice_of_a_table_and_a_chunked_table():
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 40, 5)
    part = table.slice(13, 17)
    assert_matches_reference(pack(part, MIXED, plan), part, MIXED, plan)
    chunked = pa.concat_tables([table.slice(0, 10), table.slice(10)])
    assert chunked.column("a").num_chunks == 2
    assert_matches_reference(pack(chunked, MIXED, plan), table, MIXED, plan)


def test_pack_criteo_scaled_spec():
    spec = load_spec("criteo:20")
    plan = PackingPlan.from_spec(spec)
    table = canonical_table(spec, 16, 11)
    assert_matches_reference(pack(table, spec, plan), table, spec, plan)


def test_pack_small_spec_from_decoder():
    """Decoder output packs straight away: the canonical schema is pack's input."""
    from picasso.connectors.decoding.record_decoder import RecordDecoder

    spec = small_spec()
    plan = PackingPlan.from_spec(spec)
    messages = [
        '{"label": 1, "d1": 1, "d2": 2, "h": "a", "v": 3, "bag": ["x", "y"], "vbag": [1, 2]}',
        '{"label": 0}',
        '{"label": 0, "h": "b", "bag": ["z"], "vbag": [4, 5, 6]}',
    ]
    table = RecordDecoder(spec).decode_json(messages, "s").table
    assert_matches_reference(pack(table, spec, plan), table, spec, plan)


# -- zero copy ------------------------------------------------------------------------------


def values_address(array: pa.Array, width: int) -> int:
    """Address of the first value of a primitive array (offset included)."""
    return array.buffers()[1].address + array.offset * width


def test_to_torch_is_zero_copy():
    plan = PackingPlan.from_spec(MIXED)
    batch = pack(canonical_table(MIXED, 32, 6), MIXED, plan)
    tensors = batch.to_torch()
    data = batch.data
    assert tensors.label.data_ptr() == values_address(data.column("label"), 4)
    assert tensors.dense.data_ptr() == values_address(data.column("dense").values, 4)
    for g in plan.groups:
        assert tensors.ids[g.name].data_ptr() == values_address(data.column(f"{g.name}.ids").values, 8)
        assert tensors.offsets[g.name].data_ptr() == values_address(data.column(f"{g.name}.offsets").values, 4)


def test_to_torch_is_zero_copy_one_hot():
    plan = PackingPlan.from_spec(ONE_HOT)
    batch = pack(one_hot_table(ONE_HOT, 20, 1), ONE_HOT, plan)
    tensors = batch.to_torch()
    for g in plan.groups:
        assert tensors.ids[g.name].data_ptr() == values_address(batch.data.column(f"{g.name}.ids").values, 8)
        assert tensors.offsets[g.name].data_ptr() == values_address(batch.data.column(f"{g.name}.offsets").values, 4)


def test_to_torch_is_zero_copy_after_ipc_round_trip():
    """The Kafka payload path: a batch read back from an Arrow IPC stream still crosses
    into torch without copying, and keeps its positions."""
    plan = PackingPlan.from_spec(MIXED)
    batch = pack(canonical_table(MIXED, 10, 8), MIXED, plan, positions={"clicks/0": 1234})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.data.schema) as writer:
        writer.write_batch(batch.data)
    read = pa.ipc.open_stream(sink.getvalue()).read_next_batch()
    again = PackedBatch(read)
    assert again.positions == {"clicks/0": 1234}
    tensors, original = again.to_torch(), batch.to_torch()
    assert tensors.dense.data_ptr() == values_address(read.column("dense").values, 4)
    for g in plan.groups:
        assert torch.equal(tensors.ids[g.name], original.ids[g.name])
        assert torch.equal(tensors.offsets[g.name], original.offsets[g.name])
        assert tensors.ids[g.name].data_ptr() == values_address(read.column(f"{g.name}.ids").values, 8)


# -- positions --------------------------------------------------------------------------------


def test_positions_round_trip_through_schema_metadata():
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 4, 0)
    positions = {"day-2024-01-02.parquet": 4096, "clicks/3": 17}
    batch = pack(table, MIXED, plan, positions=positions)
    assert batch.positions == positions
    assert POSITIONS_KEY in batch.data.schema.metadata
    # the metadata alone carries them: a new PackedBatch over the same record batch
    rebuilt = pa.RecordBatch.from_arrays(batch.data.columns, schema=batch.data.schema)
    assert PackedBatch(rebuilt).positions == positions
    assert PackedBatch(batch.data.slice(1, 2)).positions == positions
    assert pack(table, MIXED, plan).positions == {}


# -- sliced batches -----------------------------------------------------------------------------


@pytest.mark.parametrize("start, length", [(0, 5), (3, 10), (7, 1), (19, 1)])
def test_sliced_batch_gives_the_slice_tensors(start, length):
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 20, 12)
    batch = pack(table, MIXED, plan, positions={"f": 20})
    sliced = PackedBatch(batch.data.slice(start, length))
    assert_matches_reference(sliced, table.slice(start, length), MIXED, plan)
    tensors = sliced.to_torch()
    # ids and labels are still views into the original buffers
    full = batch.to_torch()
    assert tensors.label.data_ptr() == full.label.data_ptr() + 4 * start
    for g in plan.groups:
        first = batch.data.column(f"{g.name}.ids").offsets[start].as_py()
        if tensors.ids[g.name].numel():
            assert tensors.ids[g.name].data_ptr() == full.ids[g.name].data_ptr() + 8 * first


def test_sliced_one_hot_batch():
    plan = PackingPlan.from_spec(ONE_HOT)
    table = one_hot_table(ONE_HOT, 12, 2)
    batch = pack(table, ONE_HOT, plan)
    assert_matches_reference(PackedBatch(batch.data.slice(4, 5)), table.slice(4, 5), ONE_HOT, plan)


# -- the packed lookup on packed batches ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("slice_", [None, (3, 11)])
def test_packed_lookup_pools_each_bag(slice_, backend):
    """One lookup per group over a packed batch equals pooling every bag by hand (sum or
    mean per field, zeros for empty bags), sliced batch included."""
    kernels = load_backend(backend)
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 24, 13)
    batch = pack(table, MIXED, plan)
    if slice_:
        batch = PackedBatch(batch.data.slice(*slice_))
        table = table.slice(*slice_)
    generator = torch.Generator().manual_seed(0)
    weights = {g.name: torch.randn(g.num_rows, g.embedding_dim, generator=generator, dtype=torch.float64) for g in plan.groups}
    expected = reference_pool(table, MIXED, plan, weights)
    tensors = batch.to_torch()
    for g in plan.groups:
        pooled = kernels.lookup(weights[g.name].float(), tensors.ids[g.name], tensors.offsets[g.name], g.num_fields,
                                torch.tensor(g.mean_pooled))
        assert pooled.shape == (table.num_rows, g.num_fields, g.embedding_dim)
        torch.testing.assert_close(pooled, expected[g.name].float())


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_fused_update_applies_the_exact_gradient(backend):
    """With SGD at lr 1, the fused backward+update moves each row by exactly the gradient
    autograd computes for pooling by hand: repeated ids summed, mean bags scaled."""
    kernels = load_backend(backend)
    plan = PackingPlan.from_spec(MIXED)
    table = canonical_table(MIXED, 16, 14)
    tensors = pack(table, MIXED, plan).to_torch()
    g = next(g for g in plan.groups if any(g.mean_pooled))
    weight = torch.randn(g.num_rows, g.embedding_dim, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(table.num_rows, g.num_fields, g.embedding_dim, dtype=torch.float64)
    (reference_pool(table, MIXED, plan, {g.name: weight})[g.name] * upstream).sum().backward()
    updated = weight.detach().float().clone()
    kernels.fused_update(updated, [], tensors.ids[g.name], tensors.offsets[g.name], upstream.float(), g.num_fields,
                         SparseOptimizer("sgd", lr=1.0), 1, torch.tensor(g.mean_pooled))
    torch.testing.assert_close(updated, (weight - weight.grad).detach().float())


def test_a_spec_without_dense_fields_packs_or_is_refused():
    """parse_spec accepts a spec with no dense fields (they are optional, and WideDeep
    handles none). Such a spec must then pack and cross into torch, with a dense tensor
    of shape (N, 0); the alternative is to refuse it up front with a SpecError."""
    from picasso.spec import SpecError

    raw = {"label": "label", "sparse": [{"name": "a", "embedding_dim": 4, "hash_buckets": 10}]}
    try:
        spec = parse_spec(raw)
    except SpecError as err:
        assert "dense" in str(err)
        return
    plan = PackingPlan.from_spec(spec)
    table = canonical_table(spec, 5, 0)
    assert "dense" not in table.column_names
    batch = pack(table, spec, plan)
    assert batch.to_torch().dense.shape == (5, 0)
    assert_matches_reference(batch, table, spec, plan)
