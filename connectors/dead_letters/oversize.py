"""Dead letters too large for Kafka: how big a record is, and how a big one is cut down.

A refused message can be far larger than the producer may send: the consumer fetches up to
16 MiB a partition (kafka_source.FETCH_SETTINGS), the producer sends 1 MiB at most
(kafka-python's `max_request_size`), and a broker has a limit of its own. Sending such a
letter whole would fail the cycle on the same offsets for ever, so by default it is cut
instead (the policy's `too_large`, policy.py):

- the reason becomes `oversize: <why> (original reason: <reason>)`, e.g.
  `oversize: 12583500 bytes > max_request_size 1048576 (original reason: invalid JSON ...)`;
  a reason that starts with `oversize: ` is the one test a replayer needs;
- the value becomes its first bytes (the policy's `kept_prefix_bytes`, 1 KiB by default),
  raw, so a reader still sees what kind of message it was;
- header `picasso.original_size`: the original value's length in bytes, as ASCII decimal;
- header `picasso.original_sha256`: the SHA-256 of the original value, as 64 lowercase hex
  digits, so a copy of the message found elsewhere (the source topic, a backup) can be
  matched to this letter;
- a key longer than that is cut the same way, with `picasso.original_key_size` and
  `picasso.original_key_sha256`; a shorter key is kept whole and gets no key headers.

The topic, partition, offset and records headers are kept as they are. The whole message is
replayed from the source topic at that (topic, partition, offset), while the source still
retains it, and checked against the size and SHA-256. The reason's note and the headers are
the letter's own, read back by MessageDeadLetter (letters.py); this module measures a letter
and cuts it.
"""

from __future__ import annotations

from dataclasses import replace

from picasso.connectors.dead_letters.letters import Digest, MessageDeadLetter, oversize_reason

# What a record costs in a produce request beyond its key, value and header bytes: the
# record batch header (61 bytes) and the varints of lengths, deltas and header counts (under
# 150 bytes for a dead letter's headers). The margin is far above that, so a letter that
# passes this check is never refused by kafka-python's own, exact, check in send().
RECORD_OVERHEAD_BYTES = 512


def record_size(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> int:
    """An upper bound on the bytes one record takes in a produce request."""
    payload = len(key or b"") + len(value or b"")
    header_bytes = sum(len(name.encode()) + len(data) for name, data in headers)
    return payload + header_bytes + RECORD_OVERHEAD_BYTES


def _cut(payload: bytes | None, keep: int, always_digest: bool) -> tuple[bytes | None, Digest | None]:
    """The payload's first `keep` bytes, and the digest of the whole; a payload that fits
    is kept whole, with a digest only if always_digest."""
    if payload is None:
        return None, None
    if len(payload) <= keep and not always_digest:
        return payload, None
    return payload[:keep], Digest.of(payload)


def letter_size(letter: MessageDeadLetter, max_reason_bytes: int) -> int:
    """An upper bound on the bytes the letter takes in a produce request."""
    return record_size(letter.key, letter.value, letter.headers(max_reason_bytes))


def cut_letter(letter: MessageDeadLetter, why: str, keep: int) -> MessageDeadLetter:
    """The letter with its value (and a key longer than `keep`) cut to their first `keep`
    bytes, their digests, and why in its reason."""
    key, original_key = _cut(letter.key, keep, always_digest=False)
    value, original_value = _cut(letter.value, keep, always_digest=True)
    return replace(letter, key=key, value=value, original_key=original_key, original_value=original_value,
                   reason=oversize_reason(why, letter.reason))
