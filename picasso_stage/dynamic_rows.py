"""Dynamic tables: the id -> row maps of a spec's dynamic fields, and their rules.

A dynamic field (spec.DynamicTable) packs its ids as 64-bit keys (picasso.kernels.hashing.key_of,
keyed by the field's hash_seed where the spec gives one: decoding applies it, so the map
only ever sees keys, and the seed travels with the spec into checkpoints and versions).
Before a batch reaches the embeddings, DynamicRows maps each key to a row of the field's
own range of its group's table: the key's row if it has one; a new row if the field
admits it; else the field's default row (the last of its range), which every id without a
row shares and which trains like any other. The map itself is a kernel op
(kernels.id_map_*: an open-addressing table in C++, with a plain-torch reference), over
tensors held here as buffers, so that checkpoints, serving weights and deltas carry it
like any other part of the model.

Per training batch and field, in this order:
1. expire: with `evict_after_steps` N, rows no batch has used for N batches are freed
   (never below `keep_rows` live rows);
2. find: each key's row; a found row is stamped with the batch and counted;
3. admission: a key without a row is counted in a count-min sketch, and admitted once its
   count reaches `admit_after` (1: at once). The sketch may over-count, never under, so a
   key is never admitted late; its counts halve every 10 x capacity additions (TinyLFU's
   reset), so ids seen long ago fade rather than pile up;
4. admit: an admitted key takes a free row; when none is free, `when_full: lfu` takes the
   row of the least-counted key that neither this batch nor the one before has used (the
   trainer may still be computing the one before, which prepared this batch meanwhile:
   see picasso.interleave), and `refuse` leaves the key on the default row.
A row a key newly takes starts fresh: its values are a pure function of its key (as a
table's initial values are of the seed) and its optimizer slots are zero. The trainer
writes them where the compute will read the row (the table, or the cache's fast tier),
after the previous step has finished (reset_new_rows).

Evaluation and serving only read the map: an id without a row takes the default row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

import torch
from torch import nn

from picasso import kernels
from picasso.batch import TorchBatch
from picasso.frequency import DecayedSketch
from picasso.kernels.id_map_reference import EMPTY_KEY, RESOLVE_STATS, slots_for
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec, SparseField

_NONE = torch.zeros(0, dtype=torch.int64)  # no positions, no keys (never written to)
_NO_COUNTERS, _NO_ADDED = torch.zeros(0), torch.zeros((), dtype=torch.int64)  # no admission sketch
# The sketch's counts halve after this many additions per row of capacity (TinyLFU's
# sample size W = 10 x the cache's size).
_SKETCH_WINDOW = 10
# Buffers a served model does not need: it only reads keys -> rows, from row_keys (the
# index is rebuilt on load).
TRAINING_ONLY = ("index", "last_seen", "counts", "free_rows", "free_count", "sketch_counters",
                 "sketch_multipliers", "sketch_added", "batches", "event_time")


@dataclass
class DynamicStats:
    """One field's counts over the training batches since the trainer last saved a
    checkpoint (or was built): a published version's own."""

    lookups: int = 0  # ids resolved, with repeats
    hits: int = 0  # of those, ids that had a row already
    admitted: int = 0  # keys given a row
    evicted_by_age: int = 0  # rows freed by evict_after_steps
    evicted_when_full: int = 0  # rows taken from a key for a new one (when_full: lfu)
    refused: int = 0  # keys due a row that found none free (when_full: refuse, or no LFU victim)
    default_lookups: int = 0  # lookups served by the default row (not admitted yet, or no room)

    def add(self, other: "DynamicStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(frozen=True)
class RowResets:
    """The rows a batch gave to new keys in one group: where each first occurs in the
    group's flat ids, and its key (which fixes its initial values)."""

    positions: torch.Tensor
    keys: torch.Tensor


class DynamicField(nn.Module):
    """One dynamic field's map: buffers in the layout of kernels.id_map_reference."""

    def __init__(self, field: SparseField, seed: int = 0):
        super().__init__()
        self.field = field
        self.table = field.dynamic
        capacity = self.table.capacity
        self.capacity = capacity
        index = torch.empty((slots_for(capacity), 2), dtype=torch.int64)
        index[:, 0], index[:, 1] = EMPTY_KEY, -1
        self.register_buffer("index", index)
        self.register_buffer("row_keys", torch.full((capacity,), EMPTY_KEY, dtype=torch.int64))
        self.register_buffer("last_seen", torch.full((capacity,), -1, dtype=torch.int64))
        self.register_buffer("counts", torch.zeros(capacity, dtype=torch.int64))
        self.register_buffer("free_rows", torch.arange(capacity - 1, -1, -1, dtype=torch.int32))
        self.register_buffer("free_count", torch.tensor([capacity], dtype=torch.int64))
        self.sketch = None
        if self.table.admit_after > 1:
            self.sketch = DecayedSketch(capacity, seed=seed)
            # The sketch's own tensors, so that loading a state copies into what it reads.
            self.register_buffer("sketch_counters", self.sketch.counters)
            self.register_buffer("sketch_multipliers", self.sketch.multipliers)
            self.register_buffer("sketch_added", torch.zeros((), dtype=torch.int64))
        self.stats = DynamicStats()

    @property
    def stats(self) -> DynamicStats:
        """The field's counts since they were last reset."""
        return DynamicStats(self._lookups, *self._counted.tolist())

    @stats.setter
    def stats(self, stats: DynamicStats) -> None:
        # Kept as resolve's counts tensor and added to in place: a dataclass built and
        # summed field by field cost more per batch than the rest of resolve's Python.
        self._lookups = stats.lookups
        self._counted = torch.tensor([getattr(stats, name) for name in RESOLVE_STATS], dtype=torch.int64)

    @property
    def default_row(self) -> int:
        """The row (within the field's range) of every id without one of its own."""
        return self.capacity

    @property
    def live_rows(self) -> int:
        return self.capacity - int(self.free_count[0])

    def _map_state(self) -> tuple[torch.Tensor, ...]:
        return self.index, self.row_keys, self.last_seen, self.counts

    @property
    def max_age(self) -> int | None:
        """Rows unseen for longer than this, on the field's clock, are freed."""
        return self.table.evict_after_ms if self.table.evicts_by_event_time else self.table.evict_after_steps

    def resolve(self, keys: torch.Tensor, clock: "Clock | None") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows (within the field's range) of `keys`, and the positions and keys of the
        rows given to new keys. `clock`: the training batch's time on the field's clock, or
        None to only read."""
        if clock is None:
            rows = kernels.id_map_find(*self._map_state(), keys, 0, False)[0]
            return torch.where(rows >= 0, rows, self.default_row), _NONE, _NONE
        # One kernel call: expire, find, count in the sketch, admit, first occurrences.
        table, now, sketch = self.table, clock.now, self.sketch
        rows, first, new_keys, counted = kernels.id_map_resolve(
            *self._map_state(), self.free_rows, self.free_count, keys, now, self.max_age is not None,
            now - (self.max_age or 0), table.keep_rows, table.when_full == "lfu", clock.before, self.default_row,
            *((self.sketch_counters, self.sketch_multipliers, sketch.bits, self.sketch_added,
               _SKETCH_WINDOW * self.capacity) if sketch is not None else (_NO_COUNTERS, _NONE, 0, _NO_ADDED, 0)),
            table.admit_after)
        self._lookups += keys.numel()
        self._counted += counted
        return rows, first, new_keys

    def rebuild_index(self) -> None:
        """The index from row_keys: a served model loads only those."""
        kernels.id_map_rebuild(self.index, self.row_keys)

    def _apply(self, fn, recurse=True):
        """The map is host state for host kernels: it stays on the CPU when the model moves."""
        return self


@dataclass(frozen=True)
class Clock:
    """A training batch's time on a field's clock (its number, or the stream's event time
    in ms), which stamps the rows it uses, and the time of the batch before it, whose rows
    LFU spares (the trainer may still be computing on them)."""

    now: int
    before: int


class EventTimeMissing(ValueError):
    """A batch without an event time reached a field that evicts by event time."""


@dataclass(frozen=True)
class _Member:
    group: str
    position: int  # the field's place among its group's fields
    num_fields: int  # of the group
    row_offset: int  # the field's first row in the group's table
    field: DynamicField


@dataclass(frozen=True)
class FieldKeys:
    """One dynamic field's keys in a batch."""

    member: _Member
    where: torch.Tensor | None  # their positions in the group's flat ids; None: all of them
    keys: torch.Tensor


class DynamicRows(nn.Module):
    """The maps of every dynamic field of a spec, applied to whole batches."""

    def __init__(self, spec: FeatureSpec, plan: PackingPlan, seed: int = 0):
        super().__init__()
        self.maps = nn.ModuleList()
        self._members: list[_Member] = []
        for group in plan.groups:
            for position, (name, dynamic) in enumerate(zip(group.fields, group.dynamic)):
                if dynamic:
                    field = DynamicField(spec.sparse_field(name), seed=seed + len(self.maps))
                    self.maps.append(field)
                    self._members.append(_Member(group.name, position, group.num_fields,
                                                 group.row_offsets[position], field))
        # Training batches resolved: the clock of last_seen and of evict_after_steps.
        self.register_buffer("batches", torch.zeros((), dtype=torch.int64))
        # The newest event time (ms) training batches have carried: the clock of fields
        # with evict_after. -1: none yet. It only moves forward, as a watermark does, so a
        # batch of older events never turns the clock back.
        self.register_buffer("event_time", torch.tensor(-1, dtype=torch.int64))
        self._by_event_time = [m.field.field.name for m in self._members if m.field.table.evicts_by_event_time]

    def resolve(self, batch: TorchBatch, training: bool) -> tuple[TorchBatch, dict[str, RowResets]]:
        """The batch with its dynamic fields' keys replaced by table rows, and per group the
        rows given to new keys (training only; reset_new_rows writes their first values)."""
        clocks = self._advance(batch) if training else None
        parts, resets = self.keys_of(batch), {}
        rows_of_parts = []
        for part in parts:
            field = part.member.field
            rows, first, keys = field.resolve(part.keys, None if clocks is None else
                                              clocks[field.table.evicts_by_event_time])
            rows_of_parts.append(rows)
            if keys.numel():
                positions = first if part.where is None else part.where[first]
                previous = resets.get(part.member.group)
                resets[part.member.group] = RowResets(positions, keys) if previous is None else RowResets(
                    torch.cat([previous.positions, positions]), torch.cat([previous.keys, keys]))
        return self.with_rows(batch, parts, rows_of_parts), resets

    def keys_of(self, batch: TorchBatch) -> list["FieldKeys"]:
        """Each dynamic field's keys in the batch, and where they sit in its group's ids."""
        parts, field_of_ids = [], {}
        for member in self._members:
            flat = batch.ids[member.group]
            if member.num_fields == 1:  # the group's only field: every id is its key
                parts.append(FieldKeys(member, None, flat))
                continue
            if member.group not in field_of_ids:
                field_of_ids[member.group] = _field_of_ids(batch.offsets[member.group], member.num_fields, flat.numel())
            where = torch.nonzero(field_of_ids[member.group] == member.position).flatten()
            parts.append(FieldKeys(member, where, flat[where]))
        return parts

    @staticmethod
    def with_rows(batch: TorchBatch, parts: list["FieldKeys"], rows: list[torch.Tensor]) -> TorchBatch:
        """The batch with each part's keys replaced by `rows` (within the field's range)."""
        ids = dict(batch.ids)
        for part, field_rows in zip(parts, rows):
            group = part.member.group
            if part.where is None:
                ids[group] = field_rows + part.member.row_offset
                continue
            if ids[group] is batch.ids[group]:
                ids[group] = ids[group].clone()
            ids[group][part.where] = field_rows + part.member.row_offset
        return dataclasses.replace(batch, ids=ids)

    @property
    def members(self) -> list[_Member]:
        return list(self._members)

    def _advance(self, batch: TorchBatch) -> tuple[Clock, Clock | None]:
        """This training batch's clocks, (steps, event time), the clocks moved on past it."""
        number = int(self.batches)
        events = advance_event_clock(self.event_time, batch.event_time_ms, self._by_event_time,
                                     f"training batch {number}") if self._by_event_time else None
        self.batches.add_(1)
        return Clock(number, number - 1), events

    def rebuild_index(self) -> None:
        for field in self.maps:
            field.rebuild_index()

    def reset_stats(self) -> None:
        for field in self.maps:
            field.stats = DynamicStats()

    def metrics(self) -> dict[str, float]:
        """Per field: its counts (DynamicStats), its live rows and its fill."""
        out: dict[str, float] = {}
        for member in self._members:
            field = member.field
            out.update(field_metrics(field.field.name, field.stats, field.live_rows, field.capacity))
        return out

    def _apply(self, fn, recurse=True):
        return self  # host state, as DynamicField's


def advance_event_clock(clock: torch.Tensor, event_time_ms: int | None, fields: list[str], what: str) -> Clock:
    """Move an event clock (a 0-d int64 buffer, -1 before any time) forward to a batch's
    event time, never back; the batch's Clock. A first batch without a time is refused
    before anything changes."""
    newest = int(clock)
    if event_time_ms is None and newest < 0:
        raise EventTimeMissing(
            f"dynamic field(s) {', '.join(fields)} evict by event time (evict_after), but {what} carries no event "
            "time and none came before it: day-file partitions, Kafka messages and joined samples carry one "
            "(PackedBatch.event_time_ms); elsewhere use evict_after_steps")
    now = max(newest, event_time_ms if event_time_ms is not None else newest)
    clock.fill_(now)
    # The batch before was stamped with the clock as it stood (none: this is the first).
    return Clock(now, newest if newest >= 0 else now)


def field_metrics(name: str, stats: DynamicStats, live_rows: int, capacity: int) -> dict[str, float]:
    """A field's metrics, as a published version logs them: `dynamic_<field>_<count>`."""
    prefix = f"dynamic_{name}_"
    out = {prefix + f.name: float(getattr(stats, f.name)) for f in fields(stats)}
    out[prefix + "live_rows"] = float(live_rows)
    out[prefix + "fill"] = live_rows / capacity
    return out


def _field_of_ids(offsets: torch.Tensor, num_fields: int, num_ids: int) -> torch.Tensor:
    """The field (its place in the group) of each of a group's flat ids: bags are sample
    after sample, field after field, starting at `offsets`."""
    starts = offsets.to(torch.int64)
    lengths = torch.diff(starts, append=torch.tensor([num_ids]))
    fields_of_bags = torch.arange(num_fields).repeat(starts.numel() // num_fields)
    return torch.repeat_interleave(fields_of_bags, lengths)


def initial_rows(keys: torch.Tensor, width: int, scale: float) -> torch.Tensor:
    """A new row's first values: uniform in [-scale, scale), a pure function of its key
    (splitmix64 of the key and the column), so a row starts the same in every run and
    after every restore, whatever else happened in between."""
    if not scale or not keys.numel():
        return torch.zeros((keys.numel(), width))
    return kernels.id_map_initial_rows(keys, width, scale)


def reset_new_rows(embeddings, ids: dict[str, torch.Tensor], resets: dict[str, RowResets]) -> None:
    """Give the rows new keys took their first values and zeroed slots, in every embedding
    over them, where the step's ids point (table rows, or fast-tier slots with a cache); a
    dynamic cross that feeds one part of the model has rows in that part's embeddings alone."""
    for group, reset in resets.items():
        targets = ids[group][reset.positions.to(ids[group].device)]
        for embedding in embeddings:
            if embedding.has_group(group):
                embedding.reset_rows(group, targets, reset.keys)
