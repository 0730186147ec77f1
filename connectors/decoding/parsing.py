"""Each format parsed into columns for the validator: Arrow tables and batches, columns of
Python values, JSON objects (one per message or JSONL line) and Criteo TSV lines.

A parser refuses only what keeps a record from becoming a row at all (invalid JSON, a
TSV line of the wrong width, bytes that are not UTF-8); the values themselves are the
validator's to judge. Unparseable TSV values stay strings, so that the validator refuses
them by name like any other value of the wrong type.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from picasso.connectors.decoding.columns import ARROW_ERRORS, as_arrow_array
from picasso.connectors.decoding.contracts import ParsedColumns, Verdicts
from picasso.spec import FeatureSpec


def parse_table(table: pa.Table | pa.RecordBatch) -> ParsedColumns:
    """Rows of a Parquet file or an Arrow batch, one column per field."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    return parse_columns(dict(zip(table.column_names, table.columns)), table.num_rows)


def parse_columns(columns: dict[str, pa.Array | pa.ChunkedArray | list], num_rows: int) -> ParsedColumns:
    """Columns of n rows each: Arrow arrays, or Python lists of any values."""

    def payload_of(i: int) -> str:
        row = {name: values[i] for name, values in columns.items()}
        return json.dumps({k: v.as_py() if isinstance(v, pa.Scalar) else v for k, v in row.items()}, default=str)

    return ParsedColumns(columns, num_rows, Verdicts(num_rows), payload_of)


def parse_json(messages: Sequence[bytes | str], known: set[str], keep_unknown: bool) -> ParsedColumns:
    """One JSON object per message (a Kafka message, or a line of a JSONL file): a column
    per known field, and per unknown one too where keep_unknown (for the validator to
    refuse)."""
    n = len(messages)
    verdicts = Verdicts(n)
    records: list[dict] = []
    for i, message in enumerate(messages):
        try:
            record = json.loads(message, object_pairs_hook=_object_of_unique_keys)
        except _DuplicateKey as err:
            verdicts.refuse(np.array([i]), lambda _, err=err: f"invalid JSON: {err}")
            record = {}
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            reason = "blank line (no JSON object)" if not message.strip() else f"invalid JSON: {err}"
            verdicts.refuse(np.array([i]), lambda _, reason=reason: reason)
            record = {}
        if not isinstance(record, dict):
            verdicts.refuse(np.array([i]), lambda _, r=record: f"not a JSON object: {type(r).__name__}")
            record = {}
        records.append(record)
    names = known | {key for record in records for key in record} if keep_unknown else known
    columns = {name: [record.get(name) for record in records] for name in names}
    return ParsedColumns(columns, n, verdicts, lambda i: _text(messages[i]))


def parse_tsv(lines: Sequence[bytes | str], spec: FeatureSpec) -> ParsedColumns:
    """Criteo TSV: label, dense fields, sparse fields, tab-separated in spec order.

    Empty values are missing values; multi-hot ids are comma-separated.
    """
    n = len(lines)
    verdicts = Verdicts(n)
    names = [spec.label, *spec.dense_names, *spec.sparse_names]
    malformed: list[int] = []

    def on_invalid_row(row) -> str:
        malformed.append(row.number - 1)
        return "skip"

    encoded = [line if isinstance(line, bytes) else line.encode() for line in lines]
    # One line that is not UTF-8 would make the reader refuse the whole chunk: refuse it
    # alone, and hand the reader an empty row of the right width in its place.
    placeholder = b"\t" * (len(names) - 1)
    for i, line in enumerate(encoded):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as err:
            verdicts.refuse(np.array([i]), lambda _, err=err: f"TSV line is not UTF-8: {err.reason} at byte {err.start}")
            encoded[i] = placeholder
    data = b"\n".join(encoded)
    try:
        table = pa_csv.read_csv(
            io.BytesIO(data),
            read_options=pa_csv.ReadOptions(column_names=names, use_threads=False),
            parse_options=pa_csv.ParseOptions(
                delimiter="\t", quote_char=False, ignore_empty_lines=False, invalid_row_handler=on_invalid_row
            ),
            convert_options=pa_csv.ConvertOptions(
                column_types={name: pa.string() for name in names}, null_values=[""], strings_can_be_null=True
            ),
        )
    except pa.ArrowInvalid as err:  # anything else the reader refuses: refuse the chunk, named
        table, malformed = None, list(range(n))
        error = str(err).splitlines()[0]
    if malformed:
        expected = len(names)
        verdicts.refuse(
            np.array(malformed),
            lambda i: f"malformed TSV line: expected {expected} tab-separated values, "
            f"got {_text(lines[i]).count(chr(9)) + 1}" if table is not None else f"unreadable TSV: {error}",
        )
    returned = np.ones(n, dtype=bool)
    returned[malformed] = False
    kept = np.flatnonzero(returned)  # lines the CSV reader returned, in order
    columns = {}
    if table is not None:
        for name in names:
            column = as_arrow_array(table.column(name))
            columns[name] = _parse_text_column(spec, name, column)
        columns = {name: _scatter(values, kept, n) for name, values in columns.items()}
    return ParsedColumns(columns, n, verdicts, lambda i: _text(lines[i]))


def _parse_text_column(spec: FeatureSpec, name: str, column: pa.Array):
    """Typed values for a column of text; unparseable entries stay strings for the
    validator to refuse by name."""
    if name in spec.sparse_names:
        f = spec.sparse_field(name)
        if f.multi_hot:
            bags = pc.split_pattern(column, ",")
            ids = pc.list_flatten(bags)
            ids = pc.if_else(pc.equal(ids, ""), pa.scalar(None, pa.string()), ids)
            column = pa.ListArray.from_arrays(bags.offsets, ids, mask=bags.is_null())
        if f.takes_strings:
            return column
        try:
            return column.cast(pa.list_(pa.int64()) if f.multi_hot else pa.int64())
        except ARROW_ERRORS:
            return [_parse_number(v, int) for v in column.to_pylist()]
    try:
        return column.cast(pa.float64())
    except ARROW_ERRORS:
        return [_parse_number(v, float) for v in column.to_pylist()]


class _DuplicateKey(ValueError):
    pass


def _object_of_unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.loads keeps the last of two equal keys without a word; which one the producer
    meant is a guess, so such an object is refused."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(f"duplicate key {key!r} in one object")
            seen.add(key)
    return record


def _scatter(values, kept: np.ndarray, n: int):
    """Spread the values of the kept rows back to n rows, None elsewhere."""
    if len(kept) == n:
        return values
    items = values.to_pylist() if isinstance(values, pa.Array) else list(values)
    full = [None] * n
    for row, value in zip(kept, items):
        full[row] = value
    return full


def _parse_number(text, kind):
    if text is None:
        return None
    if isinstance(text, list):
        return [_parse_number(t, kind) for t in text]
    try:
        return kind(text)
    except ValueError:
        return text


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", errors="backslashreplace") if isinstance(raw, bytes) else raw
