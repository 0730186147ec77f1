"""Serving decodes a request's rows with training's rules and answers every one of them
(serving/request_decoding.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from helpers import small_spec

from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.serving.request_decoding import BadRows, decode_request

SPEC = small_spec()
DECODER = RecordDecoder(SPEC, DecodeOptions(require_label=False))

GOOD = {"d1": 0.5, "d2": 3.0, "h": "user-1", "v": 3, "bag": ["a", "b"], "vbag": [1, 2]}
# Rows of every kind a client may send, each with the part of the decoder's reason it
# must be refused for (None: a good row).
ROWS = {
    "good": (GOOD, None),
    "integer-id-in-a-hashed-field": ({**GOOD, "h": 42}, None),
    "no-field-at-all": ({}, None),
    "only-unknown-fields": ({"zzz": 1, "other": "x"}, None),
    "string-for-a-number": ({**GOOD, "d1": "old"}, "field 'd1': expected a number"),
    "bool-for-a-number": ({**GOOD, "d2": True}, "field 'd2': expected a number"),
    "dict-for-an-id": ({**GOOD, "h": {"a": 1}}, "field 'h': expected integer or string ids"),
    "bag-over-max-len": ({**GOOD, "bag": [f"id{i}" for i in range(500)]}, "field 'bag'"),
    "vocab-id-out-of-range": ({**GOOD, "v": 10}, "field 'v': id out of range [0, 10)"),
    "negative-hashed-id": ({**GOOD, "h": -1}, "field 'h': integer id -1 is outside [0, 2^64)"),
    "two-bad-fields": ({**GOOD, "d1": "old", "v": 99}, "field 'd1': expected a number"),
}


def frame(rows: list[dict]) -> pd.DataFrame:
    """As MLflow's scoring server builds it from `dataframe_records`."""
    return pd.DataFrame.from_records(rows, index=range(len(rows))) if rows else pd.DataFrame()


def training_reason(row: dict) -> str | None:
    """The verdict training gives the same row, read from a JSON event."""
    result = DECODER.decode_json([json.dumps(row).encode()], "events")
    return result.dead_letters[0].reason if result.dead_letters else None


@pytest.mark.parametrize("kind", list(ROWS))
def test_each_kind_of_row_gets_trainings_verdict(kind):
    row, refused_for = ROWS[kind]
    request = frame([GOOD, row, GOOD])
    if refused_for is None:
        decoded = decode_request(DECODER, request, "error")
        assert decoded.table.num_rows == 3 and not decoded.refused
        assert training_reason(row) is None
        return
    with pytest.raises(BadRows) as raised:
        decode_request(DECODER, request, "error")
    assert [r.row for r in raised.value.refused] == [1]
    assert refused_for in raised.value.refused[0].reason
    assert raised.value.refused[0].reason == training_reason(row)
    assert "1 of 3 rows refused (row 1: " in str(raised.value)


def test_with_on_bad_row_default_every_row_is_answered_on_its_good_fields():
    rows = [row for row, _ in ROWS.values()]
    decoded = decode_request(DECODER, frame(rows), "default")
    assert decoded.table.num_rows == len(rows)
    bad = {i for i, (_, refused_for) in enumerate(ROWS.values()) if refused_for}
    assert set(decoded.refused) == bad
    two = list(ROWS).index("two-bad-fields")
    assert "field 'd1'" in decoded.refused[two] and "field 'v'" in decoded.refused[two]
    # A refused row decodes as the same row with its refused fields missing.
    for i in bad:
        row = rows[i]
        kept = {name: value for name, value in row.items()
                if DECODER.decode_columns({name: [value]}, 1, "check").table.num_rows == 1}
        alone = decode_request(DECODER, frame([kept]), "error").table
        assert decoded.table.slice(i, 1).to_pylist() == alone.to_pylist(), list(ROWS)[i]


def test_rows_with_no_known_field_are_scored_on_defaults():
    """The trainer's missing-value policy: dense 0, sparse an empty bag."""
    decoded = decode_request(DECODER, frame([{}, {"zzz": 1}]), "error")
    assert decoded.table.num_rows == 2
    assert decoded.table.to_pylist()[0] == decoded.table.to_pylist()[1]
    assert decoded.table.column("d1").to_pylist() == [0.0, 0.0] and decoded.table.column("bag").to_pylist() == [[], []]


def test_a_missing_value_in_an_integer_column_is_missing_not_a_float():
    """pandas turns [3, None] into [3.0, NaN]; the vocabulary id stays an integer."""
    decoded = decode_request(DECODER, pd.DataFrame({"v": [3, None]}), "error")
    assert decoded.table.num_rows == 2


def test_an_unknown_on_bad_row_is_refused():
    with pytest.raises(ValueError, match="on_bad_row must be one of error, default"):
        decode_request(DECODER, frame([GOOD]), "skip")


def test_many_refused_rows_are_summarised_in_the_message_and_listed_in_full():
    rows = [{"d1": "bad"}] * 30
    with pytest.raises(BadRows) as raised:
        decode_request(DECODER, frame(rows), "error")
    assert [r.row for r in raised.value.refused] == list(range(30))
    assert str(raised.value).endswith("and 10 more)")
    assert np.all([r.reason == "field 'd1': expected a number, got str 'bad'" for r in raised.value.refused])
