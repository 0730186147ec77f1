"""The fast paths of a poll never change a verdict.

A poll of JSON messages is parsed by Arrow's reader in one call, and the rows of a poll
of Arrow IPC messages are validated as one table; the per-message path (json.loads, or
one IPC message alone) is the definition. Over random mixes of good messages and bad
ones of every kind the decoders know, each message must get exactly the verdict the
per-message path gives it: accepted with the same decoded row, or refused for the same
reason.

The examples are derandomized so that the suite is repeatable;
PICASSO_PROPERTY_EXAMPLES=N (and PICASSO_PROPERTY_RANDOM=1) explores further.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from helpers import small_spec
from hypothesis import given
from hypothesis import strategies as st
from property_settings import PROPERTY

from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.kafka_source import Messages
from picasso.connectors.decoding.json_fast_path import learned_types
from picasso.connectors.decoding.message_formats import decode_json_values, decode_messages, read_ipc_stream

SPEC = small_spec()
OPTIONS = {"ignore-unknown": DecodeOptions(), "reject-unknown": DecodeOptions(unknown_fields="reject")}
DECODERS = {name: RecordDecoder(SPEC, options) for name, options in OPTIONS.items()}

# -- JSON values of every kind a field may meet -----------------------------------------

BOUNDARY_INTS = [0, 1, -1, 7, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30]
ids_text = st.one_of(
    st.sampled_from(["a", "68fd1e64", "é", "日本", "2026-11-01", "2026-11-01T10:00:00", "", "-NaN", "1"]),
    st.text(max_size=6),  # any code point, lone surrogates included
)
integers = st.one_of(st.sampled_from(BOUNDARY_INTS), st.integers(-3, 30))
floats = st.one_of(st.sampled_from([0.0, 1.0, 2.0, 0.5, -0.5, 1e39, math.inf, -math.inf, math.nan]),
                   st.floats(allow_nan=True, allow_infinity=True))
scalars = st.one_of(integers, floats, st.booleans(), ids_text, st.none())
odd = st.one_of(st.lists(scalars, max_size=2), st.dictionaries(st.sampled_from(["a", "b"]), scalars, max_size=2))
any_value = st.one_of(scalars, odd)
an_id = st.one_of(ids_text, integers, floats, st.booleans(), st.none(), odd)
a_bag = st.one_of(st.lists(st.one_of(ids_text, integers), max_size=5), st.lists(an_id, max_size=4), an_id)

FIELD_VALUES = {
    "label": st.one_of(st.sampled_from([0, 1, 0.25, 1.0]), any_value),
    "d1": any_value,
    "d2": any_value,
    "h": an_id,
    "v": st.one_of(st.integers(-2, 12), an_id),
    "bag": a_bag,
    "vbag": st.one_of(st.lists(st.integers(-1, 21), max_size=5), a_bag),
    "extra": any_value,  # not in the spec
}


STRING_IDS, INTEGER_IDS = st.sampled_from(["a", "é", "x1"]), st.integers(0, 99)


@st.composite
def good_record(draw, h_ids=st.one_of(STRING_IDS, INTEGER_IDS)) -> dict:
    record = {"label": draw(st.sampled_from([0, 1, 0.5])), "d1": draw(st.floats(-1e3, 1e3)),
              "d2": draw(st.integers(-5, 5)), "h": draw(h_ids),
              "v": draw(st.integers(0, 9)), "bag": draw(st.lists(st.sampled_from(["p", "q", "日"]), max_size=3)),
              "vbag": draw(st.lists(st.integers(0, 19), max_size=3))}
    for name in draw(st.lists(st.sampled_from(list(record)[1:]), unique=True, max_size=2)):
        del record[name]  # missing optional fields get defaults
    return record


@st.composite
def any_record(draw) -> dict:
    names = draw(st.lists(st.sampled_from(list(FIELD_VALUES)), unique=True, max_size=len(FIELD_VALUES)))
    return {name: draw(FIELD_VALUES[name]) for name in names}


def encode(record: dict, ascii_only: bool, pretty: bool = False) -> bytes:
    indent = 1 if pretty else None  # newlines inside the message
    try:
        return json.dumps(record, ensure_ascii=ascii_only, indent=indent).encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8: write it as an escape
        return json.dumps(record, indent=indent).encode()


@st.composite
def one_producers_poll(draw) -> list[bytes]:
    """Good events whose fields keep one JSON type each, as one producer writes them: the
    fast path reads such a poll whole, and learns its column types."""
    records = draw(st.lists(good_record(draw(st.sampled_from([STRING_IDS, INTEGER_IDS]))), min_size=1, max_size=10))
    ascii_only, pretty = draw(st.booleans()), draw(st.booleans())
    return [encode(record, ascii_only, pretty) for record in records]


RAW_BAD = [
    b"", b"   ", b"{not json", b"[1, 2]", b'"label"', b"null", b'{"label": 0, "h": "a", "h": "b"}',
    b'{"label": 0, "extra": -NaN}', b'{"label": 0, "h": "\\ud800"}', b'{"label": 0}\n', b'{"label": 0} {"label": 1}',
    b'{"label": 0, "h": "\xff"}', b'{"label": 0, "d1": 1' + b"0" * 400 + b"}", b'{"label": 1,\n "h": "a"}',
    b'{"label": 0, "x": {"k": 1, "k": 2}}', b'{"label": 0, "h": 1e2}', b'{"label": 0, "d1": -Infinity}',
    b' {"label": 0}', b'{"label": 0, "extra":', b'{"k": 1}}', b'{"label": 0, "h": "a\tb"}',
    # Good, but never written by json.dumps: signed zeros.
    b'{"label": -0, "d1": -0, "d2": -0.0}',
]
json_message = st.one_of(
    st.builds(encode, good_record(), st.booleans(), st.booleans()),
    st.builds(encode, any_record(), st.booleans(), st.booleans()),
    st.sampled_from(RAW_BAD),
)


def poll(values: list[bytes]) -> Messages:
    n = len(values)
    return Messages("events", 0, 100, 100 + n, list(range(100, 100 + n)), values, [None] * n, [0] * n)


def verdicts_of_poll(decoder: RecordDecoder, fmt: str, values: list[bytes]) -> dict[int, tuple]:
    """offset -> (the reason it was refused for, or None; the decoded rows it kept)."""
    decoded = decode_messages(decoder, fmt, poll(values))
    letters = {letter.offset: letter for letter in decoded.dead_letters}
    rows, start = decoded.table.to_pylist(), 0
    verdicts = {}
    for offset, value in zip(range(100, 100 + len(values)), values):
        letter = letters.get(offset)
        table = read_ipc_stream(value)[0] if fmt == "arrow" and value else None
        sent = 1 if fmt == "json" else (table.num_rows if table is not None else 0)
        kept = 0 if letter is not None and (fmt == "json" or letter.records >= sent) else sent - (letter.records if letter else 0)
        verdicts[offset] = (letter.reason if letter else None, rows[start:start + kept])
        start += kept
    assert start == len(rows)
    return verdicts


def json_verdict_alone(decoder: RecordDecoder, value: bytes) -> tuple:
    """The per-message path: json.loads of this message alone."""
    if not value:
        return "empty message (no value)", []
    result = decoder.decode_json([value], "events/0")
    return (result.dead_letters[0].reason if result.dead_letters else None), result.table.to_pylist()


def assert_same_verdict(fast: tuple, alone: tuple, where) -> None:
    assert fast[0] == alone[0], where
    assert json.dumps(fast[1], sort_keys=True) == json.dumps(alone[1], sort_keys=True), where  # NaN-safe


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("types", ["inferred", "learned"])
@PROPERTY
@given(earlier=one_producers_poll(), values=st.lists(json_message, min_size=1, max_size=25))
def test_json_fast_path_gives_each_message_its_own_verdict(options, types, earlier, values):
    """With the column types inferred from the poll itself, and with the types learned
    from an earlier poll given to Arrow's reader."""
    decoder = RecordDecoder(SPEC, OPTIONS[options])
    if types == "learned":
        decode_messages(decoder, "json", poll(earlier))
        assert learned_types(decoder) is not None
    fast = verdicts_of_poll(decoder, "json", values)
    for offset, value in zip(range(100, 100 + len(values)), values):
        assert_same_verdict(fast[offset], json_verdict_alone(decoder, value), (offset, value))


class WithoutPerMessagePath(RecordDecoder):
    def decode_json(self, *args, **kwargs):
        raise AssertionError("the per-message path was taken")


@PROPERTY
@given(polls=st.lists(one_producers_poll(), min_size=1, max_size=3))
def test_polls_of_good_json_take_the_fast_path_and_keep_every_message(polls):
    """Pretty-printed events too; a later poll whose types differ from the learned ones
    (another producer) is read again with its own."""
    decoder = WithoutPerMessagePath(SPEC)
    for values in polls:
        decoded = decode_messages(decoder, "json", poll(values))
        assert decoded.table.num_rows == len(values) and not decoded.dead_letters


def test_messages_that_run_into_each_other_are_each_refused():
    """Arrow's reader sees the poll as one sequence of JSON values: two broken messages
    can read as one object, and a message of two objects makes up the count of rows."""
    good = json.dumps({"label": 1, "h": "a"}).encode()
    decoded = decode_messages(RecordDecoder(SPEC), "json",
                              poll([good, b'{"label": 0, "extra":', b'{"k": 1}}', b'{"label": 1}{"label": 0}', good]))
    assert decoded.table.num_rows == 2
    assert [letter.offset for letter in decoded.dead_letters] == [101, 102, 103]


def test_an_empty_value_given_straight_to_the_json_decoder_is_a_blank_line():
    """decode_messages refuses empty messages before decoding; a direct caller's empty
    value must not break the poll either."""
    good = json.dumps({"label": 1, "h": "a"}).encode()
    result = decode_json_values(RecordDecoder(SPEC), [b"", good], "events/0", [0, 1])
    assert [(letter.position, letter.reason) for letter in result.dead_letters] == [(0, "blank line (no JSON object)")]
    assert result.table.num_rows == 1


def test_minus_zero_is_zero_on_both_paths():
    """json.loads reads `-0` as the integer 0; Arrow's reader, in a column of doubles, as
    -0.0. Both paths keep +0.0."""
    values = [b'{"label": 0.5, "d1": 2.5, "d2": 0.5}', b'{"label": -0, "d1": -0, "d2": -0.0}']
    decoder = RecordDecoder(SPEC)
    fast = verdicts_of_poll(decoder, "json", values)
    assert_same_verdict(fast[101], json_verdict_alone(decoder, values[1]), values[1])
    row = fast[101][1][0]
    assert [math.copysign(1.0, row[name]) for name in ("label", "d1", "d2")] == [1.0, 1.0, 1.0]


def test_one_bad_message_of_each_kind_leaves_the_rest_of_its_poll_alone():
    """The reported cases: a float id, an id over int64, a valid uint64 id."""
    decoder = DECODERS["ignore-unknown"]
    good = [json.dumps({"label": i % 2, "h": i, "v": 1, "bag": [i, "x"]}).encode() for i in range(20)]
    for bad, refused in [(b'{"label": 0, "h": 2.0}', True), (b'{"label": 0, "h": 18446744073709551616}', True),
                         (b'{"label": 0, "h": 18446744073709551615}', False), (b'{"label": 0, "h": -3}', True),
                         (b'{"label": 0, "h": "2026-11-01"}', False), (b'{"label": 0, "h": "\xc3\xa9t\xc3\xa9"}', False)]:
        decoded = decode_messages(decoder, "json", poll(good + [bad]))
        assert [letter.offset for letter in decoded.dead_letters] == ([120] if refused else []), bad
        assert decoded.table.num_rows == 20 + (not refused), bad


# -- Arrow IPC messages whose schemas differ or conflict --------------------------------

def _encodable(text: str) -> bool:
    """Arrow string columns hold UTF-8 only: no lone surrogates."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


arrow_text = ids_text.filter(_encodable)
ARROW_COLUMNS = {
    "label": [(pa.float64(), st.one_of(st.sampled_from([0.0, 1.0, 0.5]), floats, st.none())),
              (pa.int64(), st.integers(-1, 2)), (pa.bool_(), st.booleans()), (pa.float32(), st.floats(0, 1, width=32)),
              (pa.null(), st.none())],
    "d1": [(pa.float32(), st.floats(width=32)), (pa.int64(), st.sampled_from(BOUNDARY_INTS[:7])),
           (pa.string(), arrow_text)],
    "h": [(pa.string(), arrow_text), (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
          (pa.uint64(), st.integers(0, 2**64 - 1)), (pa.float64(), floats), (pa.int32(), st.integers(-5, 5)),
          (pa.dictionary(pa.int32(), pa.string()), st.sampled_from(["a", "b", "é"]))],
    "v": [(pa.int64(), st.integers(-2, 12)), (pa.float64(), st.sampled_from([1.0, 2.5])), (pa.string(), st.just("3"))],
    "bag": [(pa.list_(pa.string()), st.lists(st.one_of(st.sampled_from(["p", "q"]), st.none()), max_size=4)),
            (pa.list_(pa.int64()), st.lists(st.integers(-2, 5), max_size=4)),
            (pa.list_(pa.float64()), st.lists(st.floats(0, 3), max_size=2))],
    "extra": [(pa.int64(), st.integers(0, 3)), (pa.string(), st.just("x"))],
}


@st.composite
def arrow_table(draw) -> pa.Table:
    rows = draw(st.integers(0, 4))
    columns = {}
    for name in draw(st.lists(st.sampled_from(list(ARROW_COLUMNS)), unique=True, min_size=1)):
        arrow_type, values = draw(st.sampled_from(ARROW_COLUMNS[name]))
        items = draw(st.lists(st.one_of(values, st.none()), min_size=rows, max_size=rows))
        columns[name] = pa.array(items, arrow_type)
    return pa.table(columns)


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@st.composite
def arrow_message(draw) -> bytes:
    value = ipc(draw(arrow_table()))
    damage = draw(st.sampled_from(["none"] * 4 + ["no-end-marker", "cut", "trailing", "garbage", "empty"]))
    if damage == "no-end-marker":
        return value[:-8]
    if damage == "cut":
        return value[:draw(st.integers(1, len(value) - 1))]
    if damage == "trailing":
        return value + b"\x00\x01"
    if damage == "garbage":
        return draw(st.binary(min_size=1, max_size=40))
    return b"" if damage == "empty" else value


def arrow_verdict_alone(decoder: RecordDecoder, value: bytes) -> tuple:
    """The per-message path: this IPC message decoded on its own."""
    decoded = decode_messages(decoder, "arrow", poll([value]))
    return (decoded.dead_letters[0].reason if decoded.dead_letters else None), decoded.table.to_pylist()


@pytest.mark.parametrize("options", list(DECODERS))
@PROPERTY
@given(values=st.lists(arrow_message(), min_size=1, max_size=8))
def test_arrow_fast_path_gives_each_message_its_own_verdict(options, values):
    decoder = DECODERS[options]
    fast = verdicts_of_poll(decoder, "arrow", values)
    for offset, value in zip(range(100, 100 + len(values)), values):
        assert_same_verdict(fast[offset], arrow_verdict_alone(decoder, value), offset)


def test_arrow_messages_with_conflicting_schemas_keep_their_own_verdicts():
    """One producer's float ids do not turn another's integer ids into floats."""
    decoder = DECODERS["ignore-unknown"]
    good = ipc(pa.table({"label": pa.array([0.0, 1.0]), "h": pa.array([1, 2], pa.int64())}))
    bad = ipc(pa.table({"label": pa.array([0.0]), "h": pa.array([2.5])}))
    decoded = decode_messages(decoder, "arrow", poll([good, bad, good]))
    assert decoded.table.num_rows == 4
    assert [letter.offset for letter in decoded.dead_letters] == [101]


@pytest.mark.parametrize("damage", ["cut-at-a-batch-boundary", "no-end-marker", "bytes-after-the-end"])
def test_an_arrow_stream_read_short_is_refused_whole(damage):
    table = pa.table({"label": pa.array([0.0, 1.0, 0.0, 1.0]), "h": pa.array(["a", "b", "c", "d"])})
    value = ipc(table)  # two batches of two rows
    source = pa.BufferReader(value)
    reader = pa.ipc.open_stream(source)
    reader.read_next_batch()
    first_batch_end = source.tell()
    damaged = {"cut-at-a-batch-boundary": value[:first_batch_end], "no-end-marker": value[:-8],
               "bytes-after-the-end": value + b"\x00" * 8}[damage]
    decoded = decode_messages(DECODERS["ignore-unknown"], "arrow", poll([damaged]))
    assert decoded.table.num_rows == 0
    assert len(decoded.dead_letters) == 1 and "invalid Arrow IPC stream" in decoded.dead_letters[0].reason
