"""Polls that hand over whole record batches: kafka-python's fetcher, read in blocks.

kafka-python builds a ConsumerRecord per message, field by field: about half of the
~5 µs a bare consumer loop takes per message here. `use_blocks(consumer)` keeps
everything kafka-python does per fetch and per batch (connections, retries, positions, high watermarks, the CRC check,
control batches, aborted transactions) and replaces only its loop over the records of a
batch: each batch comes out of `poll` as ONE ConsumerRecord whose value is a RecordBlock
of all its records (see connectors.record_batches), and whose offset is the batch's last
record's, so that the fetcher's own position bookkeeping stays right.

This reaches into kafka-python's privates: `KafkaConsumer._fetcher` with its nested
PartitionRecords class, a batch's `_buffer` (without which the batch's own records are
read) and its codec check `_assert_has_codec`. So it is only switched on for the
kafka-python major version it was written against, and when the consumer hands values
over undeserialized.
Otherwise `use_blocks` says no and the caller reads ConsumerRecords as usual
(`blocks_of` turns either kind of poll result into RecordBlocks).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import kafka

from picasso.connectors.kafka_record_batches import RecordBlock, read_batch

log = logging.getLogger(__name__)

SUPPORTED_MAJOR = 3


def use_blocks(consumer) -> bool:
    """Make this consumer's polls return one record per batch (value: a RecordBlock);
    False (and nothing changed) when that cannot be done safely."""
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(fetcher, "PartitionRecords", None)
    config = getattr(consumer, "config", {})
    if (int(kafka.__version__.split(".")[0]) != SUPPORTED_MAJOR or base is None
            or config.get("key_deserializer") or config.get("value_deserializer")):
        log.info("kafka-python %s: reading records one by one", kafka.__version__)
        return False
    fetcher.PartitionRecords = _block_partition_records(base)
    return True


def blocks_of(records: Sequence) -> RecordBlock:
    """One RecordBlock from a poll's records for one partition, whichever kind they are."""
    if records and isinstance(records[0].value, RecordBlock):
        return RecordBlock.concat([r.value for r in records])
    return RecordBlock.from_records(records)


_CLASSES: dict[type, type] = {}


def _block_partition_records(base: type) -> type:
    if base not in _CLASSES:
        class BlockPartitionRecords(base):
            def __init__(self, fetch_offset, tp, records, *args, **kwargs):
                super().__init__(fetch_offset, tp, _BlockRecords(records), *args, **kwargs)

        _CLASSES[base] = BlockPartitionRecords
    return _CLASSES[base]


class _BlockRecords:
    """The fetch's MemoryRecords, each batch wrapped in a _BlockBatch."""

    def __init__(self, records):
        self._records = records

    def next_batch(self):
        batch = self._records.next_batch()
        return None if batch is None else _BlockBatch(batch)

    def __getattr__(self, name):
        return getattr(self._records, name)


class _BlockBatch:
    """A kafka-python record batch whose iteration yields one _BatchRecord."""

    def __init__(self, batch):
        self._batch = batch

    def __getattr__(self, name):  # magic, is_control_batch, validate_crc, base_offset, ...
        return getattr(self._batch, name)

    def __next__(self):
        # The fetcher reads a control batch's marker with next(batch) (read_committed
        # consumers): that record is kafka-python's to read, as it always was.
        return next(self._batch)

    def __iter__(self):
        batch = self._batch
        raw = getattr(batch, "_buffer", None)
        if batch.magic == 2 and raw is not None:
            # read_batch decompresses with kafka.codec directly, which fails without a
            # codec's package in ways that do not name it (a call of None, for lz4); run
            # the check kafka-python makes before it decompresses a batch itself, so that
            # both read paths raise its UnsupportedCodecError.
            if batch.compression_type:
                batch._assert_has_codec(batch.compression_type)
            block = read_batch(raw)
        else:  # an old message format (or a kafka-python without the buffer): its own records
            block = RecordBlock.from_records(list(batch))
        if len(block):
            yield _BatchRecord(block, batch.timestamp_type, batch.size_in_bytes)


class _BatchRecord:
    """What the fetcher reads of a record, for a whole batch."""

    __slots__ = ("value", "offset", "timestamp", "timestamp_type", "size_in_bytes")
    key = None
    headers = ()
    checksum = None

    def __init__(self, block: RecordBlock, timestamp_type: int, size_in_bytes: int):
        self.value = block
        self.offset = int(block.offsets[-1])  # the fetcher's next position is this + 1
        self.timestamp = int(block.timestamps[-1])
        self.timestamp_type = timestamp_type
        self.size_in_bytes = size_in_bytes

    def validate_crc(self) -> bool:
        return True  # v2 batches carry one CRC for the batch, checked before iteration
