"""pack_group in plain numpy: the definition csrc/pack_groups.cpp is held to, bit for bit
(see group_ids.py for the contract). Whole columns at a time, no loop over rows; it is
what picasso.batch packed with before the kernel, and what it packs with where the C++
kernels are not built.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from picasso.kernels.group_ids import GroupIds


def pack_group(columns: Sequence[pa.ListArray], id_offsets: Sequence[int], num_rows: int) -> GroupIds:
    n, num_fields = num_rows, len(columns)
    # Every field's list offsets side by side, (n + 1, fields): one numpy pass for all of
    # them instead of a few small calls per field.
    list_offsets = np.stack([c.offsets.to_numpy() for c in columns], axis=1).astype(np.int64, copy=False)
    lengths = np.diff(list_offsets, axis=0)
    # The flat values of each field (a sliced list array's values start past offset 0).
    values = [c.values.to_numpy(zero_copy_only=False)[o[0]:o[-1]]
              for c, o in zip(columns, list_offsets.T)]
    row_offsets = np.asarray(id_offsets, dtype=np.int64)
    if n and (lengths == 1).all():  # all one-hot: the common case needs no scatter
        ids = (np.stack(values, axis=1) + row_offsets).reshape(-1)
        return GroupIds(ids, np.arange(n * num_fields + 1, dtype=np.int32))
    bag_starts = np.zeros(n * num_fields + 1, dtype=np.int64)
    np.cumsum(lengths.reshape(-1), out=bag_starts[1:])
    ids = np.empty(int(bag_starts[-1]), dtype=np.int64)
    # The values arrive field after field; each bag's run moves from its place in that
    # order to its place in sample-major order, all fields in one scatter.
    field_major = lengths.T.reshape(-1)
    source_starts = np.cumsum(field_major) - field_major
    target_starts = bag_starts[:-1].reshape(n, num_fields).T.reshape(-1)
    destination = np.repeat(target_starts - source_starts, field_major) + np.arange(len(ids))
    ids[destination] = np.concatenate(values) + np.repeat(row_offsets, [len(v) for v in values])
    return GroupIds(ids, bag_starts.astype(np.int32))
