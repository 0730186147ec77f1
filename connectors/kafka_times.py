"""Where a partition's messages reach a time: Kafka's offsets-for-times, checked against
the records.

offsets_at_time gives, for each partition, the first offset whose message is stamped at
or after a time, which is what a stream started `--start-at TIMESTAMP` (or after a model's
newest event) reads from. The broker's answer (its time index: right even when the
producers' timestamps are out of order) is taken when the records agree with it: the
message at the answer is stamped at or after the time, and the one before it before. Some
brokers answer wrong (Tansu says offset 0 for every time): the answer is then searched
for by fetching single positions, halving the range each time, which assumes the
partition's timestamps never go back (true of log-append time and of one producer
stamping in order), with one warning that says so.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kafka import TopicPartition

from picasso.connectors.kafka_clients import PartitionReader

log = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 30.0  # for the first record at or after a position: a bound for a broker that hangs


@dataclass(frozen=True)
class Stamped:
    offset: int
    timestamp_ms: int


def offsets_at_time(reader: PartitionReader, partitions: list[TopicPartition], timestamp_ms: int,
                    beginnings: dict[TopicPartition, int], ends: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Each partition's first offset stamped at or after timestamp_ms, within
    [beginning, end]; the end offset where no message is stamped that late yet."""
    told = reader.offsets_for_times(partitions, timestamp_ms)
    found = {}
    for tp in partitions:
        begin, end = beginnings[tp], ends[tp]
        answer = told.get(tp)
        answer = end if answer is None else min(max(answer, begin), end)
        if not _agrees(reader, tp, answer, timestamp_ms, begin, end):
            log.warning("%s/%d: the broker's offset for time %d ms (%s) does not match its records; searching "
                        "the partition instead, which assumes its timestamps never go back",
                        tp.topic, tp.partition, timestamp_ms, told.get(tp))
            answer = _search(reader, tp, timestamp_ms, begin, end)
        found[tp] = answer
    return found


def _agrees(reader: PartitionReader, tp: TopicPartition, answer: int, timestamp_ms: int, begin: int, end: int) -> bool:
    if answer < end:
        at = first_record_at(reader, tp, answer, end)
        if at is None or at.timestamp_ms < timestamp_ms:
            return False
    if answer > begin:
        before = last_record_before(reader, tp, answer, begin)
        if before is not None and before.timestamp_ms >= timestamp_ms:
            return False
    return True


def _search(reader: PartitionReader, tp: TopicPartition, timestamp_ms: int, begin: int, end: int) -> int:
    """The smallest position from which the first record read is stamped at or after the
    time (end: none is), by halving [begin, end)."""
    low, high = begin, end
    while low < high:
        middle = (low + high) // 2
        at = first_record_at(reader, tp, middle, high)
        if at is None or at.timestamp_ms >= timestamp_ms:
            high = middle
        else:
            low = at.offset + 1
    return low


def first_record_at(reader: PartitionReader, tp: TopicPartition, position: int, end: int) -> Stamped | None:
    """The first record at or after position and before end; None when there is none (the
    offsets between hold no message: a transaction's markers, compacted records)."""
    reader.assign(tp, position)
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    while True:
        polled = reader.poll(tp, 1, 0.5)
        block = polled.block.between(position, end)
        if len(block):
            return Stamped(int(block.offsets[0]), int(block.timestamps[0]))
        if polled.position >= end:
            return None
        if time.monotonic() > deadline:
            raise TimeoutError(f"{tp.topic}/{tp.partition}: no record at or after offset {position} came "
                               f"within {FETCH_TIMEOUT_S:g} s, though the partition ends at {end}")


def last_record_before(reader: PartitionReader, tp: TopicPartition, position: int, begin: int) -> Stamped | None:
    """The last record before position and at or after begin, looked for in windows that
    double back from position; None when there is none."""
    width = 1
    while True:
        start = max(begin, position - width)
        last = None
        at = first_record_at(reader, tp, start, position)
        while at is not None:  # read the window to its last record
            last = at
            at = first_record_at(reader, tp, at.offset + 1, position) if at.offset + 1 < position else None
        if last is not None or start == begin:
            return last
        width *= 2
