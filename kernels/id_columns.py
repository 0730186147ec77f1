"""What the decode_ids op takes and gives: the id columns of one batch, the rule that turns
each column's raw ids into rows, and the rows, bags and refusals that come back.

The op's definition is decode_ids_reference.py; csrc/decode_ids.cpp is held to it bit for
bit (tests/test_decode_ids.py).

A column is an Arrow array of n rows: ids (string, large_string or any integer type), one
per row, a null one being an empty bag; or a list (list or large_list) of such ids, a
null list being an empty bag. Its rule says what a raw id becomes:
- BUCKET: a hashed field's row, picasso.kernels.hashing.bucket_of(id, modulus);
- KEY: a dynamic field's 64-bit key, picasso.kernels.hashing.key_of(id, seed), which the C++ op
  computes from the seed's two words (hashing.key_words);
- VOCAB: the integer id itself, which must lie in [0, modulus).

A row a rule refuses gets an empty bag and one Problem per column, the first that the
decoder checks (connectors.decoding.sparse_ids), in this order: a null id in a bag; a
negative integer id where a BUCKET or KEY field wants [0, 2^64); more than max_len ids; a
VOCAB id out of range.

Feature crosses (picasso.kernels.hashing: cross) come after: cross_ids takes decoded columns of
keys (KEY, with the cross's seed), consecutive ones per cross, and gives each cross's bags
the way decode_ids gives a column's (CrossRule; its definition is cross_ids_reference.py).
Their fields refuse bad rows; a cross refuses none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from picasso.kernels.hashing import cross_start, key_words

BUCKET, KEY, VOCAB = 0, 1, 2
# How a column holds its ids (ColumnLayout): the ids' type, and whether they come in lists.
STRING, LARGE_STRING, SIGNED, UNSIGNED = range(4)
ONE_PER_ROW, LIST, LARGE_LIST = range(3)

# Problem codes, in the order the decoder checks them: a row's code is the lowest that applies.
NULL_ID, NEGATIVE_ID, TOO_LONG, OUT_OF_RANGE = 1, 2, 3, 4


@dataclass(frozen=True)
class IdRule:
    """How one column's raw ids become rows (see the module's docstring)."""

    kind: int  # BUCKET, KEY or VOCAB
    modulus: int = 0  # BUCKET: hash buckets; VOCAB: vocab size
    max_len: int = 1
    seed: int | None = None  # KEY: the field's hash_seed; None: the fixed hash

    @property
    def takes_strings(self) -> bool:
        return self.kind != VOCAB


@dataclass(frozen=True)
class IdRules:
    """The rules of many columns as one int64 matrix (a row per column), built once per
    spec: the C++ op reads it as it is, and a batch takes the rows of its columns."""

    matrix: np.ndarray  # (columns, len(RULE_FIELDS)) int64; 64-bit words as their signed bits
    rules: tuple[IdRule, ...]

    @staticmethod
    def of(rules: Sequence[IdRule]) -> "IdRules":
        rows = []
        for r in rules:
            words = key_words(r.seed) if r.kind == KEY else None
            strings, integers = words or (0, 0)
            rows.append((r.kind, r.modulus, r.max_len, _signed(strings), words is not None, _signed(integers)))
        return IdRules(np.array(rows, dtype=np.int64).reshape(len(rows), len(RULE_FIELDS)), tuple(rules))

    def __len__(self) -> int:
        return len(self.matrix)

    def take(self, columns: Sequence[int]) -> "IdRules":
        return IdRules(self.matrix[list(columns)], tuple(self.rules[c] for c in columns))


# The matrix's columns; string_start and integer_word are hashing.key_words(seed), and
# integer_mixed says whether there is a seed (else an integer id is its own key).
RULE_FIELDS = ("kind", "modulus", "max_len", "string_start", "integer_mixed", "integer_word")


@dataclass(frozen=True)
class CrossRule:
    """One cross: its fields' key columns are `count` consecutive decoded columns from
    `first`; BUCKET (modulus: hash buckets) or KEY; bags cut to max_len."""

    kind: int  # BUCKET or KEY
    first: int
    count: int
    max_len: int
    modulus: int = 0
    seed: int | None = None  # a dynamic cross's hash_seed

    def row(self) -> tuple[int, ...]:
        return (self.kind, self.modulus, self.max_len, _signed(cross_start(self.count, self.seed)), self.first,
                self.count)


# The columns of cross_ids' rules matrix (a row per cross, int64): CrossRule.row().
CROSS_FIELDS = ("kind", "modulus", "max_len", "start", "first", "count")


def cross_matrix(rules: Sequence[CrossRule]) -> np.ndarray:
    return np.array([r.row() for r in rules], dtype=np.int64).reshape(len(rules), len(CROSS_FIELDS))


@dataclass
class DecodedIds:
    """The op's result for C columns of n rows.

    Column c's ids lie in ids[starts[c] : starts[c] + offsets[c, n]], its bags given by
    offsets[c] (int32, from 0): ready to be an Arrow list column without a copy. Past its
    ids, up to the next column's start, the slots its refused rows and null lists would
    have taken are zero (each column's room is the values it was given)."""

    ids: np.ndarray  # int64
    offsets: np.ndarray  # int32 (C, n + 1)
    starts: np.ndarray  # int64 (C,)
    problems: np.ndarray  # int64 (P, 4): column, row, code, detail; by column, then row
    # detail: NEGATIVE_ID, the row's first negative id; TOO_LONG, its number of ids; else 0.


@dataclass(frozen=True)
class ColumnLayout:
    """The shape of a column the op takes (see the module's docstring)."""

    value_kind: int  # STRING, LARGE_STRING, SIGNED or UNSIGNED
    width: int  # bytes per integer id; 0 for strings
    bag_kind: int  # ONE_PER_ROW, LIST or LARGE_LIST

    @property
    def strings(self) -> bool:
        return self.width == 0


def column_layout(t: pa.DataType) -> ColumnLayout | None:
    """The layout of a column of Arrow type t, or None where the op does not take it.
    Asked once per type, and found by the type's id: hashing a pyarrow DataType costs
    more than a microsecond, which at 400 columns a batch adds up."""
    key = t.id
    if key in _LIST_IDS:
        key = (key, t.value_type.id)
    try:
        return _LAYOUTS[key]
    except KeyError:
        layout = _LAYOUTS[key] = _layout(t)
        return layout


_LIST_IDS = frozenset((pa.list_(pa.int8()).id, pa.large_list(pa.int8()).id))
_LAYOUTS: dict[int | tuple[int, int], ColumnLayout | None] = {}


def _layout(t: pa.DataType) -> ColumnLayout | None:
    bag_kind = LARGE_LIST if pa.types.is_large_list(t) else LIST if pa.types.is_list(t) else ONE_PER_ROW
    ids = t.value_type if bag_kind != ONE_PER_ROW else t
    if pa.types.is_integer(ids):
        return ColumnLayout(SIGNED if pa.types.is_signed_integer(ids) else UNSIGNED, ids.bit_width // 8, bag_kind)
    if pa.types.is_string(ids) or pa.types.is_large_string(ids):
        return ColumnLayout(LARGE_STRING if pa.types.is_large_string(ids) else STRING, 0, bag_kind)
    return None


def _signed(word: int) -> int:
    return word - (1 << 64) if word >= 1 << 63 else word
