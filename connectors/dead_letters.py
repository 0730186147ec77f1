"""Dead letters: a bad record, where it came from, and why it was refused.

Bad input never crashes a run and is never dropped silently: every refused record leaves
as one of these, and the pipeline decides where they go (files, a Kafka topic).
"""

from __future__ import annotations

import json
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
