"""Which shard holds what, and the split/merge between a Trainer's state and the shards'.

The layout follows the model the packing plan built, under the Trainer's state-dict keys:
- every dense parameter (and any other persistent buffer) lives on shard 0. CTR models'
  dense parts are small next to their tables, and one owner keeps the dense optimizer's
  state in exactly torch.optim.Adam's layout;
- every packed table (one per packing group and PackedEmbedding that has it:
  `embedding.table_dim16`, `wide_embedding.table_dim16`, `wide_embedding.table_wide_crosses`
  (a cross that feeds the wide part alone), ...) is sharded by row id: row r lives on shard
  r % num_shards at local index r // num_shards, with its optimizer slots beside it.
  Packing gives each field a range of rows, so striping by id spreads every field (and the
  Zipf-hot ids, which hashing scatters) over all shards.

`split` and `merge` are exact inverses, so a parameter server starts from any Trainer
checkpoint and writes checkpoints Trainer.restore loads: the mode is switched by
restarting from a checkpoint, nothing else. With dynamic fields, split first moves each
id to a row its owning shard holds (dynamic_shard.py): split undoes merge, and merge
undoes split up to where the ids' rows are (and any a shard had no room for).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from picasso.distributed.dynamic_shard import CLOCK_KEYS, DynamicLayout, dynamic_layouts, merge_maps, rehome
from picasso.embedding import PackedEmbedding
from picasso.kernels import SparseOptimizer


# In sync mode every rank steps a replica of the whole model: the replicas' maps would
# admit and evict each rank's own ids and part ways. GBA's shards own ids instead
# (dynamic_shard.py).
SYNC_DYNAMIC = ("dynamic tables (a sparse field's or a cross's `dynamic:`) train in the local and gba modes, not in "
                "sync: its replicas would each admit their own ids; give the field or cross hash_buckets, or train "
                "with gba")


@dataclass(frozen=True)
class TableLayout:
    key: str  # the table's state-dict key, e.g. "embedding.table_dim16"
    slot_keys: tuple[str, ...]  # its optimizer slots' keys (rows along dim 0, like the table)
    steps_key: str  # the owning PackedEmbedding's step counter (lazy Adam's bias correction)
    optimizer: SparseOptimizer
    num_rows: int
    dim: int


@dataclass(frozen=True)
class ShardLayout:
    num_shards: int
    dense: tuple[str, ...]  # dense parameter names, in model.parameters() order (the optimizer's)
    tables: tuple[TableLayout, ...]
    other: tuple[str, ...]  # any other state-dict entry (kept, unchanged, on shard 0)
    keys: tuple[str, ...]  # every state-dict key, in the model's order (merge keeps it)
    # Dynamic fields: their maps are split by key owner, their rows re-homed (dynamic_shard.py).
    dynamic: tuple[DynamicLayout, ...] = ()

    def __post_init__(self):
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")

    @classmethod
    def from_model(cls, model: nn.Module, num_shards: int) -> "ShardLayout":
        tables, steps_keys = [], set()
        for prefix, module in model.named_modules():
            if not isinstance(module, PackedEmbedding):
                continue
            at = f"{prefix}." if prefix else ""
            steps_keys.add(f"{at}steps")
            for group in module.plan.groups:
                table = module.tables[group.name]
                tables.append(TableLayout(
                    key=f"{at}table_{group.name}",
                    slot_keys=tuple(f"{at}slot{i}_{group.name}" for i in range(len(module.slots(group.name)))),
                    steps_key=f"{at}steps",
                    optimizer=module.optimizers[group.name],
                    num_rows=table.shape[0],
                    dim=table.shape[1],
                ))
        dense = tuple(name for name, _ in model.named_parameters())
        dynamic = dynamic_layouts(model, num_shards)
        sharded = {key for t in tables for key in (t.key, *t.slot_keys)}
        sharded |= {key for d in dynamic for key in d.map_keys} | (set(CLOCK_KEYS) if dynamic else set())
        other = tuple(k for k in model.state_dict() if k not in sharded and k not in dense and k not in steps_keys)
        return cls(num_shards, dense, tuple(tables), other, tuple(model.state_dict()), dynamic)

    @property
    def steps_keys(self) -> tuple[str, ...]:
        return tuple(sorted({t.steps_key for t in self.tables}))

    def table(self, key: str) -> TableLayout:
        for table in self.tables:
            if table.key == key:
                return table
        raise KeyError(f"no table {key!r} in the layout; tables: {[t.key for t in self.tables]}")

    # -- rows -----------------------------------------------------------------------------

    def owner(self, rows: torch.Tensor) -> torch.Tensor:
        return rows % self.num_shards

    def local(self, rows: torch.Tensor) -> torch.Tensor:
        return rows // self.num_shards

    def local_rows(self, shard: int, table: TableLayout) -> int:
        """How many of the table's rows shard `shard` holds."""
        return len(range(shard, table.num_rows, self.num_shards))

    # -- state ------------------------------------------------------------------------------

    def split(self, model_state: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """A model state dict (Trainer.state()["model"]) cut into one dict per shard, under
        the same keys: shard s gets rows s, s + S, s + 2S, ... of every table and slot, and
        its share of each dynamic field's map."""
        expected = set(self.keys)
        if set(model_state) != expected:
            raise ValueError(f"the state does not fit the layout: missing {sorted(expected - set(model_state))}, "
                             f"unexpected {sorted(set(model_state) - expected)}")
        parts: list[dict[str, torch.Tensor]] = [{} for _ in range(self.num_shards)]
        if self.dynamic:  # each live key's row to a row its owner holds, and each shard's maps
            model_state, maps = rehome(model_state, self.dynamic, self.num_shards)
            for part, mine in zip(parts, maps):
                part.update(mine)
                part.update({key: model_state[key].clone() for key in CLOCK_KEYS})
        for key in (*self.dense, *self.other):
            parts[0][key] = model_state[key].clone()
        for s, part in enumerate(parts):
            for key in self.steps_keys:
                part[key] = model_state[key].clone()
            for table in self.tables:
                for key in (table.key, *table.slot_keys):
                    part[key] = model_state[key][s::self.num_shards].clone()
        return parts

    def merge(self, parts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The inverse of split. Step counters are shard 0's (every shard steps alike)."""
        if len(parts) != self.num_shards:
            raise ValueError(f"expected {self.num_shards} shard states, got {len(parts)}")
        state = {key: parts[0][key] for key in (*self.dense, *self.other, *self.steps_keys)}
        for table in self.tables:
            for key in (table.key, *table.slot_keys):
                first = parts[0][key]
                full = torch.empty((table.num_rows, *first.shape[1:]), dtype=first.dtype)
                for s, part in enumerate(parts):
                    full[s::self.num_shards] = part[key]
                state[key] = full
        if self.dynamic:
            state.update(merge_maps(parts, self.dynamic))
        return {key: state[key] for key in self.keys}
