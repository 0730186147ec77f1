"""Feature crosses (picasso.kernels.hashing: cross) are computed as defined, by every decoder.

The op's reference (kernels/cross_ids_reference.py) gives picasso.kernels.hashing.cross_ids' bags
on random bags of raw ids (hashed and dynamic crosses, seeded or not, multi-hot, empty
bags, max_len cuts); the C++ op gives the reference's ids, bags and rooms bit for bit;
and a decoder gives every row the crosses of its raw values whichever path its columns
take: Arrow tables through the C++ op or its reference, JSON polls through Arrow's reader
or json.loads (mixed types walked value by value), serving's requests. A row missing a
field has an empty bag of crosses; a row with a bad field is refused for that field.

The examples are derandomized so that the suite is repeatable;
PICASSO_PROPERTY_EXAMPLES=N (and PICASSO_PROPERTY_RANDOM=1) explores further.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_settings import PROPERTY
from test_decode_ids import INTEGER_TYPES, STRING_TYPES, _bounds, id_column, sparse_field

import picasso.kernels
from picasso.kernels import hashing
from picasso.connectors.decoding import batch_ids
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.json_fast_path import read_poll
from picasso.connectors.decoding.message_formats import decode_json_values
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels import cross_ids_reference, load_backend
from picasso.kernels.id_columns import BUCKET, KEY, CrossRule
from picasso.serving.request_decoding import BadRows, decode_request
from picasso.spec import DynamicTable, FeatureSpec, SparseField, parse_spec

cpu = load_backend("cpu")

RAW_IDS = st.one_of(st.sampled_from(["", "a", "日本語", "12345678", "123456789", 0, 1, 2**63 - 1, 2**63, 2**64 - 1]),
                    st.integers(0, 2**64 - 1), st.text(max_size=12))
KEYS = st.one_of(st.sampled_from([0, 1, -1, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))
BUCKETS = [1, 7, 1000, 2**31 + 11, 2**62 + 1]
SEEDS = [1, 12345, 2**64 - 1]


def as_decoded(columns: list[list[list[int]]], n: int, slack: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns of bags of keys as decode_ids gives them (DecodedIds' ids, offsets and
    starts), each column's room `slack` zeros longer than its ids, as a refused row's."""
    offsets = np.zeros((len(columns), n + 1), dtype=np.int32)
    values, starts = [], []
    for c, (bags, extra) in enumerate(zip(columns, slack)):
        offsets[c, 1:] = np.cumsum([len(bag) for bag in bags])
        starts.append(sum(len(v) for v in values))
        values.append([key for bag in bags for key in bag] + [0] * extra)
    ids = np.array([key for v in values for key in v], dtype=np.int64)
    return ids, offsets, np.array(starts, dtype=np.int64)


def bags_of(decoded, c: int, n: int) -> list[list[int]]:
    """Column c's bags, read back from DecodedIds."""
    o, start = decoded.offsets[c], int(decoded.starts[c])
    return [decoded.ids[start + o[i]:start + o[i + 1]].tolist() for i in range(n)]


# -- the reference is the definition ---------------------------------------------------------


@st.composite
def crossed_bags(draw):
    """A cross's fields' bags of raw ids, n rows, and how the cross hashes them."""
    n = draw(st.integers(0, 8))
    fields = [[draw(st.lists(RAW_IDS, max_size=3)) for _ in range(n)] for _ in range(draw(st.integers(2, 3)))]
    kind = draw(st.sampled_from(["hashed", "dynamic", "seeded dynamic"]))
    buckets = draw(st.sampled_from(BUCKETS)) if kind == "hashed" else None
    seed = draw(st.sampled_from(SEEDS)) if kind == "seeded dynamic" else None
    return fields, n, buckets, seed, draw(st.sampled_from([1, 2, 3, 5, 27]))


@PROPERTY
@given(crossed_bags(), st.integers(0, 2), st.data())
def test_the_reference_gives_the_defined_crosses(case, lead, data):
    """The cross's columns after `lead` others, each with room to spare: the op reads its
    own columns' ids only."""
    fields, n, buckets, seed, max_len = case
    keys = [[[hashing.key_of(raw, seed) for raw in bag] for bag in bags] for bags in fields]
    others = [[[7] * 2 for _ in range(n)] for _ in range(lead)]
    slack = data.draw(st.lists(st.integers(0, 3), min_size=lead + len(keys), max_size=lead + len(keys)))
    ids, offsets, starts = as_decoded(others + keys, n, slack)
    rule = CrossRule(BUCKET if buckets else KEY, lead, len(keys), max_len, buckets or 0, seed)
    got = cross_ids_reference.cross_ids(ids, offsets, starts, [rule], n)
    want = [hashing.cross_ids([bags[i] for bags in fields], max_len, buckets, seed) for i in range(n)]
    assert bags_of(got, 0, n) == want
    assert got.starts.tolist() == [0] and len(got.ids) == sum(map(len, want)) and not len(got.problems)


# -- the C++ op is the reference --------------------------------------------------------------


@st.composite
def crosses_of_keys(draw):
    """Decoded key columns (with slack past their ids) and crosses over runs of them."""
    n = draw(st.integers(0, 10))
    count = draw(st.integers(1, 5))
    columns = [[draw(st.lists(KEYS, max_size=draw(st.sampled_from([1, 4])))) for _ in range(n)] for _ in range(count)]
    slack = draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
    rules = []
    for _ in range(draw(st.integers(0, 4))):
        first = draw(st.integers(0, count - 1))
        kind = draw(st.sampled_from([BUCKET, KEY]))
        fields, max_len = draw(st.integers(1, count - first)), draw(st.sampled_from([1, 2, 3, 7, 100]))
        rules.append(CrossRule(kind, first, fields, max_len, draw(st.sampled_from(BUCKETS)) if kind == BUCKET else 0,
                               draw(st.sampled_from([None, *SEEDS]))))
    return as_decoded(columns, n, slack), rules, n


@PROPERTY
@given(crosses_of_keys())
def test_the_kernel_gives_its_references_crosses(case):
    (ids, offsets, starts), rules, n = case
    got = cpu.cross_ids(ids, offsets, starts, rules, n)
    want = cross_ids_reference.cross_ids(ids, offsets, starts, rules, n)
    for part in ("ids", "offsets", "starts", "problems"):
        assert np.array_equal(getattr(got, part), getattr(want, part)), part
        assert getattr(got, part).dtype == getattr(want, part).dtype, part


@pytest.mark.parametrize("op", [cpu.cross_ids, cross_ids_reference.cross_ids], ids=["c++", "reference"])
def test_long_bags_whose_product_overflows_are_cut_to_max_len(op):
    """Four bags of 2^16 ids: 2^64 combinations, which a product in int64 takes for 0."""
    bags = [list(range(f, f + 2**16)) for f in range(4)]
    ids, offsets, starts = as_decoded([[bag] for bag in bags], 1, [0] * 4)
    got = op(ids, offsets, starts, [CrossRule(BUCKET, 0, 4, 5, 1000)], 1)
    assert bags_of(got, 0, 1) == [hashing.cross_ids(bags, 5, 1000)]


@pytest.mark.parametrize("rule, problem", [
    (CrossRule(BUCKET, 1, 2, 3, 1000), "not columns of the 2 given"),
    (CrossRule(BUCKET, 0, 2, 3, 0), "buckets > 0"),
])
def test_the_kernel_refuses_what_it_cannot_read(rule, problem):
    """Rules past the columns given, columns past the ids: an error, never a read out of
    bounds."""
    ids, offsets, starts = as_decoded([[[1]], [[2]]], 1, [0, 0])
    with pytest.raises(RuntimeError, match=problem):
        cpu.cross_ids(ids, offsets, starts, [rule], 1)
    with pytest.raises(RuntimeError, match="runs past"):
        cpu.cross_ids(ids[:1], offsets, starts, [CrossRule(KEY, 0, 2, 3)], 1)


# -- decoders -----------------------------------------------------------------------------


SPEC = parse_spec({
    "name": "crossed",
    "label": "label",
    "sparse": [
        {"name": "h", "embedding_dim": 4, "hash_buckets": 100},  # string ids
        {"name": "n", "embedding_dim": 4, "hash_buckets": 1000},  # integer ids
        {"name": "v", "embedding_dim": 4, "vocab_size": 10},
        # Its own seed keys its table, not its crosses: they key by their own, or none.
        {"name": "d", "embedding_dim": 4, "dynamic": {"capacity": 64, "hash_seed": 777}},
        {"name": "bag", "embedding_dim": 4, "hash_buckets": 50, "max_len": 3},
        {"name": "vbag", "embedding_dim": 4, "vocab_size": 20, "max_len": 3},
    ],
    "crosses": [
        {"name": "h_v", "fields": ["h", "v"], "hash_buckets": 1000},
        {"name": "n_d", "fields": ["n", "d"], "dynamic": {"capacity": 64}},
        {"name": "bag_d", "fields": ["bag", "d"], "dynamic": {"capacity": 64, "hash_seed": 4242}},
        {"name": "h_bag_vbag", "fields": ["h", "bag", "vbag"], "hash_buckets": 5000, "max_len": 4},
        {"name": "bag_vbag", "fields": ["bag", "vbag"], "hash_buckets": 97, "part": "both", "embedding_dim": 4},
    ],
})
TYPES = {"label": pa.float64(), "h": pa.string(), "n": pa.int64(), "v": pa.int64(), "d": pa.int64(),
         "bag": pa.list_(pa.string()), "vbag": pa.list_(pa.int64())}
# Integer ids under 2^53: serving's pandas frames hold an integer column with a missing
# value as floats, and give it back its integers only below that.
GOOD = [
    {"label": 1, "h": "abc", "n": 7, "v": 3, "d": 2**52 + 1, "bag": ["x", "y"], "vbag": [1, 2]},
    {"label": 0, "h": "日本", "n": 0, "v": 0, "d": 5, "bag": ["z", "z", "w"], "vbag": [19, 0, 5]},  # 9 cut to 4
    {"label": 0, "n": 12345678901, "v": 9, "d": 0, "bag": ["p"], "vbag": [7]},  # no h
    {"label": 1, "h": "q", "n": 3, "v": None, "d": 11, "bag": [], "vbag": [4]},  # a null v, an empty bag
    {"label": 1},  # every field missing
    {"label": 0, "h": "", "n": 2**53 - 1, "v": 1, "d": 1, "bag": None, "vbag": None},
]
# Rows a member field refuses, each with its reason: the row is refused, not its crosses.
BAD = [
    ({"label": 1, "h": "abc", "n": -5, "v": 3, "d": 1, "bag": ["x"], "vbag": [1]},
     "field 'n': integer id -5 is outside [0, 2^64) (hashed ids are unsigned 64-bit)"),
    ({"label": 1, "h": "abc", "n": 1, "v": 3, "d": 1, "bag": ["a", "b", "c", "d"], "vbag": [1]},
     "field 'bag': 4 ids, more than max_len 3"),
    ({"label": 0, "h": "abc", "n": 1, "v": 3, "d": -1, "bag": ["x"], "vbag": [1]},
     "field 'd': integer id -1 is outside [0, 2^64) (dynamic ids are unsigned 64-bit)"),
    ({"label": 0, "h": "abc", "n": 1, "v": 10, "d": 1, "bag": ["x"], "vbag": [1]},
     "field 'v': id out of range [0, 10)"),
    ({"label": 0, "h": "abc", "n": 1, "v": 3, "d": 1, "bag": ["x"], "vbag": [1, None]},
     "field 'vbag': null id in bag"),
]
# Good rows and bad, interleaved: each bad row among good ones.
ROWS = [row for pair in zip(GOOD, [row for row, _ in BAD] + [None]) for row in pair if row is not None]
REASONS = [(ROWS.index(row), reason) for row, reason in BAD]


def defined_crosses(spec: FeatureSpec, rows: list[dict]) -> dict[str, list[list[int]]]:
    """Each cross's bags of the rows, by picasso.kernels.hashing.cross_ids on their raw values."""
    def bag(value) -> list:
        return [] if value is None else value if isinstance(value, list) else [value]

    out = {}
    for cross in spec.crosses:
        seed = cross.dynamic.hash_seed if cross.dynamic is not None else None
        out[cross.name] = [hashing.cross_ids([bag(row.get(name)) for name in cross.cross_of], cross.max_len,
                                             cross.hash_buckets, seed) for row in rows]
    return out


def crosses_of(table: pa.Table, spec: FeatureSpec = SPEC) -> dict[str, list[list[int]]]:
    return {cross.name: table.column(cross.name).to_pylist() for cross in spec.crosses}


def arrow_table(rows: list[dict]) -> pa.Table:
    """The rows as an Arrow table; a field no row has is no column."""
    names = [name for name in TYPES if any(name in row for row in rows)]
    return pa.table({name: pa.array([row.get(name) for row in rows], TYPES[name]) for name in names})


def messages(rows: list[dict]) -> list[bytes]:
    return [json.dumps(row, ensure_ascii=False).encode() for row in rows]


@contextmanager
def host_ops(path: str):
    """The decoder's host ops (decode_ids, cross_ids) from the C++ backend, or the
    reference's as where the C++ kernels are not built; "per field": no column fits
    decode_ids (sparse_ids' path alone), the crosses on the C++ op."""
    with mock.patch.object(picasso.kernels, "host_backend", lambda: None if path == "reference" else cpu):
        if path != "per field":
            yield
            return
        with mock.patch.object(batch_ids, "fits_kernel", lambda f, values, n: False):
            yield


def letters(result) -> list[tuple[int, str]]:
    return [(int(letter.position), letter.reason) for letter in result.dead_letters]


def valid_rows(rows: list[dict]) -> list[dict]:
    refused = {position for position, _ in REASONS}
    return [row for i, row in enumerate(rows) if i not in refused]


@pytest.mark.parametrize("path", ["c++", "reference"])
def test_an_arrow_table_decodes_the_defined_crosses(path):
    """The usual batch: every member's column fits decode_ids, whose one call also gives
    the crosses' keys, and every cross is hashed in one cross_ids call."""
    with host_ops(path), mock.patch.object(picasso.kernels, "cross_ids", wraps=picasso.kernels.cross_ids) as spy:
        result = RecordDecoder(SPEC).decode_table(arrow_table(ROWS), "src")
    assert letters(result) == REASONS
    assert crosses_of(result.table) == defined_crosses(SPEC, valid_rows(ROWS))
    assert spy.call_count == 1 and len(spy.call_args.args[3]) == len(SPEC.crosses)


@pytest.mark.parametrize("path", ["c++", "reference"])
def test_a_missing_column_gives_its_crosses_empty_bags(path):
    """vbag absent from the batch: its crosses take the per-field path, the others stay
    on the kernel's, and no row is refused for it."""
    rows = [{name: value for name, value in row.items() if name != "vbag"} for row in GOOD]
    with host_ops(path), mock.patch.object(picasso.kernels, "cross_ids", wraps=picasso.kernels.cross_ids) as spy:
        result = RecordDecoder(SPEC).decode_table(arrow_table(rows), "src")
    assert not result.dead_letters
    crosses = crosses_of(result.table)
    assert crosses == defined_crosses(SPEC, rows)
    assert crosses["h_bag_vbag"] == crosses["bag_vbag"] == [[]] * len(rows)
    assert spy.call_count == 2


def test_a_json_poll_through_arrows_reader_decodes_the_defined_crosses():
    assert read_poll(RecordDecoder(SPEC), messages(ROWS)) is not None  # the fast path takes this poll
    result = decode_json_values(RecordDecoder(SPEC), messages(ROWS), "topic/0", np.arange(len(ROWS)))
    assert letters(result) == REASONS
    assert crosses_of(result.table) == defined_crosses(SPEC, valid_rows(ROWS))
    assert result.table.equals(RecordDecoder(SPEC).decode_table(arrow_table(ROWS), "src").table)


def test_json_messages_one_by_one_decode_the_defined_crosses():
    result = RecordDecoder(SPEC).decode_json(messages(ROWS), "topic/0")
    assert letters(result) == REASONS
    assert crosses_of(result.table) == defined_crosses(SPEC, valid_rows(ROWS))
    assert result.table.equals(RecordDecoder(SPEC).decode_table(arrow_table(ROWS), "src").table)


# Ids of two types in one field (d, n): no Arrow type holds the column, so each value is
# judged alone (sparse_ids' walk), for the field and for its crosses.
MIXED = [*ROWS[:3], {"label": 1, "h": "m", "n": "n-as-text", "v": 2, "d": "item-9", "bag": ["x"], "vbag": [3]},
         *ROWS[3:]]
MIXED_REASONS = [(position + (position >= 3), reason) for position, reason in REASONS]


def test_json_messages_of_mixed_types_decode_the_defined_crosses():
    assert read_poll(RecordDecoder(SPEC), messages(MIXED)) is None  # Arrow's reader refuses the poll
    result = decode_json_values(RecordDecoder(SPEC), messages(MIXED), "topic/0", np.arange(len(MIXED)))
    assert letters(result) == MIXED_REASONS
    refused = {position for position, _ in MIXED_REASONS}
    assert crosses_of(result.table) == defined_crosses(SPEC, [r for i, r in enumerate(MIXED) if i not in refused])


def serving_decoder() -> RecordDecoder:
    return RecordDecoder(SPEC, DecodeOptions(require_label=False))


@pytest.mark.parametrize("rows", [GOOD, [MIXED[3], *GOOD]], ids=["typed", "mixed"])
def test_serving_decodes_the_defined_crosses(rows):
    frame = pd.DataFrame.from_records([{k: v for k, v in row.items() if k != "label"} for row in rows])
    decoded = decode_request(serving_decoder(), frame, "error")
    assert crosses_of(decoded.table) == defined_crosses(SPEC, rows)


def test_serving_refuses_a_row_for_its_bad_member_field():
    frame = pd.DataFrame.from_records([{k: v for k, v in row.items() if k != "label"} for row in ROWS])
    with pytest.raises(BadRows) as raised:
        decode_request(serving_decoder(), frame, "error")
    assert [(r.row, r.reason) for r in raised.value.refused] == REASONS


# -- every path, random columns -----------------------------------------------------------


@st.composite
def good_column(draw, f: SparseField, n: int) -> pa.Array:
    """A column of n bags of ids that f takes, none empty: test_decode_ids' columns keep
    few rows whose every member has ids, and only those have crosses."""
    t = draw(st.sampled_from(INTEGER_TYPES + (STRING_TYPES if f.takes_strings else [])))
    if t in STRING_TYPES:
        ids = st.text(max_size=10)
    else:
        ids = st.integers(0, f.vocab_size - 1 if f.vocab_size else _bounds(t)[1])
    if f.multi_hot:
        return pa.array(draw(st.lists(st.lists(ids, min_size=1, max_size=f.max_len), min_size=n, max_size=n)),
                        pa.list_(t))
    return pa.array(draw(st.lists(ids, min_size=n, max_size=n)), t)


@st.composite
def crossed_batch(draw):
    """Columns good ids, or test_decode_ids' random ones (every Arrow type and shape of ids,
    nulls, sliced arrays, bad ids; now and then of a type the kernel does not take), or
    none; with crosses of their fields."""
    n = draw(st.integers(1, 12))
    fields = [draw(sparse_field(f"f{i}")) for i in range(draw(st.integers(2, 4)))]
    columns = {}
    for f in fields:
        kind = draw(st.sampled_from(["good", "good", "kernel's", "any", "missing"]))
        if kind != "missing":
            columns[f.name] = draw(good_column(f, n) if kind == "good" else id_column(f, n, kind == "kernel's"))
    crosses = []
    for x in range(draw(st.integers(1, 3))):
        members = draw(st.lists(st.sampled_from([f.name for f in fields]), min_size=2, max_size=3, unique=True))
        kind = draw(st.sampled_from(["hashed", "dynamic", "seeded dynamic"]))
        every = int(np.prod([next(f for f in fields if f.name == m).max_len for m in members]))
        max_len = draw(st.sampled_from([1, 2, every]))
        seed = draw(st.sampled_from(SEEDS)) if kind == "seeded dynamic" else None
        crosses.append(SparseField(
            f"x{x}", 1, hash_buckets=draw(st.sampled_from(BUCKETS)) if kind == "hashed" else None, max_len=max_len,
            dynamic=DynamicTable(capacity=8, hash_seed=seed) if kind != "hashed" else None, cross_of=tuple(members),
            part="wide"))
    spec = FeatureSpec(name="crossed", label="label", dense=(), sparse=tuple(fields), crosses=tuple(crosses))
    return spec, columns, n


@PROPERTY
@given(crossed_batch())
def test_every_path_decodes_the_defined_crosses_of_random_columns(case):
    """The C++ op, its reference, and the per-field path alone (no column fits the kernel)
    give one table and one set of dead letters; its crosses, the definition's."""
    spec, columns, n = case
    table = pa.table({"label": pa.array([1.0] * n), **columns})
    results = {}
    for path in ("c++", "reference", "per field"):
        with host_ops(path):
            results[path] = RecordDecoder(spec).decode_table(table, "src")
    want = results["per field"]
    for path, got in results.items():
        assert letters(got) == letters(want), path
        assert got.table.equals(want.table), path
    raw = [{name: column[i].as_py() for name, column in columns.items()} for i in range(n)]
    assert crosses_of(want.table, spec) == defined_crosses(spec, [r for r, ok in zip(raw, want.valid_mask) if ok])
