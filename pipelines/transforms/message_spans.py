"""What a Kafka chunk carries that a day-file chunk does not: its MessageSpan.

A span says which partition, which position range [start, next_position), how many
messages and records a chunk or batch covers. The stream's ledger checks the spans
against the checkpoint, which is how a run proves that no message was trained twice or
skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from picasso.batch import PackedBatch
from picasso.connectors.element_coder import register_sized_coder
from picasso.connectors.kafka_source import Messages


@dataclass(frozen=True)
class MessageSpan:
    source: str  # topic/partition
    start: int
    next_position: int
    messages: int
    records_in: int
    records_refused: int
    newest_timestamp_ms: int | None  # of the newest message in the span
    offset_sum: int = 0  # sum of the span's message offsets: which messages, in one number

    @classmethod
    def of_poll(cls, messages: Messages, records_in: int, records_refused: int) -> MessageSpan:
        return cls(
            source=messages.source, start=messages.start, next_position=messages.next_position,
            messages=len(messages), records_in=records_in, records_refused=records_refused,
            newest_timestamp_ms=max(messages.timestamps) if messages.timestamps else None,
            offset_sum=sum(messages.offsets),
        )


@register_sized_coder
@dataclass(frozen=True)
class DecodedMessageChunk:
    table: pa.Table  # canonical rows
    span: MessageSpan

    @property
    def nbytes(self) -> int:
        return self.table.nbytes


@register_sized_coder
@dataclass(frozen=True)
class PackedMessages:
    batch: PackedBatch
    span: MessageSpan

    @property
    def nbytes(self) -> int:
        return self.batch.data.nbytes
