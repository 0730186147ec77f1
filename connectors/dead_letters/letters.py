"""Dead letters: a bad record, where it came from, and why it was refused.

Bad input never crashes a run and is never dropped silently: every refused record leaves
as one of these, and the pipeline decides where they go (files, a Kafka topic).
"""

from __future__ import annotations

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
