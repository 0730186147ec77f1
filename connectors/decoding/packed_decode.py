"""A raw Arrow batch decoded and packed in one pass: PackedBatch, dead letters and absent
counts from one kernel call (picasso.kernels.decode_pack), with no canonical table between.

The reference path, RecordDecoder.decode_table then picasso.batch.pack, is the definition;
tests/test_decode_pack.py holds the one pass to it. Which batches take which path:
- one pass: a RecordBatch (or a Table of one chunk per column) whose columns are all types
  the kernel judges as the validator does (kernels/fused_batch.py lists them: integer and
  float label and dense columns, string or integer ids alone or in lists, null-typed and
  missing columns, columns no field names), decoded with the C++ kernels built;
- the reference: a spec with feature crosses, a decoder that reads join events, a Table of
  several chunks, a column of another type (dictionaries, booleans, float16, a vocab
  field's strings...: the kernel declines the batch), a column no field names when
  unknown fields are refused, or no C++ backend (PICASSO_KERNELS=reference, no compiler).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from picasso import kernels
from picasso.batch import PackedBatch, pack, packed_batch
from picasso.connectors.dead_letters.letters import DeadLetter
from picasso.connectors.decoding.batch_ids import id_rule, problem_reason
from picasso.connectors.decoding.parsing import parse_table
from picasso.connectors.decoding.record_decoder import RecordDecoder, record_positions
from picasso.connectors.decoding.validation import (dense_reason, dead_letters, dense_values, label_not_finite_reason,
                                                    label_out_of_range_reason, missing_label_reason)
from picasso.kernels.fused_batch import (DENSE, LABEL, LABEL_NOT_FINITE, LABEL_OUT_OF_RANGE, MISSING_LABEL,
                                         FusedBatch, FusedPlan, detail_value)
from picasso.kernels.id_columns import IdRules
from picasso.packing import PackingPlan


@dataclass
class PackedDecode:
    """A batch decoded and packed: DecodeResult's dead letters, valid mask and absent counts,
    with the PackedBatch of its valid rows in place of their canonical table."""

    packed: PackedBatch
    dead_letters: list[DeadLetter] = field(default_factory=list)
    valid_mask: np.ndarray | None = None
    absent: dict[str, int] = field(default_factory=dict)
    one_pass: bool = False  # which path made it (the kernel's, or the reference)

    @property
    def rows_in(self) -> int:
        return self.packed.num_samples + len(self.dead_letters)


class PackingDecoder:
    """A RecordDecoder and a packing plan of its spec, with the kernel's plan of the two
    made once."""

    def __init__(self, decoder: RecordDecoder, plan: PackingPlan):
        self.decoder = decoder
        self.plan = plan
        self.fused = fused_plan(decoder, plan)
        self._log1p = np.array([f.transform == "log1p" for f in decoder.spec.dense], dtype=bool)

    def decode_and_pack(self, batch: pa.RecordBatch | pa.Table, source: str, positions: dict[str, int] | None = None,
                        starts: dict[str, int] | None = None, first_position: int = 0,
                        row_positions: Sequence[int] | None = None) -> PackedDecode:
        """decode_table(batch, source, first_position, row_positions) then pack(..., positions,
        starts), in one pass where the batch allows (see the module's docstring)."""
        record_batch = _one_batch(batch)
        fused = None
        if self.fused is not None and record_batch is not None:
            fused = kernels.decode_pack(self.fused, record_batch)
        if fused is None:
            decoded = self.decoder.decode_table(batch, source, first_position, row_positions)
            return PackedDecode(pack(decoded.table, self.decoder.spec, self.plan, positions, starts),
                                decoded.dead_letters, decoded.valid_mask, decoded.absent)
        _, dense = dense_values(fused.dense, self._log1p)
        packed = packed_batch(fused.label, dense if self.fused.dense else None, self.plan, fused.groups, positions,
                              starts)
        letters = []
        if len(fused.verdicts):
            n = record_batch.num_rows
            letters = dead_letters(self._reasons(fused), source, record_positions(first_position, row_positions, n),
                                   parse_table(record_batch).payload_of)
        names = self.decoder.spec.feature_names
        absent = {names[f]: int(fused.absent[f]) for f in np.flatnonzero(fused.absent)}
        return PackedDecode(packed, letters, fused.valid, absent, one_pass=True)

    def _reasons(self, fused: FusedBatch) -> dict[int, str]:
        """Each refused row's reason, from its verdict, as the validator words it."""
        spec = self.decoder.spec
        reasons = {}
        for row, stage, code, index, detail in fused.verdicts.tolist():
            if stage == LABEL:
                reason = missing_label_reason(spec.label) if code == MISSING_LABEL else {
                    LABEL_NOT_FINITE: label_not_finite_reason, LABEL_OUT_OF_RANGE: label_out_of_range_reason,
                }[code](spec.label, detail_value(detail))
            elif stage == DENSE:
                reason = dense_reason(spec.dense[index].name, detail_value(detail))
            else:
                reason = problem_reason(spec.sparse[index], code, detail)
            reasons[row] = reason
        return reasons


def fused_plan(decoder: RecordDecoder, plan: PackingPlan) -> FusedPlan | None:
    """The kernel's plan of a decoder's spec and a packing plan of it; None where every
    batch takes the reference path (crosses, join events: see the module's docstring)."""
    spec = decoder.spec
    id_offsets = tuple(group.id_offsets for group in plan.groups)
    if spec.crosses or decoder.events is not None or max(map(max, id_offsets), default=0) >= 2**63:
        return None  # (tables of 2^63 rows and more: only a test's spec has them)
    index = {f.name: k for k, f in enumerate(spec.sparse)}
    return FusedPlan(
        label=spec.label,
        require_label=decoder.options.require_label,
        dense=tuple(spec.dense_names),
        log1p=tuple(f.transform == "log1p" for f in spec.dense),
        sparse=tuple(spec.sparse_names),
        rules=IdRules.of([id_rule(f) for f in spec.sparse]),
        groups=tuple(tuple(index[name] for name in group.fields) for group in plan.groups),
        id_offsets=id_offsets,
        reject_unknown=decoder.options.unknown_fields == "reject",
    )


def _one_batch(batch: pa.RecordBatch | pa.Table) -> pa.RecordBatch | None:
    """The batch as one RecordBatch, where it is one without copying."""
    if isinstance(batch, pa.RecordBatch):
        return batch
    if all(column.num_chunks == 1 for column in batch.columns):
        batches = batch.to_batches()
        return batches[0] if len(batches) == 1 else None
    return None
