"""One kernel call packs a whole packing group (picasso.kernels.pack_group), and changes no
PackedBatch.

Over random groups (list and large_list columns, one-hot and multi-hot, empty bags, null
lists with and without a range, sliced arrays and sliced children, no rows, dynamic
fields' full-range keys), the C++ op gives exactly its reference's ids and bag starts; and
pack() through the op gives exactly pack() through the reference, column for column, on
the built-in specs as the decoder makes their tables.

The examples are derandomized so that the suite is repeatable;
PICASSO_PROPERTY_EXAMPLES=N (and PICASSO_PROPERTY_RANDOM=1) explores further.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from property_settings import PROPERTY

import picasso.kernels
from picasso.batch import pack
from picasso.builtin_specs import builtin_spec, churn_spec
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels import load_backend, pack_groups_reference
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel

cpu = load_backend("cpu")

KEYS = st.integers(-(2**63), 2**63 - 1)  # a dynamic field's keys: any 64 bits, offset 0
ROWS = st.integers(0, 2**40)  # a hashed field's rows, shifted by offsets as large


@st.composite
def group_column(draw, n: int, one_hot: bool, ids) -> pa.Array:
    """A list column of n rows, sliced out of a longer one over a sliced child (so that
    both buffers start past 0); some null lists, which keep the range of their offsets."""
    before, after, skip = draw(st.integers(0, 3)), draw(st.integers(0, 2)), draw(st.integers(0, 3))
    rows = n + before + after
    lengths = [1] * rows if one_hot else draw(st.lists(st.integers(0, 4), min_size=rows, max_size=rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = draw(st.lists(ids, min_size=int(offsets[-1]) + skip, max_size=int(offsets[-1]) + skip))
    child = pa.array(values, pa.int64()).slice(skip)
    large = draw(st.booleans())
    nulls = draw(st.lists(st.booleans(), min_size=rows, max_size=rows)) if draw(st.booleans()) else None
    make = pa.LargeListArray if large else pa.ListArray
    offsets_array = pa.array(offsets, pa.int64() if large else pa.int32())
    column = make.from_arrays(offsets_array, child, mask=None if nulls is None else pa.array(nulls, pa.bool_()))
    return column.slice(before, n)


@st.composite
def group(draw) -> tuple[list[pa.Array], list[int], int]:
    n = draw(st.integers(0, 20))
    one_hot = draw(st.booleans())  # every column one-hot: the kernel's fast case, if all are
    columns, id_offsets = [], []
    for _ in range(draw(st.integers(1, 6))):
        dynamic = draw(st.booleans())
        columns.append(draw(group_column(n, one_hot and draw(st.integers(0, 5)) > 0, KEYS if dynamic else ROWS)))
        id_offsets.append(0 if dynamic else draw(st.integers(0, 2**40)))
    return columns, id_offsets, n


def assert_same_ids(columns, id_offsets, n) -> None:
    got = cpu.pack_group(columns, id_offsets, n)
    want = pack_groups_reference.pack_group(columns, id_offsets, n)
    assert got.ids.dtype == want.ids.dtype == np.int64
    assert got.bag_starts.dtype == want.bag_starts.dtype == np.int32
    assert np.array_equal(got.ids, want.ids)
    assert np.array_equal(got.bag_starts, want.bag_starts)


@PROPERTY
@given(group())
def test_the_kernel_gives_its_references_ids_and_bag_starts(case):
    assert_same_ids(*case)


@pytest.mark.parametrize("one_hot", [True, False])
def test_many_blocks_on_several_threads(one_hot):
    # Enough ids for the kernel to spread its blocks of samples over threads.
    rng = np.random.default_rng(3)
    n, count = 3_000, 60
    columns = []
    for f in range(count):
        lengths = np.ones(n, np.int32) if one_hot or f % 3 else rng.integers(0, 4, n).astype(np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 1000, offsets[-1]))))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert_same_ids(columns, list(range(0, 1000 * count, 1000)), n)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # the reference's null id
def test_columns_it_does_not_read_go_to_the_reference():
    # int32 ids, and null ids: not the canonical list<int64> the kernel reads.
    narrow = pa.array([[1, 2], [], [3]], pa.list_(pa.int32()))
    wide = pa.array([[4], [5, 6], []], pa.list_(pa.int64()))
    assert_same_ids([narrow, wide], [0, 10], 3)
    with_null = pa.array([[1, None], [2], []], pa.list_(pa.int64()))
    with mock.patch.object(pack_groups_reference, "pack_group", wraps=pack_groups_reference.pack_group) as reference:
        cpu.pack_group([with_null], [0], 3)
    assert reference.called


def packed(table: pa.Table, spec, op) -> pa.RecordBatch:
    with mock.patch.object(picasso.kernels, "pack_group", op):
        return pack(table, spec, PackingPlan.from_spec(spec), positions={"src": 7}).data


def decoded_table(spec, rows: int) -> pa.Table:
    raw, _ = PlantedModel(spec).sample(rows, 0)
    return RecordDecoder(spec).decode_table(raw, "src").table


@pytest.mark.parametrize("name", ["criteo", "criteo:387", "criteo:40", "churn"])
def test_pack_through_the_kernel_is_pack_through_the_reference(name):
    spec = churn_spec() if name == "churn" else builtin_spec(name)
    table = decoded_table(spec, 200)
    chunked = pa.concat_tables([table.slice(0, 70), table.slice(70)])
    for part in (table, table.slice(33, 101), table.slice(0, 0), chunked):
        got, want = packed(part, spec, cpu.pack_group), packed(part, spec, pack_groups_reference.pack_group)
        assert got.schema == want.schema and got.schema.metadata == want.schema.metadata
        assert got.equals(want)


@pytest.mark.skipif(picasso.kernels.host_backend() is None, reason="the host ops run as the reference here")
def test_pack_dispatches_to_the_kernel():
    spec = builtin_spec("criteo")
    with mock.patch.object(cpu, "pack_group", wraps=cpu.pack_group) as op:
        pack(decoded_table(spec, 8), spec, PackingPlan.from_spec(spec))
    assert op.call_count == len(PackingPlan.from_spec(spec).groups)
