"""Every sparse column of a batch checked into bags of rows in one kernel call
(picasso.kernels.decode_ids: the C++ op, or its numpy reference where the C++ backend is
unavailable), with the verdicts decoding.sparse_ids gives.

The kernel takes the columns of one Arrow type of ids (strings, or integers of any
width), alone or in lists: what Parquet files, Arrow batches and the JSON fast path give.
Any other column (Python values from json.loads, mixed types, dictionaries, floats, a
vocab field's strings) goes to sparse_ids.sparse_bags, the path that names each culprit.
Either way a row keeps the reason of the first check it failed: fields are judged in spec
order, and within a field the kernel reports the first problem in sparse_bags' order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from picasso import kernels
from picasso.connectors.decoding.contracts import Verdicts
from picasso.connectors.decoding.sparse_ids import (id_reason, null_id_reason, out_of_range_reason, sparse_bags,
                                                    too_long_reason)
from picasso.kernels.id_columns import (BUCKET, KEY, NEGATIVE_ID, NULL_ID, OUT_OF_RANGE, TOO_LONG, VOCAB, DecodedIds,
                                        IdRule, IdRules, column_layout)
from picasso.spec import SparseField

_BAGS = pa.list_(pa.int64())

# Why a field refuses a row, by the kernel's problem code and its detail; in the order the
# codes are applied (sparse_bags' order).
_REASONS = {
    NULL_ID: lambda f, detail: null_id_reason(f),
    NEGATIVE_ID: lambda f, detail: id_reason(f, detail),
    TOO_LONG: lambda f, detail: too_long_reason(f, detail),
    OUT_OF_RANGE: lambda f, detail: out_of_range_reason(f),
}


def id_rule(f: SparseField) -> IdRule:
    """What the kernel makes of a field's raw ids: picasso.hashing's bucket or key, or the
    vocab id itself."""
    if f.hashed:
        return IdRule(BUCKET, f.hash_buckets, f.max_len)
    if f.dynamic is not None:
        return IdRule(KEY, 0, f.max_len, seed=f.dynamic.hash_seed)
    return IdRule(VOCAB, f.vocab_size, f.max_len)


class SparseColumns:
    """The sparse fields of a spec, with their rules made once."""

    def __init__(self, fields: Sequence[SparseField]):
        self.fields = tuple(fields)
        self.rules = IdRules.of([id_rule(f) for f in self.fields])

    def bags(self, columns: dict[str, object], n: int, verdicts: Verdicts) -> dict[str, pa.ListArray]:
        """Each field's bags of rows (before packing offsets), one per row; bad rows refused."""
        chosen = [i for i, f in enumerate(self.fields) if fits_kernel(f, columns.get(f.name), n)]
        bags = {}
        if chosen:
            rules = self.rules if len(chosen) == len(self.fields) else self.rules.take(chosen)
            decoded = kernels.decode_ids([columns[self.fields[i].name] for i in chosen], rules, n)
            bags = dict(zip(chosen, zip(_list_arrays(decoded, n), _problems_by_column(decoded, len(chosen)))))
        out = {}
        for i, f in enumerate(self.fields):
            if i in bags:
                out[f.name], problems = bags[i]
                if problems is not None:
                    _refuse(f, problems, verdicts)
            else:
                out[f.name] = sparse_bags(f, columns.get(f.name), n, verdicts)
        return out


def fits_kernel(f: SparseField, values, n: int) -> bool:
    """Whether the kernel takes this column: one Arrow type of ids, alone or in lists (a
    vocab field's ids must be integers)."""
    if not isinstance(values, pa.Array) or len(values) != n:
        return False
    layout = column_layout(values.type)
    return layout is not None and (f.takes_strings or not layout.strings)


def _list_arrays(decoded: DecodedIds, n: int) -> list[pa.ListArray]:
    """One list<int64> array per column, on the kernel's buffers (no copy). Each column
    gets slices of its own: an array over a shared buffer would pickle all of it (Beam
    pickles decoded tables between stages), 400 columns' ids for each column."""
    ids, offsets = pa.py_buffer(decoded.ids), pa.py_buffer(decoded.offsets)
    width = (n + 1) * decoded.offsets.itemsize
    lengths = decoded.offsets[:, n].tolist()
    return [
        pa.Array.from_buffers(_BAGS, n, [None, offsets.slice(c * width, width)],
                              children=[pa.Array.from_buffers(pa.int64(), length, [None, ids.slice(8 * start, 8 * length)])])
        for c, (start, length) in enumerate(zip(decoded.starts.tolist(), lengths))
    ]


def _problems_by_column(decoded: DecodedIds, columns: int) -> list[np.ndarray | None]:
    """Each column's (column, row, code, detail) rows, None where it refused no row."""
    if not len(decoded.problems):  # the usual case
        return [None] * columns
    bounds = np.searchsorted(decoded.problems[:, 0], np.arange(columns + 1))
    return [decoded.problems[bounds[c]:bounds[c + 1]] if bounds[c + 1] > bounds[c] else None
            for c in range(columns)]


def _refuse(f: SparseField, problems: np.ndarray, verdicts: Verdicts) -> None:
    for code, reason in _REASONS.items():
        found = problems[problems[:, 2] == code]
        if len(found):
            detail = dict(zip(found[:, 1].tolist(), found[:, 3].tolist()))
            verdicts.refuse(found[:, 1], lambda i, reason=reason: reason(f, detail[i]))
