"""cross_ids in plain numpy: the definition csrc/cross_ids.cpp is held to, bit for bit
(the contract: id_columns.py; the hash: picasso.kernels.hashing, cross).

Per cross, per row: the product of its fields' bag lengths, cut to max_len, gives the
row's number of crosses; output position p of a row is the combination whose index, read
in the mixed radix of the bag lengths (the last field fastest), is p.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from picasso.kernels.hashing import splitmix64_array
from picasso.kernels.id_columns import BUCKET, CrossRule, DecodedIds


def cross_ids(ids: np.ndarray, offsets: np.ndarray, starts: np.ndarray, rules: Sequence[CrossRule],
              num_rows: int) -> DecodedIds:
    """ids, offsets and starts: decoded columns as DecodedIds holds them (the fields' keys).
    Returns the crosses as DecodedIds (no problems: a cross refuses no row)."""
    parts = [_cross(ids, offsets, starts, rule, num_rows) for rule in rules]
    rooms = [len(out) for out, _ in parts]
    return DecodedIds(
        ids=np.concatenate([out for out, _ in parts]) if parts else np.zeros(0, np.int64),
        offsets=np.stack([o for _, o in parts]) if parts else np.zeros((0, num_rows + 1), np.int32),
        starts=np.concatenate([[0], np.cumsum(rooms)[:-1]]).astype(np.int64) if parts else np.zeros(0, np.int64),
        problems=np.zeros((0, 4), np.int64),
    )


def _cross(ids: np.ndarray, offsets: np.ndarray, starts: np.ndarray, rule: CrossRule,
           n: int) -> tuple[np.ndarray, np.ndarray]:
    members = range(rule.first, rule.first + rule.count)
    lengths = [np.diff(offsets[m, : n + 1]).astype(np.int64) for m in members]
    count = np.ones(n, dtype=np.int64)
    for length in lengths:  # cut field by field: a product of long bags would overflow int64
        count = np.minimum(count * length, rule.max_len)
    out_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(count, out=out_offsets[1:])
    row = np.repeat(np.arange(n), count)
    position = np.arange(len(row)) - out_offsets[:-1].astype(np.int64)[row]
    keys = []
    for m, length in zip(reversed(members), reversed(lengths)):  # the last field fastest
        within = position % length[row]
        position //= length[row]
        keys.append(ids[starts[m] + offsets[m, row].astype(np.int64) + within].view(np.uint64))
    h = np.full(len(row), _unsigned(_start(rule)), dtype=np.uint64)
    for key in reversed(keys):
        h = splitmix64_array(h ^ key)
    out = (h % np.uint64(rule.modulus)).astype(np.int64) if rule.kind == BUCKET else h.view(np.int64)
    return out, out_offsets


def _start(rule: CrossRule) -> int:
    return rule.row()[3]


def _unsigned(word: int) -> int:
    return word + (1 << 64) if word < 0 else word
