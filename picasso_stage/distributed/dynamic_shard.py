"""Dynamic tables on a parameter server: each shard owns the ids that hash to it, admits and
evicts them there, and gives them rows of its own stripe.

A dynamic field's C rows and its default row (row C) sit in its group's table at rows
row_offset + r, striped over the shards like every row (table row R lives on shard
R % S: layout.py). Shard s owns the keys k with owner_of(k) = s (a salted splitmix64 of
the key, mod S) and gives them only field rows of its own stripe, r = band + j * S for
j = 0 .. local_capacity - 1, band = (s - row_offset) mod S. A key's map entry, its row's
values and its optimizer slots are therefore all on one shard, which admits and evicts
alone: no shard ever asks another.

Per shard and field, a DynamicField (picasso.dynamic_rows) of the shard's rows runs the
field's rules on the shard's clock: the global step for evict_after_steps, the newest
event time its resolves carried for evict_after; admit_after counts in the shard's own
sketch; LFU spares the rows any batch used within the staleness limit (a gradient for
them may still arrive; a staler one is dropped anyway). A row a key newly takes starts as
in a Trainer: values from its key, slots zero; its version jumps far ahead, so a gradient
still in flight for the row's old key counts as hopelessly stale (GBA drops it; plain
async, which weighs nothing, applies it).

Between a Trainer's state and the shards (ShardLayout.split and merge):
- split re-homes the Trainer's live keys to their owners, each with its row's values and
  slots. A shard to which more keys hash than it has rows keeps the most-counted (then
  the most recent); the rest are evicted and take the default row until they are admitted
  again. The admission sketch starts afresh.
- merge is the union of the shards' rows, which are the Trainer's rows already: a Trainer
  loads it as is, its index rebuilt, its clock the global step and the newest event time.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from picasso import kernels
from picasso.dynamic_rows import Clock, DynamicField, DynamicStats, advance_event_clock, field_metrics
from picasso.embedding import PackedEmbedding
from picasso.kernels.hashing import splitmix64_array
from picasso.kernels.id_map_reference import EMPTY_KEY
from picasso.spec import SparseField

_OWNER_SALT = np.uint64(0x5851F42D4C957F2D)  # keeps the owner apart from the map's home slot
BATCHES_KEY = "dynamic_rows.batches"
EVENT_TIME_KEY = "dynamic_rows.event_time"
CLOCK_KEYS = (BATCHES_KEY, EVENT_TIME_KEY)
# A row's version jumps this far when a new key takes it: a gradient pulled for its old
# key is then staler than any limit (dropped), or weighed to nothing where none is set.
_NEW_KEY_VERSIONS = 1 << 20


def owner_of(keys: torch.Tensor, num_shards: int) -> torch.Tensor:
    """The shard that owns each key."""
    if num_shards == 1:
        return torch.zeros(keys.numel(), dtype=torch.int64)
    mixed = splitmix64_array(keys.numpy().view(np.uint64) ^ _OWNER_SALT)
    return torch.from_numpy((mixed % np.uint64(num_shards)).astype(np.int64))


@dataclass(frozen=True)
class DynamicLayout:
    """One dynamic field, as the shards hold it."""

    field: SparseField
    prefix: str  # its map's state-dict prefix, e.g. "dynamic_rows.maps.0"
    row_offset: int  # its first row in its group's tables
    tables: tuple[str, ...]  # the tables over its group (every embedding of the model that has it)
    slots: tuple[tuple[str, ...], ...]  # each table's optimizer slots
    init_scales: tuple[float, ...]  # each table's PackedEmbedding.init_scale
    map_keys: tuple[str, ...]  # the map's state-dict keys

    @property
    def capacity(self) -> int:
        return self.field.dynamic.capacity

    def band(self, shard: int, num_shards: int) -> int:
        return (shard - self.row_offset) % num_shards

    def local_capacity(self, shard: int, num_shards: int) -> int:
        return len(range(self.band(shard, num_shards), self.capacity, num_shards))

    def local_field(self, shard: int, num_shards: int) -> SparseField:
        """The field as shard `shard` maps it: its share of the rows and of keep_rows."""
        table, rows = self.field.dynamic, self.local_capacity(shard, num_shards)
        keep = min(rows, math.ceil(table.keep_rows * rows / table.capacity))
        return dataclasses.replace(self.field, dynamic=dataclasses.replace(table, capacity=rows, keep_rows=keep))

    def field_rows(self, shard: int, num_shards: int, local: torch.Tensor) -> torch.Tensor:
        """The field rows of a shard's local map rows."""
        return self.band(shard, num_shards) + local * num_shards


def dynamic_layouts(model: nn.Module, num_shards: int) -> tuple[DynamicLayout, ...]:
    rows = model._modules.get("dynamic_rows")
    if rows is None:
        return ()
    embeddings = [(prefix, m) for prefix, m in model.named_modules() if isinstance(m, PackedEmbedding)]
    layouts = []
    for index, member in enumerate(rows.members):
        prefix = f"dynamic_rows.maps.{index}"
        # The embeddings over its group: every one of the model's, but a dynamic cross that
        # feeds one part of the model has rows in that part's embeddings alone (packing).
        tables = [(f"{name}.table_{member.group}",
                   tuple(f"{name}.slot{i}_{member.group}" for i in range(len(e.slots(member.group)))), e.init_scale)
                  for name, e in embeddings if e.has_group(member.group)]
        layout = DynamicLayout(member.field.field, prefix, member.row_offset, tuple(t for t, _, _ in tables),
                               tuple(s for _, s, _ in tables), tuple(float(c) for _, _, c in tables),
                               tuple(f"{prefix}.{name}" for name in member.field.state_dict()))
        if layout.capacity < num_shards:
            raise ValueError(f"dynamic field '{layout.field.name}' has {layout.capacity} rows, fewer than the "
                             f"{num_shards} shards that would share them")
        layouts.append(layout)
    return tuple(layouts)


def _local_map(layout: DynamicLayout, shard: int, num_shards: int, local, keys, last_seen, counts) -> dict:
    """A shard's map state holding `keys` at local rows `local`, its other rows free (the
    lowest pops first)."""
    field = DynamicField(layout.local_field(shard, num_shards), seed=shard)
    field.row_keys[local], field.last_seen[local], field.counts[local] = keys, last_seen, counts
    free = torch.nonzero(field.row_keys == EMPTY_KEY).flatten().flip(0)
    field.free_rows[: free.numel()] = free.to(torch.int32)
    field.free_count[0] = free.numel()
    field.rebuild_index()
    return {f"{layout.prefix}.{name}": value for name, value in field.state_dict().items()}


def _places(layout: DynamicLayout, shard: int, num_shards: int, rows: torch.Tensor) -> torch.Tensor:
    """Local rows on `shard` for keys now at field `rows` (kept ones, in row order): a row
    already in the shard's stripe stays where it is (so split undoes merge), the others
    take the lowest local rows left."""
    band, capacity = layout.band(shard, num_shards), layout.local_capacity(shard, num_shards)
    home = (rows - band) % num_shards == 0
    local = torch.full_like(rows, -1)
    local[home] = (rows[home] - band) // num_shards
    taken = torch.zeros(capacity, dtype=torch.bool)
    taken[local[home]] = True
    local[~home] = torch.nonzero(~taken).flatten()[: int((~home).sum())]
    return local


def rehome(state: dict[str, torch.Tensor], layouts: tuple[DynamicLayout, ...],
           num_shards: int) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """A Trainer's model state with every live key's row moved to a row its owner holds,
    and each shard's maps; see the module's docstring."""
    state = dict(state)
    maps: list[dict[str, torch.Tensor]] = [{} for _ in range(num_shards)]
    for layout in layouts:
        row_keys = state[f"{layout.prefix}.row_keys"]
        last_seen, counts = state[f"{layout.prefix}.last_seen"], state[f"{layout.prefix}.counts"]
        live = torch.nonzero(row_keys != EMPTY_KEY).flatten()
        owners = owner_of(row_keys[live], num_shards)
        moves_from, moves_to = [], []
        for shard in range(num_shards):
            mine = live[owners == shard]
            # The most-counted first, then the most recent, then the lowest row.
            order = np.lexsort((mine.numpy(), -last_seen[mine].numpy(), -counts[mine].numpy()))
            kept = mine[torch.from_numpy(order[: layout.local_capacity(shard, num_shards)])].sort().values
            local = _places(layout, shard, num_shards, kept)
            maps[shard].update(_local_map(layout, shard, num_shards, local, row_keys[kept], last_seen[kept],
                                          counts[kept]))
            moves_from.append(kept)
            moves_to.append(layout.field_rows(shard, num_shards, local))
        source, target = torch.cat(moves_from) + layout.row_offset, torch.cat(moves_to) + layout.row_offset
        for key in (*layout.tables, *(slot for slots in layout.slots for slot in slots)):
            moved = state[key].clone()
            moved[target] = state[key][source]
            state[key] = moved
    return state, maps


def merge_maps(parts: list[dict[str, torch.Tensor]], layouts: tuple[DynamicLayout, ...]) -> dict[str, torch.Tensor]:
    """The Trainer's map state from every shard's (a fresh admission sketch)."""
    num_shards, merged = len(parts), {}
    for layout in layouts:
        field = DynamicField(layout.field)
        for shard, part in enumerate(parts):
            local_keys = part[f"{layout.prefix}.row_keys"]
            live = torch.nonzero(local_keys != EMPTY_KEY).flatten()
            rows = layout.field_rows(shard, num_shards, live)
            field.row_keys[rows] = local_keys[live]
            field.last_seen[rows] = part[f"{layout.prefix}.last_seen"][live]
            field.counts[rows] = part[f"{layout.prefix}.counts"][live]
        free = torch.nonzero(field.row_keys == EMPTY_KEY).flatten().flip(0)  # the lowest row pops first
        field.free_rows[: free.numel()] = free.to(torch.int32)
        field.free_count[0] = free.numel()
        field.rebuild_index()
        merged.update({f"{layout.prefix}.{name}": value for name, value in field.state_dict().items()})
    for key in CLOCK_KEYS:
        merged[key] = torch.stack([part[key] for part in parts]).max()
    return merged


class ShardMaps:
    """One shard's maps, over its tensors (under the Trainer's keys, so snapshots carry them)."""

    def __init__(self, layouts: tuple[DynamicLayout, ...], shard: int, num_shards: int,
                 tensors: dict[str, torch.Tensor], protect_steps: int):
        self.layouts, self.shard, self.num_shards = layouts, shard, num_shards
        self.tensors, self.protect_steps = tensors, protect_steps
        self.fields: dict[str, DynamicField] = {}
        for layout in layouts:
            field = DynamicField(layout.local_field(shard, num_shards), seed=shard)
            field.load_state_dict({name: tensors[f"{layout.prefix}.{name}"] for name in field.state_dict()})
            for name, buffer in field.named_buffers():  # one storage: the snapshot reads what resolves change
                tensors[f"{layout.prefix}.{name}"] = buffer
            self.fields[layout.field.name] = field

    def resolve(self, keys: dict[str, torch.Tensor], event_time_ms: int | None, step: int,
                versions: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per field, the field rows of its keys (all owned here): admitted, evicted and new
        rows started as the field's rules say. The caller holds the shard's lock."""
        steps = Clock(step, step - self.protect_steps)
        events = self._event_clock(event_time_ms, [f for f in keys if self.fields[f].table.evicts_by_event_time])
        rows_of = {}
        for layout in self.layouts:
            name = layout.field.name
            if name not in keys:
                continue
            wanted = keys[name].to(torch.int64)
            if wanted.numel() and bool((owner_of(wanted, self.num_shards) != self.shard).any()):
                raise ValueError(f"shard {self.shard} was sent keys of dynamic field '{name}' that another shard owns")
            field = self.fields[name]
            local, first, new_keys = field.resolve(wanted, events if field.table.evicts_by_event_time else steps)
            rows = torch.where(local == field.default_row, layout.capacity,
                               layout.field_rows(self.shard, self.num_shards, local))
            if new_keys.numel():
                self._start_rows(layout, rows[first], new_keys, versions)
            rows_of[name] = rows
        return rows_of

    def take_stats(self) -> dict[str, tuple[DynamicStats, int]]:
        """Per field, its counts since the last call (which starts them afresh) and its
        live rows: what a checkpoint of this step reports."""
        taken = {}
        for name, field in self.fields.items():
            taken[name], field.stats = (field.stats, field.live_rows), DynamicStats()
        return taken

    def _event_clock(self, event_time_ms: int | None, fields: list[str]) -> Clock | None:
        if not fields:
            return None
        return advance_event_clock(self.tensors[EVENT_TIME_KEY], event_time_ms, fields, "the batch")

    def _start_rows(self, layout: DynamicLayout, rows: torch.Tensor, keys: torch.Tensor,
                    versions: dict[str, torch.Tensor]) -> None:
        local = (rows + layout.row_offset) // self.num_shards
        for table, slots, scale in zip(layout.tables, layout.slots, layout.init_scales):
            kernels.id_map_reset_rows(self.tensors[table], [self.tensors[slot] for slot in slots], local, keys, scale)
            versions[table][local] += _NEW_KEY_VERSIONS


def checkpoint_metrics(layouts: tuple[DynamicLayout, ...], taken: list[dict]) -> dict[str, float]:
    """Every shard's take_stats of one step, summed per field into a Trainer's metrics."""
    out = {}
    for layout in layouts:
        name, total, live = layout.field.name, DynamicStats(), 0
        for shard in taken:
            stats, rows = shard[name]
            total.add(stats)
            live += rows
        out.update(field_metrics(name, total, live, layout.capacity))
    return out
