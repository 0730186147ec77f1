"""Sync mode: N ranks (torchrun), each a full replica, one global batch per step.

Each rank computes its local batch's gradients exactly as a GBA worker does
(local_gradient.py), the ranks exchange them as flat tensors (below), and every rank
steps its own one-shard parameter server once (`Shard.apply`) with the gradient that
GBA's aggregation (aggregation.py) makes of N fresh local batches with M = N. By default
that is one Trainer step on the N local batches concatenated: the global batch's summed
loss over B = N times the local batch size, for the dense weights and the rows alike
(tests/test_sync_one_batch.py checks it step for step). The arithmetic is GBA's, which is
what lets a job switch between the modes with nothing changed but the mode. Every rank
applies the same bits to the same state, so the replicas stay identical without
broadcasting parameters.

Replicated, not sharded: every rank applies every rank's rows to its own full copy of the
tables, N times the optimizer work of one apply, inside the step a straggler stretches.
`SyncStats.apply_s` measures it (benchmarks.gba reports its share of a step).

The ranks step together: when one runs out of batches, all stop (its tail is not trained,
as with a DistributedSampler that drops the last uneven batches).

The exchange: two collectives a step over the default process group (gloo, which
sync-worker starts). With 4 ranks on 2 cores a gloo collective costs about 4 ms whether it
carries 12 numbers or 0.8 MB (measured), so a step pays for collectives more than for bytes,
and everything a step needs rides in these two:
1. all_reduce (sum) of one float32 tensor: every dense gradient flattened, times its
   batch's samples n_i; one slot per dense parameter, 1 where the rank has its gradient
   (aggregation leaves a parameter no batch reached without a gradient, so Adam skips
   it); and each rank's header in slots of its own, zero in every other rank's tensor, so
   the sum carries each header exactly: samples, configured batch size, mean loss, whether
   its sources changed, and its distinct rows per row set. Divided by B (the sum of the
   ranks' batch sizes), the dense part is aggregation's sum n_i g_i / B, rounded in
   another order (equal to float tolerance; a ring all-reduce hands every rank the same
   bits). Scaling after the sum rather than by n_i / B before is what lets the header ride
   along: B is not known until the headers have travelled. A rank out of batches sends samples 0, and every rank stops.
2. all_gather of one float32 tensor per rank, padded to the longest (the headers gave every
   rank's length): its sources' positions (raw int64 bits), its distinct rows per row set
   (raw int32 bits when every table's rows fit, else int64) and every table's row
   gradients. The tables of one packing group are looked up by the same ids (embedding and
   wide_embedding alike), so their rows travel once. Every rank then sums duplicate rows
   with aggregation.aggregate itself: the row part is GBA's bit for bit, under either row
   gradient rule (touched-mean needs to know which ranks held a row, which the gathered ids
   say). All-reducing over the union of the ranks' rows instead would need the ids gathered
   first (one more collective) and, with the benchmark's batches (the union is 0.75 of all
   W ranks' rows), move more: 2(W-1)/W of the union each way against W-1 ranks' rows.
Per step at the benchmark's settings (criteo:26, MLP 256-128, 4 ranks of 512): the
all-reduce's tensor is 0.71 MB (a ring moves 1.07 MB each way per rank) and a rank's part
of the gather 0.76 MB, of which it receives 3, 2.3 MB.

Positions: every rank's batch positions are known on every rank after each step, and a
checkpoint (rank 0's, every `checkpoint_every` steps and at the end) carries them: a job
resumed from it, in any mode, reads each source on from there. Each rank's source names
are agreed with one all_gather_object on the first step and whenever a rank's batch names
other sources than it announced; from then on only the values travel, inside the gather.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from picasso.batch import PackedBatch
from picasso.distributed.aggregation import Contribution, GlobalGradient, RowGradient, Weighted, aggregate
from picasso.distributed.gba import GBAConfig
from picasso.distributed.layout import SYNC_DYNAMIC, ShardLayout
from picasso.distributed.local_gradient import GradientComputer, LocalGradient
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.staleness import NO_DECAY
from picasso.distributed.worker import Straggler
from picasso.trainer import Trainer, merge_positions

_EXACT = 2 ** 24  # float32 holds every integer below this: header counts travel as floats
_HEADER = 4  # a header's slots before its row counts: samples, batch size, mean loss, renamed


@dataclass(frozen=True)
class TableSlot:
    key: str  # the table's state-dict key
    dim: int
    row_set: int  # tables looked up by the same ids (one packing group) share a row set


@dataclass(frozen=True)
class ExchangeLayout:
    """The shape of every rank's gradients, the same on every rank (each builds the same
    model): it cuts the exchange's flat tensors."""

    dense: tuple[tuple[str, tuple[int, ...]], ...]  # parameter name and shape, in the optimizer's order
    tables: tuple[TableSlot, ...]
    id_dtype: torch.dtype = torch.int64  # how row ids travel; int32 halves them where every table fits

    def __post_init__(self):
        if self.id_dtype not in (torch.int32, torch.int64):
            raise ValueError(f"row ids travel as int32 or int64, not {self.id_dtype}")
        sets = sorted({t.row_set for t in self.tables})
        if sets != list(range(len(sets))):
            raise ValueError(f"row sets must be numbered 0..n-1, got {sets}")

    @classmethod
    def of(cls, layout: ShardLayout, tensors: dict[str, torch.Tensor], computer: GradientComputer) -> "ExchangeLayout":
        """A shard's dense parameters and the computer's lookups (tables of one group share rows)."""
        groups: dict[str, int] = {}
        tables = tuple(TableSlot(lookup.key, layout.table(lookup.key).dim, groups.setdefault(lookup.group, len(groups)))
                       for lookup in computer.lookups)
        fits = all(table.num_rows <= torch.iinfo(torch.int32).max for table in layout.tables)
        return cls(tuple((name, tuple(tensors[name].shape)) for name in layout.dense), tables,
                   torch.int32 if fits else torch.int64)

    @property
    def row_sets(self) -> int:
        return 1 + max((t.row_set for t in self.tables), default=-1)

    @property
    def set_keys(self) -> tuple[str, ...]:
        """Per row set, the first table's key: its rows speak for the set."""
        first: dict[int, str] = {}
        for table in self.tables:
            first.setdefault(table.row_set, table.key)
        return tuple(first[s] for s in range(self.row_sets))

    @property
    def dense_size(self) -> int:
        return sum(math.prod(shape) for _, shape in self.dense)

    @property
    def header_size(self) -> int:
        return _HEADER + self.row_sets

    @property
    def id_slots(self) -> int:
        """float32 slots per row id."""
        return torch.empty((), dtype=self.id_dtype).element_size() // 4

    def payload_size(self, rows: tuple[int, ...], positions: int) -> int:
        """float32 slots of a rank's part of the gather: `positions` int64 values, its ids per
        row set, and every table's row gradients."""
        return 2 * positions + sum(rows) * self.id_slots + sum(rows[t.row_set] * t.dim for t in self.tables)


@dataclass(frozen=True)
class RankHeader:
    """What one rank announces in the all-reduce."""

    samples: int  # 0: the rank has no batch, and every rank stops
    batch_size: int  # its configured local batch (Contribution.batch_size; 0: unsaid)
    loss_sum: float
    renamed: bool  # its batch's sources differ from the ones it announced before
    rows: tuple[int, ...]  # its distinct rows per row set


@dataclass(frozen=True)
class _RankPart:
    """One rank's part of the gather, read back."""

    sparse: dict[str, RowGradient]  # table key -> its rows and row gradients
    positions: list[int]  # its position values, in the order of its agreed source names


@dataclass(frozen=True)
class Exchanged:
    """One step's gradients, as every rank holds them after the exchange."""

    dense: dict[str, torch.Tensor]  # already reduced: aggregation's sum n_i g_i / B
    contributions: tuple[Contribution, ...]  # per rank: its samples and row gradients (no dense)
    loss_sum: float  # over every rank
    positions: tuple[dict[str, int], ...]  # per rank: where its batch ends in its sources

    @property
    def samples(self) -> int:
        return sum(c.samples for c in self.contributions)

    def gradient(self, row_gradient: str = "global-mean") -> GlobalGradient:
        """The step's gradient: the rows summed by aggregation itself, every rank fresh (weight 1)."""
        fresh = [Weighted(c, 1.0, {key: torch.ones(()).expand(rows.rows.shape[0]) for key, rows in c.sparse.items()})
                 for c in self.contributions]
        return GlobalGradient(self.dense, aggregate(fresh, row_gradient).sparse, self.samples,
                              tuple(c.worker for c in self.contributions))


class GradientExchange:
    """The two collectives of a sync step (see the module docstring), one instance per rank."""

    def __init__(self, layout: ExchangeLayout, rank: int, world_size: int, group=None):
        self.layout, self.rank, self.world_size, self.group = layout, rank, world_size, group
        self.sources: list[tuple[str, ...]] = [()] * world_size  # every rank's source names, as last agreed

    def exchange(self, local: LocalGradient | None, positions: dict[str, int], token: int = 0) -> Exchanged | None:
        """Every rank calls it once a step, with its batch's gradient (None: it has no batch)
        and positions; None when some rank had no batch: every rank stops. token: the step
        the gradients were computed at, recorded in the contributions."""
        if local is not None:
            self._check(local)
        renamed = local is not None and tuple(positions) != self.sources[self.rank]
        headers, dense = self._all_reduce(local, renamed)
        if not all(h.samples for h in headers):
            return None
        if any(h.renamed for h in headers):
            named: list = [None] * self.world_size
            dist.all_gather_object(named, dict(positions), group=self.group)
            self.sources = [tuple(p) for p in named]
            carried = [0] * self.world_size  # this once the names brought the values too
        else:
            named, carried = None, [len(s) for s in self.sources]
        parts = self._all_gather(local, headers, positions, carried)
        contributions = tuple(Contribution(f"rank{rank}/sync", token, header.samples, sparse=part.sparse,
                                           batch_size=header.batch_size)
                              for rank, (header, part) in enumerate(zip(headers, parts)))
        every = tuple(named) if named is not None else \
            tuple(dict(zip(names, part.positions)) for names, part in zip(self.sources, parts))
        return Exchanged(dense, contributions, sum(h.loss_sum for h in headers), every)

    def _check(self, local: LocalGradient) -> None:
        if local.samples >= _EXACT or any(r.numel() >= _EXACT for r in local.rows.values()):
            raise ValueError(f"a local batch of {local.samples} samples: the exchange's header counts samples and "
                             f"rows in float32, exact below {_EXACT}")
        for table, first in ((t, self.layout.set_keys[t.row_set]) for t in self.layout.tables):
            if table.key != first and not torch.equal(local.rows[table.key], local.rows[first]):
                raise ValueError(f"tables {first} and {table.key} share a row set but were given different rows")

    def _all_reduce(self, local: LocalGradient | None,
                    renamed: bool) -> tuple[list[RankHeader], dict[str, torch.Tensor]]:
        layout, size = self.layout, self.layout.dense_size
        width = layout.header_size
        flat = torch.zeros(size + len(layout.dense) + self.world_size * width)
        if local is not None:
            at = 0
            for i, (name, shape) in enumerate(layout.dense):
                numel = math.prod(shape)
                grad = local.dense.get(name)
                if grad is not None:
                    flat[at:at + numel] = grad.reshape(-1)
                    flat[size + i] = 1.0
                at += numel
            flat[:size] *= local.samples
            mine = size + len(layout.dense) + self.rank * width
            # The mean loss is float32 already (a float32 loss times n): it travels exactly.
            flat[mine:mine + width] = torch.tensor(
                [local.samples, local.batch_size, local.loss_sum / local.samples, float(renamed),
                 *(local.rows[key].numel() for key in layout.set_keys)])
        dist.all_reduce(flat, group=self.group)
        slots = flat[size:].tolist()
        present, slots = slots[:len(layout.dense)], slots[len(layout.dense):]
        headers = []
        for rank in range(self.world_size):
            samples, batch_size, mean_loss, renamed_, *rows = slots[rank * width:(rank + 1) * width]
            headers.append(RankHeader(int(samples), int(batch_size), mean_loss * samples, bool(renamed_),
                                      tuple(int(r) for r in rows)))
        global_size = sum(h.batch_size or h.samples for h in headers)  # B, as aggregation's
        dense, at = {}, 0
        summed = flat[:size] / max(global_size, 1)
        for (name, shape), count in zip(layout.dense, present):
            numel = math.prod(shape)
            if count:
                dense[name] = summed[at:at + numel].view(shape)
            at += numel
        return headers, dense

    def _all_gather(self, local: LocalGradient, headers: list[RankHeader], positions: dict[str, int],
                    carried: list[int]) -> list[_RankPart]:
        """carried: per rank, how many position values its part carries."""
        layout = self.layout
        sizes = [layout.payload_size(h.rows, n) for h, n in zip(headers, carried)]
        # Even, and the int64 parts first: every rank's part of the gather is 8-byte aligned,
        # so the raw bits are viewed back as int64 in place. Never empty, which gloo refuses.
        longest = max(2, max(sizes) + max(sizes) % 2)
        send = torch.zeros(longest)
        own = [positions[source] for source in self.sources[self.rank]][:carried[self.rank]]
        mine = [torch.tensor(own, dtype=torch.int64).view(torch.float32)]
        mine += [local.rows[key].to(layout.id_dtype).view(torch.float32) for key in layout.set_keys]
        mine += [local.row_grads[t.key].float().reshape(-1) for t in layout.tables]
        torch.cat(mine, out=send[:sizes[self.rank]])
        gathered = torch.empty(self.world_size * longest)
        dist.all_gather_single(gathered, send, group=self.group)
        parts = []
        for header, part, values in zip(headers, gathered.split(longest), carried):
            at, rows = 2 * values, []
            for count in header.rows:
                width = count * layout.id_slots
                rows.append(part[at:at + width].view(layout.id_dtype).to(torch.int64))
                at += width
            sparse = {}
            for table in layout.tables:
                count = header.rows[table.row_set]
                grads = part[at:at + count * table.dim].view(count, table.dim)
                # Every row is fresh at this step: no staleness to tell, so no versions travel.
                unversioned = torch.zeros((), dtype=torch.int64).expand(count)
                sparse[table.key] = RowGradient(rows[table.row_set], grads, unversioned)
                at += count * table.dim
            parts.append(_RankPart(sparse, part[:2 * values].view(torch.int64).tolist()))
        return parts


@dataclass
class SyncStats:
    steps: int = 0
    samples: int = 0  # over every rank
    loss_sum: float = 0.0  # over every rank, each batch's loss before its step
    seconds: float = 0.0  # in steps, this rank's wall time
    apply_s: float = 0.0  # of which applying the global gradient to this rank's replica

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")


class SyncReplica:
    def __init__(self, trainer: Trainer, rank: int, world_size: int, slowdown: float = 1.0,
                 row_gradient: str = "global-mean"):
        """trainer: this rank's Trainer, built (and restored) alike on every rank; its
        config's loss_batch_size is this rank's local batch (B = the ranks' sum);
        slowdown: this rank straggles (worker.Straggler), as the benchmark injects;
        row_gradient: aggregation's rule for rows (ROW_GRADIENTS)."""
        self.trainer, self.rank, self.world_size, self.straggler = trainer, rank, world_size, Straggler(slowdown)
        if trainer.spec.dynamic_fields:
            raise ValueError(SYNC_DYNAMIC)
        self.row_gradient = row_gradient
        self.shard, self.layout = build_shard(trainer, 0, 1, GBAConfig(world_size, NO_DECAY, row_gradient))
        config = trainer.config
        self.computer = GradientComputer(config.build_model(trainer.spec, trainer.plan), config.loss_batch_size or 0)
        self.last_apply_s = 0.0  # the last step's time applying the gradient
        self.exchange = GradientExchange(ExchangeLayout.of(self.layout, self.shard.tensors, self.computer),
                                         rank, world_size)
        self.positions = dict(trainer.positions)  # how far every rank's sources are trained

    def train(self, batches: Iterable[PackedBatch], checkpoint_every: int = 0,
              save: Callable[["SyncReplica"], object] | None = None) -> SyncStats:
        """save(replica) is called on every rank after each checkpoint_every-th step (0: never);
        the replicas are identical then, so one rank writing is enough."""
        stats = SyncStats()
        batches = iter(batches)
        while True:
            started = time.perf_counter()
            stepped = self._step(next(batches, None))
            if stepped is None:
                return stats
            loss_sum, samples = stepped
            stats.steps += 1
            stats.samples += samples
            stats.loss_sum += loss_sum
            stats.seconds += time.perf_counter() - started
            stats.apply_s += self.last_apply_s
            if checkpoint_every and save is not None and stats.steps % checkpoint_every == 0:
                save(self)

    def step(self, batch: PackedBatch) -> tuple[float, int]:
        """One global step; returns (summed loss, samples) over every rank's batch."""
        stepped = self._step(batch)
        if stepped is None:
            raise RuntimeError("no global step: some rank had no batch")
        return stepped

    def _step(self, batch: PackedBatch | None) -> tuple[float, int] | None:
        local, token = None, self.shard.control.step
        with self.straggler.working():  # this rank's own work: a straggler's takes longer
            if batch is not None and batch.num_samples > 0:
                tensors = batch.to_torch()
                rows = self.computer.rows_needed(tensors)
                # Read in place rather than pulled: the shard is this replica's alone, stepped
                # only by this thread, and every rank is fresh, so a pull's token, versions and
                # copies (a tenth of a rank's work in a step) buy nothing.
                values = {key: self.shard.tensors[key][self.layout.local(wanted)] for key, wanted in rows.items()}
                dense = {name: self.shard.tensors[name] for name in self.layout.dense}
                local = self.computer.compute(tensors, dense, rows, values)
        exchanged = self.exchange.exchange(local, batch.positions if local is not None else {}, token)
        if exchanged is None:
            return None
        with self.straggler.working():  # stepping its replica is its own work too
            applying = time.perf_counter()
            self.shard.apply(exchanged.gradient(self.row_gradient))
            self.last_apply_s = time.perf_counter() - applying
            for positions in exchanged.positions:
                self.positions = merge_positions(self.positions, positions)
        self.straggler.end_step()
        return exchanged.loss_sum, exchanged.samples

    def state(self) -> dict:
        """Trainer.state()'s layout, for a checkpoint any mode resumes from."""
        return trainer_state(self.layout, [self.shard.snapshot()], self.trainer)
