"""Every sparse column of a batch checked into bags of rows in one kernel call
(picasso.kernels.decode_ids: the C++ op, or its numpy reference where the C++ backend is
unavailable), with the verdicts decoding.sparse_ids gives.

The kernel takes the columns of one Arrow type of ids (strings, or integers of any
width), alone or in lists: what Parquet files, Arrow batches and the JSON fast path give.
Any other column (Python values from json.loads, mixed types, dictionaries, floats, a
vocab field's strings) goes to sparse_ids.sparse_bags, the path that names each culprit.
Either way a row keeps the reason of the first check it failed: fields are judged in spec
order, and within a field the kernel reports the first problem in sparse_bags' order.

Feature crosses (picasso.kernels.hashing: cross) follow their fields: each field's ids decoded as
keys (in the same kernel call where the column fits it, else by sparse_bags, so both give
one key per id), then every cross of the batch hashed in one kernels.cross_ids call. A
cross refuses no row: its fields judge the row, and a row missing one of them has an
empty bag of crosses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from picasso import kernels
from picasso.connectors.decoding.contracts import Verdicts
from picasso.connectors.decoding.sparse_ids import (id_reason, null_id_reason, out_of_range_reason, sparse_bags,
                                                    too_long_reason)
from picasso.kernels.id_columns import (BUCKET, KEY, NEGATIVE_ID, NULL_ID, OUT_OF_RANGE, TOO_LONG, VOCAB, CrossRule,
                                        DecodedIds, IdRule, IdRules, column_layout)
from picasso.spec import DynamicTable, SparseField

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
    """What the kernel makes of a field's raw ids: picasso.kernels.hashing's bucket or key, or the
    vocab id itself."""
    if f.hashed:
        return IdRule(BUCKET, f.hash_buckets, f.max_len)
    if f.dynamic is not None:
        return IdRule(KEY, 0, f.max_len, seed=f.dynamic.hash_seed)
    return IdRule(VOCAB, f.vocab_size, f.max_len)


def key_field(f: SparseField, cross: SparseField) -> SparseField:
    """Field f as a cross reads it: its ids as keys (KEY), keyed by the cross's seed."""
    seed = cross.dynamic.hash_seed if cross.dynamic is not None else None
    return SparseField(f.name, 1, max_len=f.max_len, dynamic=DynamicTable(capacity=1, hash_seed=seed))


class SparseColumns:
    """The sparse fields of a spec and its crosses, with their rules made once."""

    def __init__(self, fields: Sequence[SparseField], crosses: Sequence[SparseField] = ()):
        self.fields = tuple(fields)
        self.crosses = tuple(crosses)
        by_name = {f.name: f for f in self.fields}
        # Per cross, its fields as keys; their rules follow the fields' in one IdRules.
        self.members = [[key_field(by_name[name], cross) for name in cross.cross_of] for cross in self.crosses]
        self.rules = IdRules.of([id_rule(f) for f in self.fields] + [id_rule(m) for ms in self.members for m in ms])
        self.first_member = np.cumsum([len(self.fields)] + [len(ms) for ms in self.members]).tolist()
        self.column_names = [f.name for f in self.fields] + [m.name for ms in self.members for m in ms]  # by rule

    def bags(self, columns: dict[str, object], n: int, verdicts: Verdicts) -> dict[str, pa.ListArray]:
        """Each field's bags of rows (before packing offsets), one per row, bad rows
        refused; then each cross's."""
        chosen = [i for i, f in enumerate(self.fields) if fits_kernel(f, columns.get(f.name), n)]
        # Crosses whose every field the kernel takes: their keys decode in the same call.
        fast = [x for x, members in enumerate(self.members)
                if all(fits_kernel(m, columns.get(m.name), n) for m in members)]
        taken = chosen + [self.first_member[x] + k for x in fast for k in range(len(self.members[x]))]
        bags, decoded = {}, None
        if taken:
            rules = self.rules if len(taken) == len(self.rules) else self.rules.take(taken)
            decoded = kernels.decode_ids([columns[self.column_names[c]] for c in taken], rules, n)
            bags = dict(zip(chosen, zip(_list_arrays(decoded, n, len(chosen)), _problems_by_column(decoded, len(chosen)))))
        out = {}
        for i, f in enumerate(self.fields):
            if i in bags:
                out[f.name], problems = bags[i]
                if problems is not None:
                    _refuse(f, problems, verdicts)
            else:
                out[f.name] = sparse_bags(f, columns.get(f.name), n, verdicts)
        if self.crosses:
            out.update(self._crosses(columns, n, fast, decoded, len(chosen)))
        return out

    def _crosses(self, columns: dict[str, object], n: int, fast: list[int], decoded: DecodedIds | None,
                 first: int) -> dict[str, pa.ListArray]:
        """The crosses' bags: those in `fast` from the decoded key columns after the first
        `first` (the fields'), the others from their fields' keys by sparse_bags."""
        out = {}
        if fast:
            crossed = kernels.cross_ids(decoded.ids, decoded.offsets, decoded.starts, self._rules(fast, first), n)
            out.update(zip((self.crosses[x].name for x in fast), _list_arrays(crossed, n)))
        slow = [x for x in range(len(self.crosses)) if x not in set(fast)]
        if slow:
            # A field's refusals are its own (already judged): this Verdicts is a scratch pad.
            scratch = Verdicts(n)
            keys = [sparse_bags(m, columns.get(m.name), n, scratch) for x in slow for m in self.members[x]]
            ids, offsets, starts = _layout(keys, n)
            crossed = kernels.cross_ids(ids, offsets, starts, self._rules(slow, 0), n)
            out.update(zip((self.crosses[x].name for x in slow), _list_arrays(crossed, n)))
        return {cross.name: out[cross.name] for cross in self.crosses}

    def _rules(self, crosses: list[int], first: int) -> list[CrossRule]:
        """The rules of these crosses, whose fields' key columns follow one another from `first`."""
        rules = []
        for x in crosses:
            rules.append(cross_rule(self.crosses[x], first))
            first += len(self.members[x])
        return rules


def cross_rule(cross: SparseField, first: int) -> CrossRule:
    """What kernels.cross_ids makes of a cross whose fields' keys start at column `first`."""
    seed = cross.dynamic.hash_seed if cross.dynamic is not None else None
    return CrossRule(BUCKET if cross.hashed else KEY, first, len(cross.cross_of), cross.max_len,
                     cross.hash_buckets or 0, seed)


def _layout(bags: list[pa.ListArray], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """List arrays of keys as decoded columns (DecodedIds' ids, offsets and starts)."""
    offsets = np.zeros((len(bags), n + 1), dtype=np.int32)
    values = []
    for c, bag in enumerate(bags):
        list_offsets = bag.offsets.to_numpy()
        offsets[c] = list_offsets - list_offsets[0]
        values.append(bag.values.slice(list_offsets[0], list_offsets[-1] - list_offsets[0]).to_numpy())
    starts = np.concatenate([[0], np.cumsum([len(v) for v in values])[:-1]]).astype(np.int64)
    return (np.concatenate(values).astype(np.int64) if values else np.zeros(0, np.int64)), offsets, starts


def fits_kernel(f: SparseField, values, n: int) -> bool:
    """Whether the kernel takes this column: one Arrow type of ids, alone or in lists (a
    vocab field's ids must be integers)."""
    if not isinstance(values, pa.Array) or len(values) != n:
        return False
    layout = column_layout(values.type)
    return layout is not None and (f.takes_strings or not layout.strings)


def _list_arrays(decoded: DecodedIds, n: int, columns: int | None = None) -> list[pa.ListArray]:
    """One list<int64> array per column (the first `columns`, or all), on the kernel's
    buffers (no copy). Each column gets slices of its own: an array over a shared buffer
    would pickle all of it (Beam pickles decoded tables between stages), 400 columns' ids
    for each column."""
    ids, offsets = pa.py_buffer(decoded.ids), pa.py_buffer(decoded.offsets)
    width = (n + 1) * decoded.offsets.itemsize
    lengths = decoded.offsets[:columns, n].tolist()
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
    for code in _REASONS:
        found = problems[problems[:, 2] == code]
        if len(found):
            detail = dict(zip(found[:, 1].tolist(), found[:, 3].tolist()))
            verdicts.refuse(found[:, 1], lambda i, code=code: problem_reason(f, code, detail[i]))


def problem_reason(f: SparseField, code: int, detail: int) -> str:
    """Why field f refuses a row, from a kernel's problem code and detail (id_columns)."""
    return _REASONS[code](f, detail)
