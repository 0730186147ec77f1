"""What the pack_group op takes and gives: the id columns of one packing group
(picasso.packing.PackedGroup) of a batch, and that group's ids as a PackedBatch lays them
out (picasso.batch).

The op's definition is pack_groups_reference.py; csrc/pack_groups.cpp is held to it bit
for bit (tests/test_pack_groups.py).

It takes the group's fields' columns, each an Arrow list array of n rows of integer ids
(the canonical table's list<int64>: connectors.decoding.validation), in the group's field
order, one chunk each, and what each field's ids are shifted by (PackedGroup.id_offsets).
A list's validity is not read: a null list is the range its offsets give it (empty, in
any table the decoders make), and ids are never null.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class GroupIds:
    """The op's result for n samples of F fields.

    ids: every field's ids plus its id offset, sample after sample and, within a sample,
    field after field (bag after bag). bag_starts[s * F + f]: where sample s's bag of
    field f starts in ids, and bag_starts[n * F] == len(ids)."""

    ids: np.ndarray  # int64
    bag_starts: np.ndarray  # int32 (n * F + 1,)
