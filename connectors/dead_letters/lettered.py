"""Which messages have a dead letter already: read back from the dead-letter topic, so that
each letter is written once however often its message is read again.

A letter's identity is its message's position, (topic, partition, offset), which its
headers carry (letters.py). A writer that starts (a job resubmitted after a kill, a stream
cycle retried after a failure) will read again messages whose letters an earlier writer
wrote; it reads here which of them the topic holds, and skips those (topic.py).

What it has to find: every letter of a source partition at or above the writer's floor,
the offset the writer starts reading that partition from (LetterScope.floors): nothing
below it is read again. It reads each partition of the topic back from its end, a window
at a time (doubling), and stops once, for every source partition it was asked of, it has
seen a letter below the floor, or at the partition's start. That stop is valid where the
letters of one source partition are written in source-offset order (LetterScope.in_order),
so that nothing older than a letter below the floor is at or above it:
- the endless job: each partition is read by one reader, in order, and each poll's letters
  are acknowledged before the next poll is decoded;
- a cycle of the stream: its letters may come in any order, but every one is at or above
  the cycle's start, and a cycle from a later start begins only after a cycle before it
  checkpointed, so no letter below a floor follows one above it.
A joined stream writes an orphan label's letter when its wait ends, after letters of later
messages: it is not in order, and the whole topic is read (once per start).

A record that is not a picasso letter (no position headers, or ones that do not parse) is
someone else's and is passed over. A topic that does not exist yet holds no letter.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from kafka import TopicPartition
from kafka.errors import KafkaError

from picasso.connectors.dead_letters.letters import MessageDeadLetter, letter_position
from picasso.connectors.kafka_config import KafkaConnection, latest_offsets, source_name

FIRST_WINDOW = 1000  # records read back from a partition's end first; each further window doubles
READ_TIMEOUT_S = 30.0  # a read of the topic that makes no progress for this long fails


class LettersUnreadable(ConnectionError):
    """The dead-letter topic could not be read back (its broker gone): a writer that does not
    know what it holds must not write, or it may write a letter twice."""


@dataclass(frozen=True)
class LetterScope:
    """What a writer will letter: each source partition from its floor on."""

    floors: dict[str, int] | None = None  # source ("topic/partition") -> its first offset read; None: all from 0
    in_order: bool = True  # one source partition's letters are written in offset order (module docstring)

    def floor(self, source: str) -> int | None:
        """The floor of a source this writer reads (0 for every source without floors), or None."""
        return 0 if self.floors is None else self.floors.get(source)


@dataclass
class Lettered:
    """The positions at or above the scope's floors that have a letter in the topic."""

    scope: LetterScope
    offsets: dict[str, set[int]] = field(default_factory=dict)  # source -> offsets lettered

    def has(self, letter: MessageDeadLetter) -> bool:
        return letter.offset in self.offsets.get(source_name(letter.topic, letter.partition), ())

    def add(self, letters: Iterable[MessageDeadLetter]) -> None:
        for letter in letters:
            self.offsets.setdefault(source_name(letter.topic, letter.partition), set()).add(letter.offset)

    @property
    def count(self) -> int:
        return sum(len(offsets) for offsets in self.offsets.values())


def read_lettered(connection: KafkaConnection, topic: str, scope: LetterScope,
                  first_window: int = FIRST_WINDOW) -> Lettered:
    """What the topic holds of the scope (see the module docstring); LettersUnreadable if it
    cannot be read."""
    lettered = Lettered(scope)
    try:
        # The writer's own client (topic.py): this reads what it wrote, whichever client the stream reads with.
        consumer = connection.consumer(allow_auto_create_topics=False)
    except KafkaError as error:
        raise LettersUnreadable(f"dead-letter topic '{topic}' could not be read back: {error}") from error
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            return lettered
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        begins, ends = consumer.beginning_offsets(tps), latest_offsets(consumer, tps)
        for tp in tps:
            _read_back(consumer, tp, begins[tp], ends[tp], lettered, first_window)
    except (KafkaError, TimeoutError) as error:
        raise LettersUnreadable(f"dead-letter topic '{topic}' could not be read back: "
                                f"{type(error).__name__}: {error}") from error
    finally:
        consumer.close()
    return lettered


def _read_back(consumer, tp: TopicPartition, begin: int, end: int, lettered: Lettered, first_window: int) -> None:
    """One partition, window by window from its end, until every source asked of has shown a
    letter below its floor (in_order), or to the partition's start."""
    scope = lettered.scope
    waiting = set(scope.floors) if scope.in_order and scope.floors is not None else None
    high, size = end, first_window
    while high > begin:
        low = max(begin, high - size)
        below = _read_window(consumer, tp, low, high, lettered)
        if waiting is not None:
            waiting -= below
            if not waiting:
                return
        high, size = low, size * 2


def _read_window(consumer, tp: TopicPartition, low: int, high: int, lettered: Lettered) -> set[str]:
    """Collect the letters at offsets [low, high) of the partition; the sources that had one
    below their floor."""
    below: set[str] = set()
    consumer.assign([tp])
    consumer.seek(tp, low)
    position, progressed = low, time.monotonic()
    while position < high:
        records = consumer.poll(timeout_ms=500).get(tp, [])
        for record in records:
            if low <= record.offset < high:  # a fetch may start at its batch's first record
                _collect(record, lettered, below)
        now_at = consumer.position(tp)
        if now_at > position:
            position, progressed = now_at, time.monotonic()
        elif time.monotonic() - progressed > READ_TIMEOUT_S:
            raise TimeoutError(f"{tp.topic}/{tp.partition} read no further than offset {position} "
                               f"in {READ_TIMEOUT_S:g} s (reading back to {high})")
    return below


def _collect(record, lettered: Lettered, below: set[str]) -> None:
    position = letter_position(record.headers)
    if position is None:  # not a picasso letter: another writer's record
        return
    topic, partition, offset = position
    source = source_name(topic, partition)
    floor = lettered.scope.floor(source)
    if floor is None:
        return  # a source this writer does not read
    if offset >= floor:
        lettered.offsets.setdefault(source, set()).add(offset)
    else:
        below.add(source)
