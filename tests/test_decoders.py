"""Decoders: valid rows come out canonical, every bad row becomes a dead letter that says
where it was, what it was and which field was wrong, and nothing raises."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from picasso.connectors.dead_letters.letters import DeadLetter
from picasso.connectors.decoding.contracts import DecodeOptions, DecodeResult
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels.hashing import bucket_of

from helpers import small_spec

SPEC = small_spec()  # label, d1, d2 (log1p), h (hashed 100), v (vocab 10), bag (hashed 50, max 3, mean), vbag (vocab 20, max 3)
ORDER = ["label", "d1", "d2", "h", "v", "bag", "vbag"]

# Valid rows as plain values. Hashed ids are strings so that JSON, TSV and Parquet carry
# the same ids (in TSV every id is text, and "7" and 7 are different ids).
GOOD = [
    {"label": 1, "d1": 2.5, "d2": -3, "h": "abc", "v": 3, "bag": ["x", "y"], "vbag": [1, 2]},
    {"label": 0, "d1": -1.25, "d2": 10, "h": "日本", "v": 0, "bag": ["z"], "vbag": [19, 0, 5]},
    {"label": 0, "d1": 1e6, "d2": 0.5, "h": "68fd1e64", "v": 9, "bag": ["p", "q", "p"], "vbag": [7]},
    {"label": 1},  # every optional field missing
    {"label": 0, "d1": 3, "h": "only-h", "vbag": []},
]


def signed_log1p(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x) if x else 0.0


def canonical(row: dict) -> dict:
    """What the decoder must produce for a valid row, worked out by hand."""
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    return {
        "label": f32(row["label"]),
        "d1": f32(row.get("d1", 0.0)),
        "d2": f32(signed_log1p(row.get("d2", 0.0))),
        "h": [bucket_of(row["h"], 100)] if "h" in row else [],
        "v": [row["v"]] if "v" in row else [],
        "bag": [bucket_of(x, 50) for x in row.get("bag", [])],
        "vbag": list(row.get("vbag", [])),
    }


def to_json(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False)


def to_tsv(row: dict) -> str:
    def cell(value):
        if value is None:
            return ""
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        return str(value)

    return "\t".join(cell(row.get(name)) for name in ORDER)


ARROW_TYPES = {
    "label": pa.float64(),
    "d1": pa.float64(),
    "d2": pa.float64(),
    "h": pa.string(),
    "v": pa.int64(),
    "bag": pa.list_(pa.string()),
    "vbag": pa.list_(pa.int64()),
}


def to_table(rows: list[dict]) -> pa.Table:
    return pa.table({name: pa.array([r.get(name) for r in rows], ARROW_TYPES[name]) for name in ORDER})


def check_accounting(result: DecodeResult, rows_in: int) -> None:
    assert isinstance(result, DecodeResult)
    assert result.rows_in == rows_in
    assert result.table.num_rows + len(result.dead_letters) == rows_in
    assert result.table.schema == RecordDecoder(SPEC).schema
    assert result.valid_mask is not None and len(result.valid_mask) == rows_in
    assert int(result.valid_mask.sum()) == result.table.num_rows
    positions = [d.position for d in result.dead_letters]
    assert len(set(positions)) == len(positions)  # one dead letter per bad row


# -- the canonical schema -----------------------------------------------------------------


def test_canonical_schema():
    schema = RecordDecoder(SPEC).schema
    assert schema.names == ["label", "d1", "d2", "h", "v", "bag", "vbag"]
    assert schema.field("label").type == pa.float32()
    assert schema.field("d1").type == pa.float32()
    for name in ("h", "v", "bag", "vbag"):
        assert schema.field(name).type == pa.list_(pa.int64())


def test_valid_json_rows():
    result = RecordDecoder(SPEC).decode_json([to_json(r) for r in GOOD], "topic/0")
    check_accounting(result, len(GOOD))
    assert result.dead_letters == []
    assert result.table.to_pylist() == [canonical(r) for r in GOOD]


def test_valid_json_bytes_messages():
    result = RecordDecoder(SPEC).decode_json([to_json(r).encode() for r in GOOD], "topic/0")
    assert result.table.to_pylist() == [canonical(r) for r in GOOD]


def test_valid_tsv_lines():
    result = RecordDecoder(SPEC).decode_tsv([to_tsv(r) for r in GOOD], "day.tsv")
    check_accounting(result, len(GOOD))
    assert result.dead_letters == []
    assert result.table.to_pylist() == [canonical(r) for r in GOOD]


def test_valid_parquet_rows(tmp_path):
    path = tmp_path / "day.parquet"
    pq.write_table(to_table(GOOD), path)
    result = RecordDecoder(SPEC).decode_table(pq.read_table(path), str(path))
    check_accounting(result, len(GOOD))
    assert result.dead_letters == []
    assert result.table.to_pylist() == [canonical(r) for r in GOOD]


def test_valid_arrow_record_batch_and_chunked_table():
    decoder = RecordDecoder(SPEC)
    batch = to_table(GOOD).to_batches()[0]
    assert decoder.decode_table(batch, "kafka").table.to_pylist() == [canonical(r) for r in GOOD]
    chunked = pa.concat_tables([to_table(GOOD[:2]), to_table(GOOD[2:])])
    assert chunked.column("h").num_chunks == 2
    assert decoder.decode_table(chunked, "kafka").table.to_pylist() == [canonical(r) for r in GOOD]


def test_same_row_in_every_format_decodes_the_same(tmp_path):
    decoder = RecordDecoder(SPEC)
    from_json = decoder.decode_json([to_json(r) for r in GOOD], "a").table
    from_tsv = decoder.decode_tsv([to_tsv(r) for r in GOOD], "b").table
    pq.write_table(to_table(GOOD), tmp_path / "c.parquet")
    from_parquet = decoder.decode_table(pq.read_table(tmp_path / "c.parquet"), "c").table
    assert from_json.equals(from_tsv)
    assert from_json.equals(from_parquet)


def test_same_row_in_every_format_with_a_label_not_named_label(tmp_path):
    # The label column is whatever the spec calls it; TSV's first column is the label.
    spec = small_spec(label="click")
    decoder = RecordDecoder(spec)
    rows = [{("click" if k == "label" else k): v for k, v in r.items()} for r in GOOD]
    expected = [canonical(r) for r in GOOD]  # the canonical column is always `label`
    assert decoder.decode_json([to_json(r) for r in rows], "a").table.to_pylist() == expected
    table = to_table(GOOD).rename_columns(["click", *ORDER[1:]])
    assert decoder.decode_table(table, "c").table.to_pylist() == expected
    result = decoder.decode_tsv([to_tsv(r) for r in GOOD], "b")
    assert [d.reason for d in result.dead_letters] == []
    assert result.table.to_pylist() == expected


def test_missing_optional_fields_get_defaults():
    decoder = RecordDecoder(SPEC)
    empty = {"label": 1.0, "d1": 0.0, "d2": 0.0, "h": [], "v": [], "bag": [], "vbag": []}
    assert decoder.decode_json(['{"label": 1}'], "s").table.to_pylist() == [empty]
    nulls = '{"label": 1, "d1": null, "d2": null, "h": null, "v": null, "bag": null, "vbag": null}'
    assert decoder.decode_json([nulls], "s").table.to_pylist() == [empty]
    assert decoder.decode_tsv(["1\t\t\t\t\t\t"], "s").table.to_pylist() == [empty]
    assert decoder.decode_table(pa.table({"label": [1]}), "s").table.to_pylist() == [empty]
    assert decoder.decode_table(to_table([{"label": 1}]), "s").table.to_pylist() == [empty]


@pytest.mark.parametrize(
    "messages",
    [
        ['{"label": 1, "bag": [], "vbag": []}'],  # only empty bags: JSON gives them no id type
        ['{"label": 1, "bag": []}', '{"label": 0, "bag": []}'],
    ],
)
def test_batches_of_only_empty_bags(messages):
    result = RecordDecoder(SPEC).decode_json(messages, "s")
    check_accounting(result, len(messages))
    assert result.dead_letters == []
    assert result.table.column("bag").to_pylist() == [[]] * len(messages)
    assert result.table.column("vbag").to_pylist() == [[]] * len(messages)


def test_empty_bags_only_in_a_table():
    table = pa.table({"label": [1, 0], "bag": pa.array([[], []], pa.list_(pa.string())), "vbag": [[], None]})
    result = RecordDecoder(SPEC).decode_table(table, "s")
    assert result.dead_letters == []
    assert result.table.column("bag").to_pylist() == [[], []]


def test_log1p_is_signed():
    values = [-1e6, -1000.0, -3.0, -0.5, 0.0, 0.5, 3.0, 1000.0, 1e6]
    decoder = RecordDecoder(SPEC)
    messages = [json.dumps({"label": 0, "d1": x, "d2": x}) for x in values]
    table = decoder.decode_json(messages, "s").table
    expected = [np.float32(np.sign(x) * np.log1p(abs(x))) for x in values]
    assert table.column("d2").to_pylist() == [float(e) for e in expected]
    assert table.column("d1").to_pylist() == [float(np.float32(x)) for x in values]  # identity untouched
    # antisymmetric, monotone
    d2 = np.array(table.column("d2").to_pylist())
    assert np.all(np.diff(d2) > 0)
    assert np.allclose(d2, -d2[::-1])


def test_integer_ids_in_hashed_fields_use_the_integer_hash():
    decoder = RecordDecoder(SPEC)
    table = decoder.decode_json(['{"label": 0, "h": 7, "bag": [1, 18446744073709551615]}'], "s").table
    assert table.column("h").to_pylist() == [[bucket_of(7, 100)]]
    assert table.column("bag").to_pylist() == [[bucket_of(1, 50), bucket_of(2**64 - 1, 50)]]
    # mixed with string ids in the same batch: each id keeps its own hash
    table = decoder.decode_json(['{"label": 0, "h": 7}', '{"label": 0, "h": "7"}'], "s").table
    assert table.column("h").to_pylist() == [[bucket_of(7, 100)], [bucket_of("7", 100)]]


def test_soft_labels_and_label_not_required_for_serving():
    decoder = RecordDecoder(SPEC)
    assert decoder.decode_json(['{"label": 0.25}'], "s").table.column("label").to_pylist() == [0.25]
    serving = RecordDecoder(SPEC, DecodeOptions(require_label=False))
    result = serving.decode_json(['{"d1": 1, "h": "a"}'], "s")
    assert result.dead_letters == []
    assert result.table.to_pylist()[0]["h"] == [bucket_of("a", 100)]


def test_bad_decode_options():
    with pytest.raises(ValueError):
        DecodeOptions(unknown_fields="drop")


# -- bad JSON records ---------------------------------------------------------------------

# (id, message, words the reason must contain)
BAD_JSON = [
    ("invalid-json", "{not json", ["invalid JSON"]),
    ("truncated-json", '{"label": 1, "d1": ', ["invalid JSON"]),
    ("array", "[1, 2]", ["not a JSON object", "list"]),
    ("string", '"label"', ["not a JSON object", "str"]),
    ("number", "3", ["not a JSON object"]),
    ("null", "null", ["not a JSON object"]),
    ("missing-label", '{"d1": 1, "h": "a"}', ["missing label", "'label'"]),
    ("null-label", '{"label": null}', ["missing label", "'label'"]),
    ("label-above-1", '{"label": 2}', ["'label'", "[0, 1]"]),
    ("label-below-0", '{"label": -0.5}', ["'label'", "[0, 1]"]),
    ("label-string", '{"label": "1"}', ["'label'", "number"]),
    ("label-nan", '{"label": NaN}', ["'label'", "finite"]),
    ("dense-string", '{"label": 0, "d1": "abc"}', ["'d1'", "number"]),
    ("dense-list", '{"label": 0, "d2": [1]}', ["'d2'", "number"]),
    ("dense-nan", '{"label": 0, "d1": NaN}', ["'d1'", "finite"]),
    ("dense-inf", '{"label": 0, "d2": Infinity}', ["'d2'", "finite"]),
    ("dense-minus-inf", '{"label": 0, "d1": -Infinity}', ["'d1'", "finite"]),
    ("float-id-hashed", '{"label": 0, "h": 1.5}', ["'h'"]),
    ("float-id-vocab", '{"label": 0, "v": 2.0}', ["'v'", "integer"]),
    ("string-id-vocab", '{"label": 0, "v": "3"}', ["'v'", "integer"]),
    ("bool-id", '{"label": 0, "h": true}', ["'h'"]),
    ("object-id", '{"label": 0, "h": {"a": 1}}', ["'h'"]),
    ("float-id-in-bag", '{"label": 0, "vbag": [1, 2.5]}', ["'vbag'"]),
    ("vocab-too-big", '{"label": 0, "v": 10}', ["'v'", "range"]),
    ("vocab-negative", '{"label": 0, "v": -1}', ["'v'", "range"]),
    ("vocab-bag-out-of-range", '{"label": 0, "vbag": [1, 20]}', ["'vbag'", "range"]),
    ("oversize-bag", '{"label": 0, "bag": ["a", "b", "c", "d"]}', ["'bag'", "max_len"]),
    ("oversize-vocab-bag", '{"label": 0, "vbag": [1, 2, 3, 4, 5]}', ["'vbag'", "max_len"]),
    ("list-in-one-hot", '{"label": 0, "h": ["a", "b"]}', ["'h'", "max_len"]),
    ("null-id-in-vocab-bag", '{"label": 0, "vbag": [1, null]}', ["'vbag'", "null"]),
    # Ambiguous values are refused, never guessed:
    ("label-bool", '{"label": true}', ["'label'", "bool"]),
    ("dense-bool", '{"label": 0, "d1": false}', ["'d1'", "bool"]),
    ("dense-int-beyond-float64", '{"label": 0, "d1": 1' + "0" * 400 + "}", ["'d1'", "not finite (inf)"]),
    ("duplicate-key", '{"label": 0, "h": "a", "h": "b"}', ["duplicate key 'h'"]),
    ("duplicate-nested-key", '{"label": 0, "x": {"k": 1, "k": 2}}', ["duplicate key 'k'"]),
    ("hashed-id-negative", '{"label": 0, "h": -7}', ["'h'", "[0, 2^64)"]),
    ("hashed-id-beyond-uint64", '{"label": 0, "h": 18446744073709551616}', ["'h'", "[0, 2^64)"]),
    ("hashed-bag-negative", '{"label": 0, "bag": [1, -2]}', ["'bag'", "[0, 2^64)"]),
    ("lone-surrogate-id", '{"label": 0, "h": "a\\ud800"}', ["'h'", "surrogate"]),
    ("blank-line", "", ["blank line"]),
    ("whitespace-line", "  \t ", ["blank line"]),
    ("deeply-nested", '{"label": 0, "x": ' + "[" * 100_000 + "]" * 100_000 + "}", ["invalid JSON"]),
]


def check_one_bad_record(decode, good: list, bad, context: str, source: str, first_position: int, words: list[str]):
    """Decode `bad` alone or between three good records; exactly it is refused, where it
    stood, as it arrived, for a reason containing `words`, and the good rows survive."""
    records = [good[0], bad, good[1], good[2]] if context == "between-good-rows" else [bad]
    bad_index = 1 if context == "between-good-rows" else 0
    result = decode(records, source, first_position=first_position)
    check_accounting(result, len(records))
    assert len(result.dead_letters) == 1, [d.reason for d in result.dead_letters]
    letter = result.dead_letters[0]
    assert letter.source == source
    assert letter.position == first_position + bad_index
    assert letter.payload == bad
    for word in words:
        assert word in letter.reason, letter.reason
    if context == "between-good-rows":
        assert result.table.to_pylist() == [canonical(r) for r in GOOD[:3]]
        assert result.valid_mask.tolist() == [True, False, True, True]
    return result


@pytest.mark.parametrize("message, words", [c[1:] for c in BAD_JSON], ids=[c[0] for c in BAD_JSON])
@pytest.mark.parametrize("context", ["between-good-rows", "alone"])
def test_bad_json_record_becomes_a_dead_letter(message, words, context):
    good = [to_json(r) for r in GOOD[:3]]
    check_one_bad_record(RecordDecoder(SPEC).decode_json, good, message, context, "clicks/3", 1000, words)


@pytest.mark.parametrize(
    "message, field",
    [
        ('{"label": 0, "bag": ["a", null]}', "bag"),
        ('{"label": 0, "bag": [null]}', "bag"),  # no id at all to give the column a type
        ('{"label": 0, "vbag": [null]}', "vbag"),
    ],
)
@pytest.mark.parametrize("context", ["between-good-rows", "alone"])
def test_null_id_in_a_bag_becomes_a_dead_letter(message, field, context):
    decoder = RecordDecoder(SPEC)
    messages = [to_json(GOOD[0]), message] if context == "between-good-rows" else [message]
    result = decoder.decode_json(messages, "s")  # must not raise
    check_accounting(result, len(messages))
    [letter] = result.dead_letters
    assert letter.position == len(messages) - 1 and letter.payload == message
    assert f"'{field}'" in letter.reason and ("null" in letter.reason or "None" in letter.reason), letter.reason


@pytest.mark.parametrize(
    "message, field",
    [
        ('{"label": 0, "v": 100000000000000000000}', "v"),  # a JSON integer beyond int64
        ('{"label": 0, "vbag": [1, -100000000000000000000]}', "vbag"),
    ],
)
def test_vocab_id_beyond_int64_becomes_a_dead_letter(message, field):
    result = RecordDecoder(SPEC).decode_json([to_json(GOOD[0]), message], "s")  # must not raise
    check_accounting(result, 2)
    [letter] = result.dead_letters
    assert letter.position == 1 and letter.payload == message and f"'{field}'" in letter.reason
    assert result.table.to_pylist() == [canonical(GOOD[0])]


def test_every_bad_json_record_at_once():
    """All the bad records of BAD_JSON in one batch, between good ones: each is refused
    for its own field (the wording may differ: a mixed column takes the slow path), and
    the good rows all come through."""
    decoder = RecordDecoder(SPEC)
    messages, expected_good, expected_bad = [], [], {}
    for i, (_, message, words) in enumerate(BAD_JSON):
        good = GOOD[i % 3]
        messages.append(to_json(good))
        expected_good.append(canonical(good))
        expected_bad[len(messages)] = (message, words)
        messages.append(message)
    result = decoder.decode_json(messages, "s", first_position=50)
    check_accounting(result, len(messages))
    assert result.table.to_pylist() == expected_good
    assert [d.position for d in result.dead_letters] == [50 + i for i in expected_bad]
    for letter in result.dead_letters:
        message, words = expected_bad[letter.position - 50]
        assert letter.payload == message
        assert words[0] in letter.reason, letter.reason


def test_explicit_positions():
    decoder = RecordDecoder(SPEC)
    result = decoder.decode_json([to_json(GOOD[0]), "bad", "[]"], "t/1", positions=[17, 42, 99])
    assert [(d.position, d.payload) for d in result.dead_letters] == [(42, "bad"), (99, "[]")]
    result = decoder.decode_tsv([to_tsv(GOOD[0]), "1\t2", "x"], "f", positions=[5, 6, 8])
    assert [d.position for d in result.dead_letters] == [6, 8]


def test_invalid_utf8_json_message():
    decoder = RecordDecoder(SPEC)
    result = decoder.decode_json([b'{"label": 1, "h": "\xff\xfe"}', to_json(GOOD[0]).encode()], "s")
    check_accounting(result, 2)
    [letter] = result.dead_letters
    assert letter.position == 0 and "invalid JSON" in letter.reason
    assert "\\xff" in letter.payload  # the raw bytes survive in the payload
    assert result.table.to_pylist() == [canonical(GOOD[0])]


def test_unknown_fields_rejected_or_ignored():
    messages = [to_json(GOOD[0]), '{"label": 1, "colour": "red"}', '{"label": 0, "colour": null}']
    rejecting = RecordDecoder(SPEC, DecodeOptions(unknown_fields="reject")).decode_json(messages, "s")
    check_accounting(rejecting, 3)
    [letter] = rejecting.dead_letters
    assert letter.position == 1 and "unknown field" in letter.reason and "'colour'" in letter.reason
    ignoring = RecordDecoder(SPEC, DecodeOptions(unknown_fields="ignore")).decode_json(messages, "s")
    assert ignoring.dead_letters == []
    assert ignoring.table.num_rows == 3
    assert "colour" not in ignoring.table.column_names
    assert ignoring.table.to_pylist()[1] == canonical({"label": 1})


def test_unknown_parquet_column_rejected_or_ignored():
    table = to_table(GOOD[:2]).append_column("colour", pa.array(["red", None]))
    rejecting = RecordDecoder(SPEC, DecodeOptions(unknown_fields="reject")).decode_table(table, "f")
    check_accounting(rejecting, 2)
    [letter] = rejecting.dead_letters
    assert letter.position == 0 and "'colour'" in letter.reason
    ignoring = RecordDecoder(SPEC).decode_table(table, "f")
    assert ignoring.dead_letters == [] and ignoring.table.to_pylist() == [canonical(r) for r in GOOD[:2]]


def test_dense_values_are_finite_in_float32():
    # 1e300 is a finite JSON number, but it has no float32 value: it must not reach the
    # canonical table as inf (the decoder promises finite dense values).
    decoder = RecordDecoder(SPEC)
    result = decoder.decode_json(['{"label": 0, "d1": 1e300}', '{"label": 0, "d1": -1e39}', to_json(GOOD[0])], "s")
    check_accounting(result, 3)
    assert np.isfinite(np.array(result.table.column("d1").to_pylist(), dtype=np.float32)).all()
    for letter in result.dead_letters:
        assert "'d1'" in letter.reason


# -- anything at all: no exception, every row accounted for, valid rows within the spec ------

FUZZ_VALUES = [
    None, 0, 1, -1, 0.5, 2, 1.5, -0.0, 7, 19, 10**20, 1e300, float("nan"), float("inf"),
    "a", "", "7", "日本", True, False, [], [None], ["a"], ["a", "b"], ["a", "b", "c", "d"],
    [1], [1, 2, 3], [1, 2, 3, 4], [1.5], [-1], [[1]], {"x": 1},
]


def assert_valid_canonical(table: pa.Table) -> None:
    for row in table.to_pylist():
        assert 0.0 <= row["label"] <= 1.0
        assert math.isfinite(row["d1"]) and math.isfinite(row["d2"])
        for name, rows, max_len in (("h", 100, 1), ("v", 10, 1), ("bag", 50, 3), ("vbag", 20, 3)):
            assert len(row[name]) <= max_len
            assert all(0 <= i < rows for i in row[name]), (name, row[name])


def test_json_fuzz_never_raises():
    import random

    problems = []
    for seed in range(300):
        decoder = RecordDecoder(SPEC, DecodeOptions(unknown_fields="reject" if seed % 2 else "ignore"))
        rng = random.Random(seed)
        messages = []
        for _ in range(rng.randint(1, 6)):
            record = {name: rng.choice(FUZZ_VALUES) for name in ORDER + ["extra"] if rng.random() < 0.6}
            messages.append(json.dumps(record))
        if rng.random() < 0.2:
            messages.insert(rng.randint(0, len(messages)), rng.choice(["garbage", "[]", "{", "null"]))
        try:
            result = decoder.decode_json(messages, "fuzz", first_position=seed * 10)
        except Exception as err:  # collected, so the report shows every distinct failure
            problems.append(f"{type(err).__name__}: {err} <- {messages}")
            continue
        assert result.rows_in == len(messages)
        for letter in result.dead_letters:
            assert letter.payload == messages[letter.position - seed * 10]
        assert_valid_canonical(result.table)
    assert not problems, "\n".join(sorted(set(p.split(" <- ")[0] for p in problems))) + "\n" + problems[0]


def test_tsv_fuzz_never_raises():
    import random

    cells = ["", "0", "1", "2", "-3", "0.5", "nan", "inf", "abc", "a,b", "a,b,c,d", "1,2", "1,,2", "19", "20", "-1", "1e300", "日本"]
    decoder = RecordDecoder(SPEC)
    for seed in range(200):
        rng = random.Random(seed)
        lines = ["\t".join(rng.choice(cells) for _ in range(rng.choice([7, 7, 7, 6, 8, 1]))) for _ in range(rng.randint(1, 6))]
        result = decoder.decode_tsv(lines, "fuzz")
        assert result.rows_in == len(lines)
        for letter in result.dead_letters:
            assert letter.payload == lines[letter.position]
        assert_valid_canonical(result.table)


# -- bad TSV lines ------------------------------------------------------------------------

BAD_TSV = [
    ("too-few-columns", "1\t2", ["malformed TSV", "7"]),
    ("one-column", "garbage", ["malformed TSV", "7"]),
    ("too-many-columns", to_tsv(GOOD[0]) + "\textra", ["malformed TSV", "7"]),
    ("missing-label", "\t1\t1\ta\t1\ta\t1", ["missing label", "'label'"]),
    ("label-above-1", "2\t1\t1\ta\t1\ta\t1", ["'label'", "[0, 1]"]),
    ("label-text", "yes\t1\t1\ta\t1\ta\t1", ["'label'", "number"]),
    ("dense-text", "0\tabc\t1\ta\t1\ta\t1", ["'d1'", "number"]),
    ("dense-nan", "0\tnan\t1\ta\t1\ta\t1", ["'d1'", "finite"]),
    ("dense-inf", "0\t1\tinf\ta\t1\ta\t1", ["'d2'", "finite"]),
    ("float-id-vocab", "0\t1\t1\ta\t1.5\ta\t1", ["'v'", "integer"]),
    ("text-id-vocab", "0\t1\t1\ta\tfoo\ta\t1", ["'v'", "integer"]),
    ("vocab-out-of-range", "0\t1\t1\ta\t10\ta\t1", ["'v'", "range"]),
    ("vocab-bag-out-of-range", "0\t1\t1\ta\t1\ta\t1,30", ["'vbag'", "range"]),
    ("empty-id-in-vocab-bag", "0\t1\t1\ta\t1\ta\t1,,2", ["'vbag'"]),
    ("oversize-bag", "0\t1\t1\ta\t1\ta,b,c,d\t1", ["'bag'", "max_len"]),
    ("oversize-vocab-bag", "0\t1\t1\ta\t1\ta\t1,2,3,4", ["'vbag'", "max_len"]),
]


@pytest.mark.parametrize("line, words", [c[1:] for c in BAD_TSV], ids=[c[0] for c in BAD_TSV])
@pytest.mark.parametrize("context", ["between-good-rows", "alone"])
def test_bad_tsv_line_becomes_a_dead_letter(line, words, context):
    good = [to_tsv(r) for r in GOOD[:3]]
    check_one_bad_record(RecordDecoder(SPEC).decode_tsv, good, line, context, "day-3.tsv", 20, words)


def test_every_bad_tsv_line_at_once():
    decoder = RecordDecoder(SPEC)
    lines, expected_bad = [], {}
    for i, (_, line, words) in enumerate(BAD_TSV):
        lines.append(to_tsv(GOOD[i % 3]))
        expected_bad[len(lines)] = (line, words)
        lines.append(line)
    result = decoder.decode_tsv(lines, "f")
    check_accounting(result, len(lines))
    assert result.table.to_pylist() == [canonical(GOOD[i % 3]) for i in range(len(BAD_TSV))]
    assert [d.position for d in result.dead_letters] == list(expected_bad)
    for letter in result.dead_letters:
        line, words = expected_bad[letter.position]
        assert letter.payload == line
        for word in words:
            assert word in letter.reason


def test_tsv_bytes_lines():
    decoder = RecordDecoder(SPEC)
    result = decoder.decode_tsv([to_tsv(r).encode() for r in GOOD] + [b"1\t2"], "f")
    check_accounting(result, len(GOOD) + 1)
    assert result.table.to_pylist() == [canonical(r) for r in GOOD]
    assert result.dead_letters[0].payload == "1\t2"


def test_tsv_criteo_spec():
    from picasso.spec_refs import load_spec

    spec = load_spec("criteo")
    decoder = RecordDecoder(spec)
    dense = ["1", "", "-2", *["0"] * 10]
    sparse = ["68fd1e64", "", *[f"{i:08x}" for i in range(24)]]
    result = decoder.decode_tsv(["\t".join(["1", *dense, *sparse]), "0\t1\t2"], "criteo.tsv")
    assert result.rows_in == 2 and result.table.num_rows == 1 and len(result.dead_letters) == 1
    [row] = result.table.to_pylist()
    assert row["label"] == 1.0
    assert row["I1"] == pytest.approx(math.log1p(1)) and row["I2"] == 0.0
    assert row["I3"] == pytest.approx(-math.log1p(2))
    assert row["C1"] == [bucket_of("68fd1e64", spec.sparse[0].hash_buckets)] and row["C2"] == []
    assert "malformed" in result.dead_letters[0].reason and "40" in result.dead_letters[0].reason


# -- bad Parquet / Arrow rows -------------------------------------------------------------

BAD_TABLES = [
    ("missing-label-column", pa.table({"d1": [1.0, 2.0]}), [0, 1], ["missing label", "'label'"]),
    ("null-label", pa.table({"label": [1, None]}), [1], ["missing label"]),
    ("label-out-of-range", pa.table({"label": [1.0, 1.5]}), [1], ["'label'", "[0, 1]"]),
    ("label-strings", pa.table({"label": ["1", "0"]}), [0, 1], ["'label'", "number"]),
    ("dense-strings", pa.table({"label": [1, 0], "d1": ["1.0", "x"]}), [0, 1], ["'d1'", "number"]),
    ("dense-nan", pa.table({"label": [1, 0], "d1": [1.0, float("nan")]}), [1], ["'d1'", "finite"]),
    ("dense-inf", pa.table({"label": [1, 0], "d2": [float("-inf"), 1.0]}), [0], ["'d2'", "finite"]),
    ("float-ids-hashed", pa.table({"label": [1, 0], "h": [1.5, None]}), [0], ["'h'"]),
    ("float-ids-vocab", pa.table({"label": [1, 0], "v": [1.0, 2.0]}), [0, 1], ["'v'", "integer"]),
    ("string-ids-vocab", pa.table({"label": [1, 0], "v": ["1", None]}), [0], ["'v'", "integer"]),
    ("vocab-out-of-range", pa.table({"label": [1, 0], "v": [1, 12]}), [1], ["'v'", "range"]),
    ("vocab-bag-out-of-range", pa.table({"label": [1, 0], "vbag": [[-1], [2]]}), [0], ["'vbag'", "range"]),
    ("oversize-bag", pa.table({"label": [1, 0], "bag": [["a"], ["a", "b", "c", "d"]]}), [1], ["'bag'", "max_len"]),
    ("null-id-in-vocab-bag", pa.table({"label": [1, 0], "vbag": [[1], [1, None]]}), [1], ["'vbag'", "null"]),
]


@pytest.mark.parametrize(
    "table, bad_rows, words", [c[1:] for c in BAD_TABLES], ids=[c[0] for c in BAD_TABLES]
)
def test_bad_table_rows_become_dead_letters(table, bad_rows, words, tmp_path):
    path = tmp_path / "f.parquet"
    pq.write_table(table, path)
    read = pq.read_table(path)
    result = RecordDecoder(SPEC).decode_table(read, str(path), first_position=300)
    check_accounting(result, table.num_rows)
    assert [d.position for d in result.dead_letters] == [300 + i for i in bad_rows]
    rows = table.to_pylist()
    for i, letter in zip(bad_rows, result.dead_letters):
        assert letter.source == str(path)
        payload = json.loads(letter.payload)
        for name, value in rows[i].items():  # the row as it arrived
            if isinstance(value, float) and not math.isfinite(value):
                continue
            assert payload[name] == value
        for word in words:
            assert word in letter.reason, letter.reason
    good = [i for i in range(table.num_rows) if i not in bad_rows]
    assert result.valid_mask.tolist() == [i in good for i in range(table.num_rows)]


def test_null_id_in_a_hashed_bag_in_a_table():
    table = pa.table({"label": [1, 0], "bag": [["a"], ["b", None]]})
    result = RecordDecoder(SPEC).decode_table(table, "f")  # must not raise
    check_accounting(result, 2)
    [letter] = result.dead_letters
    assert letter.position == 1 and "'bag'" in letter.reason and "null" in letter.reason
    assert result.table.column("bag").to_pylist() == [[bucket_of("a", 50)]]


def test_narrow_and_large_arrow_types():
    table = pa.table(
        {
            "label": pa.array([1, 0], pa.int8()),
            "d1": pa.array([1.5, -2], pa.float32()),
            "h": pa.array(["a", "b"], pa.large_string()),
            "v": pa.array([1, 9], pa.uint8()),
        }
    )
    result = RecordDecoder(SPEC).decode_table(table, "f")
    assert result.dead_letters == []
    assert result.table.to_pylist() == [
        canonical({"label": 1, "d1": 1.5, "h": "a", "v": 1}),
        canonical({"label": 0, "d1": -2, "h": "b", "v": 9}),
    ]


def test_dictionary_encoded_string_columns_from_parquet(tmp_path):
    path = tmp_path / "dict.parquet"
    pq.write_table(to_table(GOOD), path)
    table = pq.read_table(path, read_dictionary=["h", "bag.list.element"])
    assert pa.types.is_dictionary(table.schema.field("h").type)
    assert pa.types.is_dictionary(table.schema.field("bag").type.value_type)
    result = RecordDecoder(SPEC).decode_table(table, str(path))
    assert result.dead_letters == []
    assert result.table.to_pylist() == [canonical(r) for r in GOOD]


def test_dictionary_encoded_integer_ids_in_a_vocab_field():
    # e.g. an Arrow batch built from pandas categoricals: integer ids, dictionary-encoded
    plain = to_table(GOOD)
    encoded = plain.set_column(plain.schema.get_field_index("v"), "v", plain.column("v").dictionary_encode())
    assert pa.types.is_dictionary(encoded.schema.field("v").type)
    result = RecordDecoder(SPEC).decode_table(encoded, "kafka")
    assert [d.reason for d in result.dead_letters] == []
    assert result.table.to_pylist() == [canonical(r) for r in GOOD]


def test_dictionary_encoded_integer_ids_in_a_hashed_field():
    table = pa.table({"label": [1, 0, 1], "h": pa.array([5, 6, 5]).dictionary_encode()})
    result = RecordDecoder(SPEC).decode_table(table, "kafka")  # must not raise
    assert [d.reason for d in result.dead_letters] == []
    assert result.table.column("h").to_pylist() == [[bucket_of(5, 100)], [bucket_of(6, 100)], [bucket_of(5, 100)]]


def test_dictionary_encoded_string_ids_with_nulls():
    table = pa.table(
        {
            "label": [1, 0, 1],
            "h": pa.array(["a", None, "b"]).dictionary_encode(),
            "bag": pa.array([["a"], ["b", None], []], pa.list_(pa.dictionary(pa.int32(), pa.string()))),
        }
    )
    result = RecordDecoder(SPEC).decode_table(table, "f")
    check_accounting(result, 3)
    [letter] = result.dead_letters
    assert letter.position == 1 and "'bag'" in letter.reason and "null" in letter.reason
    assert result.table.column("h").to_pylist() == [[bucket_of("a", 100)], [bucket_of("b", 100)]]


# -- dead letters ---------------------------------------------------------------------------


def test_dead_letter_json_round_trip():
    result = RecordDecoder(SPEC).decode_json(['{"label": 7, "h": "日本"}'], "t/0", first_position=5)
    [letter] = result.dead_letters
    again = DeadLetter.from_json(letter.to_json())
    assert again == letter
    assert json.loads(letter.to_json()) == {
        "source": "t/0",
        "position": 5,
        "payload": '{"label": 7, "h": "日本"}',
        "reason": letter.reason,
    }


def test_nan_labels_are_refused_in_parquet_arrow_and_tsv(tmp_path):
    decoder = RecordDecoder(SPEC)
    table = pa.table({"label": pa.array([0.0, float("nan"), 1.0]), "h": ["a", "b", "c"]})
    pq.write_table(table, tmp_path / "part.parquet")
    for result in (decoder.decode_table(pq.read_table(tmp_path / "part.parquet"), "file"),
                   decoder.decode_table(table.to_batches()[0], "batch"),
                   decoder.decode_tsv(["0\t\t\ta\t\t\t", "nan\t\t\tb\t\t\t", "1\t\t\tc\t\t\t"], "tsv")):
        assert result.valid_mask.tolist() == [True, False, True]
        assert [letter.reason for letter in result.dead_letters] == ["label 'label' is not finite (nan)"]


def test_a_uint64_hashed_column_hashes_like_the_integer_ids():
    ids = [0, 7, 2**63, 2**64 - 1]
    table = pa.table({"label": pa.array([0.0] * 4), "h": pa.array(ids, pa.uint64())})
    result = RecordDecoder(SPEC).decode_table(table, "batch")
    assert not result.dead_letters
    assert result.table.column("h").to_pylist() == [[bucket_of(i, 100)] for i in ids]


def test_negative_ids_in_a_hashed_integer_column_are_refused():
    table = pa.table({"label": pa.array([0.0] * 3), "h": pa.array([5, -1, 6], pa.int64()),
                      "bag": pa.array([[1], [2], [3, -(2**63)]], pa.list_(pa.int64()))})
    result = RecordDecoder(SPEC).decode_table(table, "batch")
    assert result.valid_mask.tolist() == [True, False, False]
    assert [letter.reason for letter in result.dead_letters] == [
        "field 'h': integer id -1 is outside [0, 2^64) (hashed ids are unsigned 64-bit)",
        f"field 'bag': integer id {-(2**63)} is outside [0, 2^64) (hashed ids are unsigned 64-bit)"]
