"""pack_group on the C++ kernel (csrc/pack_groups.cpp): the Arrow arrays of a group's
fields described by the addresses of their buffers (decode_ids_cpu.buffer_row), one int64
row per field beside its id offset, and handed over in one call.

Addresses rather than tensors or numpy views: at hundreds of fields the reference's few
calls per field (offsets.to_numpy, values.to_numpy...) cost more than moving the ids. The
arrays stay referenced by the caller until the call returns, and the kernel only reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import torch

from picasso.kernels import pack_groups_reference
from picasso.kernels.decode_ids_cpu import BUFFER_FIELDS, buffer_row
from picasso.kernels.group_ids import GroupIds
from picasso.kernels.id_columns import LARGE_LIST, ONE_PER_ROW, SIGNED, column_layout

# A field's row as the kernel's enum Field reads it: these buffer fields of buffer_row, in
# this order (bag_kind becomes 1 for int64 list offsets), then the field's id offset.
_TAKEN = ("bag_offsets", "bag_kind", "bag_start", "values", "value_start")
FIELD_COLUMNS = (*_TAKEN, "id_offset")
_PICK = [BUFFER_FIELDS.index(name) for name in _TAKEN]
_KIND, _WIDTH, _NULL_IDS, _BAGS = (BUFFER_FIELDS.index(name) for name in
                                   ("value_kind", "value_width", "value_validity", "bag_kind"))


def packer(kernel: Callable) -> Callable[[Sequence[pa.ListArray], Sequence[int], int], GroupIds]:
    """pack_group over the extension's kernel (picasso_kernels.pack_groups.pack)."""

    def pack_group(columns: Sequence[pa.ListArray], id_offsets: Sequence[int], num_rows: int) -> GroupIds:
        buffers = _buffers(columns) if num_rows else None
        if buffers is None:  # no rows, or columns the kernel does not read: the definition
            return pack_groups_reference.pack_group(columns, id_offsets, num_rows)
        fields = np.empty((len(columns), len(FIELD_COLUMNS)), dtype=np.int64)
        fields[:, : len(_TAKEN)] = buffers[:, _PICK]
        fields[:, 1] = buffers[:, _BAGS] == LARGE_LIST
        fields[:, -1] = id_offsets
        ids, bag_starts = kernel(torch.from_numpy(fields), int(num_rows))
        return GroupIds(ids.numpy(), bag_starts.numpy())

    return pack_group


def _buffers(columns: Sequence[pa.ListArray]) -> np.ndarray | None:
    """The columns' buffer rows (decode_ids_cpu.BUFFER_FIELDS), or None unless every column
    is a list or large list of int64 ids without nulls, which is what the kernel reads."""
    if any(column_layout(c.type) is None for c in columns):
        return None
    buffers = np.array([buffer_row(c) for c in columns], dtype=np.int64).reshape(-1, len(BUFFER_FIELDS))
    taken = ((buffers[:, _KIND] == SIGNED) & (buffers[:, _WIDTH] == 8) & (buffers[:, _NULL_IDS] == 0)
             & (buffers[:, _BAGS] != ONE_PER_ROW))
    return buffers if taken.all() else None
