"""Record batches read as columns agree with kafka-python's own record-by-record reading,
for keys, null keys and values, empty values, headers, large varints, compression and
broker timestamps; a damaged batch is an error, never wrong records."""

from __future__ import annotations

import numpy as np
import pytest
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from picasso.connectors.kafka_record_batches import RecordBlock, read_batch

GZIP, ZSTD = 1, 4


def build(records, compression=0, base_offset=0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for offset, timestamp, key, value, headers in records:
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=headers)
    buffer = builder.build()
    buffer[0:8] = base_offset.to_bytes(8, "big", signed=True)
    return bytes(buffer)


def kafka_python_reads(batch: bytes) -> RecordBlock:
    return RecordBlock.from_records(list(DefaultRecordBatch(batch)))


def assert_same(block: RecordBlock, expected: RecordBlock):
    assert block.offsets.tolist() == expected.offsets.tolist()
    assert block.timestamps.tolist() == expected.timestamps.tolist()
    assert block.keys == expected.keys
    assert block.values == expected.values


def mixed_records(n: int = 300):
    rng = np.random.default_rng(7)
    records = []
    for i in range(n):
        key = None if i % 3 else b"k%d" % i
        value = None if i % 17 == 5 else b"" if i % 19 == 3 else bytes(rng.integers(0, 256, int(rng.integers(1, 3000))))
        headers = [("h", b"x" * (i % 4)), ("n", None)] if i % 11 == 0 else []
        # Offsets with gaps (a compacted topic) and timestamps out of order.
        records.append((i * 3, 1_700_000_000_000 + int(rng.integers(-10**6, 10**6)), key, value, headers))
    return records


@pytest.mark.parametrize("compression", [0, GZIP, ZSTD], ids=["none", "gzip", "zstd"])
def test_columns_match_kafka_python(compression):
    batch = build(mixed_records(), compression, base_offset=10**12)
    assert_same(read_batch(batch), kafka_python_reads(batch))


def test_log_append_time_batches_take_the_broker_time():
    batch = bytearray(build([(i, 1000 + i, None, b"v", []) for i in range(5)]))
    attributes = int.from_bytes(batch[21:23], "big") | 0x08
    batch[21:23] = attributes.to_bytes(2, "big")
    block = read_batch(bytes(batch))
    assert block.timestamps.tolist() == [1004] * 5  # the batch's max timestamp
    assert_same(block, kafka_python_reads(bytes(batch)))


def test_an_empty_batch_has_no_records():
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, timestamp=1, key=None, value=b"x", headers=[])
    batch = bytearray(builder.build())
    batch[57:61] = (0).to_bytes(4, "big")  # record count 0 ...
    del batch[61:]  # ... and no record bytes (what compaction can leave behind)
    assert len(read_batch(bytes(batch))) == 0


@pytest.mark.parametrize("damage", ["truncated", "length", "trailing"])
def test_a_damaged_batch_is_an_error(damage):
    batch = bytearray(build([(i, 1, None, b"value-%d" % i, []) for i in range(10)]))
    if damage == "truncated":
        del batch[-5:]
    elif damage == "length":
        batch[61] = 0x7E  # the first record claims 63 bytes
    else:
        batch += b"\x00\x00"
    with pytest.raises(CorruptRecordError):
        read_batch(bytes(batch))


def test_between_keeps_an_offset_range():
    block = read_batch(build([(i, 1, None, b"%d" % i, []) for i in range(10)], base_offset=100))
    part = block.between(103, 107)
    assert part.offsets.tolist() == [103, 104, 105, 106]
    assert part.values == [b"3", b"4", b"5", b"6"]
    assert block.between(0, 1000) is block
    joined = RecordBlock.concat([block.between(100, 103), block.between(103, 110)])
    assert_same(joined, block)


def test_a_control_batch_marker_is_read_by_kafka_python():
    # read_committed consumers read the marker of a control batch with next(batch).
    from picasso.connectors.kafka_blocks import _BlockBatch

    batch = bytearray(build([(0, 1, b"\x00\x00\x00\x00", b"", [])]))  # version 0, type 0: abort
    attributes = int.from_bytes(batch[21:23], "big") | 0x20 | 0x10  # control, transactional
    batch[21:23] = attributes.to_bytes(2, "big")
    wrapped = _BlockBatch(DefaultRecordBatch(bytes(batch)))
    assert wrapped.is_control_batch
    assert next(wrapped).abort
