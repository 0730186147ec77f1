"""Each dead letter once (connectors/dead_letters/lettered.py, topic.py): a writer that starts
again reads back from the topic which letters of what it reads are there, and skips them.

Against the real broker (the kafka_bootstrap fixture), with the writer's own producer
(DeadLetterProducer), its topic read back by a consumer of the test's own."""

from __future__ import annotations

from collections import Counter

import pytest
import confluent_kafka
from kafka import KafkaConsumer
from kafka_broker import create_topic
from test_stream_exactly_once import _read_topic

from picasso.connectors.dead_letters.letters import MessageDeadLetter, letter_position
from picasso.connectors.dead_letters.lettered import Lettered, LetterScope, LettersUnreadable, read_lettered
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.dead_letters.topic import DeadLetterProducer, DeadLettersNotWritten
from picasso.connectors.kafka_config import KafkaConnection
from picasso.distributed.transport import free_port  # a port that nothing listens on


def letter(topic: str, partition: int, offset: int) -> MessageDeadLetter:
    return MessageDeadLetter(topic=topic, partition=partition, offset=offset, key=f"k{offset}".encode(),
                             value=f'{{"bad": {offset}'.encode(), timestamp_ms=1_700_000_000_000 + offset,
                             reason="invalid JSON: Expecting ',' delimiter")


def write(bootstrap: str, topic: str, letters: list[MessageDeadLetter], scope: LetterScope = LetterScope(),
          lettered: Lettered | None = None, polls: int = 1) -> DeadLetterProducer:
    """One writer's life: opened, the letters sent and confirmed in `polls` rounds, closed."""
    producer = DeadLetterProducer(KafkaConnection(bootstrap), DeadLetterPolicy(topic=topic), scope, lettered)
    producer.open()
    try:
        size = -(-len(letters) // polls) if letters else 1
        for start in range(0, len(letters), size):
            for one in letters[start:start + size]:
                producer.send(one)
            producer.confirm()
    finally:
        producer.close()
    return producer


def positions_in(bootstrap: str, topic: str) -> Counter:
    """Each letter's (topic, partition, offset) in the topic, and how many times it is there."""
    return Counter(position for r in _read_topic(bootstrap, topic)
                   if (position := letter_position(r.headers)) is not None)


def test_a_writer_started_again_skips_the_letters_the_topic_holds_and_writes_the_rest(kafka_bootstrap, kafka_topic):
    create_topic(kafka_bootstrap, kafka_topic)
    first = [letter("events", 0, offset) for offset in range(0, 40, 2)]
    write(kafka_bootstrap, kafka_topic, first, LetterScope({"events/0": 0}), polls=4)
    # Killed after 0..38 were written and trained to 20 (its position): the next writer
    # reads from 20 on, so 20..38 come again, and 40..58 are new.
    again = [letter("events", 0, offset) for offset in range(20, 60, 2)]
    second = write(kafka_bootstrap, kafka_topic, again, LetterScope({"events/0": 20}), polls=3)
    assert second.skipped == 10
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter({("events", 0, o): 1 for o in range(0, 60, 2)})
    # And one more start, from a position that no letter sits at, with nothing new.
    third = write(kafka_bootstrap, kafka_topic, [letter("events", 0, o) for o in range(32, 60, 2)],
                  LetterScope({"events/0": 31}))
    assert third.skipped == 14 and third.sent == 0
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter({("events", 0, o): 1 for o in range(0, 60, 2)})


def test_letters_of_several_partitions_over_a_topic_of_several_partitions_are_each_written_once(
        kafka_bootstrap, kafka_topic):
    """The letter topic has three partitions (the writer's keys spread the letters over all
    of them), the source two topics of two partitions; the scan reads back in windows of 4,
    so that it must go back window by window to each source's floor, and no further."""
    create_topic(kafka_bootstrap, kafka_topic, 3)
    sources = [("clicks", 0), ("clicks", 1), ("views", 0), ("views", 1)]
    written = [letter(topic, partition, offset) for offset in range(100) for topic, partition in sources]
    write(kafka_bootstrap, kafka_topic, written, LetterScope({f"{t}/{p}": 0 for t, p in sources}), polls=10)
    floors = {"clicks/0": 90, "clicks/1": 10, "views/0": 50, "views/1": 100}
    connection = KafkaConnection(kafka_bootstrap)
    held = read_lettered(connection, kafka_topic, LetterScope(floors), first_window=4)
    assert held.offsets == {source: set(range(floor, 100)) for source, floor in floors.items() if floor < 100}
    again = [letter(t, p, offset) for t, p in sources for offset in range(floors[f"{t}/{p}"], 120)]
    second = write(kafka_bootstrap, kafka_topic, again, LetterScope(floors))
    assert second.skipped == sum(100 - floor for floor in floors.values()) and second.sent == 4 * 20
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter(
        {(t, p, offset): 1 for t, p in sources for offset in range(120)})


def test_an_empty_letter_topic_holds_nothing_and_every_letter_is_written(kafka_bootstrap, kafka_topic):
    create_topic(kafka_bootstrap, kafka_topic, 2)
    assert read_lettered(KafkaConnection(kafka_bootstrap), kafka_topic, LetterScope({"events/0": 0})).count == 0
    write(kafka_bootstrap, kafka_topic, [letter("events", 0, offset) for offset in range(5)],
          LetterScope({"events/0": 0}))
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter({("events", 0, o): 1 for o in range(5)})


def test_a_letter_topic_that_does_not_exist_yet_holds_nothing_and_is_not_made_by_the_look(
        kafka_bootstrap, kafka_topic):
    connection = KafkaConnection(kafka_bootstrap)
    assert read_lettered(connection, kafka_topic, LetterScope({"events/0": 0})).count == 0
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    try:
        assert kafka_topic not in consumer.topics()  # the look made no topic (of the broker's default size)
    finally:
        consumer.close()
    create_topic(kafka_bootstrap, kafka_topic)  # as the runs do before they write (ensure_topic)
    write(kafka_bootstrap, kafka_topic, [letter("events", 0, offset) for offset in range(3)],
          LetterScope({"events/0": 0}))
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter({("events", 0, o): 1 for o in range(3)})


FOREIGN = [
    [],  # no headers at all
    [("picasso.topic", b"events"), ("picasso.partition", b"0")],  # no offset
    [("picasso.topic", b"events"), ("picasso.partition", b"zero"), ("picasso.offset", b"7")],
    [("picasso.topic", b"\xff\xfe"), ("picasso.partition", b"0"), ("picasso.offset", b"7")],  # not UTF-8
    [("picasso.topic", b"events"), ("picasso.partition", b"0"), ("picasso.offset", None)],
    [("trace-id", b"abc")],
]


def test_records_of_another_writer_in_the_letter_topic_are_passed_over(kafka_bootstrap, kafka_topic):
    """Another tool's records, and ones whose position headers do not parse, are not letters:
    the start reads past them, and the letters among them are still each written once."""
    create_topic(kafka_bootstrap, kafka_topic)
    write(kafka_bootstrap, kafka_topic, [letter("events", 0, offset) for offset in range(5)])
    # Another tool's producer, on the other client (confluent-kafka takes a header of no value).
    other = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for i, headers in enumerate(FOREIGN * 3):
        other.produce(kafka_topic, value=b"not a letter" if i % 2 else None, headers=headers)
    assert other.flush(30) == 0
    second = write(kafka_bootstrap, kafka_topic, [letter("events", 0, offset) for offset in range(3, 9)],
                   LetterScope({"events/0": 3}))
    assert second.skipped == 2
    records = _read_topic(kafka_bootstrap, kafka_topic)
    assert len(records) == 9 + 3 * len(FOREIGN)
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter({("events", 0, o): 1 for o in range(9)})


def test_letters_out_of_their_partitions_order_are_read_back_from_the_whole_topic(kafka_bootstrap, kafka_topic):
    """A joined stream letters an orphan label when its wait ends, after letters of later
    labels: with in_order=False the letters of each source are sought over the whole topic,
    not only back to the first one below the floor."""
    create_topic(kafka_bootstrap, kafka_topic)
    scope = LetterScope({"labels/0": 0}, in_order=False)
    write(kafka_bootstrap, kafka_topic, [letter("labels", 0, o) for o in (40, 41, 42, 5, 6, 43)], scope, polls=3)
    unordered = LetterScope({"labels/0": 30}, in_order=False)
    assert read_lettered(KafkaConnection(kafka_bootstrap), kafka_topic, unordered, first_window=1).offsets == \
        {"labels/0": {40, 41, 42, 43}}
    # In order it would have stopped at 6 and 5, below the floor: that is why a joined run says so.
    ordered = LetterScope({"labels/0": 30})
    assert read_lettered(KafkaConnection(kafka_bootstrap), kafka_topic, ordered, first_window=1).offsets == \
        {"labels/0": {43}}
    second = write(kafka_bootstrap, kafka_topic, [letter("labels", 0, o) for o in (40, 41, 42, 43, 44)], unordered)
    assert second.skipped == 4
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter(
        {("labels", 0, o): 1 for o in (5, 6, 40, 41, 42, 43, 44)})


def test_what_a_writer_had_acknowledged_it_does_not_send_again(kafka_bootstrap, kafka_topic):
    """A bundle retried in the same writer (a runner retries a bundle that failed after its
    letters were acknowledged): the letters it had confirmed are skipped, without a look."""
    create_topic(kafka_bootstrap, kafka_topic)
    producer = DeadLetterProducer(KafkaConnection(kafka_bootstrap), DeadLetterPolicy(topic=kafka_topic),
                                  LetterScope({"events/0": 0}), Lettered(LetterScope({"events/0": 0})))
    producer.open()
    try:
        for _ in range(2):
            for offset in range(4):
                producer.send(letter("events", 0, offset))
            producer.confirm()
    finally:
        producer.close()
    assert producer.skipped == 4
    assert positions_in(kafka_bootstrap, kafka_topic) == Counter({("events", 0, o): 1 for o in range(4)})


@pytest.mark.parametrize("given", [None, "nothing"])
def test_a_writer_told_the_topic_holds_nothing_does_not_look(kafka_bootstrap, kafka_topic, given):
    """A stream whose last cycle checkpointed knows the topic holds none of the next cycle's
    letters, and says so (Lettered of nothing): the writer then sends without reading the
    topic back; told nothing (None), it looks, and skips what is there."""
    create_topic(kafka_bootstrap, kafka_topic)
    scope = LetterScope({"events/0": 0})
    write(kafka_bootstrap, kafka_topic, [letter("events", 0, 0)], scope)
    second = write(kafka_bootstrap, kafka_topic, [letter("events", 0, 0)], scope,
                   Lettered(scope) if given == "nothing" else None)
    assert second.skipped == (0 if given == "nothing" else 1)
    assert positions_in(kafka_bootstrap, kafka_topic)[("events", 0, 0)] == (2 if given == "nothing" else 1)


def test_a_writer_whose_broker_is_gone_writes_nothing_and_says_the_topic_could_not_be_read(tmp_path):
    """With no broker to read the topic back from, a writer cannot know what it holds: it
    sends nothing (it might letter twice) and fails the bundle as a letter not written."""
    connection = KafkaConnection(f"127.0.0.1:{free_port()}", {"bootstrap_timeout_ms": 2000})
    with pytest.raises(LettersUnreadable, match="could not be read back"):
        read_lettered(connection, "letters", LetterScope({"events/0": 0}))
    producer = DeadLetterProducer(connection, DeadLetterPolicy(topic="letters"), LetterScope({"events/0": 0}))
    with pytest.raises(DeadLettersNotWritten, match="'letters' could not be read back"):
        producer.send(letter("events", 0, 1))
    assert producer.sent == 0
