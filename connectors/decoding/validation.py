"""Parsed columns checked against the spec, whatever their format, by one set of rules:

- label: required (in training), a number in [0, 1];
- dense fields: numbers, finite; missing means 0; `log1p` fields become sign(x)·log(1+|x|);
- sparse fields: see decoding.sparse_ids (and decoding.batch_ids, which checks the
  columns of one Arrow type of ids in one kernel call);
- unknown fields: ignored, or refused when DecodeOptions.unknown_fields is "reject".

The canonical table holds `label` (float32), one float32 column per dense field and one
list<int64> column of row indices per sparse field (a dynamic field's: its ids' 64-bit
keys, picasso.kernels.hashing.key_of), in spec order, then one per feature cross (computed from
its fields: decoding.batch_ids), then a decoder's join fields, if any.
Columns are checked with vectorised Arrow/numpy ops; only a column that fails its fast
path (mixed types from JSON, say) is walked element by element, to name the culprit rows.
No exception escapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from picasso.connectors.dead_letters.letters import DeadLetter
from picasso.connectors.decoding.columns import as_arrow_array, describe, null_mask
from picasso.connectors.decoding.contracts import DecodeOptions, DecodeResult, Verdicts
from picasso.connectors.decoding.batch_ids import SparseColumns
from picasso.spec import FeatureSpec


class ColumnValidator:
    """`events`, when given, also reads and validates the fields of a join event (its key
    and event time: connectors.join_events.EventFields), as columns after the canonical
    ones."""

    def __init__(self, spec: FeatureSpec, options: DecodeOptions, events=None):
        self.spec = spec
        self.options = options
        self.events = events
        self.known = {spec.label, *spec.dense_names, *spec.sparse_names, *(events.names if events else ())}
        self._log1p = np.array([f.transform == "log1p" for f in spec.dense], dtype=bool)
        self._sparse = SparseColumns(spec.sparse, spec.crosses)
        self.schema = pa.schema(
            [pa.field("label", pa.float32())]
            + [pa.field(f.name, pa.float32()) for f in spec.dense]
            + [pa.field(f.name, pa.list_(pa.int64())) for f in spec.id_features]
            + (list(events.schema) if events else [])
        )

    def validate(
        self,
        columns: dict[str, object],
        n: int,
        verdicts: Verdicts,
        source: str,
        positions: np.ndarray,
        payload_of: Callable[[int], str],
    ) -> DecodeResult:
        spec = self.spec
        # One contiguous array per Arrow column, made once (a table of many IPC messages
        # comes in many chunks).
        columns = {name: as_arrow_array(v) if isinstance(v, pa.ChunkedArray) else v for name, v in columns.items()}
        out: dict[str, pa.Array] = {}
        label, out["label"] = self._label(columns.get(spec.label), n, verdicts)

        dense = self._dense(columns, n, verdicts)
        for j, f in enumerate(spec.dense):
            out[f.name] = dense[:, j]

        out.update(self._sparse.bags(columns, n, verdicts))

        if self.options.unknown_fields == "reject":
            for name in sorted(set(columns) - self.known):
                present = ~null_mask(columns[name], n)
                verdicts.refuse(present, lambda _, name=name: f"unknown field '{name}'")
        events = self.events.validate(columns, n, verdicts, positions, label) if self.events else {}

        good = ~verdicts.bad
        absent = self._absent(columns, n, good)
        if verdicts.bad.any():
            keep = pa.array(good)
            arrays = [pa.array(out["label"][good])] + [pa.array(out[f.name][good]) for f in spec.dense]
            arrays += [out[f.name].filter(keep) for f in spec.id_features]
            arrays += [column.filter(keep) for column in events.values()]
        else:
            arrays = [pa.array(out["label"])] + [pa.array(out[f.name]) for f in spec.dense]
            arrays += [out[f.name] for f in spec.id_features]
            arrays += list(events.values())
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        dead = dead_letters(verdicts.reasons, source, positions, payload_of)
        return DecodeResult(table=table, dead_letters=dead, valid_mask=good, absent=absent)

    def _absent(self, columns: dict[str, object], n: int, good: np.ndarray) -> dict[str, int]:
        """Per feature of the spec, the valid rows without it (null, or no such column)."""
        absent = {}
        valid = None
        for name in self.spec.feature_names:
            values = columns.get(name)
            if isinstance(values, (pa.Array, pa.ChunkedArray)) and values.null_count == 0:
                continue  # the usual case, without making a mask
            if values is None:
                valid = int(np.count_nonzero(good)) if valid is None else valid
                missing = valid
            else:
                missing = int(np.count_nonzero(null_mask(values, n) & good))
            if missing:
                absent[name] = missing
        return absent

    def _label(self, values, n: int, verdicts: Verdicts) -> tuple[np.ndarray, np.ndarray]:
        """The labels as read (float64, for the join fields' checks) and the label column."""
        name = self.spec.label
        if values is None and self.options.require_label:
            verdicts.refuse(np.ones(n, dtype=bool), lambda _: missing_label_reason(name))
        label, label_null = _numbers(name, values, n, verdicts)
        if self.options.require_label:
            verdicts.refuse(label_null, lambda _: missing_label_reason(name))
            not_finite = ~label_null & ~np.isfinite(label)
            verdicts.refuse(not_finite, lambda i: label_not_finite_reason(name, label[i]))
            out_of_range = ~label_null & ~not_finite & ((label < 0) | (label > 1))
            verdicts.refuse(out_of_range, lambda i: label_out_of_range_reason(name, label[i]))
        # Refused or missing labels (any value outside [0, 1]) are zeroed before the cast.
        # Adding 0.0 turns -0.0 into 0.0: json.loads reads `-0` as the integer 0, Arrow's
        # reader as -0.0 in a column of doubles, and the two paths must give one row.
        return label, (np.where(label_null | verdicts.bad, 0.0, label) + 0.0).astype(np.float32)

    def _dense(self, columns: dict[str, object], n: int, verdicts: Verdicts) -> np.ndarray:
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
                column, null = _numbers(f.name, columns.get(f.name), n, verdicts)
                values[:, j] = np.where(null, 0.0, column) if null.any() else column
        values += 0.0  # -0.0 becomes 0.0, as for labels
        values, dense = dense_values(values, self._log1p)
        bad = ~np.isfinite(dense)
        if bad.any():
            for j in np.flatnonzero(bad.any(axis=0)):
                verdicts.refuse(bad[:, j], lambda i, j=j: dense_reason(fields[j].name, values[i, j]))
            dense[bad] = 0.0
        return dense


# Why a row is refused for its label or a dense value: one text per check, whichever path
# (this module's, or the one-pass kernel's: decoding.packed_decode) found it.
def missing_label_reason(name: str) -> str:
    return f"missing label '{name}'"


def label_not_finite_reason(name: str, value: float) -> str:
    return f"label '{name}' is not finite ({value})"


def label_out_of_range_reason(name: str, value: float) -> str:
    return f"label '{name}' must be in [0, 1], got {value}"


def dense_reason(name: str, value: float) -> str:
    """A dense value (transformed) that is not finite, or does not fit a float32."""
    problem = "does not fit a float32" if np.isfinite(value) else "not finite"
    return f"field '{name}': {problem} ({value})"


def dense_values(values: np.ndarray, log1p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A (rows, fields) float64 matrix of dense values as read (missing values 0) with the
    log1p fields transformed, and as float32; values too big for a float32 become inf."""
    if log1p.all():  # Criteo's case: the whole matrix, in place
        values = _signed_log1p(values)
    elif log1p.any():
        values[:, log1p] = _signed_log1p(values[:, log1p])
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is what the caller checks
        return values, values.astype(np.float32)


def dead_letters(reasons: dict[int, str], source: str, positions: np.ndarray,
                 payload_of: Callable[[int], str]) -> list[DeadLetter]:
    """A dead letter per refused row (by row), with its position and payload."""
    return [DeadLetter(source=source, position=int(positions[i]), payload=payload_of(i), reason=reasons[i])
            for i in sorted(reasons)]


def _numbers(name: str, values, n: int, verdicts: Verdicts) -> tuple[np.ndarray, np.ndarray]:
    """float64 values and a null mask; values of a wrong type are refused."""
    if values is None:
        return np.zeros(n), np.ones(n, dtype=bool)
    arr = as_arrow_array(values)
    if arr is not None and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)
                            or pa.types.is_null(arr.type)):
        null = null_mask(arr, n)
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


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) or isinstance(value, np.number)


def _as_number(value) -> tuple[float, str | None]:
    """A label's or dense field's value as a float, or why it is refused. Booleans are
    refused rather than read as 0/1: `true` where a number belongs is more likely a
    producer's bug than a click."""
    if not _is_number(value):
        return 0.0, f"expected a number, got {describe(value)}"
    try:
        return float(value), None
    except OverflowError:  # an integer of hundreds of digits: infinite as a float, as Arrow reads it
        return (math.inf if value > 0 else -math.inf), None


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
