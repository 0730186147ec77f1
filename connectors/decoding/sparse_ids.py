"""A sparse field's column checked into bags of row ids: an id, or a list of at most
max_len ids, per row; a missing value is an empty bag.

Hashed and dynamic fields take string or integer ids (integers in [0, 2^64)); vocab
fields take integers in [0, vocab_size). A column with one Arrow type of ids is checked
with vectorised ops; only one with no single type (mixed JSON values) is walked id by id,
and both give a refused row the same reason, for the same first bad id.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from picasso.connectors.decoding.columns import as_arrow_array, describe, has_negative, null_mask
from picasso.connectors.decoding.contracts import Verdicts
from picasso.connectors.decoding.id_bucketing import row_of, string_id_rows
from picasso.spec import SparseField

_NULL_ID = "null id in bag"
_UINT64_END = 1 << 64


def sparse_bags(f: SparseField, values, n: int, verdicts: Verdicts) -> pa.ListArray:
    """Bags of row indices (before packing offsets), one per row; bad rows refused."""
    if values is None:
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.int64()))
    arr = as_arrow_array(values)
    parts = _id_parts(arr, n) if arr is not None else None
    if parts is not None:
        lengths, flat, null_ids = parts
        ids = flat.fill_null(0 if pa.types.is_integer(flat.type) else "") if flat.null_count else flat
        # owner: the row of each id; built only when some id may need refusing.
        negative_ids = f.takes_strings and has_negative(ids)
        owner = (np.repeat(np.arange(n), lengths) if not f.takes_strings or null_ids.any() or negative_ids
                 else None)
        if null_ids.any():
            verdicts.refuse(owner[null_ids], lambda i: null_id_reason(f))
        if f.takes_strings:
            if negative_ids:
                negative = ids.to_numpy(zero_copy_only=False) < 0
                first = _first_per_row(owner, negative, ids)
                verdicts.refuse(owner[negative], lambda i: id_reason(f, first[i]))
            rows = string_id_rows(f, ids)
        elif pa.types.is_integer(ids.type):
            rows = ids.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            rows = np.zeros(len(ids), np.int64)
            first = _first_per_row(owner, np.ones(len(ids), dtype=bool), ids)
            verdicts.refuse(lengths > 0, lambda i: id_reason(f, first[i]))
    else:
        items = values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else list(values)
        lengths, rows, owner = _bags_one_by_one(f, items, verdicts)
    verdicts.refuse(lengths > f.max_len, lambda i: too_long_reason(f, lengths[i]))
    if f.vocab_size is not None:
        out_of_range = (rows < 0) | (rows >= f.vocab_size)
        verdicts.refuse(owner[out_of_range], lambda i: out_of_range_reason(f))
        rows = np.where(out_of_range, 0, rows)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(rows, pa.int64()))


def _bags_one_by_one(f: SparseField, items: list, verdicts: Verdicts):
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
        rows.extend(row_of(v, f) for v in bag)
        owner.extend([i] * len(bag))
    return lengths, np.array(rows, dtype=np.int64), np.array(owner, dtype=np.int64)


# Why a field refuses a row: one text per check, whichever path (this module's, or the
# kernel's: decoding.batch_ids) found it.
def null_id_reason(f: SparseField) -> str:
    return f"field '{f.name}': {_NULL_ID}"


def id_reason(f: SparseField, value) -> str:
    return f"field '{f.name}': {_id_problem(value, f)}"


def too_long_reason(f: SparseField, length: int) -> str:
    return f"field '{f.name}': {length} ids, more than max_len {f.max_len}"


def out_of_range_reason(f: SparseField) -> str:
    return f"field '{f.name}': {_out_of_range(f)}"


def _out_of_range(f: SparseField) -> str:
    return f"id out of range [0, {f.vocab_size})"


def _id_problem(value, f: SparseField) -> str | None:
    """Why one raw id is refused, or None.

    Hashed fields take strings and integers in [0, 2^64): a negative or wider integer
    has no single unsigned 64-bit reading (a signed hash? a bug?), so it is refused
    rather than wrapped. Out-of-range vocab ids are refused by the caller, which checks
    whole columns at once.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, str) and not f.takes_strings):
        kind = "integer or string" if f.takes_strings else "integer"
        return f"expected {kind} ids, got {describe(value)}"
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
        return lengths, flat, null_mask(flat, len(flat))
    if not _id_type_ok(arr.type):
        return None
    # A single id per row is a bag of one; a missing one, an empty bag.
    present = ~null_mask(arr, n)
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
