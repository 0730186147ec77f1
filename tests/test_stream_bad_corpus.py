"""Every kind of bad message among valid events, through one `picasso stream
--until-caught-up` process: it exits 0, the dead-letter topic holds exactly the bad
messages the broker accepted, each with its reason, and exactly the valid events train.

The JSON topic holds every bad JSON kind the decoders know, the reported poll-poisoning
ones included (a float id, an id over int64, a `null` message that crashed pyarrow's
reader), messages of 2 MiB and 12 MiB (too large for the dead-letter producer: written
cut, as `oversize`), and valid messages that look odd (a uint64 id, non-ASCII ids, a
date-like string id). The Arrow topic holds IPC streams read short and schemas that
conflict.
"""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka_broker import create_topic
from stream_helpers import arrow_messages, json_messages, run_stream_process, stream_command, write_spec

from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.connectors.decoding.message_formats import encode_arrow

MIB = 1 << 20


def _good(i: int) -> dict:
    return json.loads(json_messages(1, stream=100 + i)[0])


def _with(i: int, **fields) -> bytes:
    return json.dumps({**_good(i), **fields}).encode()


BAD_JSON = {
    "invalid JSON": b"{not json",
    "not an object": b"[1, 2]",
    "null": b"null",
    "blank": b"   ",
    "not UTF-8": b'{"label": 0, "h": "\xff\xfe"}',
    "duplicate key": b'{"label": 0, "h": "a", "h": "b"}',
    "-NaN": b'{"label": 0, "extra": -NaN}',
    "float id": _with(1, h=2.0),
    "id over uint64": _with(2, h=2**64),
    "negative id": _with(3, h=-5),
    "lone surrogate id": b'{"label": 0, "h": "\\ud800"}',
    "bool label": _with(4, label=True),
    "bool dense": _with(5, d1=False),
    "string dense": _with(6, d1="old"),
    "NaN label": b'{"label": NaN}',
    "label out of range": _with(7, label=2),
    "missing label": json.dumps({"d1": 1.0}).encode(),
    "dict id": _with(8, h={"a": 1}),
    "bag over max_len": _with(9, bag=["a", "b", "c", "d"]),
    "deep nesting": b'{"label": 0, "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "2 MiB": _with(10, d1="x" * (2 * MIB)),
    "12 MiB": _with(11, d1="x" * (12 * MIB)),
}
ODD_BUT_VALID = [_with(12, h=2**64 - 1), _with(13, h="日本"), _with(14, h="2026-11-01"), _with(15, bag=["é", "ü"])]


def _ipc(table: pa.Table) -> bytes:
    return encode_arrow(table, table.num_rows)[0]


def _bad_arrow() -> dict[str, bytes]:
    good = arrow_messages(10, 10, stream=20)[0]
    return {
        "no end marker": good[:-8],
        "cut short": good[: len(good) // 2],
        "bytes after the end": good + b"\x00" * 8,
        "float ids": _ipc(pa.table({"label": pa.array([0.0, 1.0]), "h": pa.array([1.5, 2.5])})),
        "not IPC": b"\x00garbage",
    }


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=16 * MIB)
    try:
        for value in values:
            producer.send(topic, value=value, partition=0)
        producer.flush()
    finally:
        producer.close()


def _read_all(bootstrap: str, topic: str) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000,
                             max_partition_fetch_bytes=16 * MIB, fetch_max_bytes=64 * MIB)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        return list(consumer)
    finally:
        consumer.close()


def test_one_stream_run_through_every_bad_kind(kafka_bootstrap, kafka_topic, tmp_path):
    events, batches, dead = kafka_topic, f"{kafka_topic}-arrow", f"{kafka_topic}.dead"
    good = json_messages(300, stream=21)
    # Bad messages spread among the good ones, each in its own place of some poll.
    json_values = list(good)
    for k, value in enumerate(BAD_JSON.values()):
        json_values.insert(13 * k + 5, value)
    json_values[40:40] = ODD_BUT_VALID
    bad_offsets = {json_values.index(BAD_JSON[kind]): kind for kind in BAD_JSON}
    arrow_good = arrow_messages(200, 20, stream=22)
    arrow_values = list(arrow_good)
    for k, value in enumerate(_bad_arrow().values()):
        arrow_values.insert(2 * k + 1, value)
    arrow_bad = {i for i, value in enumerate(arrow_values) if value not in arrow_good}
    for topic, values in ((events, json_values), (batches, arrow_values)):
        create_topic(kafka_bootstrap, topic, 1)
        _produce(kafka_bootstrap, topic, values)
    assert len(_read_all(kafka_bootstrap, events)) == len(json_values)  # the broker took every message

    workdir = tmp_path / "work"
    log = tmp_path / "stream.log"
    command = stream_command(write_spec(tmp_path), kafka_bootstrap, f"{events}:json", workdir, "--topic",
                             f"{batches}:arrow", "--dead-letter-topic", dead, "--until-caught-up", "--publish-every",
                             "0", "--batch-messages", "50", "--json")
    done = run_stream_process(command, log, timeout=600)
    assert done.returncode == 0, log.read_text()[-3000:]
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["failures"] == 0 and summary["stopped"] is None and summary["lag"] == 0

    letters = [MessageDeadLetter.from_record(record) for record in _read_all(kafka_bootstrap, dead)]
    by_place = {(letter.topic, letter.offset): letter for letter in letters}
    assert len(by_place) == len(letters)  # one run, no retries: each once
    assert set(by_place) == {(events, o) for o in bad_offsets} | {(batches, o) for o in arrow_bad}
    for (topic, offset), letter in by_place.items():
        original = (json_values if topic == events else arrow_values)[offset]
        assert letter.reason and letter.partition == 0, (offset, letter.reason)
        if len(original) > MIB:  # too large for the dead-letter producer: cut, with its size and hash
            assert letter.is_cut and letter.original_value.size == len(original)
            assert letter.original_value.sha256 == hashlib.sha256(original).hexdigest()
            assert letter.value == original[: len(letter.value)] and "'d1'" in letter.original_reason
        else:
            assert letter.value == original, (offset, bad_offsets.get(offset))

    # What trained: every valid JSON event and every valid Arrow row, counted by the ledger.
    assert summary["messages"] == len(json_values) + len(arrow_values)
    assert summary["dead_letters"] == len(bad_offsets) + sum(letter.records for letter in letters if letter.topic == batches)
    assert summary["samples"] == len(good) + len(ODD_BUT_VALID) + 200
    ledger = summary["ledger"]["partitions"]
    assert ledger[f"{events}/0"]["samples"] == len(good) + len(ODD_BUT_VALID)
    assert ledger[f"{batches}/0"]["samples"] == 200
