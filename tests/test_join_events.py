"""Impression and label events decoded for the join (connectors.join_events), and the join
section of a spec (picasso.sample_join.join_spec): every kind of bad event is a dead letter with its
reason, every bad setting an error that names it."""

import json

import numpy as np
import pyarrow as pa
import pytest
from helpers import small_spec

from picasso.connectors.join_events import (
    JoinDecoders, decode_poll, impressions_of, labels_of, orphan_dead_letter,
)
from picasso.connectors.kafka_source import Messages
from picasso.connectors.decoding.message_formats import encode_arrow
from picasso.sample_join.join_spec import JoinSpec
from picasso.sample_join.join_rules import OrphanLabel, join_keys
from picasso.spec import SpecError, parse_spec
from picasso.spec_refs import load_join_spec
from picasso.connectors.synthetic.planted import PlantedModel

SPEC = small_spec(name="join-events")
NOW = 1_780_000_000_000


def poll(topic: str, values: list[bytes], timestamp: int = NOW) -> Messages:
    n = len(values)
    return Messages(topic, 0, 0, n, list(range(n)), values, [None] * n, [timestamp] * n)


def impression(i: int, **changes) -> dict:
    table, _ = PlantedModel(SPEC).sample(1, stream=i)
    row = table.to_pylist()[0]
    row.pop(SPEC.label)
    return {**row, "request_id": f"r{i}", "event_time_ms": NOW - 1000 + i, **changes}


def label(i: int, **changes) -> dict:
    return {"request_id": f"r{i}", "event_time_ms": NOW + i, SPEC.label: 1, **changes}


def encoded(rows: list[dict]) -> list[bytes]:
    return [json.dumps(row).encode() for row in rows]


@pytest.fixture
def decoders() -> JoinDecoders:
    return JoinDecoders(SPEC, JoinSpec())


def test_impressions_decode_to_features_keys_and_times(decoders):
    decoded = decode_poll(decoders.impressions, "json", poll("imps", encoded([impression(i) for i in range(5)])))
    assert not decoded.dead_letters
    events = impressions_of(decoded.table, decoders.feature_names)
    assert events.rows.schema == decoders.feature_schema
    assert events.times.tolist() == [NOW - 1000 + i for i in range(5)]
    assert events.keys.tolist() == join_keys([pa.array([f"r{i}" for i in range(5)])]).tolist()


def test_arrow_impressions_decode_like_json_ones(decoders):
    rows = [impression(i) for i in range(6)]
    as_json = decode_poll(decoders.impressions, "json", poll("imps", encoded(rows)))
    as_arrow = decode_poll(decoders.impressions, "arrow", poll("imps", encode_arrow(pa.Table.from_pylist(rows), 4)))
    assert as_arrow.table.equals(as_json.table)


@pytest.mark.parametrize("bad, reason", [
    ({"request_id": None}, "missing join key field 'request_id'"),
    ({"request_id": 1.5}, "join key field 'request_id' must be a string or an integer"),
    ({"request_id": True}, "join key field 'request_id' must be a string or an integer"),
    ({"event_time_ms": None}, "missing event time 'event_time_ms'"),
    ({"event_time_ms": "yesterday"}, "event time 'event_time_ms' must be whole epoch milliseconds"),
    ({"event_time_ms": 12.5}, "event time 'event_time_ms' must be whole epoch milliseconds"),
    ({"event_time_ms": -5}, "event time 'event_time_ms' is before 1970"),
    ({"event_time_ms": (NOW + 2 * 3_600_000) * 1000}, "after its message's timestamp"),  # microseconds
])
def test_a_bad_impression_is_a_dead_letter_with_its_reason(decoders, bad, reason):
    rows = [impression(0), impression(1, **bad), impression(2)]
    decoded = decode_poll(decoders.impressions, "json", poll("imps", encoded(rows)))
    assert [letter.offset for letter in decoded.dead_letters] == [1]
    assert reason in decoded.dead_letters[0].reason
    assert decoded.table.num_rows == 2


def test_a_missing_key_field_is_refused_for_every_field_of_a_compound_key():
    decoders = JoinDecoders(SPEC, JoinSpec(key=("request_id", "item")))
    rows = [impression(0, item="a"), impression(1)]
    decoded = decode_poll(decoders.impressions, "json", poll("imps", encoded(rows)))
    assert [(letter.offset, letter.reason) for letter in decoded.dead_letters] == [(1, "missing join key field 'item'")]


def test_integer_and_text_keys_are_one_key(decoders):
    as_text = decode_poll(decoders.labels, "json", poll("labs", encoded([label(0, request_id="7")])))
    as_int = decode_poll(decoders.labels, "json", poll("labs", encoded([label(0, request_id=7)])))
    assert labels_of(as_text.table, "labs/0").keys.tolist() == labels_of(as_int.table, "labs/0").keys.tolist()


@pytest.mark.parametrize("bad, reason", [
    ({SPEC.label: 0.5}, "label must be 0 or 1"),
    ({SPEC.label: 2}, "must be in [0, 1]"),
    ({SPEC.label: None}, "missing label"),
    ({"request_id": None}, "missing join key field"),
    ({"event_time_ms": None}, "missing event time"),
])
def test_a_bad_label_is_a_dead_letter_with_its_reason(decoders, bad, reason):
    decoded = decode_poll(decoders.labels, "json", poll("labs", encoded([label(0), label(1, **bad)])))
    assert [letter.offset for letter in decoded.dead_letters] == [1]
    assert reason in decoded.dead_letters[0].reason


def test_labels_keep_where_they_came_from_for_their_dead_letter(decoders):
    decoded = decode_poll(decoders.labels, "json", poll("labs", encoded([label(0), label(3, **{SPEC.label: 0})])))
    events = labels_of(decoded.table, "labs/0")
    assert events.values.tolist() == [1, 0] and events.refs == [["labs/0", 0, "r0"], ["labs/0", 1, "r3"]]
    letter = orphan_dead_letter(OrphanLabel(int(events.keys[0]), NOW, 1, events.refs[0]), JoinSpec(), SPEC.label)
    assert (letter.topic, letter.partition, letter.offset) == ("labs", 0, 0)
    assert json.loads(letter.value) == {"request_id": "r0", "event_time_ms": NOW, SPEC.label: 1}
    assert "orphan label" in letter.reason and "request_id=r0" in letter.reason


def test_an_orphan_says_whether_its_impression_was_forgotten_or_never_came(decoders):
    decoded = decode_poll(decoders.labels, "json", poll("labs", encoded([label(0)])))
    events = labels_of(decoded.table, "labs/0")
    join = JoinSpec(wait_ms=1_800_000, horizon_ms=3_600_000)
    key, ref = int(events.keys[0]), events.refs[0]
    never = orphan_dead_letter(OrphanLabel(key, NOW, 1, ref), join, SPEC.label).reason
    assert never == ("orphan label: no impression with request_id=r0 arrived within 60 s of the label's time, "
                     "nor in the 10800 s before it")
    forgotten = orphan_dead_letter(OrphanLabel(key, NOW, 1, ref, NOW - 7_200_000), join, SPEC.label).reason
    assert forgotten == ("orphan label: the impression with request_id=r0 was forgotten at the join's horizon, "
                         "5400 s after its time (W 1800 s + horizon 3600 s); the label came 7200 s after the impression")


def test_tsv_cannot_carry_join_events(decoders):
    with pytest.raises(ValueError, match="json or arrow"):
        decode_poll(decoders.labels, "tsv", poll("labs", [b"1\t2"]))


def test_the_join_section_of_a_spec(tmp_path):
    raw = {**SPEC.to_dict(), "join": {"key": ["request_id", "item"], "time": "ts", "label": "clicked",
                                      "wait": "10m", "late_labels": "correct", "orphan_grace": "30s",
                                      "idle_after": "2m"}}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(raw))
    join = load_join_spec(path)
    assert join == JoinSpec(key=("request_id", "item"), time_field="ts", label_field="clicked", wait_ms=600_000,
                            late_labels="correct", orphan_grace_ms=30_000, idle_after_ms=120_000)
    assert join.policy().wait_ms == 600_000 and load_join_spec("criteo") == JoinSpec()


def test_a_bad_join_section_names_every_problem():
    raw = {**SPEC.to_dict(), "join": {"key": [], "wait": "15", "late_labels": "keep", "lag": "1s", "time": 3,
                                      "idle_after": "soon"}}
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    text = str(err.value)
    for problem in ("'key' must be a field name", "'wait': duration '15' has no unit", "'late_labels' must be one of",
                    "unknown key 'lag'", "'time' must be a field name", "'idle_after':"):
        assert problem in text, text


def test_decoded_times_are_int64_even_from_float_json(decoders):
    decoded = decode_poll(decoders.impressions, "json", poll("imps", encoded([impression(0, event_time_ms=float(NOW))])))
    assert impressions_of(decoded.table, decoders.feature_names).times.dtype == np.int64


def test_decoded_events_carry_their_keys_so_a_colliding_key_joins_nothing_of_another(decoders):
    """The decoders give the join each key itself beside its hash: a label whose key was
    chosen to share another user's hash does not take that user's impression."""
    from picasso.sample_join.join_rules import JoinPolicy
    from picasso.sample_join.join_state import JoinState

    victim, crafted = "aaaaaaaabbbbbbbb", "WnSYpkMCpr|VGy6A"  # one word-wise splitmix64 hash
    imps = decode_poll(decoders.impressions, "json", poll("imps", encoded([impression(0, request_id=victim)])))
    labs = decode_poll(decoders.labels, "json", poll("labs", encoded([label(0, request_id=crafted)])))
    impressions, labels = impressions_of(imps.table, decoders.feature_names), labels_of(labs.table, "labs/0")
    assert impressions.keys.tolist() == labels.keys.tolist()  # the hashes collide: the ids must tell
    assert (impressions.ids.tolist(), labels.ids.tolist()) == ([victim], [crafted])
    join = JoinState(JoinPolicy(wait_ms=10_000), decoders.feature_schema)
    join.advance(impressions, labels, watermark=NOW)
    assert join.pending == 1 and join.waiting_labels == 1 and join.counts.positives == 0
