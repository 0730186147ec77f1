"""The id -> row map of a dynamic table, in plain torch: the definition the C++ map
(csrc/id_map.cpp) is held to, tensor for tensor.

A map of `capacity` rows is these host tensors, all changed in place:
- `index`: int64 (slots, 2), an open-addressing hash table with linear probing: each
  slot a (key, row) pair, (EMPTY_KEY, -1) when empty. `slots` is a power of two at least
  twice the capacity, so the table is at most half full and probes stay short. A key's
  home slot is the top bits of splitmix64(key). Deletion shifts later entries of the
  probe run back (no tombstones), so the layout depends only on the order of inserts and
  deletes, which both implementations make in the same order.
- `row_keys`: int64 (capacity,), the key of each row, EMPTY_KEY when the row is free.
- `last_seen`: int64 (capacity,), the batch that last used the row; -1 when free.
- `counts`: int64 (capacity,), the row's occurrences since its key was admitted.
- `free_rows`: int32 (capacity,), a stack of the free rows: free_rows[:free_count[0]],
  popped from the end. A new map pops 0, 1, 2, ...; freed rows are pushed in the order
  they were freed, so the last freed is the first reused.
- `free_count`: int64 (1,).

Keys are 64-bit ids as int64 (picasso.kernels.hashing.key_of). The one key EMPTY_KEY (2^63 as
unsigned) marks empty slots, so it is never admitted: an id with that key always takes
the field's default row.

Four ops:
- `find(keys, batch, update)`: the row of each key, or -1; with `update`, every row found
  is stamped last_seen = batch and its count grows by its occurrences. The keys not found
  come back once each, in order of first occurrence, with their occurrences and, per
  input position, the index of its key among them.
- `admit(keys, key_counts, batch, lfu, protect_since)`: rows for new keys, in order: a
  free row while there is one; else, with `lfu`, the row of the live key with the fewest
  counts (then the oldest last_seen, then the lowest row) among rows last seen before
  `protect_since` (the trainer protects the rows of the batch in flight); else -1
  (refused). A reused row's key is deleted from the index before the new key goes in.
- `expire(older_than, keep)`: free every row last seen before `older_than`, oldest first
  (by last_seen, then row), but never so many that fewer than `keep` rows stay live.
- `rebuild()`: the index again from row_keys, inserting rows in order (serving loads
  only row_keys).
And one op that is the four above as a training batch of one field uses them, in one
call (picasso.dynamic_rows.DynamicField.resolve): `resolve(...)`, below.
And two ops on no map: `initial_rows(keys, width, scale)`, the first values of the rows
new keys take, and `reset_rows(weight, slots, targets, keys, scale)`, which writes them
into a table (zeros when scale is 0) and zeroes the same rows of its optimizer slots.
"""

from __future__ import annotations

import numpy as np
import torch

from picasso.kernels.hashing import splitmix64_array
from picasso.kernels.reference import sketch_add

EMPTY_KEY = -(1 << 63)
_MIN_SLOTS = 8


def slots_for(capacity: int) -> int:
    """Index slots for a capacity: the smallest power of two >= 2 * capacity."""
    return max(_MIN_SLOTS, 1 << (2 * capacity - 1).bit_length())


def home_slots(keys: torch.Tensor, slots: int) -> torch.Tensor:
    """Each key's home slot: the top log2(slots) bits of splitmix64(key)."""
    bits = slots.bit_length() - 1
    z = splitmix64_array(keys.numpy().view(np.uint64))
    return torch.from_numpy((z >> np.uint64(64 - bits)).astype(np.int64))


def _slots_of(index: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The slot holding each key, or -1."""
    mask = index.shape[0] - 1
    slot = home_slots(keys, index.shape[0])
    found = torch.full_like(keys, -1)
    pending = torch.nonzero(keys != EMPTY_KEY).flatten()
    while pending.numel():
        held = index[slot[pending], 0]
        hit = held == keys[pending]
        found[pending[hit]] = slot[pending[hit]]
        pending = pending[~hit & (held != EMPTY_KEY)]
        slot[pending] = (slot[pending] + 1) & mask
    return found


def _insert(index: torch.Tensor, key: int, row: int) -> None:
    mask = index.shape[0] - 1
    slot = int(home_slots(torch.tensor([key]), index.shape[0])[0])
    while int(index[slot, 0]) != EMPTY_KEY:
        slot = (slot + 1) & mask
    index[slot, 0], index[slot, 1] = key, row


def _delete(index: torch.Tensor, key: int) -> None:
    """Remove key, shifting back the entries after it in its probe run."""
    mask = index.shape[0] - 1
    hole = int(_slots_of(index, torch.tensor([key]))[0])
    index[hole] = torch.tensor([EMPTY_KEY, -1])
    probe = hole
    while True:
        probe = (probe + 1) & mask
        key_here = int(index[probe, 0])
        if key_here == EMPTY_KEY:
            return
        home = int(home_slots(torch.tensor([key_here]), index.shape[0])[0])
        # The entry stays unless the hole lies on its way from home to where it is.
        stays = hole < home <= probe if hole <= probe else home > hole or home <= probe
        if not stays:
            index[hole] = index[probe]
            index[probe] = torch.tensor([EMPTY_KEY, -1])
            hole = probe


def _first_occurrence_unique(keys: torch.Tensor):
    """Distinct keys in order of first occurrence, their counts, and each position's index."""
    distinct, inverse, counts = torch.unique(keys, return_inverse=True, return_counts=True)
    first = torch.full((distinct.numel(),), keys.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, inverse, torch.arange(keys.numel()), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    return distinct[order], counts[order], rank[inverse]


def find(index, row_keys, last_seen, counts, keys, batch: int, update: bool):
    slot = _slots_of(index, keys)
    hit = slot >= 0
    rows = torch.full_like(keys, -1)
    rows[hit] = index[slot[hit], 1]
    if update and hit.any():
        hit_rows = rows[hit]
        last_seen[hit_rows] = batch
        counts.index_add_(0, hit_rows, torch.ones_like(hit_rows))
    miss = ~hit & (keys != EMPTY_KEY)
    miss_inverse = torch.full_like(keys, -1)
    miss_keys, miss_counts, rank = _first_occurrence_unique(keys[miss])
    miss_inverse[miss] = rank
    return rows, miss_keys, miss_counts, miss_inverse


def _by(*columns: torch.Tensor) -> torch.Tensor:
    """Positions sorted by the columns, the first most significant (stable sorts, last first)."""
    order = torch.arange(columns[0].numel())
    for column in reversed(columns):
        order = order[torch.sort(column[order], stable=True).indices]
    return order


def admit(index, row_keys, last_seen, counts, free_rows, free_count, keys, key_counts, batch: int, lfu: bool,
          protect_since: int):
    rows = torch.full_like(keys, -1)
    evicted_keys, evicted_rows = [], []
    victims = torch.zeros(0, dtype=torch.int64)
    short = keys.numel() - int(free_count[0])
    if lfu and short > 0:
        candidates = torch.nonzero((row_keys != EMPTY_KEY) & (last_seen < protect_since)).flatten()
        order = _by(counts[candidates], last_seen[candidates], candidates)
        victims = candidates[order[:short]]
    next_victim = 0
    for i in range(keys.numel()):
        if int(free_count[0]):
            free_count[0] -= 1
            row = int(free_rows[int(free_count[0])])
        elif next_victim < victims.numel():
            row = int(victims[next_victim])
            next_victim += 1
            evicted_keys.append(int(row_keys[row]))
            evicted_rows.append(row)
            _delete(index, int(row_keys[row]))
        else:
            continue
        _insert(index, int(keys[i]), row)
        row_keys[row], last_seen[row], counts[row] = keys[i], batch, key_counts[i]
        rows[i] = row
    return rows, torch.tensor(evicted_keys, dtype=torch.int64), torch.tensor(evicted_rows, dtype=torch.int64)


def expire(index, row_keys, last_seen, counts, free_rows, free_count, older_than: int, keep: int):
    live = row_keys.numel() - int(free_count[0])
    candidates = torch.nonzero((row_keys != EMPTY_KEY) & (last_seen < older_than)).flatten()
    candidates = candidates[_by(last_seen[candidates], candidates)][: max(0, live - keep)]
    evicted_keys = row_keys[candidates].clone()
    for row in candidates.tolist():
        _delete(index, int(row_keys[row]))
        row_keys[row], last_seen[row], counts[row] = EMPTY_KEY, -1, 0
        free_rows[int(free_count[0])] = row
        free_count[0] += 1
    return evicted_keys, candidates


def rebuild(index, row_keys) -> None:
    index[:, 0], index[:, 1] = EMPTY_KEY, -1
    for row in torch.nonzero(row_keys != EMPTY_KEY).flatten().tolist():
        _insert(index, int(row_keys[row]), row)


def initial_rows(keys: torch.Tensor, width: int, scale: float) -> torch.Tensor:
    """(len(keys), width) float32: column c of key k is uniform in [-scale, scale), from the
    top 24 bits of splitmix64(k * (width + 1) + c + 1) (uint64 arithmetic), computed in
    float64 and rounded once. A pure function of the key, so a row starts the same in
    every run and after every restore."""
    with np.errstate(over="ignore"):
        mixed = splitmix64_array(keys.numpy().view(np.uint64)[:, None] * np.uint64(width + 1)
                            + np.arange(1, width + 1, dtype=np.uint64))
    unit = (mixed >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return torch.from_numpy(((2 * unit - 1) * scale).astype(np.float32)).reshape(keys.numel(), width)


def reset_rows(weight: torch.Tensor, slots: list[torch.Tensor], targets: torch.Tensor, keys: torch.Tensor,
               scale: float) -> None:
    """Rows `targets` of `weight` take `keys`' first values (zeros when scale is 0), and the
    same rows of every slot tensor are zeroed, in place."""
    weight[targets] = initial_rows(keys, weight.shape[1], scale).to(weight.device) if scale else 0.0
    for slot in slots:
        slot[targets] = 0


# resolve's counts, in the order it returns them (DynamicStats' fields after lookups).
RESOLVE_STATS = ("hits", "admitted", "evicted_by_age", "evicted_when_full", "refused", "default_lookups")


def resolve(index, row_keys, last_seen, counts, free_rows, free_count, keys, now: int, expire_rows: bool,
            older_than: int, keep: int, lfu: bool, protect_since: int, default_row: int, sketch_counters,
            sketch_multipliers, sketch_bits: int, sketch_added, sketch_window: int, admit_after: float):
    """One training batch of one field: with `expire_rows`, expire(older_than, keep); find
    (stamping with `now`); the misses counted in the admission sketch when it has counters
    (sketch_added, a 0-d int64, gathers their occurrences; once it reaches sketch_window
    the counters halve and it restarts), and admitted when their estimate reaches
    admit_after (every miss, without a sketch); admit(lfu, protect_since). Returns each
    key's row (default_row for a key left without one, EMPTY_KEY's included), the position
    of the first occurrence and the key of each key given a row, in admission order, and
    the counts RESOLVE_STATS names."""
    stats = dict.fromkeys(RESOLVE_STATS, 0)
    if expire_rows:
        stats["evicted_by_age"] = expire(index, row_keys, last_seen, counts, free_rows, free_count, older_than,
                                         keep)[1].numel()
    rows, miss_keys, miss_counts, miss_inverse = find(index, row_keys, last_seen, counts, keys, now, True)
    stats["hits"] = int((rows >= 0).sum())
    chosen = torch.ones(miss_keys.numel(), dtype=torch.bool)
    if sketch_counters.numel() and miss_keys.numel():
        chosen = sketch_add(sketch_counters, miss_keys, miss_counts, sketch_multipliers, sketch_bits) >= admit_after
        sketch_added.add_(miss_counts.sum())
        if int(sketch_added) >= sketch_window:
            sketch_counters.mul_(0.5)
            sketch_added.zero_()
    row_of_miss = torch.full((miss_keys.numel(),), -1, dtype=torch.int64)
    if chosen.any():
        new_rows, _, taken = admit(index, row_keys, last_seen, counts, free_rows, free_count, miss_keys[chosen],
                                   miss_counts[chosen], now, lfu, protect_since)
        stats["evicted_when_full"], stats["refused"] = taken.numel(), int((new_rows < 0).sum())
        row_of_miss[chosen] = new_rows
    missed = miss_inverse >= 0
    rows[missed] = row_of_miss[miss_inverse[missed]]
    # Where each miss first occurs: its index among the misses is its rank in that order.
    first = torch.full((miss_keys.numel(),), keys.numel(), dtype=torch.int64)
    first.scatter_reduce_(0, miss_inverse[missed], torch.nonzero(missed).flatten(), reduce="amin")
    given = torch.nonzero(row_of_miss >= 0).flatten()
    stats["admitted"] = given.numel()
    default = rows < 0
    stats["default_lookups"] = int(default.sum())
    rows[default] = default_row
    return rows, first[given], miss_keys[given], torch.tensor([stats[name] for name in RESOLVE_STATS])
