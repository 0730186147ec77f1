"""What serving does with a request's rows: decode them as training would, and decide
what a refused row gets.

The decoder is training's (connectors/decoding/), with no label required, so serving
and training never disagree about a row. Every input row gets exactly one answer, in
order:
- `on_bad_row: error` (the default): a request with any refused row is refused whole,
  naming each refused row and its reason (BadRows);
- `on_bad_row: default`: a refused row is scored on its good fields, the refused ones
  taken as missing (the trainer's defaults: dense 0, sparse an empty bag), and its
  reasons are reported next to its probability.
A row with no known field at all is not refused: it is scored on defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from picasso.connectors.decoding.contracts import DecodeResult
from picasso.connectors.decoding.record_decoder import RecordDecoder

ON_BAD_ROW = ("error", "default")
SOURCE = "serving"


def on_bad_row_problem(on_bad_row: str) -> str | None:
    if on_bad_row not in ON_BAD_ROW:
        return f"on_bad_row must be one of {', '.join(ON_BAD_ROW)}, got {on_bad_row!r}"
    return None


@dataclass(frozen=True)
class RefusedRow:
    row: int  # index of the row in the request, from 0
    reason: str


@dataclass
class BadRows(ValueError):
    """Rows of a request the decoder refused, with `on_bad_row: error`."""

    refused: list[RefusedRow]
    rows: int

    def __str__(self) -> str:
        shown = "; ".join(f"row {r.row}: {r.reason}" for r in self.refused[:20])
        more = f"; and {len(self.refused) - 20} more" if len(self.refused) > 20 else ""
        return f"{len(self.refused)} of {self.rows} rows refused ({shown}{more})"


@dataclass
class DecodedRequest:
    table: pa.Table  # one canonical row per input row, in order
    refused: dict[int, str] = field(default_factory=dict)  # row -> reasons, on_bad_row: default


def decode_request(decoder: RecordDecoder, frame: pd.DataFrame, on_bad_row: str) -> DecodedRequest:
    """Every row of the frame decoded, or BadRows."""
    if problem := on_bad_row_problem(on_bad_row):
        raise ValueError(problem)
    n = len(frame)
    columns = {str(name): _column(frame[name]) for name in frame.columns}
    decoded = decoder.decode_columns(columns, n, source=SOURCE)
    if not decoded.dead_letters:
        return DecodedRequest(decoded.table)
    if on_bad_row == "error":
        raise BadRows([RefusedRow(int(letter.position), letter.reason) for letter in decoded.dead_letters], n)
    lists = {name: _as_list(values) for name, values in columns.items()}
    refused = {}
    for letter in decoded.dead_letters:
        row = int(letter.position)
        refused[row] = "; ".join(_drop_refused_fields(decoder, lists, row)) or letter.reason
    repaired = decoder.decode_columns(lists, n, source=SOURCE)
    for letter in repaired.dead_letters:  # refused only as a whole: scored on defaults
        for values in lists.values():
            values[int(letter.position)] = None
    if repaired.dead_letters:
        repaired = decoder.decode_columns(lists, n, source=SOURCE)
    _assert_every_row(repaired, n)
    return DecodedRequest(repaired.table, refused)


def _drop_refused_fields(decoder: RecordDecoder, lists: dict[str, list], row: int) -> list[str]:
    """Set to missing each field of the row that is refused on its own; their reasons."""
    reasons = []
    for name, values in lists.items():
        if values[row] is None:
            continue
        alone = decoder.decode_columns({name: [values[row]]}, 1, source=SOURCE)
        if alone.dead_letters:
            reasons.append(alone.dead_letters[0].reason)
            values[row] = None
    return reasons


def _assert_every_row(decoded: DecodeResult, n: int) -> None:
    if decoded.dead_letters or decoded.table.num_rows != n:  # a row of missing values is always valid
        raise AssertionError(f"serving decoded {decoded.table.num_rows} of {n} rows after dropping refused fields")


def _column(series: pd.Series) -> pa.Array | list:
    """An Arrow array for a column of one numpy type; values of any other column (pandas'
    object columns: strings, lists, mixed values) as a list, which the decoder converts
    with training's checks. Arrow would convert some mixed columns itself, and read a
    `true` among numbers as 1.0."""
    if series.dtype == object:
        return [None if _missing(value) else value for value in series.tolist()]
    if series.dtype.kind == "f" and series.hasnans:
        # pandas (and JSON parsed into a DataFrame) turns an integer column with a missing
        # value into floats with NaN: give integer ids back their type, missing as null.
        present = series.dropna()
        if ((present == np.floor(present)) & (present.abs() < 2**53)).all():
            series = series.astype("Int64")
    try:
        return pa.array(series, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return [None if _missing(value) else value for value in series.tolist()]


def _as_list(values: pa.Array | list) -> list:
    return values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else list(values)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))
