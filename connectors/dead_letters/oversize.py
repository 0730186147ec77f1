"""Dead letters too large for Kafka: how big a record is, and how a big one is cut down.

A refused message can be far larger than the producer may send: the consumer fetches up to
16 MiB a partition (kafka_source.FETCH_SETTINGS), the producer sends 1 MiB at most
(kafka-python's `max_request_size`), and a broker has a limit of its own. Sending such a
letter whole would fail the cycle on the same offsets for ever, so it is cut instead:

- the reason becomes `oversize: <why> (original reason: <reason>)`, e.g.
  `oversize: 12583500 bytes > max_request_size 1048576 (original reason: invalid JSON ...)`;
  a reason that starts with `oversize: ` is the one test a replayer needs;
- the value becomes its first KEPT_PREFIX_BYTES bytes (1 KiB), raw, so a reader still sees
  what kind of message it was;
- header `picasso.original_size`: the original value's length in bytes, as ASCII decimal;
- header `picasso.original_sha256`: the SHA-256 of the original value, as 64 lowercase hex
  digits, so a copy of the message found elsewhere (the source topic, a backup) can be
  matched to this letter;
- a key over KEPT_PREFIX_BYTES is cut the same way, with `picasso.original_key_size` and
  `picasso.original_key_sha256`; a shorter key is kept whole and gets no key headers.

The topic, partition, offset and records headers are kept as they are. The whole message is
replayed from the source topic at that (topic, partition, offset), while the source still
retains it, and checked against the size and SHA-256.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

KEPT_PREFIX_BYTES = 1024

# What a record costs in a produce request beyond its key, value and header bytes: the
# record batch header (61 bytes) and the varints of lengths, deltas and header counts (under
# 150 bytes for a dead letter's headers). The margin is far above that, so a letter that
# passes this check is never refused by kafka-python's own, exact, check in send().
RECORD_OVERHEAD_BYTES = 512

OVERSIZE = "oversize"
_ORIGINAL_REASON = " (original reason: "

VALUE_HEADERS = ("picasso.original_size", "picasso.original_sha256")
KEY_HEADERS = ("picasso.original_key_size", "picasso.original_key_sha256")


@dataclass(frozen=True)
class Digest:
    """What is left of a payload that was cut: its size and its SHA-256."""

    size: int
    sha256: str  # lowercase hex

    @classmethod
    def of(cls, payload: bytes) -> "Digest":
        return cls(size=len(payload), sha256=hashlib.sha256(payload).hexdigest())

    def matches(self, payload: bytes) -> bool:
        return self == Digest.of(payload)

    def headers(self, names: tuple[str, str]) -> list[tuple[str, bytes]]:
        size_name, sha256_name = names
        return [(size_name, str(self.size).encode()), (sha256_name, self.sha256.encode())]

    @classmethod
    def from_headers(cls, headers: dict[str, str], names: tuple[str, str]) -> "Digest | None":
        size_name, sha256_name = names
        if size_name not in headers:
            return None
        return cls(size=int(headers[size_name]), sha256=headers[sha256_name])


def record_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    """An upper bound on the bytes one record takes in a produce request."""
    payload = len(key or b"") + len(value or b"")
    header_bytes = sum(len(name.encode()) + len(data) for name, data in headers)
    return payload + header_bytes + RECORD_OVERHEAD_BYTES


def cut(payload: bytes | None, always_digest: bool) -> tuple[bytes | None, Digest | None]:
    """The payload's first KEPT_PREFIX_BYTES, and the digest of the whole; a payload that
    fits is kept whole, with a digest only if always_digest."""
    if payload is None:
        return None, None
    if len(payload) <= KEPT_PREFIX_BYTES and not always_digest:
        return payload, None
    return payload[:KEPT_PREFIX_BYTES], Digest.of(payload)


def oversize_reason(why: str, original_reason: str) -> str:
    """e.g. 'oversize: 12583500 bytes > max_request_size 1048576 (original reason: ...)'."""
    return f"{OVERSIZE}: {why}{_ORIGINAL_REASON}{original_reason})"


def original_reason(reason: str) -> str:
    """The reason the message was refused, with the oversize note taken off if there is one.
    The reason header is capped, so the closing parenthesis may have been cut off."""
    if not reason.startswith(f"{OVERSIZE}: ") or _ORIGINAL_REASON not in reason:
        return reason
    inner = reason.split(_ORIGINAL_REASON, 1)[1]
    return inner[:-1] if inner.endswith(")") else inner
