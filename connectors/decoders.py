"""Decoders: raw records in, a canonical Arrow table of valid rows out, plus dead letters.

Every format (JSON events, Parquet/Arrow rows, Criteo TSV lines) is turned into columns
and validated by one column-wise validator, so the rules are the same everywhere:

- label: required (in training), a number in [0, 1];
- dense fields: numbers, finite; missing means 0; `log1p` fields become sign(x)·log(1+|x|);
- sparse fields: an id, or a list of at most max_len ids; missing means an empty bag.
  Hashed and dynamic fields take string or integer ids (integers in [0, 2^64)); vocab
  fields take integers in [0, vocab_size);
- unknown fields: ignored, or refused when DecodeOptions.unknown_fields is "reject".

The canonical table holds `label` (float32), one float32 column per dense field and one
list<int64> column of row indices per sparse field (a dynamic field's: its ids' 64-bit
keys, picasso.hashing.key_of), in spec order. Columns are checked
with vectorised Arrow/numpy ops; only a column that fails its fast path (mixed types from
JSON, say) is walked element by element, to name the culprit rows. No exception escapes.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from picasso.connectors.dead_letters import DeadLetter
from picasso.connectors.id_hashing import hash_many
from picasso.hashing import bucket_of, hash_to_buckets, key_of, keys_of
from picasso.spec import FeatureSpec, SparseField

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, OverflowError, ValueError)


@dataclass(frozen=True)
class DecodeOptions:
    require_label: bool = True  # serving decodes events that carry no label
    unknown_fields: str = "ignore"  # or "reject"

    def __post_init__(self):
        if self.unknown_fields not in ("ignore", "reject"):
            raise ValueError(f"unknown_fields must be 'ignore' or 'reject', got {self.unknown_fields!r}")


@dataclass
class DecodeResult:
    table: pa.Table  # valid rows only, canonical schema
    dead_letters: list[DeadLetter] = field(default_factory=list)
    valid_mask: np.ndarray | None = None  # which input rows are in `table`, in order

    @property
    def rows_in(self) -> int:
        return self.table.num_rows + len(self.dead_letters)


class _Verdicts:
    """The first reason each bad row was refused for."""

    def __init__(self, n: int):
        self.bad = np.zeros(n, dtype=bool)
        self.reasons: dict[int, str] = {}

    def refuse(self, rows: np.ndarray, reason: Callable[[int], str]) -> None:
        """Refuse rows (a boolean mask or indices); reason(i) is built only for new ones."""
        if rows.dtype == bool and not rows.any():  # the usual case: nothing to refuse
            return
        rows = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows)
        for i in rows[~self.bad[rows]]:
            self.reasons[int(i)] = reason(int(i))
        self.bad[rows] = True


def as_arrow_array(values) -> pa.Array | None:
    """An Arrow array for a column, or None when its values have no single Arrow type."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        return values
    try:
        arr = pa.array(values)
    except _ARROW_ERRORS:
        return None
    # After a float, Arrow reads True as 1.0; booleans must reach the validator as such.
    if pa.types.is_floating(arr.type) and any(isinstance(v, bool) for v in values):
        return None
    return arr


def _describe(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or isinstance(value, np.number)


def _as_number(value) -> tuple[float, str | None]:
    """A label's or dense field's value as a float, or why it is refused. Booleans are
    refused rather than read as 0/1: `true` where a number belongs is more likely a
    producer's bug than a click."""
    if not _is_number(value):
        return 0.0, f"expected a number, got {_describe(value)}"
    try:
        return float(value), None
    except OverflowError:  # an integer of hundreds of digits: infinite as a float, as Arrow reads it
        return (math.inf if value > 0 else -math.inf), None


class RecordDecoder:
    """`events`, when given, also reads and validates the fields of a join event (its key
    and event time: connectors.join_events.EventFields), as columns after the canonical
    ones."""

    def __init__(self, spec: FeatureSpec, options: DecodeOptions = DecodeOptions(), events=None):
        self.spec = spec
        self.options = options
        self.events = events
        self.known = {spec.label, *spec.dense_names, *spec.sparse_names, *(events.names if events else ())}
        self._log1p = np.array([f.transform == "log1p" for f in spec.dense], dtype=bool)
        self.schema = pa.schema(
            [pa.field("label", pa.float32())]
            + [pa.field(f.name, pa.float32()) for f in spec.dense]
            + [pa.field(f.name, pa.list_(pa.int64())) for f in spec.sparse]
            + (list(events.schema) if events else [])
        )

    # -- entry points, one per format -------------------------------------------------

    def decode_table(
        self, table: pa.Table | pa.RecordBatch, source: str, first_position: int = 0, positions: Sequence[int] | None = None
    ) -> DecodeResult:
        """Rows of a Parquet file or an Arrow batch, one column per field."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        columns = dict(zip(table.column_names, table.columns))
        return self.decode_columns(columns, table.num_rows, source, first_position, positions)

    def decode_columns(
        self,
        columns: dict[str, pa.Array | pa.ChunkedArray | list],
        num_rows: int,
        source: str,
        first_position: int = 0,
        positions: Sequence[int] | None = None,
    ) -> DecodeResult:
        """Columns of n rows each: Arrow arrays, or Python lists of any values."""

        def payload_of(i: int) -> str:
            row = {name: values[i] for name, values in columns.items()}
            return json.dumps({k: v.as_py() if isinstance(v, pa.Scalar) else v for k, v in row.items()}, default=str)

        n = num_rows
        return self._validate(columns, n, _Verdicts(n), source, _positions(first_position, positions, n), payload_of)

    def decode_json(
        self, messages: Sequence[bytes | str], source: str, first_position: int = 0, positions: Sequence[int] | None = None
    ) -> DecodeResult:
        """One JSON object per message (a Kafka message, or a line of a JSONL file)."""
        n = len(messages)
        verdicts = _Verdicts(n)
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
        names = self.known | {key for record in records for key in record} if self.options.unknown_fields == "reject" else self.known
        columns = {name: [record.get(name) for record in records] for name in names}
        positions = _positions(first_position, positions, n)
        return self._validate(columns, n, verdicts, source, positions, lambda i: _text(messages[i]))

    def decode_tsv(
        self, lines: Sequence[bytes | str], source: str, first_position: int = 0, positions: Sequence[int] | None = None
    ) -> DecodeResult:
        """Criteo TSV: label, dense fields, sparse fields, tab-separated in spec order.

        Empty values are missing values; multi-hot ids are comma-separated.
        """
        n = len(lines)
        verdicts = _Verdicts(n)
        names = [self.spec.label, *self.spec.dense_names, *self.spec.sparse_names]
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
                columns[name] = self._parse_text_column(name, column)
            columns = {name: _scatter(values, kept, n) for name, values in columns.items()}
        positions = _positions(first_position, positions, n)
        return self._validate(columns, n, verdicts, source, positions, lambda i: _text(lines[i]))

    # -- text parsing for TSV ----------------------------------------------------------

    def _parse_text_column(self, name: str, column: pa.Array):
        """Typed values for a column of text; unparseable entries stay strings for the
        validator to refuse by name."""
        if name in self.spec.sparse_names:
            f = self.spec.sparse_field(name)
            if f.multi_hot:
                bags = pc.split_pattern(column, ",")
                ids = pc.list_flatten(bags)
                ids = pc.if_else(pc.equal(ids, ""), pa.scalar(None, pa.string()), ids)
                column = pa.ListArray.from_arrays(bags.offsets, ids, mask=bags.is_null())
            if f.takes_strings:
                return column
            try:
                return column.cast(pa.list_(pa.int64()) if f.multi_hot else pa.int64())
            except _ARROW_ERRORS:
                return [_parse_number(v, int) for v in column.to_pylist()]
        try:
            return column.cast(pa.float64())
        except _ARROW_ERRORS:
            return [_parse_number(v, float) for v in column.to_pylist()]

    # -- the validator -----------------------------------------------------------------

    def _validate(
        self,
        columns: dict[str, object],
        n: int,
        verdicts: _Verdicts,
        source: str,
        positions: np.ndarray,
        payload_of: Callable[[int], str],
    ) -> DecodeResult:
        spec = self.spec
        # One contiguous array per Arrow column, made once (a table of many IPC messages
        # comes in many chunks).
        columns = {name: as_arrow_array(v) if isinstance(v, pa.ChunkedArray) else v for name, v in columns.items()}
        out: dict[str, pa.Array] = {}
        label_values = columns.get(spec.label)
        if label_values is None and self.options.require_label:
            verdicts.refuse(np.ones(n, dtype=bool), lambda _: f"missing label '{spec.label}'")
        label, label_null = self._numbers(spec.label, label_values, n, verdicts)
        if self.options.require_label:
            verdicts.refuse(label_null, lambda _: f"missing label '{spec.label}'")
            not_finite = ~label_null & ~np.isfinite(label)
            verdicts.refuse(not_finite, lambda i: f"label '{spec.label}' is not finite ({label[i]})")
            out_of_range = ~label_null & ~not_finite & ((label < 0) | (label > 1))
            verdicts.refuse(out_of_range, lambda i: f"label '{spec.label}' must be in [0, 1], got {label[i]}")
        # Refused or missing labels (any value outside [0, 1]) are zeroed before the cast.
        # Adding 0.0 turns -0.0 into 0.0: json.loads reads `-0` as the integer 0, Arrow's
        # reader as -0.0 in a column of doubles, and the two paths must give one row.
        out["label"] = (np.where(label_null | verdicts.bad, 0.0, label) + 0.0).astype(np.float32)

        dense = self._dense(columns, n, verdicts)
        for j, f in enumerate(spec.dense):
            out[f.name] = dense[:, j]

        out.update(self._plain_hashed(columns, n))
        for f in spec.sparse:
            if f.name not in out:
                out[f.name] = self._sparse(f, columns.get(f.name), n, verdicts)

        if self.options.unknown_fields == "reject":
            for name in sorted(set(columns) - self.known):
                present = ~_null_mask(columns[name], n)
                verdicts.refuse(present, lambda _, name=name: f"unknown field '{name}'")
        events = self.events.validate(columns, n, verdicts, positions, label) if self.events else {}

        good = ~verdicts.bad
        if verdicts.bad.any():
            keep = pa.array(good)
            arrays = [pa.array(out["label"][good])] + [pa.array(out[f.name][good]) for f in spec.dense]
            arrays += [out[f.name].filter(keep) for f in spec.sparse]
            arrays += [column.filter(keep) for column in events.values()]
        else:
            arrays = [pa.array(out["label"])] + [pa.array(out[f.name]) for f in spec.dense]
            arrays += [out[f.name] for f in spec.sparse]
            arrays += list(events.values())
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        dead = [
            DeadLetter(source=source, position=int(positions[i]), payload=payload_of(i), reason=verdicts.reasons[i])
            for i in sorted(verdicts.reasons)
        ]
        return DecodeResult(table=table, dead_letters=dead, valid_mask=good)

    def _dense(self, columns: dict[str, object], n: int, verdicts: _Verdicts) -> np.ndarray:
        """Every dense field in one (n, fields) float32 matrix, so transforms and checks run
        once for all of them: missing values are 0, log1p applied, and values that are not
        finite, or overflow a float32, refused."""
        fields = self.spec.dense
        plain = [_plain_numbers(columns.get(f.name)) for f in fields]
        if fields and all(column is not None for column in plain):
            # Every column an Arrow array of numbers (the usual case): nothing to refuse by
            # type, and numpy stacks them in one pass; nulls (missing values) become 0.
            values = np.column_stack([column for column, _ in plain]).astype(np.float64, copy=False)
            for j, (_, null) in enumerate(plain):
                if null is not None:
                    values[null, j] = 0.0
        else:
            values = np.zeros((n, len(fields)))
            for j, f in enumerate(fields):
                column, null = self._numbers(f.name, columns.get(f.name), n, verdicts)
                values[:, j] = np.where(null, 0.0, column) if null.any() else column
        values += 0.0  # -0.0 becomes 0.0, as for labels
        if self._log1p.all():  # Criteo's case: the whole matrix, in place
            values = _signed_log1p(values)
        elif self._log1p.any():
            values[:, self._log1p] = _signed_log1p(values[:, self._log1p])
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is what is checked next
            dense = values.astype(np.float32)
        bad = ~np.isfinite(dense)
        if bad.any():
            for j in np.flatnonzero(bad.any(axis=0)):
                def reason(i: int, j: int = j) -> str:
                    problem = "does not fit a float32" if np.isfinite(values[i, j]) else "not finite"
                    return f"field '{fields[j].name}': {problem} ({values[i, j]})"

                verdicts.refuse(bad[:, j], reason)
            dense[bad] = 0.0
        return dense

    def _numbers(self, name: str, values, n: int, verdicts: _Verdicts) -> tuple[np.ndarray, np.ndarray]:
        """float64 values and a null mask; values of a wrong type are refused."""
        if values is None:
            return np.zeros(n), np.ones(n, dtype=bool)
        arr = as_arrow_array(values)
        if arr is not None and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)
                                or pa.types.is_null(arr.type)):
            null = _null_mask(arr, n)
            numbers = arr.cast(pa.float64(), safe=False).fill_null(0.0).to_numpy(zero_copy_only=False)
        else:
            items = values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else list(values)
            null = np.array([v is None for v in items], dtype=bool)
            numbers = np.zeros(len(items))
            problems = {}
            for i, v in enumerate(items):
                if v is None:
                    continue
                number, problem = _as_number(v)
                if problem:
                    problems[i] = problem
                else:
                    numbers[i] = number
            if problems:
                verdicts.refuse(np.fromiter(problems, np.int64), lambda i: f"field '{name}': {problems[i]}")
        return numbers, null

    def _plain_hashed(self, columns: dict[str, object], n: int) -> dict[str, pa.ListArray]:
        """Bags of the hashed (and dynamic) fields whose column holds exactly one id per row
        (a string or integer Arrow array without nulls: the usual shape of JSON events),
        hashed together. No row of such a column can be refused, and one hash call over all of
        them costs about what one call per field costs in overhead alone."""
        plain: dict[pa.DataType, list[tuple[SparseField, pa.Array]]] = {}
        for f in self.spec.sparse:
            arr = columns.get(f.name) if f.takes_strings else None
            if (isinstance(arr, pa.Array) and arr.null_count == 0 and len(arr) == n
                    and (pa.types.is_integer(arr.type) and not _has_negative(arr)
                         or pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type))):
                plain.setdefault(arr.type, []).append((f, arr))
        if not plain:
            return {}
        offsets = pa.array(np.arange(n + 1, dtype=np.int32))
        out = {}
        for fields in plain.values():
            hashed = [(f, arr) for f, arr in fields if f.hashed]
            rows = hash_many([arr for _, arr in hashed], [f.hash_buckets for f, _ in hashed]) if hashed else []
            ids = dict(zip((f.name for f, _ in hashed), rows))
            ids.update({f.name: keys_of(arr) for f, arr in fields if not f.hashed})
            for f, _ in fields:
                out[f.name] = pa.ListArray.from_arrays(offsets, pa.array(ids[f.name]))
        return out

    def _sparse(self, f: SparseField, values, n: int, verdicts: _Verdicts) -> pa.ListArray:
        """Bags of row indices (before packing offsets), one per row; bad rows refused."""
        if values is None:
            return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.int64()))
        arr = as_arrow_array(values)
        parts = _id_parts(arr, n) if arr is not None else None
        if parts is not None:
            lengths, flat, null_ids = parts
            ids = flat.fill_null(0 if pa.types.is_integer(flat.type) else "") if flat.null_count else flat
            # owner: the row of each id; built only when some id may need refusing.
            negative_ids = f.takes_strings and _has_negative(ids)
            owner = (np.repeat(np.arange(n), lengths) if not f.takes_strings or null_ids.any() or negative_ids
                     else None)
            if null_ids.any():
                verdicts.refuse(owner[null_ids], lambda i: f"field '{f.name}': {_NULL_ID}")
            if f.takes_strings:
                if negative_ids:
                    negative = ids.to_numpy(zero_copy_only=False) < 0
                    first = _first_per_row(owner, negative, ids)
                    verdicts.refuse(owner[negative], lambda i: f"field '{f.name}': {_id_problem(first[i], f)}")
                rows = hash_to_buckets(ids, f.hash_buckets) if f.hashed else keys_of(ids)
            elif pa.types.is_integer(ids.type):
                rows = ids.to_numpy(zero_copy_only=False).astype(np.int64)
            else:
                rows = np.zeros(len(ids), np.int64)
                first = _first_per_row(owner, np.ones(len(ids), dtype=bool), ids)
                verdicts.refuse(lengths > 0, lambda i: f"field '{f.name}': {_id_problem(first[i], f)}")
        else:
            items = values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else list(values)
            lengths, rows, owner = self._sparse_slow(f, items, verdicts)
        verdicts.refuse(lengths > f.max_len, lambda i: f"field '{f.name}': {lengths[i]} ids, more than max_len {f.max_len}")
        if f.vocab_size is not None:
            out_of_range = (rows < 0) | (rows >= f.vocab_size)
            verdicts.refuse(owner[out_of_range], lambda i: f"field '{f.name}': {_out_of_range(f)}")
            rows = np.where(out_of_range, 0, rows)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(rows, pa.int64()))

    def _sparse_slow(self, f: SparseField, items: list, verdicts: _Verdicts):
        """Element-wise walk for a column with no single Arrow type (mixed JSON values)."""
        lengths = np.zeros(len(items), dtype=np.int64)
        rows: list[int] = []
        owner: list[int] = []
        for i, value in enumerate(items):
            bag = [] if value is None else value if isinstance(value, list) else [value]
            # The same reason, for the same first bad id, as the column-wise path gives.
            if isinstance(value, list) and None in bag:
                problem = _NULL_ID
            else:
                problem = next(filter(None, (_id_problem(v, f) for v in bag)), None)
            if problem:
                verdicts.refuse(np.array([i]), lambda _: f"field '{f.name}': {problem}")
                continue
            lengths[i] = len(bag)
            rows.extend(_row_of(v, f) for v in bag)
            owner.extend([i] * len(bag))
        return lengths, np.array(rows, dtype=np.int64), np.array(owner, dtype=np.int64)


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


def _signed_log1p(values: np.ndarray) -> np.ndarray:
    """sign(x)·log(1+|x|), reusing one buffer for the intermediate steps."""
    out = np.abs(values)
    np.log1p(out, out=out)
    out *= np.sign(values)
    return out


def _plain_numbers(values) -> tuple[np.ndarray, np.ndarray | None] | None:
    """An integer or floating Arrow array as numpy, with its null mask (None when it has
    no nulls); None for anything else."""
    if not isinstance(values, pa.Array) or not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return None
    null = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    return values.to_numpy(zero_copy_only=False), null


def _out_of_range(f: SparseField) -> str:
    return f"id out of range [0, {f.vocab_size})"


_NULL_ID = "null id in bag"
_UINT64_END = 1 << 64


def _id_problem(value, f: SparseField) -> str | None:
    """Why one raw id is refused, or None.

    Hashed fields take strings and integers in [0, 2^64): a negative or wider integer
    has no single unsigned 64-bit reading (a signed hash? a bug?), so it is refused
    rather than wrapped. Out-of-range vocab ids are refused by the caller, which checks
    whole columns at once.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, str) and not f.takes_strings):
        kind = "integer or string" if f.takes_strings else "integer"
        return f"expected {kind} ids, got {_describe(value)}"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # JSON's "\ud800": a lone surrogate, which no UTF-8 id has
            return f"string id {value!r:.40} is not valid Unicode (a lone surrogate)"
    elif f.takes_strings and not 0 <= value < _UINT64_END:
        kind = "hashed" if f.hashed else "dynamic"
        return f"integer id {value} is outside [0, 2^64) ({kind} ids are unsigned 64-bit)"
    elif not f.takes_strings and not 0 <= value < f.vocab_size:
        return _out_of_range(f)
    return None


def _row_of(value: int | str, f: SparseField) -> int:
    """The id a valid raw id packs as: its bucket, its dynamic key, or the vocab id itself."""
    if f.hashed:
        return bucket_of(value, f.hash_buckets)
    return key_of(value) if f.dynamic is not None else value


def _has_negative(ids: pa.Array) -> bool:
    return pa.types.is_signed_integer(ids.type) and len(ids) > 0 and pc.min(ids).as_py() < 0


def _first_per_row(owner: np.ndarray, flagged: np.ndarray, ids: pa.Array) -> dict[int, object]:
    """The first flagged id of each row that has one, as a Python value."""
    first: dict[int, object] = {}
    for position in np.flatnonzero(flagged):
        first.setdefault(int(owner[position]), ids[int(position)].as_py())
    return first


def _id_type_ok(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)


def _id_parts(arr: pa.Array, n: int) -> tuple[np.ndarray, pa.Array, np.ndarray] | None:
    """Bag lengths, flat ids and the null-id mask of a column of ids or of bags of ids;
    None when the column's type is neither (floats, say)."""
    if pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.int64), pa.array([], pa.int64()), np.zeros(0, dtype=bool)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        if not _id_type_ok(arr.type.value_type):
            return None
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = _plain_ids(pc.list_flatten(arr))
        return lengths, flat, _null_mask(flat, len(flat))
    if not _id_type_ok(arr.type):
        return None
    # A single id per row is a bag of one; a missing one, an empty bag.
    present = ~_null_mask(arr, n)
    flat = _plain_ids(arr if arr.null_count == 0 else arr.filter(pa.array(present)))
    return present.astype(np.int64), flat, np.zeros(len(flat), dtype=bool)


def _plain_ids(ids: pa.Array) -> pa.Array:
    """Ids as integers or strings: bags that held only nulls (Arrow's null type) become
    int64, and integer dictionaries are decoded. String dictionaries stay encoded, so
    that only their distinct values are hashed."""
    if pa.types.is_null(ids.type):
        return ids.cast(pa.int64())
    if pa.types.is_dictionary(ids.type) and pa.types.is_integer(ids.type.value_type):
        return ids.dictionary_decode()
    return ids


def _null_mask(values, n: int) -> np.ndarray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if values.null_count == 0:
            return np.zeros(n, dtype=bool)
        return values.is_null().to_numpy(zero_copy_only=False)
    return np.array([v is None for v in values], dtype=bool)


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


def _positions(first_position: int, positions: Sequence[int] | None, n: int) -> np.ndarray:
    """Each record's position in its source: given, or consecutive from first_position."""
    return np.asarray(positions) if positions is not None else first_position + np.arange(n)


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8", errors="backslashreplace") if isinstance(raw, bytes) else raw
