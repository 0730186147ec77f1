"""The dead letters of day files, as JSON lines in files: one DeadLetter (letters.py) a line.

A daily run writes them under WORKDIR/dead_letters/date=D[/hour=H]/ (pipelines/runs/workdir.py).
"""

from __future__ import annotations

import apache_beam as beam


class WriteDeadLettersToFiles(beam.PTransform):
    """DeadLetters in; JSON lines in files PREFIX-NNNNN-of-NNNNN.jsonl, none when there are
    none: Beam's S3 writer cannot make an empty object (a multipart upload of no parts),
    and an empty file says nothing anyway."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def expand(self, letters):
        return (letters
                | "ToJson" >> beam.Map(lambda letter: letter.to_json())
                | "Write" >> beam.io.WriteToText(self.prefix, file_name_suffix=".jsonl", skip_if_empty=True))
