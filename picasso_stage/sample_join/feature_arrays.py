"""Feature rows as numpy arrays, one row after another: how a join holds its rows.

A join takes a few rows at a time out of a million it holds, many times a call. From Arrow
tables each take costs a compute-kernel call per column, about 7 µs whatever the rows:
0.3 ms per take of Criteo's 40 fields, which made the takes half of the join's time. Here
a row's numbers are one record of a numpy structured array and its lists' items one run
of a flat array (field after field), so a take is a few numpy gathers, however many
fields there are; the Arrow columns are made once, on the way out.

FeatureLayout holds what a schema allows: numbers (integer and floating fields, nulls
allowed) and lists of numbers (all lists of one item type, as the canonical rows'
list<int64> ids; null lists allowed, null items not). It refuses anything else by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass
class FeatureArrays:
    numbers: np.ndarray  # (n,) structured: one field per number column
    nulls: np.ndarray | None  # (n, number columns) bool, True where null; None: no nulls
    lengths: np.ndarray  # (n, list columns) int8/16/32: each list's length, -1 a null list
    starts: np.ndarray  # (n + 1,) int64: row r's items are items[starts[r]:starts[r + 1]]
    items: np.ndarray  # every row's list items, row after row, each row's lists in order

    def __len__(self) -> int:
        return len(self.numbers)

    @property
    def nbytes(self) -> int:
        nulls = 0 if self.nulls is None else self.nulls.nbytes
        return self.numbers.nbytes + nulls + self.lengths.nbytes + self.starts.nbytes + self.items.nbytes

    def take(self, rows: np.ndarray) -> "FeatureArrays":
        """These rows (indices), in the order given."""
        begin, end = self.starts[rows], self.starts[rows + 1]
        return FeatureArrays(
            numbers=self.numbers[rows], nulls=None if self.nulls is None else self.nulls[rows],
            lengths=self.lengths[rows], starts=_starts_of(end - begin), items=self.items[_runs(begin, end - begin)])

    @staticmethod
    def concat(parts: Sequence["FeatureArrays"]) -> "FeatureArrays":
        if len(parts) == 1:
            return parts[0]
        nulls = None
        if any(p.nulls is not None for p in parts):
            nulls = np.concatenate([np.zeros((len(p), p.numbers_columns), bool) if p.nulls is None else p.nulls
                                    for p in parts])
        offsets = np.cumsum([0] + [len(p.items) for p in parts[:-1]])
        starts = np.concatenate([parts[0].starts[:1]] + [p.starts[1:] + o for p, o in zip(parts, offsets)])
        return FeatureArrays(numbers=np.concatenate([p.numbers for p in parts]), nulls=nulls,
                         lengths=np.concatenate([p.lengths for p in parts]), starts=starts,
                         items=np.concatenate([p.items for p in parts]))

    @property
    def numbers_columns(self) -> int:
        return len(self.numbers.dtype.names or ())


class FeatureLayout:
    """A schema's fields as numbers and lists, and the ways from Arrow to FeatureArrays and
    back. Columns keep the schema's order."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        numbers, lists, problems = [], [], []
        for i, f in enumerate(schema):
            if _is_number(f.type):
                numbers.append(i)
            elif pa.types.is_list(f.type) and _is_number(f.type.value_type):
                lists.append(i)
            else:
                problems.append(f"'{f.name}' ({f.type})")
        item_types = {schema[i].type.value_type for i in lists}
        if len(item_types) > 1:
            problems.append("lists of more than one item type (" + ", ".join(sorted(map(str, item_types))) + ")")
        if problems:
            raise ValueError("feature rows hold numbers and lists of numbers of one item type; not "
                             + ", ".join(problems))
        self.numbers, self.lists = numbers, lists
        self.record = np.dtype([(schema[i].name, schema[i].type.to_pandas_dtype()) for i in numbers])
        self.item = np.dtype(schema[lists[0]].type.value_type.to_pandas_dtype()) if lists else np.dtype(np.int64)

    def empty(self) -> FeatureArrays:
        return FeatureArrays(np.zeros(0, self.record), None, np.zeros((0, len(self.lists)), np.int8),
                         np.zeros(1, np.int64), np.zeros(0, self.item))

    def from_arrow(self, table: pa.Table) -> FeatureArrays:
        n = table.num_rows
        numbers = np.empty(n, self.record)
        nulls = None
        for j, i in enumerate(self.numbers):
            column = table.column(i).combine_chunks()
            if column.null_count:
                if nulls is None:
                    nulls = np.zeros((n, len(self.numbers)), bool)
                nulls[:, j] = column.is_null().to_numpy(zero_copy_only=False)
                column = column.fill_null(0)
            numbers[self.schema[i].name] = column.to_numpy(zero_copy_only=False)
        lengths = np.zeros((n, len(self.lists)), np.int64)
        sources = []  # per list column: its items, in row order
        for j, i in enumerate(self.lists):
            column = table.column(i).combine_chunks()
            if column.values.null_count and column.flatten().null_count:
                raise ValueError(f"list field '{self.schema[i].name}' has null items")
            offsets = column.offsets.to_numpy()
            counts = np.diff(offsets)
            if column.null_count:
                null = column.is_null().to_numpy(zero_copy_only=False)
                counts = np.where(null, 0, counts)
                lengths[:, j] = np.where(null, -1, counts)
            else:
                lengths[:, j] = counts
            sources.append(column.values.to_numpy(zero_copy_only=False)[_runs(offsets[:-1], counts)])
        counts = lengths.clip(0)
        starts = _starts_of(counts.sum(axis=1))
        items = np.empty(int(starts[-1]), self.item)
        # Where each list's run begins in the row-major items: its row's start, then the
        # lists before it in the row.
        run_starts = starts[:-1, None] + np.cumsum(counts, axis=1) - counts
        for j, source in enumerate(sources):
            items[_runs(run_starts[:, j], counts[:, j])] = source
        return FeatureArrays(numbers, nulls, lengths.astype(_length_type(lengths)), starts, items)

    def to_arrow(self, rows: FeatureArrays) -> pa.Table:
        columns: list[pa.Array | None] = [None] * len(self.schema)
        for j, i in enumerate(self.numbers):
            values = np.ascontiguousarray(rows.numbers[self.schema[i].name])
            mask = None if rows.nulls is None or not rows.nulls[:, j].any() else rows.nulls[:, j]
            columns[i] = pa.array(values, type=self.schema[i].type, mask=mask)
        if self.lists:
            counts = rows.lengths.clip(0).astype(np.int64)
            # Items field after field: list j of row r goes to the j-th field's block,
            # after the lists of field j in the rows before r.
            field_totals = counts.sum(axis=0)
            field_starts = np.cumsum(field_totals) - field_totals
            within = np.cumsum(counts, axis=0) - counts
            by_field = np.empty(len(rows.items), self.item)
            by_field[_runs((field_starts + within).ravel(), counts.ravel())] = rows.items
            for j, i in enumerate(self.lists):
                offsets = np.r_[within[:, j], field_totals[j]].astype(np.int32)
                items = by_field[field_starts[j]:field_starts[j] + field_totals[j]]
                null = rows.lengths[:, j] < 0
                columns[i] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(items), type=self.schema[i].type,
                                                      mask=pa.array(null) if null.any() else None)
        return pa.Table.from_arrays(columns, schema=self.schema)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _starts_of(counts: np.ndarray) -> np.ndarray:
    starts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    return starts


def _runs(begins: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices begins[0] .. begins[0] + counts[0] - 1, then begins[1] ..., one array."""
    counts = np.asarray(counts, np.int64)
    total = int(counts.sum())
    if total == len(counts) and (not total or counts.max() == 1):  # one item each: a single-valued field
        return np.asarray(begins, np.int64)
    before = np.cumsum(counts) - counts
    return np.repeat(np.asarray(begins, np.int64) - before, counts) + np.arange(total)


def _length_type(lengths: np.ndarray) -> np.dtype:
    """The narrowest signed type for these lengths (criteo's ids: one byte a list)."""
    top = int(lengths.max()) if lengths.size else 0
    for t in (np.int8, np.int16, np.int32):
        if top <= np.iinfo(t).max:
            return np.dtype(t)
    return np.dtype(np.int64)
