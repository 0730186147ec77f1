"""Kafka record batches (message format v2) read into columns, all records at once.

kafka-python turns every record of a fetch into Python objects field by field (a varint
decoder call per field, a DefaultRecord, a ConsumerRecord): about 2.5 µs per message on
these machines, more than picasso's validation and packing of a JSON event together (its
transport, the rest of the ~5 µs a bare consumer loop takes, is not changed here). A
RecordBlock holds one batch's records as columns instead (about 0.4 µs a record): the only
per-record Python work left is finding where each record starts (its length prefix) and
slicing out its key and value; every other field is decoded with vectorised numpy.

The layout is Kafka's (KIP-98), the same on every broker since 0.11:

    batch  := baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8 (2),
              crc uint32, attributes int16, lastOffsetDelta int32, baseTimestamp int64,
              maxTimestamp int64, producerId int64, producerEpoch int16, baseSequence int32,
              recordCount int32, records (compressed as a whole per attributes & 7)
    record := length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
              keyLength varint, key, valueLength varint, value, headerCount varint, headers

Varints are zig-zag encoded. A length of -1 is a null key or value. Headers are not read
(picasso does not use them) but must lie inside their record.

Checks that kafka-python makes stay where they are: the CRC and the control/aborted batch
logic run in its fetcher (see connectors.kafka_blocks) before a batch reaches us.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from kafka import codec
from kafka.errors import CorruptRecordError, UnsupportedCodecError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_APPEND_TIME = 0x08
_DECOMPRESS = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode, 4: codec.zstd_decode}


@dataclass(frozen=True)
class RecordBlock:
    """Consecutive records of one partition, as columns."""

    offsets: np.ndarray  # int64, increasing
    timestamps: np.ndarray  # int64, ms
    keys: list  # bytes or None
    values: list  # bytes or None

    def __len__(self) -> int:
        return len(self.offsets)

    def between(self, first: int, stop: int) -> RecordBlock:
        """The records with first <= offset < stop (a fetch can start before the position
        asked for: the broker answers with whole batches)."""
        lo, hi = np.searchsorted(self.offsets, [first, stop])
        if lo == 0 and hi == len(self.offsets):
            return self
        return RecordBlock(self.offsets[lo:hi], self.timestamps[lo:hi], self.keys[lo:hi], self.values[lo:hi])

    @staticmethod
    def concat(blocks: Sequence[RecordBlock]) -> RecordBlock:
        if len(blocks) == 1:
            return blocks[0]
        return RecordBlock(
            np.concatenate([b.offsets for b in blocks]) if blocks else np.zeros(0, np.int64),
            np.concatenate([b.timestamps for b in blocks]) if blocks else np.zeros(0, np.int64),
            [key for b in blocks for key in b.keys],
            [value for b in blocks for value in b.values],
        )

    @staticmethod
    def from_records(records: Sequence) -> RecordBlock:
        """From objects with offset, timestamp, key and value (kafka-python's own records)."""
        return RecordBlock(
            np.fromiter((r.offset for r in records), np.int64, len(records)),
            np.fromiter((r.timestamp for r in records), np.int64, len(records)),
            [r.key for r in records],
            [r.value for r in records],
        )


def read_batch(batch: bytes | bytearray | memoryview) -> RecordBlock:
    """Every record of one v2 record batch (header included), CRC already checked."""
    (base_offset, _length, _epoch, magic, _crc, attributes, _last_delta, base_timestamp, max_timestamp,
     _producer, _producer_epoch, _sequence, count) = HEADER.unpack_from(batch)
    if magic != 2:
        raise ValueError(f"record batch of magic {magic}: only v2 batches are read as columns")
    records = memoryview(batch)[HEADER_SIZE:]
    compression = attributes & 0x07
    if compression:
        if compression not in _DECOMPRESS:
            raise UnsupportedCodecError(f"unknown compression type {compression}")
        records = _DECOMPRESS[compression](bytes(records))
    block = _read_records(bytes(records), count, base_offset, base_timestamp)
    if attributes & LOG_APPEND_TIME:  # the broker's time for every record
        block.timestamps[:] = max_timestamp
    return block


def _read_records(data: bytes, count: int, base_offset: int, base_timestamp: int) -> RecordBlock:
    if count == 0:
        return RecordBlock(np.zeros(0, np.int64), np.zeros(0, np.int64), [], [])
    bodies, ends = _record_bounds(data, count)
    buf = np.frombuffer(data, dtype=np.uint8)
    pos = bodies + 1  # past the record's attributes (int8, unused by Kafka so far)
    timestamp_delta, pos = _varints(buf, pos)
    offset_delta, pos = _varints(buf, pos)
    key_length, pos = _varints(buf, pos)
    key_start = pos
    pos = pos + np.maximum(key_length, 0)
    value_length, pos = _varints(buf, pos)
    value_start = pos
    pos = pos + np.maximum(value_length, 0)
    header_count, pos = _varints(buf, pos)
    if (pos > ends).any() or (key_length < -1).any() or (value_length < -1).any() or (header_count < 0).any():
        raise CorruptRecordError("record fields run past their record's length")
    if ((header_count == 0) & (pos != ends)).any():
        raise CorruptRecordError("record length does not match its fields")
    return RecordBlock(
        offsets=base_offset + offset_delta,
        timestamps=base_timestamp + timestamp_delta,
        keys=_slices(data, key_start, key_length),
        values=_slices(data, value_start, value_length),
    )


def _record_bounds(data: bytes, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each record's body starts and ends. Each start depends on the previous
    record's length, so this walk is sequential: the one Python loop per record, kept to
    a varint of one or two bytes in the common case and checked once at the end."""
    bodies: list[int] = []
    lengths: list[int] = []
    add_body, add_length = bodies.append, lengths.append
    pos = 0
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                raw = b
                pos += 1
            else:
                b1 = data[pos + 1]
                if b1 < 0x80:
                    raw = (b & 0x7F) | (b1 << 7)
                    pos += 2
                else:
                    raw, pos = _varint_at(data, pos)
            length = (raw >> 1) ^ -(raw & 1)
            add_body(pos)
            add_length(length)
            pos += length
    except IndexError:
        raise CorruptRecordError(f"record batch ends inside record {len(bodies)} of {count}") from None
    starts = np.array(bodies, dtype=np.int64)
    sizes = np.array(lengths, dtype=np.int64)
    if (sizes < 0).any() or (starts < 0).any():
        raise CorruptRecordError("a record has a negative length")
    if pos != len(data):
        raise CorruptRecordError(f"records of the batch end at byte {pos} of {len(data)}")
    return starts, starts + sizes


def _varint_at(data: bytes, pos: int) -> tuple[int, int]:
    """The raw (still zig-zagged) unsigned varint at pos, and the position after it."""
    raw = shift = 0
    while True:
        b = data[pos]
        raw |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return raw, pos
        shift += 7
        if shift >= 64:
            raise CorruptRecordError("varint longer than 64 bits")


def _varints(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zig-zag varints starting at each position, and the positions after them.

    One vectorised pass per byte of the longest varint, each over the varints still
    going. Reads are clipped to the buffer: a varint cut off by its end shows up as a
    position past its record, which the caller refuses."""
    last = len(buf) - 1
    byte = buf[np.minimum(pos, last)]
    raw = (byte & 0x7F).astype(np.uint64)
    going = np.flatnonzero(byte >= 0x80)
    size = np.ones(len(pos), dtype=np.int64)
    shift = np.uint64(7)
    while len(going):
        if shift >= 70:
            raise CorruptRecordError("varint longer than 10 bytes")
        byte = buf[np.minimum(pos[going] + size[going], last)]
        raw[going] |= (byte & 0x7F).astype(np.uint64) << shift
        size[going] += 1
        going = going[byte >= 0x80]
        shift += np.uint64(7)
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    return values, pos + size


def _slices(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> list:
    """data[start:start+length] for each, None where the length is -1 (a null)."""
    if (lengths == -1).all():  # keys, usually
        return [None] * len(lengths)
    if not (lengths >= 0).all():
        return [None if n < 0 else data[s:s + n] for s, n in zip(starts.tolist(), lengths.tolist())]
    if not lengths.any():
        return [b""] * len(lengths)
    return [data[s:e] for s, e in zip(starts.tolist(), (starts + lengths).tolist())]
