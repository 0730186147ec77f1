"""One pass from a raw Arrow batch to a PackedBatch (picasso.kernels.decode_pack, through
connectors.decoding.packed_decode) changes nothing: over random batches (labels, dense
and id columns of every type the op takes, with nulls, null-typed and missing columns,
bad labels, bad dense values, bad ids, multi-hot lists, columns no field names, 0, 1, 2
and more rows, sliced batches) it gives exactly what the reference path gives,
RecordDecoder.decode_table then picasso.batch.pack: the packed batch bit for bit, the
same dead letters (position, payload and reason), valid mask and absent counts. Batches
it declines take the reference path, and say so.

The examples are derandomized so that the suite is repeatable;
PICASSO_PROPERTY_EXAMPLES=N (and PICASSO_PROPERTY_RANDOM=1) explores further.
"""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from property_settings import PROPERTY
from test_decode_ids import _bounds, id_column, sparse_field

import picasso.kernels
from picasso.batch import PackedBatch, pack
from picasso.builtin_specs import builtin_spec
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.packed_decode import PackingDecoder
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.kernels import load_backend
from picasso.packing import PackingPlan
from picasso.spec import DenseField, DynamicTable, FeatureSpec, SparseField

cpu = load_backend("cpu")  # the op is C++ only: without it every batch takes the reference path

NUMBER_TYPES = [pa.int8(), pa.uint8(), pa.int32(), pa.int64(), pa.uint64(), pa.float32(), pa.float64()]


@st.composite
def number_column(draw, n: int, label: bool) -> pa.Array:
    """n numbers of one Arrow type (or Arrow's null type), some null: the edges of the
    type, values that are not finite and, in float64, ones that overflow a float32."""
    t = draw(st.sampled_from(NUMBER_TYPES + [pa.null()] * (not label)))
    if pa.types.is_null(t):
        return pa.nulls(n)
    if pa.types.is_integer(t):
        low, high = _bounds(t)
        values = st.one_of(st.sampled_from([v for v in (0, 1, 2, -1, 7, low, high) if low <= v <= high]),
                           st.integers(low, high))
        good = st.sampled_from([0, 1])
    else:
        edges = [0.0, 1.0, -0.0, 0.5, 2.0, -1.0, 1e-40, 3.4e38, math.inf, -math.inf, math.nan]
        if t.bit_width == 64:
            edges += [1e39, -1e39, 3.5e38, 1e308, -1e308]
        values = st.one_of(st.sampled_from(edges), st.floats(width=t.bit_width))
        good = st.sampled_from([0.0, 1.0, 0.5])
    if label and draw(st.integers(0, 2)) < 2:  # mostly good labels: rows live on to be judged on the rest
        values = good
    if draw(st.integers(0, 3 if label else 1)) == 1:
        values = st.one_of(values, st.none())
    return pa.array(draw(st.lists(values, min_size=n, max_size=n)), t)


@st.composite
def spec_and_batch(draw) -> tuple[FeatureSpec, pa.RecordBatch]:
    dense = [DenseField(f"d{j}", draw(st.sampled_from(["identity", "log1p"]))) for j in range(draw(st.integers(0, 3)))]
    sparse = []
    for k in range(draw(st.integers(1, 4))):
        # Fields share groups in any order, and a group's fields are of any kinds.
        sparse.append(dataclasses.replace(draw(sparse_field(f"s{k}")), group=draw(st.sampled_from([None, "g", "h"]))))
    spec = FeatureSpec("label", tuple(dense), tuple(sparse))
    # Two fields of 2^62 hash buckets in one group: a table no int64 row offset reaches.
    assume(all(group.num_rows < 2**63 for group in PackingPlan.from_spec(spec).groups))
    before, n, after = draw(st.integers(0, 2)), draw(st.sampled_from([0, 1, 2, 3, 7, 12])), draw(st.integers(0, 2))
    total = before + n + after
    columns = {}
    names = ["label", *spec.dense_names, *spec.sparse_names, "extra"]
    for name in draw(st.permutations(names)):  # any column order
        if draw(st.integers(0, 6)) == 6:
            continue  # now and then a column the batch lacks
        if name == "extra":
            columns[name] = pa.array([draw(st.sampled_from(["x", None])) for _ in range(total)], pa.string())
        elif name == "label" or name in spec.dense_names:
            columns[name] = draw(number_column(total, label=name == "label"))
        elif draw(st.integers(0, 7)) == 7:
            columns[name] = pa.nulls(total)  # Arrow's null type: no ids at all
        else:
            columns[name] = draw(id_column(spec.sparse_field(name), total, kernel_only=True))
    batch = pa.RecordBatch.from_pydict(columns) if columns else pa.RecordBatch.from_pydict({}).slice(0, 0)
    if not columns:  # a batch of no columns has no rows to slice
        return spec, batch
    return spec, batch.slice(before, n)  # a sliced batch: its columns' buffers start past 0


def reference(decoder: RecordDecoder, plan: PackingPlan, batch, positions, starts):
    decoded = decoder.decode_table(batch, "src", first_position=100)
    return decoded, pack(decoded.table, decoder.spec, plan, positions, starts)


def assert_same_packed(got: PackedBatch, want: PackedBatch) -> None:
    """Bit for bit: the same schema (and positions), and the same bytes in every tensor."""
    assert got.data.schema.equals(want.data.schema, check_metadata=True)
    a, b = got.to_torch(), want.to_torch()
    for name in ("label", "dense"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.numpy().tobytes() == y.numpy().tobytes(), name  # NaN labels too, where no label is required
    assert a.ids.keys() == b.ids.keys()
    for group in a.ids:
        assert np.array_equal(a.ids[group].numpy(), b.ids[group].numpy()), group
        assert a.offsets[group].dtype == b.offsets[group].dtype
        assert np.array_equal(a.offsets[group].numpy(), b.offsets[group].numpy()), group


def assert_same_as_reference(decoder: RecordDecoder, batch, one_pass: bool | None = True):
    plan = PackingPlan.from_spec(decoder.spec)
    positions, starts = {"src": 100 + batch.num_rows}, {"src": 100}
    got = PackingDecoder(decoder, plan).decode_and_pack(batch, "src", positions, starts, first_position=100)
    decoded, packed = reference(decoder, plan, batch, positions, starts)
    if one_pass is not None:
        assert got.one_pass == one_pass
    assert [(x.source, x.position, x.payload, x.reason) for x in got.dead_letters] == \
        [(x.source, x.position, x.payload, x.reason) for x in decoded.dead_letters]
    assert np.array_equal(got.valid_mask, decoded.valid_mask)
    assert got.absent == decoded.absent
    assert got.rows_in == decoded.rows_in
    assert_same_packed(got.packed, packed)
    return got


OPTIONS = [DecodeOptions(), DecodeOptions(require_label=False)]


@pytest.mark.parametrize("options", OPTIONS, ids=["training", "no-label-required"])
@PROPERTY
@given(case=spec_and_batch())
def test_one_pass_gives_exactly_the_reference_result(options, case):
    spec, batch = case
    assert_same_as_reference(RecordDecoder(spec, options), batch)


@PROPERTY
@given(case=spec_and_batch())
def test_refused_unknown_fields_take_the_reference_path_only_where_a_batch_has_one(case):
    spec, batch = case
    decoder = RecordDecoder(spec, DecodeOptions(unknown_fields="reject"))
    assert_same_as_reference(decoder, batch, one_pass="extra" not in batch.schema.names)


def spec_of_every_kind() -> FeatureSpec:
    return FeatureSpec("label", (DenseField("d0"), DenseField("d1", "log1p")),
                       (SparseField("h", 4, hash_buckets=100), SparseField("v", 4, vocab_size=10, max_len=3),
                        SparseField("k", 4, max_len=2, group="own",
                                    dynamic=DynamicTable(capacity=8, hash_seed=7))))


GOOD = {"label": pa.array([0, 1, 1]), "d0": pa.array([1.5, None, 2.0]), "d1": pa.array([3, 4, None]),
        "h": pa.array(["a", "b", None]), "v": pa.array([[1, 2], [], None]), "k": pa.array([["x"], ["y", "z"], []])}


@pytest.mark.parametrize("name, column", [
    ("h", pa.array(["a", "b", "a"]).dictionary_encode()),
    ("d0", pa.array([True, False, True])),
    ("d0", pa.array(np.array([1, 2, 3], np.float16))),
    ("label", pa.array(["0", "1", "x"])),
    ("v", pa.array(["1", "2", "3"])),  # a vocab field's strings
    ("v", pa.array([[None], [], None], pa.list_(pa.null()))),
    ("k", pa.array([b"x", b"y", b"z"])),
    ("h", pa.array([[["a"]], [], None])),
])
def test_columns_the_op_declines_take_the_reference_path(name, column):
    batch = pa.RecordBatch.from_pydict({**GOOD, name: column})
    assert_same_as_reference(RecordDecoder(spec_of_every_kind()), batch, one_pass=False)


def test_specs_with_crosses_and_tables_of_many_chunks_take_the_reference_path():
    spec = builtin_spec("criteo")
    table, _ = PlantedModel(spec).sample(300, 0)
    decoder = RecordDecoder(spec)
    assert_same_as_reference(decoder, pa.concat_tables([table.slice(0, 100), table.slice(100)]), one_pass=False)
    assert_same_as_reference(decoder, table.combine_chunks(), one_pass=True)  # a table of one chunk
    crossed = FeatureSpec(spec.label, spec.dense, spec.sparse, crosses=(
        SparseField("c1_c2", 4, hash_buckets=1000, cross_of=("C1", "C2"), part="wide"),))
    assert_same_as_reference(RecordDecoder(crossed), table.to_batches()[0], one_pass=False)


def test_without_the_cpu_backend_every_batch_takes_the_reference_path():
    with mock.patch.object(picasso.kernels, "host_backend", lambda: None):
        assert_same_as_reference(RecordDecoder(spec_of_every_kind()), pa.RecordBatch.from_pydict(GOOD), one_pass=False)


@pytest.mark.parametrize("name", ["criteo", "criteo:400"])
def test_synthetic_criteo_batches_with_bad_rows(name):
    """The planted data's shapes (string tokens, multi-hot lists, int64 dense columns with
    nulls), then with a bad label, a bad dense value and a bag too long planted among them."""
    spec = builtin_spec(name)
    table, _ = PlantedModel(spec).sample(1024, 1)
    got = assert_same_as_reference(RecordDecoder(spec), table.to_batches()[0])
    assert not got.dead_letters
    labels = table.column(spec.label).to_numpy().astype(np.float64)
    labels[[3, 10]] = [2.0, math.nan]
    dense = table.column(spec.dense_names[0]).to_pylist()
    dense[5] = math.inf
    one_hot = next(f.name for f in spec.sparse if f.max_len == 1)
    bags = [[token] for token in table.column(one_hot).to_pylist()]
    bags[7] = bags[7] * 2
    columns = dict(zip(table.column_names, table.columns))
    columns.update({spec.label: pa.array(labels), spec.dense_names[0]: pa.array(dense, pa.float64()),
                    one_hot: pa.array(bags)})
    got = assert_same_as_reference(RecordDecoder(spec), pa.table(columns).combine_chunks().to_batches()[0])
    assert [letter.position for letter in got.dead_letters] == [103, 105, 107, 110]


def test_a_batch_of_no_rows_and_one_of_no_columns():
    decoder = RecordDecoder(spec_of_every_kind())
    assert_same_as_reference(decoder, pa.RecordBatch.from_pydict(GOOD).slice(3, 0))
    got = assert_same_as_reference(decoder, pa.RecordBatch.from_pydict({"label": pa.array([1.0, 0.0])}))
    assert got.absent == {"d0": 2, "d1": 2, "h": 2, "v": 2, "k": 2}
