"""What the decode_pack op takes and gives: a raw Arrow record batch and a spec's plan in;
the packed tensors of the rows kept and each refused row's first failed check out, in one
call and with no canonical table between (csrc/decode_pack.cpp).

Its definition is the reference path, connectors.decoding's RecordDecoder.decode_table
followed by picasso.batch.pack (connectors.decoding.packed_decode takes one or the other,
tests/test_decode_pack.py holds them together): the same rows kept, the same packed
values bit for bit, the same first reason for every refused row, the same absent counts.

The op declines a batch (None) that has a column of a type it does not judge as the
validator does; the caller then takes the reference path. It takes: label and dense
columns of integers (any width, signed or not), float32, float64 or Arrow's null type;
sparse columns of string or large_string ids (hashed and dynamic fields) or integer ids,
one per row or in a list or large_list, or of the null type; missing columns; columns no
field names (ignored) unless the plan refuses unknown fields. Anything else (a
dictionary, booleans, float16, decimals, binary, list<null>, nested lists, a vocab
field's strings) it declines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from picasso.kernels.group_ids import GroupIds
from picasso.kernels.id_columns import IdRules

# A verdict's stage: the check that refused the row (KEPT: none), in the validator's order.
KEPT, LABEL, DENSE, SPARSE = range(4)
# A LABEL verdict's code. A SPARSE verdict's code is id_columns' problem (NULL_ID...); a
# DENSE verdict has none (its value says whether it is not finite or overflows a float32).
MISSING_LABEL, LABEL_NOT_FINITE, LABEL_OUT_OF_RANGE = 1, 2, 3
# The columns of FusedBatch.verdicts.
VERDICT_FIELDS = ("row", "stage", "code", "field", "detail")


@dataclass(frozen=True)
class FusedPlan:
    """A spec and packing plan as the op reads them, made once per spec."""

    label: str
    require_label: bool
    dense: tuple[str, ...]
    log1p: tuple[bool, ...]  # per dense field: a log1p field's values never overflow a float32
    sparse: tuple[str, ...]
    rules: IdRules  # per sparse field (id_columns.IdRule)
    groups: tuple[tuple[int, ...], ...]  # per packing group: its fields, as indices into `sparse`
    id_offsets: tuple[tuple[int, ...], ...]  # per packing group: PackedGroup.id_offsets
    reject_unknown: bool  # a column no field names declines the batch (the reference refuses its rows)


@dataclass
class FusedBatch:
    """The op's result for a batch of n rows, m of them kept (in order).

    dense holds the values as read (nulls 0, -0.0 as 0.0) before the dense transform, which
    is the caller's: numpy's log1p is the definition and may differ from libm's in the last
    bit. verdicts has a row per refused row, by row: its stage, code, field (a dense field's
    index, or a sparse field's into FusedPlan.sparse) and detail (a LABEL or DENSE value's
    float64 bits; a SPARSE problem's detail, as id_columns.DecodedIds gives it)."""

    label: np.ndarray  # float32 (m,)
    dense: np.ndarray  # float64 (m, dense fields)
    valid: np.ndarray  # bool (n,)
    verdicts: np.ndarray  # int64 (n - m, len(VERDICT_FIELDS))
    absent: np.ndarray  # int64 (dense + sparse fields,): kept rows lacking each feature
    groups: list[GroupIds]  # per packing group


def detail_value(detail: int) -> np.float64:
    """A LABEL or DENSE verdict's value, from its bits."""
    return np.array([detail], dtype=np.int64).view(np.float64)[0]
