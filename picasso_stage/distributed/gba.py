"""GBA token control: the global step, the workers' tokens, and when to step.

One `TokenControl` runs per parameter-server shard, over that shard's parameters:
- `pull(worker)` returns the token, the current global step; the worker computes its
  local gradient against parameters of that step.
- `push(contribution, row_staleness)` weighs the gradient by its staleness (step - token;
  per row, the row's own update count since the pull), drops it past the decay's hard
  limit, and buffers it. When M = `global_batches` contributions are in (exactly the
  synchronous global batch: N_sync local batches), it returns their aggregate for one
  optimizer step and advances the step. A push never waits for other workers.
- `drop_worker(worker)` forgets a failed worker: its buffered contributions leave the
  global batch and its tokens become invalid, so a push it sent before dying is refused.
  The worker rejoins by pulling again under a new incarnation id (see `worker_id`). Workers
  silent for longer than a lease are dropped the same way (`drop_silent`).
- a push whose source ranges were trained already (a retried bundle, a replay after a
  restart) is acknowledged as a duplicate and not trained again (applied_ranges.py).
- `pass_over(...)` takes a batch with nothing to train (its every message refused): its
  ranges go into the ledger and its positions count in the worker's order, as a push's.

Plain asynchronous training is the same machinery with M = 1 and no decay
(`GBAConfig.plain_async`): every push steps at once, however stale.

Nothing here touches a network or a parameter: shard.py applies the aggregate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from picasso.distributed.aggregation import Contribution, GlobalGradient, Weighted, aggregate, check_row_gradient
from picasso.distributed.applied_ranges import AppliedRanges
from picasso.distributed.staleness import NO_DECAY, StalenessDecay
from picasso.sample_identity import Range, Spans, joined_positions, spans_of
from picasso.trainer import merge_positions


@dataclass(frozen=True)
class GBAConfig:
    global_batches: int  # M: local batches per global step, N_sync (the sync mode's worker count)
    decay: StalenessDecay = field(default_factory=StalenessDecay)
    # How a row's gradient is averaged (aggregation.py): over the global batch, as one big
    # batch would (the paper's aggregation, and sync's), or over the batches that touched it.
    row_gradient: str = "global-mean"

    def __post_init__(self):
        if self.global_batches < 1:
            raise ValueError(f"global_batches (M) must be >= 1, got {self.global_batches}")
        check_row_gradient(self.row_gradient)

    @classmethod
    def plain_async(cls) -> "GBAConfig":
        """The baseline: no aggregation, no staleness control."""
        return cls(global_batches=1, decay=NO_DECAY)


@dataclass(frozen=True)
class PushOutcome:
    accepted: bool  # counted towards a global batch
    reason: str  # why not, when refused; "" when accepted
    staleness: int  # step at push - token (-1 when the token was not checked)
    weight: float  # the dense staleness weight (0 when refused)
    step: int  # the global step after this push
    stepped: bool  # this push completed a global batch
    duplicate: bool = False  # its source ranges were trained already: acknowledged, not trained


class WorkerDropped(ValueError):
    """A dropped incarnation pulled: it must rejoin under a new one (and re-read its source
    from the server's positions: its buffered batches were discarded)."""


def worker_id(name: str, incarnation: str) -> str:
    """A worker's id: its stable name (a rank) and the incarnation (a fresh id per process
    start), so the pushes of a worker that died are told apart from its successor's."""
    if not name or "/" in name:
        raise ValueError(f"a worker name must be non-empty and without '/', got {name!r}")
    return f"{name}/{incarnation}"


class TokenControl:
    def __init__(self, config: GBAConfig, step: int = 0, clock=time.monotonic, positions: dict[str, int] | None = None,
                 ledger: AppliedRanges | None = None):
        """positions: the sources' positions the model has trained up to (its checkpoint's);
        ledger: the source ranges it holds (its checkpoint's too)."""
        self.config = config
        self.step = step
        # Claimed: in the model, or buffered for the next step (given back if dropped).
        self.ledger = ledger.copy() if ledger is not None else AppliedRanges()
        # Advanced only when a batch leaves the buffer (stepped, or dropped as too stale): a
        # batch still buffered is not in the model, so a checkpoint's positions exclude it.
        self.positions = dict(positions or {})
        self.contributed: dict[str, int] = {}  # worker name (no incarnation) -> local batches accepted
        # Per worker (incarnation): the positions of numbered batches that left the buffer
        # ahead of an earlier batch of theirs, and the next number positions wait for.
        self._landed: dict[str, dict[int, dict[str, int]]] = {}
        self._next_sequence: dict[str, int] = {}
        # Per worker (incarnation): the ranges of batches passed over (pass_over) whose
        # positions wait for an earlier batch, by number: claimed, but not yet in the model.
        self._passed: dict[str, dict[int, dict[str, list[Range]]]] = {}
        self._clock = clock
        self._last_seen: dict[str, float] = {}  # live workers
        self._dropped: set[str] = set()
        self._buffer: list[Weighted] = []
        self.counts = {"accepted": 0, "accepted_samples": 0, "dropped_stale": 0, "refused_dropped_worker": 0,
                       "refused_unknown_worker": 0, "discarded_failed_worker": 0, "refused_budget_spent": 0,
                       "duplicate": 0, "refused_partly_trained": 0, "passed_over": 0, "steps": 0}
        self.staleness_sum = 0  # over the accepted pushes: with counts["accepted"], their mean staleness

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def dropped(self) -> set[str]:
        return set(self._dropped)

    @property
    def workers(self) -> list[str]:
        return sorted(self._last_seen)

    def knows(self, worker: str) -> bool:
        """Whether this worker has pulled here (it may have been dropped since)."""
        return worker in self._last_seen or worker in self._dropped

    def pull(self, worker: str) -> int:
        if worker in self._dropped:
            raise WorkerDropped(f"worker {worker!r} was dropped; rejoin under a new incarnation")
        self._last_seen[worker] = self._clock()
        return self.step

    def push(self, contribution: Contribution,
             row_staleness: dict[str, torch.Tensor] | None = None) -> tuple[PushOutcome, GlobalGradient | None]:
        """row_staleness: per table of contribution.sparse, each row's updates since the pull."""
        worker = contribution.worker
        if worker in self._dropped:
            return self.refuse("refused_dropped_worker", f"worker {worker!r} was dropped (failed or silent)"), None
        if worker not in self._last_seen:
            return self.refuse("refused_unknown_worker", f"worker {worker!r} never pulled"), None
        if not 0 <= contribution.token <= self.step:
            raise ValueError(f"worker {worker!r} pushed token {contribution.token}, outside [0, {self.step}]")
        self._last_seen[worker] = self._clock()
        verdict = self.ledger.verdict(contribution.ranges)
        if verdict != "new":
            # Its positions are recorded all the same: they are no further than the trained
            # ones, and the worker's later pushes wait for this sequence number.
            self._record_positions(worker, contribution.sequence, contribution.positions)
            if verdict == "held":
                self.counts["duplicate"] += 1
                return PushOutcome(False, f"already trained: {_describe(contribution.ranges)}", -1, 0.0, self.step,
                                   False, duplicate=True), None
            return self.refuse("refused_partly_trained", f"partly trained already: {_describe(contribution.ranges)} "
                               "(re-read a source from its checkpoint's positions, in the same batches)"), None
        self.ledger.add_all(contribution.ranges)
        staleness = self.step - contribution.token
        decay = self.config.decay
        if decay.dropped(staleness):
            self.counts["dropped_stale"] += 1
            self._record_positions(worker, contribution.sequence, contribution.positions)  # consumed, on purpose unused
            return PushOutcome(False, f"staleness {staleness} > limit {decay.limit}", staleness, 0.0, self.step,
                               False), None
        row_staleness = row_staleness or {}
        missing = set(contribution.sparse) - set(row_staleness)
        if missing:
            raise ValueError(f"no row staleness for tables {sorted(missing)}")
        row_weights = {table: _row_weights(decay, row_staleness[table]) for table in contribution.sparse}
        weight = decay.weight(staleness)
        self._buffer.append(Weighted(contribution, weight, row_weights))
        self.counts["accepted"] += 1
        self.counts["accepted_samples"] += contribution.samples
        self.staleness_sum += staleness
        name = worker.split("/", 1)[0]
        self.contributed[name] = self.contributed.get(name, 0) + 1
        if len(self._buffer) < self.config.global_batches:
            return PushOutcome(True, "", staleness, weight, self.step, False), None
        gradient = aggregate(self._buffer, self.config.row_gradient)
        for weighted in self._buffer:
            self._record_positions(weighted.contribution.worker, weighted.contribution.sequence,
                                   weighted.contribution.positions)
        self._buffer = []
        self.step += 1
        self.counts["steps"] += 1
        return PushOutcome(True, "", staleness, weight, self.step, True), gradient

    def pass_over(self, worker: str, sequence: int, positions: dict[str, int], ranges: dict[str, Spans]) -> bool:
        """A batch of `worker`'s with nothing to train (its every message refused), numbered
        as its pushes are: its ranges go into the ledger, untrained, and its positions count
        once every earlier batch of the worker's has left the buffer, as a push's would. So
        the ledger has no hole where it was and the positions pass it; its ranges count as
        in the model only with its positions (a checkpoint must not hold a range beyond a
        batch still buffered, or a re-read from its positions would overlap it).

        False, and nothing recorded, for a worker that never pulled here or was dropped:
        its source is read again from the positions (a rejoin; a restarted server's
        resubmitted job), and that read passes the batch over again."""
        if worker in self._dropped or worker not in self._last_seen:
            return False
        self._last_seen[worker] = self._clock()
        fresh = self.ledger.missing(ranges)  # a re-read's: what a checkpoint had is kept as it is
        self.ledger.add_all(fresh)
        self._passed.setdefault(worker, {})[sequence] = fresh
        self._record_positions(worker, sequence, positions)
        self.counts["passed_over"] += 1
        return True

    def _record_positions(self, worker: str, sequence: int, positions: dict[str, int]) -> None:
        """A batch left the buffer (stepped, or dropped as too stale), or was passed over.
        Its positions count once every earlier batch of its worker has left too: pushes of
        one worker can reach the shard out of order (RPC threads), and a checkpoint's
        positions must never pass a batch the model has not seen, or a resumed job would
        skip it."""
        if sequence < 0:  # not numbered: taken as they come
            self.positions = merge_positions(self.positions, positions)
            return
        landed = self._landed.setdefault(worker, {})
        landed[sequence] = positions
        passed = self._passed.get(worker, {})
        following = self._next_sequence.get(worker, 0)
        while following in landed:
            self.positions = merge_positions(self.positions, landed.pop(following))
            passed.pop(following, None)  # a batch passed over is in the model with its positions
            following += 1
        self._next_sequence[worker] = following

    def drop_worker(self, worker: str) -> int:
        """Forget a failed worker; returns how many of its buffered contributions left."""
        self._last_seen.pop(worker, None)
        self._dropped.add(worker)
        # Positions still waiting for an earlier batch of it: that batch never comes.
        self._landed.pop(worker, None)
        self._next_sequence.pop(worker, None)
        for ranges in self._passed.pop(worker, {}).values():  # read again after its rejoin
            self.ledger.remove_all(ranges)
        kept = [w for w in self._buffer if w.contribution.worker != worker]
        for weighted in self._buffer:
            if weighted.contribution.worker == worker:  # not trained: a re-read trains it
                self.ledger.remove_all(weighted.contribution.ranges)
        discarded = len(self._buffer) - len(kept)
        self._buffer = kept
        self.counts["discarded_failed_worker"] += discarded
        return discarded

    def retire(self, worker: str) -> None:
        """A worker that finished: no longer expected, never dropped; what it pushed counts."""
        self._last_seen.pop(worker, None)

    def drop_silent(self, lease_s: float, heard: dict[str, float] | None = None) -> list[str]:
        """Drop every worker not heard from (pull or push) within lease_s seconds. `heard`:
        when calls arrived (by this clock), which may be before they were handled: a call
        waiting behind an optimizer step is no sign of a dead worker."""
        now, heard = self._clock(), heard or {}
        silent = [w for w, seen in self._last_seen.items() if now - max(seen, heard.get(w, seen)) > lease_s]
        for worker in silent:
            self.drop_worker(worker)
        return silent

    def settle(self, ranges: dict[str, Spans]) -> None:
        """Positions of a joined stream that nothing more will be trained for (a forgotten
        impression's correction, a duplicate impression, a label the join needs no more,
        a dead letter's): into the ledger, untrained, so that the positions pass them
        (sample_identity)."""
        self.ledger.add_all(ranges)

    def all_positions(self) -> dict[str, int]:
        """The positions of batches read in order, and a joined stream's partitions' from
        the ranges in the model (sample_identity.joined_positions)."""
        return {**self.positions, **joined_positions(self.applied().ranges)}

    def applied(self) -> AppliedRanges:
        """The ranges in the model: the claimed ones less those still buffered, and those
        passed over whose positions still wait."""
        applied = self.ledger.copy()
        for weighted in self._buffer:
            applied.remove_all(weighted.contribution.ranges)
        for passed in self._passed.values():
            for ranges in passed.values():
                applied.remove_all(ranges)
        return applied

    def refuse(self, count: str, reason: str) -> PushOutcome:
        """A push not counted, for `reason`, tallied under counts[count]."""
        self.counts[count] += 1
        return PushOutcome(False, reason, -1, 0.0, self.step, False)


def _describe(ranges: dict[str, Spans]) -> str:
    return ", ".join(f"{source} " + " ".join(f"[{a}, {b})" for a, b in spans_of(value))
                     for source, value in sorted(ranges.items()))


def _row_weights(decay: StalenessDecay, staleness: torch.Tensor) -> torch.Tensor:
    """Per-row weights. A row past the hard limit gets weight 0 but still counts as
    touched: the worker's batch did hold its id."""
    if staleness.numel() and int(staleness.min()) < 0:
        raise ValueError("row staleness must be >= 0 (a version from the future?)")
    distinct, inverse = torch.unique(staleness, return_inverse=True)
    weights = torch.tensor([decay.weight(int(s)) for s in distinct], dtype=torch.float32)
    return weights[inverse] if staleness.numel() else torch.zeros(0)
