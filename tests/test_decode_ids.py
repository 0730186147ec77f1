"""One kernel call decodes every id column of a batch (picasso.kernels.decode_ids), and
changes no verdict.

Over random columns (strings, integers of every width, alone or in lists, with nulls,
null lists, negative and huge ids, unicode, sliced arrays), the C++ op gives exactly its
reference's ids, bags and problems; and a decoder using the op gives exactly the table
and dead letters of today's per-field path (decoding.sparse_ids), missing fields and
columns the op does not take (a vocab field's strings, floats) included.

The examples are derandomized so that the suite is repeatable;
PICASSO_PROPERTY_EXAMPLES=N (and PICASSO_PROPERTY_RANDOM=1) explores further.
"""

from __future__ import annotations

import pickle
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_settings import PROPERTY

import picasso.kernels
from picasso.builtin_specs import builtin_spec
from picasso.connectors.decoding import batch_ids
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels import decode_ids_reference, load_backend
from picasso.kernels.id_columns import IdRules
from picasso.spec import DynamicTable, FeatureSpec, SparseField
from picasso.connectors.synthetic.planted import PlantedModel

cpu = load_backend("cpu")

INTEGER_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
STRING_TYPES = [pa.string(), pa.large_string()]


def _bounds(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    return (0, 2**bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def ids_of(t: pa.DataType):
    if t in STRING_TYPES:  # any text Arrow holds: unicode, empty, longer than a word
        return st.one_of(st.sampled_from(["", "a", "68fd1e64", "é", "日本語", "12345678", "123456789"]),
                         st.text(st.characters(blacklist_categories=["Cs"]), max_size=20))
    low, high = _bounds(t)
    edges = [v for v in (0, 1, 2, 9, 10, 19, 20, -1, -2, low, high, 2**63 - 1, 2**63) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


@st.composite
def sparse_field(draw, name: str) -> SparseField:
    kind = draw(st.sampled_from(["hashed", "dynamic", "vocab"]))
    max_len = draw(st.sampled_from([1, 2, 3]))
    if kind == "hashed":
        buckets = draw(st.sampled_from([1, 3, 1000, 2**31 + 11, 2**62 + 1]))
        return SparseField(name, embedding_dim=4, hash_buckets=buckets, max_len=max_len)
    if kind == "dynamic":
        seed = draw(st.sampled_from([None, 12345, 2**64 - 1]))
        return SparseField(name, embedding_dim=4, max_len=max_len, dynamic=DynamicTable(capacity=8, hash_seed=seed))
    return SparseField(name, embedding_dim=4, vocab_size=draw(st.sampled_from([1, 10, 20])), max_len=max_len)


@st.composite
def id_column(draw, f: SparseField, n: int, kernel_only: bool) -> pa.Array:
    """A column of n rows for field f, sliced out of a longer one (so that its buffers
    start past 0); kernel_only: only types the op takes."""
    types = INTEGER_TYPES + (STRING_TYPES if f.takes_strings else [])
    if not kernel_only:
        types = types + STRING_TYPES + [pa.float64()]
    t = draw(st.sampled_from(types))
    values = st.floats(-3, 30) if pa.types.is_floating(t) else ids_of(t)
    ids = st.one_of(values, st.none()) if draw(st.booleans()) else values
    shape = draw(st.sampled_from(["one", "list", "large_list"]))
    before, after = draw(st.integers(0, 3)), draw(st.integers(0, 2))
    if shape == "one":
        items = draw(st.lists(ids, min_size=n + before + after, max_size=n + before + after))
        return pa.array(items, t).slice(before, n)
    bag = st.lists(ids, max_size=4)
    items = draw(st.lists(st.one_of(bag, st.none()) if draw(st.booleans()) else bag,
                          min_size=n + before + after, max_size=n + before + after))
    list_type = pa.list_(t) if shape == "list" else pa.large_list(t)
    return pa.array(items, list_type).slice(before, n)


@st.composite
def batch(draw, kernel_only: bool) -> tuple[list[SparseField], dict[str, pa.Array], int]:
    n = draw(st.integers(0, 12))
    fields = [draw(sparse_field(f"f{i}")) for i in range(draw(st.integers(1, 5)))]
    columns = {}
    for f in fields:
        if kernel_only or draw(st.integers(0, 5)):  # now and then a field the batch lacks
            columns[f.name] = draw(id_column(f, n, kernel_only))
    return fields, columns, n


@PROPERTY
@given(batch(kernel_only=True))
def test_the_kernel_gives_its_references_ids_bags_and_problems(case):
    fields, columns, n = case
    rules = IdRules.of([batch_ids.id_rule(f) for f in fields])
    arrays = [columns[f.name] for f in fields]
    got, want = cpu.decode_ids(arrays, rules, n), decode_ids_reference.decode_ids(arrays, rules, n)
    for part in ("ids", "offsets", "starts", "problems"):
        assert np.array_equal(getattr(got, part), getattr(want, part)), part


@contextmanager
def decoding_ids(path: str):
    """The decoder's sparse columns through the C++ op, its reference, or today's
    per-field path alone (no column fits the kernel)."""
    if path == "today":
        with mock.patch.object(batch_ids, "fits_kernel", lambda f, values, n: False):
            yield
        return
    op = cpu.decode_ids if path == "c++" else decode_ids_reference.decode_ids
    with mock.patch.object(picasso.kernels, "decode_ids", op):
        yield


def decoded(spec: FeatureSpec, table: pa.Table, path: str) -> tuple[pa.Table, list[tuple[int, str]]]:
    with decoding_ids(path):
        result = RecordDecoder(spec).decode_table(table, "src")
    return result.table, [(letter.position, letter.reason) for letter in result.dead_letters]


def assert_same_decoding(spec: FeatureSpec, table: pa.Table) -> None:
    want = decoded(spec, table, "today")
    for path in ("c++", "reference"):
        got = decoded(spec, table, path)
        assert got[1] == want[1], path
        assert got[0].equals(want[0]), path


@PROPERTY
@given(batch(kernel_only=False), st.data())
def test_the_decoder_gives_todays_rows_and_verdicts(case, data):
    """Labels that are missing or out of range too: a row keeps its first reason."""
    fields, columns, n = case
    labels = data.draw(st.lists(st.sampled_from([0.0, 1.0, 1.0, 0.0, None, 2.0]), min_size=n, max_size=n))
    spec = FeatureSpec(name="ids", label="label", dense=(), sparse=tuple(fields))
    assert_same_decoding(spec, pa.table({"label": pa.array(labels, pa.float64()), **columns}))


@pytest.mark.parametrize("name", ["criteo", "criteo:40"])
def test_realistic_batches_decode_as_today(name):
    """Criteo's 26 string fields, and 40 fields of which every tenth is a multi-hot bag."""
    spec = builtin_spec(name)
    table, _ = PlantedModel(spec).sample(1500, stream=0)
    for part in table.to_batches(max_chunksize=1024):
        assert_same_decoding(spec, pa.Table.from_batches([part]))


def test_a_decoded_column_pickles_its_own_ids_only():
    """Columns share the kernel's buffers; Beam pickles decoded tables between stages, and
    a column must not carry every other column's ids with it."""
    spec = builtin_spec("criteo:40")
    table, _ = PlantedModel(spec).sample(1024, stream=0)
    with decoding_ids("c++"):
        column = RecordDecoder(spec).decode_table(table, "src").table.column("C10")  # a multi-hot one
    assert len(pickle.dumps(column)) < 2 * column.nbytes + 4096
