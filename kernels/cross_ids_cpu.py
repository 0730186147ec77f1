"""cross_ids on the C++ kernel (csrc/cross_ids.cpp): the fields' decoded keys and the
crosses' rules (id_columns.cross_matrix) handed over as tensors on the same memory, and
the crosses handed back as numpy arrays on the kernel's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from picasso.kernels.id_columns import CrossRule, DecodedIds, cross_matrix

_NO_PROBLEMS = np.zeros((0, 4), dtype=np.int64)


def crosser(kernel: Callable) -> Callable[[np.ndarray, np.ndarray, np.ndarray, Sequence[CrossRule], int], DecodedIds]:
    """cross_ids over the extension's kernel (picasso_kernels.cross_ids.cross)."""

    def cross_ids(ids: np.ndarray, offsets: np.ndarray, starts: np.ndarray, rules: Sequence[CrossRule],
                  num_rows: int) -> DecodedIds:
        out_ids, out_offsets, out_starts = kernel(_tensor(ids, np.int64), _tensor(offsets, np.int32),
                                                  _tensor(starts, np.int64), torch.from_numpy(cross_matrix(rules)),
                                                  int(num_rows))
        # A cross refuses no row: its fields judge them (id_columns).
        return DecodedIds(out_ids.numpy(), out_offsets.numpy(), out_starts.numpy(), _NO_PROBLEMS)

    return cross_ids


def _tensor(values: np.ndarray, dtype: type) -> torch.Tensor:
    """A tensor on the array's memory where it is contiguous, of the type, and writable (the
    kernel only reads it, but torch warns of a read-only array); else on a copy."""
    return torch.from_numpy(np.require(values, dtype, ("C", "W")))
