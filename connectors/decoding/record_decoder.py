"""RecordDecoder: the object callers hold to decode records of any format against one spec.

Each entry point parses its format into columns (decoding.parsing) and hands them to the
one validator (decoding.validation), so every format gets the same rules and reasons.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from picasso.connectors.decoding.contracts import DecodeOptions, DecodeResult, ParsedColumns
from picasso.connectors.decoding.parsing import parse_columns, parse_json, parse_table, parse_tsv
from picasso.connectors.decoding.validation import ColumnValidator
from picasso.spec import FeatureSpec


class RecordDecoder:
    """`events`, when given, also reads and validates the fields of a join event (its key
    and event time: connectors.join_events.EventFields), as columns after the canonical
    ones."""

    def __init__(self, spec: FeatureSpec, options: DecodeOptions = DecodeOptions(), events=None):
        self.spec = spec
        self.options = options
        self.events = events
        self.validator = ColumnValidator(spec, options, events)
        self.known = self.validator.known  # every field name a record may carry
        self.schema = self.validator.schema  # of the canonical table

    def decode_table(
        self, table: pa.Table | pa.RecordBatch, source: str, first_position: int = 0, positions: Sequence[int] | None = None
    ) -> DecodeResult:
        """Rows of a Parquet file or an Arrow batch, one column per field."""
        return self._decode(parse_table(table), source, first_position, positions)

    def decode_columns(
        self,
        columns: dict[str, pa.Array | pa.ChunkedArray | list],
        num_rows: int,
        source: str,
        first_position: int = 0,
        positions: Sequence[int] | None = None,
    ) -> DecodeResult:
        """Columns of n rows each: Arrow arrays, or Python lists of any values."""
        return self._decode(parse_columns(columns, num_rows), source, first_position, positions)

    def decode_json(
        self, messages: Sequence[bytes | str], source: str, first_position: int = 0, positions: Sequence[int] | None = None
    ) -> DecodeResult:
        """One JSON object per message (a Kafka message, or a line of a JSONL file)."""
        # Unknown fields are kept only where they are to be refused.
        parsed = parse_json(messages, self.known, keep_unknown=self.options.unknown_fields == "reject")
        return self._decode(parsed, source, first_position, positions)

    def decode_tsv(
        self, lines: Sequence[bytes | str], source: str, first_position: int = 0, positions: Sequence[int] | None = None
    ) -> DecodeResult:
        """Criteo TSV: label, dense fields, sparse fields, tab-separated in spec order.

        Empty values are missing values; multi-hot ids are comma-separated.
        """
        return self._decode(parse_tsv(lines, self.spec), source, first_position, positions)

    def _decode(self, parsed: ParsedColumns, source: str, first_position: int,
                positions: Sequence[int] | None) -> DecodeResult:
        n = parsed.num_rows
        return self._validate(parsed.columns, n, parsed.verdicts, source,
                              record_positions(first_position, positions, n), parsed.payload_of)

    def _validate(self, columns, n, verdicts, source, positions, payload_of) -> DecodeResult:
        # The one call every format's records pass through, kept on the decoder so that a
        # test can make it raise for a poll, as a decoder bug would
        # (tests/test_stream_failures.py).
        return self.validator.validate(columns, n, verdicts, source, positions, payload_of)


def record_positions(first_position: int, positions: Sequence[int] | None, n: int) -> np.ndarray:
    """Each record's position in its source: given, or consecutive from first_position."""
    return np.asarray(positions) if positions is not None else first_position + np.arange(n)
