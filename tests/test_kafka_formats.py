"""Message formats and the dead-letter topic, through a real broker and a Beam pipeline.

One pipeline run per format reads a topic that mixes good messages with one message of
each kind of bad; each kind is then its own test against the dead-letter topic.
"""

from __future__ import annotations

import json
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import small_spec
from kafka import KafkaConsumer, TopicPartition
from kafka_broker import create_topic, produce_values

from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.kafka_config import KafkaConnection, latest_offsets
from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.dead_letters.topic import WriteDeadLettersToKafka
from picasso.connectors.kafka_source import Messages, ReadFromKafka
from picasso.connectors.decoding.message_formats import decode_json_values, decode_messages, encode_arrow, encode_json
from picasso.pipelines.transforms.decode import DEAD_LETTERS, DecodeMessages
from picasso.pipelines.transforms.pack import PackMessages

SPEC = small_spec()


def good_row(i: int) -> dict:
    return {"label": i % 2, "d1": float(i), "d2": 2.0, "h": f"tok{i % 7}", "v": i % 10, "bag": ["a", "b"], "vbag": [1, 2]}


def _json(row) -> bytes:
    return json.dumps(row).encode()


# kind -> (message value, a phrase its reason must contain)
JSON_BAD = {
    "invalid_json": (b'{"label": 1, "d1": ', "invalid JSON"),
    "not_an_object": (b"[1, 2, 3]", "not a JSON object"),
    "missing_label": (_json({k: v for k, v in good_row(1).items() if k != "label"}), "missing label"),
    "wrong_type": (_json({**good_row(2), "d1": "three"}), "expected a number"),
    "nan": (b'{"label": 1, "d1": NaN}', "not finite"),
    "inf": (b'{"label": 1, "d2": Infinity}', "not finite"),
    "id_out_of_range": (_json({**good_row(3), "v": 10}), "out of range"),
    "oversize_multi_hot": (_json({**good_row(4), "bag": ["a", "b", "c", "d"]}), "more than max_len"),
    "unknown_field": (_json({**good_row(5), "surprise": 1}), "unknown field 'surprise'"),
    "not_utf8": (b'{"label": 1, "h": "\xff\xfe"}', "invalid JSON"),
    "empty": (b"", "empty message"),
}


def run_pipeline(bootstrap: str, topic: str, fmt: str, options: DecodeOptions = DecodeOptions(), out_dir=None):
    """Read the topic, decode and pack; dead letters go to TOPIC.dead. Returns the packed
    sample count, the positions reached, and the dead letters read back from the topic."""
    connection = KafkaConnection(bootstrap)
    dead_topic = f"{topic}.dead"
    create_topic(bootstrap, dead_topic)
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        decoded = (pipeline | ReadFromKafka.bounded(connection, [topic], max_messages=7)
                   | DecodeMessages(SPEC, {topic: fmt}, options))
        decoded[DEAD_LETTERS] | WriteDeadLettersToKafka(connection, DeadLetterPolicy(topic=dead_topic))
        packed = decoded.chunks | PackMessages(SPEC)
        (packed | beam.Map(lambda p: json.dumps([p.batch.num_samples, p.span.next_position]))
         | beam.io.WriteToText(str(out_dir / "packed"), shard_name_template=""))
    results = [json.loads(line) for line in (out_dir / "packed").read_text().splitlines()]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(dead_topic, 0)
    end = latest_offsets(consumer, [tp])[tp]
    consumer.assign([tp])
    consumer.seek(tp, 0)
    letters = []
    while len(letters) < end:
        for records in consumer.poll(timeout_ms=1000).values():
            letters += [MessageDeadLetter.from_record(r) for r in records]
    consumer.close()
    return sum(n for n, _ in results), max(p for _, p in results), letters


@pytest.fixture(scope="module")
def json_run(kafka_bootstrap, tmp_path_factory):
    topic = "formats-json"
    values = [_json(good_row(i)) for i in range(20)] + [value for value, _ in JSON_BAD.values()]
    create_topic(kafka_bootstrap, topic)
    produce_values(kafka_bootstrap, topic, values)
    samples, position, letters = run_pipeline(kafka_bootstrap, topic, "json", DecodeOptions(unknown_fields="reject"),
                                              tmp_path_factory.mktemp("json"))
    return values, samples, position, {letter.offset: letter for letter in letters}


@pytest.mark.parametrize("kind", list(JSON_BAD))
def test_each_bad_json_message_becomes_a_dead_letter_with_its_bytes_and_reason(json_run, kind):
    values, _, _, letters = json_run
    offset = 20 + list(JSON_BAD).index(kind)
    value, phrase = JSON_BAD[kind]
    letter = letters[offset]
    assert letter.topic == "formats-json" and letter.partition == 0 and letter.offset == offset
    assert (letter.value or b"") == value  # the original bytes, untouched
    assert phrase in letter.reason, letter.reason


def test_good_json_messages_are_all_trained_and_none_dropped(json_run):
    values, samples, position, letters = json_run
    assert samples == 20
    assert len(letters) == len(JSON_BAD)
    assert samples + len(letters) == len(values) and position == len(values)


@pytest.fixture(scope="module")
def arrow_run(kafka_bootstrap, tmp_path_factory):
    topic = "formats-arrow"
    rows = [good_row(i) for i in range(30)]
    table = pa.Table.from_pylist(rows)
    bad_rows = pa.Table.from_pylist([good_row(100), {**good_row(101), "v": 99}, good_row(102),
                                     {**good_row(103), "d1": float("nan")}])
    values = encode_arrow(table, 10) + [b"ARROW1 but not really"] + encode_arrow(bad_rows, 10)
    create_topic(kafka_bootstrap, topic)
    produce_values(kafka_bootstrap, topic, values)
    samples, position, letters = run_pipeline(kafka_bootstrap, topic, "arrow", out_dir=tmp_path_factory.mktemp("arrow"))
    return values, samples, position, {letter.offset: letter for letter in letters}


def test_arrow_messages_carry_many_samples(arrow_run):
    values, samples, position, _ = arrow_run
    assert samples == 30 + 2 and position == len(values)


def test_invalid_arrow_ipc_is_a_dead_letter(arrow_run):
    values, _, _, letters = arrow_run
    letter = letters[3]
    assert letter.value == values[3] and "invalid Arrow IPC" in letter.reason and letter.records == 1


def test_bad_rows_of_an_arrow_message_make_one_dead_letter_naming_each_row(arrow_run):
    values, _, _, letters = arrow_run
    letter = letters[4]
    assert letter.value == values[4] and letter.records == 2
    assert "row 1:" in letter.reason and "out of range" in letter.reason
    assert "row 3:" in letter.reason and "not finite" in letter.reason


def test_malformed_tsv_line_is_a_dead_letter(kafka_bootstrap, tmp_path):
    topic = "formats-tsv"
    good = [b"1\t0.5\t2\ttok\t3\ta,b\t1,2", b"0\t\t\t\t\t\t"]
    bad = {b"1\t0.5\t2": "malformed TSV line", b"1\tx\t2\ttok\t3\ta\t1": "expected a number",
           b"1\t0.5\t2\ttok\t3\ta,b,c,d\t1": "more than max_len"}
    values = good + list(bad)
    create_topic(kafka_bootstrap, topic)
    produce_values(kafka_bootstrap, topic, values)
    samples, position, letters = run_pipeline(kafka_bootstrap, topic, "tsv", out_dir=tmp_path)
    assert samples == 2 and position == len(values)
    by_offset = {letter.offset: letter for letter in letters}
    for offset, (value, phrase) in enumerate(bad.items(), start=len(good)):
        assert by_offset[offset].value == value and phrase in by_offset[offset].reason


# -- the JSON fast path never changes a verdict --------------------------------------------

def _messages(values: list[bytes]) -> Messages:
    n = len(values)
    return Messages("t", 0, 0, n, list(range(n)), values, [None] * n, [0] * n)


def test_json_fast_path_matches_the_per_message_decoder():
    decoder = RecordDecoder(SPEC)
    values = [_json(good_row(i)) for i in range(50)] + [_json({**good_row(1), "bag": None, "h": None, "d1": None})]
    fast = decode_json_values(decoder, values, "t/0", np.arange(len(values)))
    slow = decoder.decode_json(values, "t/0", positions=np.arange(len(values)))
    assert fast.table.equals(slow.table)
    assert not fast.dead_letters and not slow.dead_letters


@pytest.mark.parametrize("kind", list(JSON_BAD))
def test_json_fast_path_falls_back_to_the_same_dead_letters(kind):
    decoder = RecordDecoder(SPEC, DecodeOptions(unknown_fields="reject"))
    values = [_json(good_row(i)) for i in range(5)] + [JSON_BAD[kind][0]]
    decoded = decode_messages(decoder, "json", _messages(values))
    assert decoded.table.num_rows == 5
    assert [letter.offset for letter in decoded.dead_letters] == [5]
    assert JSON_BAD[kind][1] in decoded.dead_letters[0].reason


def test_json_values_with_newlines_inside_still_decode():
    decoder = RecordDecoder(SPEC)
    pretty = json.dumps(good_row(3), indent=2).encode()
    decoded = decode_messages(decoder, "json", _messages([_json(good_row(1)), pretty]))
    assert decoded.table.num_rows == 2 and not decoded.dead_letters


def test_encoders_round_trip():
    table = pa.Table.from_pylist([good_row(i) for i in range(25)])
    assert [json.loads(v) for v in encode_json(table)] == table.to_pylist()
    messages = encode_arrow(table, 10)
    assert len(messages) == 3
    back = pa.concat_tables(pa.ipc.open_stream(m).read_all() for m in messages)
    assert back.equals(table)
    assert not math.isnan(back.column("d1").to_numpy()[0])
