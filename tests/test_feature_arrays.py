"""Feature rows as numpy arrays (picasso.sample_join.feature_arrays): Arrow in, takes, Arrow out, exactly."""

import numpy as np
import pyarrow as pa
import pytest

from picasso.sample_join.feature_arrays import FeatureArrays, FeatureLayout

SCHEMA = pa.schema([pa.field("label", pa.float32()), pa.field("ids", pa.list_(pa.int64())),
                    pa.field("n", pa.int64()), pa.field("one", pa.list_(pa.int64())), pa.field("x", pa.float64())])


def random_table(rng, n: int) -> pa.Table:
    def lists(longest):
        return [None if rng.random() < 0.1 else rng.integers(-(1 << 62), 1 << 62, rng.integers(0, longest)).tolist()
                for _ in range(n)]
    return pa.table({
        "label": pa.array(rng.random(n).astype(np.float32)),
        "ids": pa.array(lists(5), pa.list_(pa.int64())),
        "n": pa.array([None if rng.random() < 0.2 else int(v) for v in rng.integers(-9, 9, n)], pa.int64()),
        "one": pa.array([[int(v)] for v in rng.integers(0, 1 << 40, n)], pa.list_(pa.int64())),
        "x": pa.array(rng.standard_normal(n)),
    }, schema=SCHEMA)


@pytest.mark.parametrize("seed", range(4))
def test_rows_come_back_exactly_after_takes_and_concatenation(seed):
    rng = np.random.default_rng(seed)
    layout = FeatureLayout(SCHEMA)
    tables = [random_table(rng, int(rng.integers(0, 60))) for _ in range(3)]
    # Sliced and chunked tables too: offsets into their buffers must be honoured.
    tables.append(pa.concat_tables([tables[0].slice(3), tables[1].slice(1, 7)]))
    parts, expected = [], []
    for table in tables:
        rows = layout.from_arrow(table)
        assert layout.to_arrow(rows).equals(table.combine_chunks())
        picked = np.sort(rng.choice(table.num_rows, rng.integers(0, table.num_rows + 1), replace=False))
        parts.append(rows.take(picked))
        expected.append(table.take(pa.array(picked, pa.int64())))
    out = layout.to_arrow(FeatureArrays.concat(parts))
    assert out.to_pylist() == pa.concat_tables(expected).to_pylist()
    assert out.schema.equals(SCHEMA)


def test_single_valued_lists_use_one_byte_of_length_a_row():
    table = pa.table({"label": pa.array([1.0, 0.0], pa.float32()), "ids": pa.array([[1], [2]]), "n": [1, 2],
                      "one": pa.array([[3], [4]]), "x": [0.5, 0.25]}, schema=SCHEMA)
    rows = FeatureLayout(SCHEMA).from_arrow(table)
    assert rows.lengths.dtype == np.int8 and rows.items.tolist() == [1, 3, 2, 4]


def test_other_types_are_refused_by_name():
    schema = pa.schema([pa.field("s", pa.string()), pa.field("a", pa.list_(pa.int64())),
                        pa.field("b", pa.list_(pa.float32()))])
    with pytest.raises(ValueError) as error:
        FeatureLayout(schema)
    assert "'s' (string)" in str(error.value) and "more than one item type" in str(error.value)


def test_null_items_are_refused():
    table = pa.table({"label": pa.array([1.0], pa.float32()), "ids": pa.array([[1, None]]), "n": [1],
                      "one": pa.array([[3]]), "x": [0.5]}, schema=SCHEMA)
    with pytest.raises(ValueError, match="'ids' has null items"):
        FeatureLayout(SCHEMA).from_arrow(table)
