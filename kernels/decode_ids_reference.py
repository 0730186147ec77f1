"""decode_ids in plain numpy and pyarrow: the definition csrc/decode_ids.cpp is held to,
bit for bit (see id_columns.py for the contract). The rows come from picasso.kernels.hashing's
own column functions, the ones serving uses.

Column by column: which values belong to a bag (a null list's values do not; nor, for ids
one per row, a null id), each row's first problem, and the ids of the rows kept, packed
from the column's start, the rest of its room zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from picasso.kernels.hashing import hash_to_buckets, keys_of
from picasso.kernels.id_columns import (BUCKET, KEY, NEGATIVE_ID, NULL_ID, OUT_OF_RANGE, TOO_LONG, DecodedIds,
                                        IdRule, IdRules)


def decode_ids(columns: Sequence[pa.Array], rules: IdRules, num_rows: int) -> DecodedIds:
    parts = [_column(arr, rule, num_rows) for arr, rule in zip(columns, rules.rules)]
    rooms = [len(ids) for ids, _, _ in parts]
    starts = np.concatenate([[0], np.cumsum(rooms)[:-1]]).astype(np.int64) if parts else np.zeros(0, np.int64)
    problems = [np.column_stack([np.full(len(p), c), p]) for c, (_, _, p) in enumerate(parts)]
    return DecodedIds(
        ids=np.concatenate([ids for ids, _, _ in parts]) if parts else np.zeros(0, np.int64),
        offsets=np.stack([offsets for _, offsets, _ in parts]) if parts else np.zeros((0, num_rows + 1), np.int32),
        starts=starts,
        problems=np.concatenate(problems).astype(np.int64) if problems else np.zeros((0, 4), np.int64),
    )


def _column(arr: pa.Array, rule: IdRule, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids in the column's room, bag offsets, problems as (row, code, detail) rows)."""
    bags = pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
    if bags:
        list_offsets = arr.offsets.to_numpy().astype(np.int64)
        values = arr.values.slice(list_offsets[0], list_offsets[-1] - list_offsets[0])
        owner = np.repeat(np.arange(n), np.diff(list_offsets))
        member = _valid(arr)[owner]
        null_id = member & ~_valid(values)
    else:
        values, owner = arr, np.arange(n)
        member = _valid(arr)
        null_id = np.zeros(n, dtype=bool)
    integers = pa.types.is_integer(values.type)
    plain = values.fill_null(0 if integers else "") if values.null_count else values
    numbers = plain.to_numpy(zero_copy_only=False) if integers else None
    present = member & ~null_id
    lengths = np.bincount(owner[member], minlength=n)

    code = np.zeros(n, dtype=np.int64)
    detail = np.zeros(n, dtype=np.int64)
    code[owner[null_id]] = NULL_ID
    if rule.takes_strings and integers and pa.types.is_signed_integer(values.type):
        negative = np.flatnonzero(present & (numbers < 0))
        rows, first = np.unique(owner[negative], return_index=True)  # a row's first negative id
        fresh = code[rows] == 0
        code[rows[fresh]], detail[rows[fresh]] = NEGATIVE_ID, numbers[negative[first[fresh]]]
    too_long = (code == 0) & (lengths > rule.max_len)
    code[too_long], detail[too_long] = TOO_LONG, lengths[too_long]
    if not rule.takes_strings:
        out_of_range = np.zeros(n, dtype=bool)
        out_of_range[owner[present & _outside(numbers, rule.modulus)]] = True
        code[out_of_range & (code == 0)] = OUT_OF_RANGE

    kept = member & (code[owner] == 0)
    ids = np.zeros(len(values), dtype=np.int64)
    ids[: np.count_nonzero(kept)] = _rows(plain, numbers, rule)[kept]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(code == 0, lengths, 0), out=offsets[1:])
    refused = np.flatnonzero(code)
    return ids, offsets, np.column_stack([refused, code[refused], detail[refused]])


def _rows(plain: pa.Array, numbers: np.ndarray | None, rule: IdRule) -> np.ndarray:
    if rule.kind == BUCKET:
        return hash_to_buckets(plain, rule.modulus)
    if rule.kind == KEY:
        return keys_of(plain, rule.seed)
    return numbers.astype(np.int64)


def _outside(numbers: np.ndarray, modulus: int) -> np.ndarray:
    """Vocab ids outside [0, modulus); an unsigned id past 2^63 is too."""
    if numbers.dtype.kind == "u":
        return numbers >= np.uint64(modulus)
    return (numbers < 0) | (numbers >= modulus)


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return pc.is_valid(arr).to_numpy(zero_copy_only=False)
