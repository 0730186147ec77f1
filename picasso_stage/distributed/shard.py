"""One parameter-server shard: its part of the model, its optimizers, its token control.

A shard holds, under the Trainer's state-dict keys (layout.py): on shard 0 the dense
parameters with Adam over them (the Trainer's dense optimizer, from
TrainConfig.dense_optimizer_for: same settings, same state layout), and on every shard its
stripe of each embedding table with the table's sparse optimizer slots (its weight decay
too). It also counts, per local row, how many optimizer steps have updated it (its
version), which gives each pushed row its own staleness.

`pull` and `push` are what the RPC layer (param_server.py) serves; a lock makes each one
atomic, so a pull never sees half a step. When a push completes a global batch, the
shard applies it at once: the dense gradient through Adam, each table's aggregated row
gradients through its fused sparse optimizer kernel (one (row, gradient) bag per row,
which is exactly the update the Trainer's backward pass makes for those rows).
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field, replace

import torch

from picasso import kernels
from picasso.distributed.aggregation import Contribution, GlobalGradient, RowGradient
from picasso.distributed.dynamic_shard import BATCHES_KEY, ShardMaps
from picasso.distributed.gba import GBAConfig, PushOutcome, TokenControl, WorkerDropped
from picasso.distributed.layout import ShardLayout, TableLayout
from picasso.distributed.applied_ranges import AppliedRanges
from picasso.sample_identity import Range, Spans
from picasso.trainer import TrainConfig


@dataclass(frozen=True)
class Pulled:
    token: int  # the shard's global step: push it back with the gradient
    dense: dict[str, torch.Tensor]  # parameter name -> value (shard 0, when asked)
    rows: dict[str, torch.Tensor]  # table key -> (k, dim) values of the rows asked for, in their order
    versions: dict[str, torch.Tensor]  # table key -> (k,) how many steps had updated each row
    stop: bool = False  # the job's sample budget is spent: train no further
    dropped: bool = False  # the pulling incarnation was dropped: nothing else is filled in
    # The shard does not know a worker that has pulled from it before: it restarted (from
    # its checkpoint) since. Nothing else is filled in.
    restarted: bool = False


@dataclass(frozen=True)
class ShardSnapshot:
    """A shard's whole state at one step; layout.merge over all shards gives the model's."""

    index: int
    tensors: dict[str, torch.Tensor]
    dense_optimizer: dict | None  # shard 0's Adam state_dict
    step: int
    samples: int  # samples in the global batches applied
    counts: dict[str, int] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)  # sources' positions of the batches applied
    contributed: dict[str, int] = field(default_factory=dict)  # worker name -> local batches accepted
    applied: dict[str, list[list[int]]] = field(default_factory=dict)  # source -> ranges in the model (applied_ranges.py)
    # Per dynamic field, (its counts since the snapshot before, its live rows) on this shard.
    dynamic: dict = field(default_factory=dict)
    # Shard 0: the prequential window (labels, and the scores given before training) of the
    # batches trained since the window was last published, and the newest event time trained.
    window: Scored | None = None
    newest_event_ms: int | None = None


@dataclass(frozen=True)
class Scored:
    """Labels and the scores a model gave them before training on them, in training order."""

    labels: torch.Tensor
    scores: torch.Tensor

    @classmethod
    def empty(cls) -> "Scored":
        return cls(torch.zeros(0), torch.zeros(0))


@dataclass(frozen=True)
class ShardStatus:
    step: int
    samples: int
    workers: list[str]  # the live workers' ids (name/incarnation): those that pulled within their lease
    counts: dict[str, int]  # what the pushes came to (TokenControl.counts)
    staleness_sum: int  # of the accepted pushes (steps between their pull and their push)


class Shard:
    def __init__(self, index: int, layout: ShardLayout, tensors: dict[str, torch.Tensor], gba: GBAConfig,
                 train: TrainConfig, dense_optimizer: dict | None = None, step: int = 0, samples: int = 0,
                 sample_budget: int | None = None, positions: dict[str, int] | None = None, checkpoint_every: int = 0,
                 ledger: AppliedRanges | None = None, window: Scored | None = None, newest_event_ms: int | None = None):
        """sample_budget: pulls answer stop once pushes of this many samples have been
        counted, and pushes after that are refused, so a job trains on a set number of
        samples however its workers share them (fast workers take more batches than a
        straggler)."""
        if not 0 <= index < layout.num_shards:
            raise ValueError(f"shard index {index} outside [0, {layout.num_shards})")
        self.index, self.layout = index, layout
        self.tensors = tensors
        self.params = [torch.nn.Parameter(tensors[name], requires_grad=True) for name in layout.dense] \
            if index == 0 else []
        for name, param in zip(layout.dense, self.params):
            self.tensors[name] = param.data  # one storage: the optimizer steps what pulls read
        self.dense_optimizer = train.dense_optimizer_for(self.params) if self.params else None
        if dense_optimizer is not None and self.dense_optimizer is not None:
            self.dense_optimizer.load_state_dict(dense_optimizer)
        self.versions = {t.key: torch.zeros(layout.local_rows(index, t), dtype=torch.int64) for t in layout.tables}
        self.control = TokenControl(gba, step, positions=positions, ledger=ledger)
        # The dynamic fields' maps of the keys this shard owns. LFU spares rows used within
        # the staleness limit: a gradient for them may still come.
        decay = gba.decay
        self.maps = ShardMaps(layout.dynamic, index, layout.num_shards, self.tensors,
                              decay.limit if decay.limit is not None else max(decay.tau_max, 1)) \
            if layout.dynamic else None
        self.samples = samples
        self.sample_budget = sample_budget
        # A snapshot is stashed at each step that is a multiple of checkpoint_every (0: none),
        # taken under the push lock right after that step: every shard stashes the same step,
        # so shard 0 can write a checkpoint of one step across shards while pushes go on.
        self.checkpoint_every = checkpoint_every
        self._stash_at: int | None = None  # a step asked for by stash_at (wall-clock checkpoints)
        self._stashed_now: tuple | None = None  # (step, positions) of the last stash_now
        self._stashed: dict[int, ShardSnapshot] = {}
        # The prequential window by the step that trained it (see ShardSnapshot.window): a
        # checkpoint's version forgets what it holds (forget_window), later steps stay.
        self._window: list[tuple[int, Scored]] = [(self.control.step, window)] if window is not None else []
        self.newest_event_ms = newest_event_ms
        self._lock = threading.Lock()
        self._arrived: dict[str, float] = {}  # when each worker's latest call came in (before the lock)

    # -- what workers call ------------------------------------------------------------------

    def pull(self, worker: str, rows: dict[str, torch.Tensor], dense: bool, first: bool = True) -> Pulled:
        """first: the worker's first pull from this shard. A later one from a worker this
        shard has never heard of means the shard restarted since: the worker's source has
        read past the checkpoint it resumed from, and its pushes must not come in."""
        self._arrived[worker] = time.monotonic()
        with self._lock:
            if not first and not self.control.knows(worker):
                return Pulled(-1, {}, {}, {}, restarted=True)
            try:
                token = self.control.pull(worker)
            except WorkerDropped:  # an answer, not an error: the worker rejoins (worker.py)
                return Pulled(-1, {}, {}, {}, dropped=True)
            values, versions = {}, {}
            for key, wanted in rows.items():
                local = self._local(key, wanted)
                # Indexing gathers into new tensors: later steps cannot change what is sent.
                values[key] = self.tensors[key][local]
                versions[key] = self.versions[key][local]
            dense_values = {name: self.tensors[name].clone() for name in self.layout.dense} if dense else {}
            return Pulled(token, dense_values, values, versions, stop=self._budget_spent())

    def resolve(self, worker: str, keys: dict[str, torch.Tensor], event_time_ms: int | None) -> dict[str, torch.Tensor]:
        """Per dynamic field, the rows of its keys (all owned here): dynamic_shard.ShardMaps."""
        self._arrived[worker] = time.monotonic()
        if self.maps is None:
            raise ValueError(f"shard {self.index} holds no dynamic fields")
        with self._lock:
            return self.maps.resolve(keys, event_time_ms, self.control.step, self.versions)

    def push(self, contribution: Contribution) -> PushOutcome:
        self._arrived[contribution.worker] = time.monotonic()
        with self._lock:
            # Pushed after the budget was spent (its pull came just before): not trained, so a
            # job trains on exactly its budget, however its workers raced to the end.
            if self._budget_spent():
                return self.control.refuse("refused_budget_spent", "the job's sample budget is spent")
            local_sparse, staleness = {}, {}
            for key, grad in contribution.sparse.items():
                local = self._local(key, grad.rows)
                local_sparse[key] = RowGradient(local, grad.grads, grad.versions)
                staleness[key] = self.versions[key][local] - grad.versions
            unknown = set(contribution.dense) - set(self.layout.dense) if self.index == 0 else set(contribution.dense)
            if unknown:
                raise ValueError(f"shard {self.index} holds no dense parameters {sorted(unknown)}")
            local_contribution = replace(contribution, sparse=local_sparse)  # the rest (positions, sequence) as sent
            outcome, gradient = self.control.push(local_contribution, staleness)
            if gradient is not None:
                self._apply(gradient)
                self._stepped(gradient)
            return outcome

    def apply(self, gradient: GlobalGradient) -> int:
        """One optimizer step with a global batch aggregated elsewhere (sync mode reduces it
        across its ranks), counted as if its contributions had been pushed and accepted
        here; returns the new global step. Nothing is token-controlled: the caller vouches
        that every contribution is fresh."""
        with self._lock:
            self._apply(gradient)
            self.control.step += 1
            counts = self.control.counts
            counts["steps"] += 1
            counts["accepted"] += len(gradient.workers)
            counts["accepted_samples"] += gradient.samples
            self._stepped(gradient)
            return self.control.step

    def positions(self) -> dict[str, int]:
        """How far the model is trained into each source (shard 0 keeps them)."""
        with self._lock:
            return self.control.all_positions()

    def held(self, worker: str, ranges: dict[str, Spans]) -> dict[str, list[Range]]:
        """The parts of a batch's identity this shard holds (claimed or trained): a joined
        batch leaves those rows out before its gradient is computed (worker.py)."""
        self._arrived[worker] = time.monotonic()
        with self._lock:
            return self.control.ledger.held(ranges)

    def settle(self, worker: str, ranges: dict[str, Spans]) -> None:
        """Positions nothing more will be trained for (TokenControl.settle)."""
        self._arrived[worker] = time.monotonic()
        with self._lock:
            self.control.settle(ranges)

    def pass_over(self, worker: str, sequence: int, positions: dict[str, int], ranges: dict[str, Spans]) -> bool:
        """A batch with nothing to train: its ranges and positions (TokenControl.pass_over)."""
        self._arrived[worker] = time.monotonic()
        with self._lock:
            return self.control.pass_over(worker, sequence, positions, ranges)

    def drop_worker(self, worker: str) -> int:
        with self._lock:
            return self.control.drop_worker(worker)

    def retire(self, worker: str) -> None:
        with self._lock:
            self.control.retire(worker)

    def renew(self, worker: str) -> None:
        """A worker with nothing to train says it is alive (its lease runs from now)."""
        self._arrived[worker] = time.monotonic()

    def drop_silent(self, lease_s: float) -> list[str]:
        with self._lock:
            return self.control.drop_silent(lease_s, dict(self._arrived))

    def step(self) -> int:
        with self._lock:
            return self.control.step

    def counts(self) -> dict[str, int]:
        """What the pushes came to: accepted, duplicates, refusals by reason, steps."""
        with self._lock:
            return dict(self.control.counts)

    def status(self) -> "ShardStatus":
        """Where this shard stands, for monitoring (a metrics scrape, from any thread)."""
        with self._lock:
            control = self.control
            return ShardStatus(control.step, self.samples, control.workers, dict(control.counts),
                               control.staleness_sum)

    def stash_at(self, step: int) -> bool:
        """Stash a snapshot when the model reaches `step` (a wall-clock checkpoint: shard 0
        asks every shard for the same step); False when this shard is past it already."""
        with self._lock:
            if self.control.step >= step:
                return False
            self._stash_at = step
            return True

    def stash_pending(self) -> bool:
        """A snapshot asked for by stash_at waits for a step this shard has not reached."""
        with self._lock:
            return self._stash_at is not None and self.control.step < self._stash_at

    def stash_now(self) -> bool:
        """Stash a snapshot of the model as it is, unless it is as the last one found it
        (the same step and positions): an idle stream's model is not copied again and again."""
        with self._lock:
            state = (self.control.step, sorted(self.control.all_positions().items()))
            self._stash_at = None  # taken now: no step need wait for it
            if state == self._stashed_now:
                return False
            self._stashed_now = state
            self._stashed[self.control.step] = self._snapshot()
            return True

    def forget_window(self, step: int) -> None:
        """A version now holds the window up to `step`, the step of the newest snapshot
        (a snapshot joins the window's entries into one at its step): the next version's
        window starts after it."""
        with self._lock:
            self._window = [(s, scored) for s, scored in self._window if s > step]

    def stashed_steps(self) -> list[int]:
        with self._lock:
            return sorted(self._stashed)

    def stashed(self, step: int, take: bool = False) -> ShardSnapshot | None:
        """The snapshot stashed at `step` (None when not yet); take=True also forgets it and
        every older one."""
        with self._lock:
            found = self._stashed.get(step)
            if take:
                self._stashed = {s: snap for s, snap in self._stashed.items() if s > step}
            return found

    def snapshot(self) -> ShardSnapshot:
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> ShardSnapshot:
        """The caller holds the lock."""
        if self.maps is not None:  # the maps' step clock is the global step
            self.tensors[BATCHES_KEY].fill_(self.control.step)
        return ShardSnapshot(
            index=self.index,
            tensors={key: value.clone() for key, value in self.tensors.items()},
            # A copy: Adam's state_dict holds its live moment tensors, which later steps change.
            dense_optimizer=copy.deepcopy(self.dense_optimizer.state_dict()) if self.dense_optimizer else None,
            step=self.control.step,
            samples=self.samples,
            counts=dict(self.control.counts),
            positions=self.control.all_positions(),
            contributed=dict(self.control.contributed),
            applied=self.control.applied().to_json(),
            dynamic=self.maps.take_stats() if self.maps is not None else {},
            window=self._window_now() if self.index == 0 else None,
            newest_event_ms=self.newest_event_ms,
        )

    def _window_now(self) -> Scored:
        """The window as one Scored (kept joined: every snapshot would join it again)."""
        if len(self._window) > 1:
            step = self._window[-1][0]
            self._window = [(step, Scored(torch.cat([w.labels for _, w in self._window]),
                                          torch.cat([w.scores for _, w in self._window])))]
        return self._window[0][1] if self._window else Scored.empty()

    # -- the optimizer step -------------------------------------------------------------------

    def _apply(self, gradient: GlobalGradient) -> None:
        if self.dense_optimizer is not None and gradient.dense:
            for name, param in zip(self.layout.dense, self.params):
                param.grad = gradient.dense.get(name)  # None: no worker sent it, Adam skips it
            self.dense_optimizer.step()
            self.dense_optimizer.zero_grad(set_to_none=True)
        for key in self.layout.steps_keys:  # one step of every PackedEmbedding, like a Trainer's forward
            self.tensors[key] += 1
        for key, (rows, grads) in gradient.sparse.items():
            self._apply_rows(self.layout.table(key), rows, grads)
            self.versions[key][rows] += 1
        self.samples += gradient.samples

    def _apply_rows(self, table: TableLayout, rows: torch.Tensor, grads: torch.Tensor) -> None:
        if rows.numel() == 0:
            return
        kernels.fused_update(
            self.tensors[table.key], [self.tensors[k] for k in table.slot_keys], rows,
            torch.arange(rows.numel(), dtype=torch.int32), grads.view(rows.numel(), 1, table.dim),
            1, table.optimizer, int(self.tensors[table.steps_key]),
        )

    def _stepped(self, gradient: GlobalGradient) -> None:
        """The caller holds the lock and has just applied `gradient` as the current step:
        its scores join the window, and a snapshot is stashed when one is due."""
        step = self.control.step
        if gradient.labels is not None:
            self._window.append((step, Scored(gradient.labels, gradient.scores)))
        if gradient.event_time_ms is not None:
            self.newest_event_ms = max(self.newest_event_ms or gradient.event_time_ms, gradient.event_time_ms)
        if (self.checkpoint_every and step % self.checkpoint_every == 0) or step == self._stash_at:
            self._stashed[step] = self._snapshot()

    def _budget_spent(self) -> bool:
        return self.sample_budget is not None and self.control.counts["accepted_samples"] >= self.sample_budget

    def _local(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        table = self.layout.table(key)
        rows = rows.to(torch.int64)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= table.num_rows):
            raise ValueError(f"rows of {key} must be in [0, {table.num_rows})")
        if self.layout.num_shards > 1 and rows.numel() and bool((self.layout.owner(rows) != self.index).any()):
            raise ValueError(f"shard {self.index} was sent rows of {key} that another shard owns")
        return self.layout.local(rows)
