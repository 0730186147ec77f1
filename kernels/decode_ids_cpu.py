"""decode_ids on the C++ kernel (csrc/decode_ids.cpp): the Arrow arrays of a batch's id
columns described by the addresses of their buffers, one int64 row per column, beside
the columns' rules, and handed over in one call.

Addresses rather than tensors: a tensor per buffer costs microseconds each, which at 400
columns of three or four buffers is a millisecond before the kernel starts. The arrays
stay referenced by the caller until the call returns, and the kernel only reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import torch

from picasso.kernels.id_columns import ONE_PER_ROW, DecodedIds, IdRules, column_layout

# The buffer fields of a column's row, before its rule (id_columns.RULE_FIELDS): the
# kernel's enum Column names them in this order, and its kinds are id_columns' (STRING...).
BUFFER_FIELDS = ("value_kind", "value_width", "values", "value_offsets", "value_validity", "value_start",
                 "bag_kind", "bag_offsets", "bag_validity", "bag_start")


def decoder(kernel: Callable) -> Callable[[Sequence[pa.Array], IdRules, int], DecodedIds]:
    """decode_ids over the extension's kernel (picasso_kernels.decode_ids.decode)."""

    def decode_ids(columns: Sequence[pa.Array], rules: IdRules, num_rows: int) -> DecodedIds:
        buffers = np.array([buffer_row(arr) for arr in columns], dtype=np.int64).reshape(-1, len(BUFFER_FIELDS))
        table = np.concatenate([buffers, rules.matrix], axis=1)
        ids, offsets, starts, problems = kernel(torch.from_numpy(table), int(num_rows))
        return DecodedIds(ids.numpy(), offsets.numpy(), starts.numpy(), problems.numpy())

    return decode_ids


def buffer_row(arr: pa.Array) -> tuple[int, ...]:
    """A column's BUFFER_FIELDS. The values of a list column are its child array (whose own
    element offset applies); the list's offsets index into that child."""
    layout = column_layout(arr.type)
    if layout.bag_kind == ONE_PER_ROW:
        bags = (ONE_PER_ROW, 0, 0, 0)
    else:
        validity, offsets = arr.buffers()[:2]
        bags = (layout.bag_kind, offsets.address, _address(validity) if arr.null_count else 0, arr.offset)
        arr = arr.values
    buffers = arr.buffers()
    validity = _address(buffers[0]) if arr.null_count else 0
    if layout.width:
        return (layout.value_kind, layout.width, _address(buffers[1]), 0, validity, arr.offset) + bags
    return (layout.value_kind, 0, _address(buffers[2]), _address(buffers[1]), validity, arr.offset) + bags


def _address(buffer: pa.Buffer | None) -> int:
    return buffer.address if buffer is not None else 0
