"""Dead letters: a bad record, where it came from, and why it was refused.

Bad input never crashes a run and is never dropped silently: every refused record leaves
as a letter, and the policy (policy.py) says what happens to it. Two kinds of letter:
- DeadLetter: a record of a day file (or a row a decoder refused), written to files
  (files.py);
- MessageDeadLetter: a Kafka message, its bytes as they arrived, written to the
  dead-letter topic (topic.py), and read back from it. One too large for Kafka is cut
  down (oversize.py): it then carries the Digest of what was cut, and says so in its
  reason.

A served model returns DeadLetters for the rows it refuses, and ships this module: it
imports nothing but the standard library (tests/test_served_code.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DeadLetter:
    source: str  # a file path, or topic/partition
    position: int  # row in the file, or offset in the partition
    payload: str  # the record as it arrived (a JSON line, a TSV line, or a row as JSON)
    reason: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DeadLetter":
        return cls(**json.loads(text))


_ROW = re.compile(r"^row \d+: ")  # an Arrow message's letter names each refused row first
_LEADING_WORDS = re.compile(r"[A-Za-z][A-Za-z ]*")
REASON_KIND_WORDS = 4


def reason_kind(reason: str) -> str:
    """A short kind of a dead letter's reason, for counting letters by reason (a metric
    label): its first words, up to the first quote, digit or punctuation mark, in lower
    case, joined by '_' ("field 'c1': null id" -> field, "invalid JSON: Expecting value"
    -> invalid_json, "row 3: missing label 'y'" -> missing_label). Reasons are picasso's
    own sentences, which quote names and put values after a colon, so their first words
    never come from the data and the kinds stay a small, fixed set."""
    text = _ROW.sub("", reason.strip(), count=1)
    words = _LEADING_WORDS.match(text)
    kind = "_".join(words.group(0).lower().split()[:REASON_KIND_WORDS]) if words else ""
    return kind or "other"


# A cut letter says so in its reason: 'oversize: <why> (original reason: <reason>)'.
OVERSIZE = "oversize"
_ORIGINAL_REASON = " (original reason: "
# ... and in these headers: the size and SHA-256 of the value, and of a key if it was cut.
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


@dataclass(frozen=True)
class MessageDeadLetter:
    """A refused Kafka message. Its record in the dead-letter topic keeps the original key
    and value bytes untouched (so it can be replayed once fixed) and says in its headers
    which topic, partition and offset it came from, why it was refused, and how many of its
    records were (an Arrow IPC message carries many)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None  # the message exactly as it arrived, or its first bytes if it was cut
    timestamp_ms: int
    reason: str
    records: int = 1  # refused records in this message (rows of an Arrow IPC message)
    # Set only on a letter cut down to fit Kafka's size limits: the originals' size and hash.
    original_key: Digest | None = None
    original_value: Digest | None = None

    @property
    def is_cut(self) -> bool:
        return self.reason.startswith(f"{OVERSIZE}: ")

    @property
    def original_reason(self) -> str:
        """Why the message was refused, without the note that it was cut."""
        return original_reason(self.reason)

    def headers(self, max_reason_bytes: int) -> list[tuple[str, bytes]]:
        """The record's headers, its reason capped at max_reason_bytes."""
        headers = [
            ("picasso.topic", self.topic.encode()),
            ("picasso.partition", str(self.partition).encode()),
            ("picasso.offset", str(self.offset).encode()),
            ("picasso.reason", _capped_utf8(self.reason, max_reason_bytes)),
            ("picasso.records", str(self.records).encode()),
        ]
        if self.original_value is not None:
            headers += self.original_value.headers(VALUE_HEADERS)
        if self.original_key is not None:
            headers += self.original_key.headers(KEY_HEADERS)
        return headers

    @classmethod
    def from_record(cls, record) -> "MessageDeadLetter":
        """Read one back from a consumed dead-letter record."""
        headers = {key: value.decode() for key, value in record.headers}
        return cls(
            topic=headers["picasso.topic"],
            partition=int(headers["picasso.partition"]),
            offset=int(headers["picasso.offset"]),
            key=record.key,
            value=record.value,
            timestamp_ms=record.timestamp,
            reason=headers["picasso.reason"],
            records=int(headers["picasso.records"]),
            original_key=Digest.from_headers(headers, KEY_HEADERS),
            original_value=Digest.from_headers(headers, VALUE_HEADERS),
        )


POSITION_HEADERS = ("picasso.topic", "picasso.partition", "picasso.offset")


def letter_position(headers) -> tuple[str, int, int] | None:
    """The (topic, partition, offset) a dead-letter record's headers name: its identity, by
    which it is written once (lettered.py); None for a record that is not a letter (headers
    missing, or not text and numbers), which a reader of the topic passes over."""
    found = {name: value for name, value in headers or () if name in POSITION_HEADERS}
    try:
        topic, partition, offset = (found[name].decode() for name in POSITION_HEADERS)
        return topic, int(partition), int(offset)
    except (KeyError, AttributeError, UnicodeDecodeError, ValueError):
        return None


def _capped_utf8(text: str, limit: int) -> bytes:
    # Cut on a character boundary, so that the header always decodes again.
    return text.encode()[:limit].decode(errors="ignore").encode()
