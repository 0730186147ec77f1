"""Many id columns bucketed in few calls of picasso.hashing.hash_to_buckets.

Each call has a fixed cost of a dozen numpy passes, which for a poll of 1,000 JSON events
is most of the work: one call per sparse field cost about 1 µs per event for Criteo's 26
fields. The columns are concatenated and hashed once, modulo a common multiple L of
their bucket counts; since (h mod L) mod b == h mod b whenever b divides L, reducing each
field's part modulo its own bucket count gives exactly the rows of one call per field.
Long columns (a table of many Arrow messages) gain nothing from that and would pay for
the copy and the second modulo, so they keep one call each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from picasso.hashing import hash_to_buckets

# hash_to_buckets returns int64 rows: a common multiple must stay below 2**63.
_LARGEST_MULTIPLE = 2**62
# Ids per combined call: past this, a call's fixed cost is small next to its work.
_COMBINE_UP_TO = 1 << 16


def hash_many(arrays: Sequence[pa.Array], buckets: Sequence[int]) -> list[np.ndarray]:
    """hash_to_buckets(arrays[i], buckets[i]) for every i. The arrays are null-free and
    share one Arrow type."""
    out: list[np.ndarray] = []
    per_group = max(1, _COMBINE_UP_TO // max(1, max(map(len, arrays), default=1)))
    for group in _groups(buckets, per_group):
        combined = pa.concat_arrays([arrays[i] for i in group]) if len(group) > 1 else arrays[group[0]]
        multiple = math.lcm(*(buckets[i] for i in group))
        rows = hash_to_buckets(combined, multiple)
        if len(group) == 1:
            out.append(rows)
            continue
        # Each part modulo its own bucket count, in one numpy pass.
        lengths = [len(arrays[i]) for i in group]
        rows %= np.repeat(np.array([buckets[i] for i in group], dtype=np.int64), lengths)
        out += np.split(rows, np.cumsum(lengths)[:-1])
    return out


def _groups(buckets: Sequence[int], most: int) -> list[list[int]]:
    """Runs of at most `most` consecutive fields whose bucket counts have a common
    multiple below the limit."""
    groups: list[list[int]] = []
    multiple = _LARGEST_MULTIPLE + 1
    for i, b in enumerate(buckets):
        candidate = math.lcm(multiple, b) if groups else _LARGEST_MULTIPLE + 1
        if groups and candidate <= _LARGEST_MULTIPLE and len(groups[-1]) < most:
            groups[-1].append(i)
            multiple = candidate
        else:
            groups.append([i])
            multiple = b
    return groups
