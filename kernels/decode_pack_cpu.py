"""decode_pack on the C++ kernel (csrc/decode_pack.cpp): the batch exported once through
the Arrow C data interface (RecordBatch._export_to_c into two structs allocated here), the
plan made into the kernel's own object once per FusedPlan, and one call.

The kernel releases the exported structs itself, however it returns; it is called right
after the export, so nothing else can leave them unreleased.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import torch

from picasso.kernels.fused_batch import FusedBatch, FusedPlan
from picasso.kernels.group_ids import GroupIds

# sizeof(struct ArrowArray) and sizeof(struct ArrowSchema), in int64 words.
_ARRAY_WORDS, _SCHEMA_WORDS = 10, 9
_PLAN = "_decode_pack_cpu"  # where a FusedPlan keeps the kernel's object of it


def fused_packer(kernel: Callable, plan_type: type) -> Callable[[FusedPlan, pa.RecordBatch], FusedBatch | None]:
    """decode_pack over the extension's kernel (picasso_kernels.decode_pack)."""

    def decode_pack(plan: FusedPlan, batch: pa.RecordBatch) -> FusedBatch | None:
        handle = plan.__dict__.get(_PLAN)
        if handle is None:  # a frozen dataclass: kept beside its fields, as PackingPlan.for_part keeps its parts
            handle = plan.__dict__[_PLAN] = plan_type(
                plan.label, list(plan.dense), list(plan.log1p), list(plan.sparse),
                torch.from_numpy(np.ascontiguousarray(plan.rules.matrix)), [list(g) for g in plan.groups],
                [list(o) for o in plan.id_offsets], plan.require_label, plan.reject_unknown)
        array, schema = np.zeros(_ARRAY_WORDS, np.int64), np.zeros(_SCHEMA_WORDS, np.int64)
        batch._export_to_c(array.ctypes.data, schema.ctypes.data)
        out = kernel(handle, array.ctypes.data, schema.ctypes.data)
        if not out:
            return None
        label, dense, valid, verdicts, absent, *groups = (t.numpy() for t in out)
        return FusedBatch(label, dense, valid, verdicts, absent,
                          [GroupIds(ids, starts) for ids, starts in zip(groups[::2], groups[1::2])])

    return decode_pack
