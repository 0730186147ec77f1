"""The hot-row cache: two tiers per packed table, and the per-batch moves between them.

- The big tier holds every row and its optimizer slots: the PackedEmbedding's own table
  buffers, in host memory or memory-mapped from files under `CacheConfig.big_tier_dir`
  for tables larger than RAM. Checkpoints save it, so a checkpoint is the same with the
  cache on or off.
- The fast tier holds the hottest rows (a HotRowDirectory decides which) in one compact
  array per table, on the GPU when training runs there, followed by a staging area for
  the rows a batch needs that are not hot.

A batch goes through three calls:
1. `prepare` (may run in a worker thread while the previous batch computes): de-duplicate
   the batch's ids, count them in the directory, map them to fast-tier slots, gather the
   missing rows (and their slots) from the big tier, and rewrite the ids as fast-tier
   indices;
2. `install` (main thread, just before compute): copy the gathered rows into the staging
   area; a row the previous batch also staged was written back after `prepare` read it,
   so it is read again now;
3. `commit` (after compute): write the staged rows, now updated, back to the big tier.
Hot rows stay in the fast tier, updated in place; a hot row a step touched is dirty, and
dirty rows are written back when evicted and by `flush` (before a checkpoint). Every row a step touches is in the fast tier while the
step runs, and every row is read after its last write, so training with the cache
computes exactly what it computes without (tests check this to 1e-6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from picasso import big_tier, kernels
from picasso.batch import TorchBatch
from picasso.embedding import PackedEmbedding
from picasso.hot_rows import HotRowDirectory


@dataclass(frozen=True)
class CacheConfig:
    # Fast-tier size per packed group: rows ("50000"), bytes ("64MiB", "2GB") or a share
    # of the group's rows ("5%"). Bytes count the row and its optimizer slots, summed over
    # every embedding of the model that uses the group (Wide&Deep has two; a cross's group
    # that feeds one part of the model, one).
    capacity: str = "10%"
    group_capacity: dict[str, str] = field(default_factory=dict)  # per-group overrides
    refresh_every: int = 100  # steps between admissions/evictions (every step while slots are free)
    half_life: float = 2000.0  # steps for a row's access count to halve
    big_tier_dir: str | None = None  # memory-map the big tier from files here

    def capacity_of(self, group: str) -> str:
        return self.group_capacity.get(group, self.capacity)


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_capacity(text: str, num_rows: int, row_bytes: int) -> int:
    """Rows of fast tier that `text` asks for, between 1 and num_rows."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%|[kmg]i?b|b)?\s*", str(text).lower())
    if not match:
        raise ValueError(f"cache capacity {text!r}: give rows (50000), bytes (64MiB) or a share of rows (5%)")
    number, unit = float(match.group(1)), match.group(2) or ""
    if unit == "%":
        rows = num_rows * number / 100
    elif unit:
        rows = number * _UNITS[unit] / row_bytes
    else:
        rows = number
    return max(1, min(num_rows, int(rows)))


def counter_metrics(counters, **derived: float) -> dict[str, float]:
    """A dataclass of counts as metrics (floats), with the rates derived from them."""
    return {**{f.name: float(getattr(counters, f.name)) for f in fields(counters)}, **derived}


@dataclass
class CacheStats:
    """Counts since the last `reset`, over training steps."""

    steps: int = 0
    lookups: int = 0  # ids looked up (with repeats)
    hits: int = 0  # of those, served by a hot row
    rows_moved: int = 0  # rows copied between tiers (staged in, written back, admitted, evicted)
    bytes_moved: int = 0
    refreshes: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else float("nan")

    def as_metrics(self) -> dict[str, float]:
        return counter_metrics(self, hit_rate=self.hit_rate)


class TieredTable:
    """One embedding's table for one group: big tier (its buffers) and fast tier."""

    def __init__(self, embedding: PackedEmbedding, group: str, capacity: int, device: torch.device,
                 big_tier_dir: Path | None):
        names = [f"table_{group}"] + [f"slot{i}_{group}" for i in range(len(embedding.slots(group)))]
        if big_tier_dir is not None:
            for name in names:
                if big_tier.path_of(embedding._buffers[name]) is None:  # made in memory: copied into a file
                    embedding._buffers[name] = big_tier.file_copy(embedding._buffers[name], big_tier_dir, name)
        self.big = [embedding._buffers[name] for name in names]
        self.capacity = capacity
        self.device = device
        self.fast = [torch.zeros((capacity, *t.shape[1:]), dtype=t.dtype, device=device) for t in self.big]
        self.row_bytes = sum(t[0].numel() * t.element_size() for t in self.big)

    @property
    def staging_capacity(self) -> int:
        return self.fast[0].shape[0] - self.capacity

    def ensure_staging(self, rows: int) -> None:
        if rows > self.staging_capacity:
            size = self.capacity + max(rows, int(self.staging_capacity * 1.25))
            grown = []
            for t in self.fast:
                bigger = torch.empty((size, *t.shape[1:]), dtype=t.dtype, device=t.device)
                # The staged rows too: a scoring batch may grow the area while a training
                # batch's rows sit in it, installed and waiting to compute.
                bigger[: t.shape[0]] = t
                grown.append(bigger)
            self.fast = grown

    def gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Big-tier values of rows (and of their slots)."""
        values = []
        for t in self.big:
            value = torch.empty((rows.numel(), *t.shape[1:]), dtype=t.dtype)
            kernels.copy_rows(value, _ALL, t, rows)
            values.append(value)
        return values

    def load(self, slots: torch.Tensor, values: list[torch.Tensor]) -> None:
        for fast, value in zip(self.fast, values):
            kernels.copy_rows(fast, slots, value, _ALL)

    def write_back(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        for fast, big in zip(self.fast, self.big):
            kernels.copy_rows(big, rows, fast, slots)


_ALL = torch.zeros(0, dtype=torch.int64)  # copy_rows: every row in order
_NONE = torch.zeros(0, dtype=torch.int64)  # no rows in flight


@dataclass
class PreparedGroup:
    lookups: int  # ids looked up
    hits: int  # of those, served by hot rows
    hit_slots: torch.Tensor  # the hot slots the batch reads (and, training, updates)
    miss_rows: torch.Tensor  # rows staged for this batch, in staging order
    staged: list[list[torch.Tensor]]  # per tiered table, the gathered values of miss_rows
    reread: torch.Tensor  # staging positions to read again at install (written back since gathered)


@dataclass
class PreparedBatch:
    tensors: TorchBatch  # ids rewritten as fast-tier indices
    groups: dict[str, PreparedGroup]
    epoch: int  # the directory's mapping it was prepared against


class HotCache:
    """The fast tiers of every PackedEmbedding of a model, one directory per packed group
    (over the tables of the embeddings that have the group)."""

    def __init__(self, embeddings: list[PackedEmbedding], config: CacheConfig, device: torch.device, seed: int = 0):
        # The whole plan: a model's embeddings may each hold a part of its groups (a cross
        # that feeds one part of the model: packing), and a group's tiers are those of the
        # embeddings that have it.
        plan = embeddings[0].plan.root
        groups = [(i, g) for i, g in enumerate(plan.groups) if any(e.has_group(g.name) for e in embeddings)]
        big_dir = Path(config.big_tier_dir) if config.big_tier_dir else None
        if big_dir is not None:
            big_dir.mkdir(parents=True, exist_ok=True)
        unknown = sorted(set(config.group_capacity) - {g.name for _, g in groups})
        if unknown:
            raise ValueError(f"cache capacity for {unknown}: no such packed table; the tables are "
                             f"{[g.name for _, g in groups]}")
        self.directories: dict[str, HotRowDirectory] = {}
        self.tables: dict[str, list[TieredTable]] = {}
        for embedding in embeddings:
            embedding.fast_tiers = {}
        for i, group in groups:  # seeded by the group's place in the plan, whichever embeddings have it
            having = [e for e in embeddings if e.has_group(group.name)]
            row_bytes = sum(t[0].numel() * 4 for e in having for t in [e.tables[group.name], *e.slots(group.name)])
            capacity = parse_capacity(config.capacity_of(group.name), group.num_rows, row_bytes)
            self.directories[group.name] = HotRowDirectory(
                group.num_rows, capacity, config.refresh_every, config.half_life, seed=seed + i)
            self.tables[group.name] = [TieredTable(e, group.name, capacity, device, big_dir) for e in having]
            for embedding, tier in zip(having, self.tables[group.name]):
                embedding.fast_tiers[group.name] = tier
        for embedding in embeddings:
            # state_dict() and load_state_dict() see the tables: keep them and the fast tier
            # in step, so that saving or loading the model directly is right too.
            embedding.register_state_dict_pre_hook(lambda *_: self.flush())
            embedding.register_load_state_dict_post_hook(lambda *_: self.reload())
        # Hot slots updated since their row was last written back to the big tier.
        self.dirty = {name: torch.zeros(d.capacity, dtype=torch.bool) for name, d in self.directories.items()}
        self.epoch = 0
        self.stats = CacheStats()
        self._in_flight: dict[str, torch.Tensor] = {}  # rows staged by the batch being computed

    # -- the three calls of a batch ---------------------------------------------------

    def prepare(self, tensors: TorchBatch, observe: bool = True) -> PreparedBatch:
        """`observe`: count the lookups (training batches, once each). No refresh may run
        meanwhile: it changes the mapping this reads."""
        groups, local_ids = {}, {}
        for name, directory in self.directories.items():
            ids = tensors.ids[name]
            local_ids[name], miss_rows, miss_counts, hit_slots, hit_counts = kernels.map_to_slots(
                ids, directory.slot_of_row, directory.capacity)
            if observe:
                directory.observe(miss_rows, miss_counts, hit_slots, hit_counts)
            previous = self._in_flight.get(name)
            reread = torch.zeros(0, dtype=torch.int64)
            if previous is not None and previous.numel() and miss_rows.numel():
                reread = kernels.positions_in(miss_rows, previous, directory.num_rows)
            # Gathered on the host, then sent to the fast tier's device now (on a GPU, on
            # the caller's stream: the trainer's copy stream, beside the running step).
            staged = [[value.to(table.device, non_blocking=True) for value in table.gather(miss_rows)]
                      for table in self.tables[name]]
            groups[name] = PreparedGroup(ids.numel(), int(hit_counts.sum()), hit_slots, miss_rows, staged, reread)
        local = replace(tensors, ids=local_ids)
        return PreparedBatch(local, groups, self.epoch)

    def install(self, prepared: PreparedBatch, training: bool = True) -> None:
        """Load the batch's staged rows. A scoring batch (`training` False) stages its rows
        after the last training batch's and points its ids there, so that scoring between
        two training steps (a stream's prequential score, or while an interleaved step is
        installed and waiting to compute) never changes what a training step reads or
        writes back."""
        if prepared.epoch != self.epoch:
            raise RuntimeError("batch was prepared before the last cache refresh; prepare it again")
        shifted = {}
        for name, group in prepared.groups.items():
            directory = self.directories[name]
            after = 0 if training else self._in_flight.get(name, _NONE).numel()
            staging = directory.capacity + after + torch.arange(group.miss_rows.numel())
            for table, staged in zip(self.tables[name], group.staged):
                table.ensure_staging(after + group.miss_rows.numel())
                table.load(staging, staged)
                if group.reread.numel():
                    table.load(staging[group.reread], table.gather(group.miss_rows[group.reread]))
            if after:
                ids = prepared.tensors.ids[name]
                shifted[name] = torch.where(ids >= directory.capacity, ids + after, ids)
            if training:
                self._in_flight[name] = group.miss_rows
                self.dirty[name][group.hit_slots] = True
                self.stats.lookups += group.lookups
                self.stats.hits += group.hits
                # Staged in now and written back by commit (counted here: commit may run
                # in the compute thread, and stats are only written from this one).
                self._count_moved(name, 2 * group.miss_rows.numel())
        if training:
            self.stats.steps += 1
        if shifted:
            prepared.tensors = replace(prepared.tensors, ids={**prepared.tensors.ids, **shifted})

    def commit(self, prepared: PreparedBatch) -> None:
        """Write the batch's staged rows back to the big tier."""
        for name, group in prepared.groups.items():
            staging = self.directories[name].capacity + torch.arange(group.miss_rows.numel())
            for table in self.tables[name]:
                table.write_back(staging, group.miss_rows)

    # -- refresh, flush, checkpoints --------------------------------------------------

    @property
    def refresh_due(self) -> bool:
        return any(d.refresh_due for d in self.directories.values())

    def refresh(self) -> None:
        """Admit and evict per the directories; batches prepared before must be prepared again."""
        for name, directory in self.directories.items():
            if not directory.refresh_due:
                continue
            plan = directory.plan_refresh()
            dirty = self.dirty[name][plan.evict_slots]
            evict_slots, evict_rows = plan.evict_slots[dirty], plan.evict_rows[dirty]
            for table in self.tables[name]:
                if evict_rows.numel():
                    table.write_back(evict_slots, evict_rows)
                if plan.admit_rows.numel():
                    table.load(plan.admit_slots, table.gather(plan.admit_rows))
            self.dirty[name][plan.admit_slots] = False
            self._count_moved(name, evict_rows.numel() + plan.admit_rows.numel())
            self.stats.refreshes += 1
        self.epoch += 1
        self._in_flight = {}

    def flush(self) -> None:
        """Write every dirty hot row back to the big tier, so the tables alone are complete."""
        for name, directory in self.directories.items():
            slots = torch.nonzero(self.dirty[name]).flatten()
            for table in self.tables[name]:
                table.write_back(slots, directory.row_of_slot[slots])
            self.dirty[name][slots] = False
            self._count_moved(name, slots.numel())

    def reload(self) -> None:
        """Read every hot row from the big tier again (after the tables were restored)."""
        for name, directory in self.directories.items():
            slots = torch.nonzero(directory.row_of_slot >= 0).flatten()
            for table in self.tables[name]:
                table.load(slots, table.gather(directory.row_of_slot[slots]))
            self.dirty[name].zero_()
        self.epoch += 1
        self._in_flight = {}

    def state_dict(self) -> dict:
        return {name: directory.state_dict() for name, directory in self.directories.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, directory in self.directories.items():
            if name in state:
                directory.load_state_dict(state[name])
        self.reload()

    def _count_moved(self, group: str, rows: int) -> None:
        self.stats.rows_moved += rows
        self.stats.bytes_moved += rows * sum(t.row_bytes for t in self.tables[group])
