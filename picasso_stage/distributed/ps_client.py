"""The worker's client of the parameter server (param_server.py).

`PSClient` splits a worker's requests by owner (layout.py): a pull asks each shard for its
rows (and shard 0 for the dense parameters) and reassembles them in the order asked; a
push sends every shard its part without waiting, so the worker computes its next batch
while the shards aggregate. Every shard receives every push, even one with none of its
rows: each shard counts the same local batches towards its global batches. At most
`max_in_flight` pushes per shard are outstanding; a worker further ahead waits for the
oldest (a bound on memory, not a barrier between workers; 0 makes every push complete
before the next pull, for runs that must be deterministic).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import torch

from picasso.distributed import transport
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.dynamic_shard import owner_of
from picasso.distributed.gba import PushOutcome, WorkerDropped, worker_id
from picasso.distributed.layout import ShardLayout
from picasso.distributed.local_gradient import LocalGradient
from picasso.distributed.param_server import ParameterServerError, shard_name

log = logging.getLogger(__name__)


class ServerRestarted(ParameterServerError):
    """A shard restarted from its checkpoint while this worker trained against it."""


@dataclass(frozen=True)
class PulledBatch:
    tokens: tuple[int, ...]  # per shard
    dense: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor]  # table key -> rows asked for
    values: dict[str, torch.Tensor]  # table key -> their values, in that order
    versions: dict[str, torch.Tensor]
    stop: bool  # shard 0 says the job's sample budget is spent


class PSClient:
    def __init__(self, layout: ShardLayout, worker: str, max_in_flight: int = 2, call=None):
        """call(shard, method, args, asynchronous) -> the answer, or (asynchronous) a Call
        with done() and result(); `over_grpc(connections)` reaches real shards,
        `picasso.connectors.testing.param_server.in_process(shards)` Shard objects in this
        process (tests and one-process benchmarks)."""
        if call is None:
            raise ValueError("PSClient needs a call: over_grpc(connections) or in_process(shards)")
        self.layout, self.worker, self.max_in_flight = layout, worker, max_in_flight
        self._call = call
        self._in_flight: list[list] = [[] for _ in range(layout.num_shards)]
        self.outcomes: list[PushOutcome] = []  # shard 0's answers to this worker's pushes
        self._pushed = 0  # pushes so far: the next push's sequence number
        self._pulled_from: set[int] = set()  # shards this incarnation has pulled from

    def pull(self, rows: dict[str, torch.Tensor]) -> PulledBatch:
        owners = self._owners(rows)
        # Every shard's part is asked at once: the shards look their rows up in parallel.
        calls = [self._call(s, "pull", (self.worker, self._part(rows, owners, s), s == 0, s not in self._pulled_from),
                            True)
                 for s in range(self.layout.num_shards)]
        answers = [self._settled(s, "pull", call) for s, call in enumerate(calls)]
        restarted = [shard_name(s) for s, answer in enumerate(answers) if answer.restarted]
        if restarted:
            raise ServerRestarted(f"{', '.join(restarted)} restarted while {self.worker} trained: it resumed from "
                                  "its checkpoint, behind what this worker has read. Stopping rather than pushing "
                                  "into it; run the job again and it reads on from the server's positions")
        self._pulled_from.update(range(self.layout.num_shards))
        dropped = [shard_name(s) for s, answer in enumerate(answers) if answer.dropped]
        if dropped:
            raise WorkerDropped(f"{self.worker} was dropped by {', '.join(dropped)} (silent past its lease?)")
        if owners is None:  # one shard: its answer is in the order asked
            return PulledBatch((answers[0].token,), answers[0].dense, rows, answers[0].rows, answers[0].versions,
                               answers[0].stop)
        values, versions = {}, {}
        for key, wanted in rows.items():
            dim = self.layout.table(key).dim
            values[key] = torch.empty(wanted.numel(), dim)
            versions[key] = torch.empty(wanted.numel(), dtype=torch.int64)
            for s, answer in enumerate(answers):
                mine = owners[key] == s
                values[key][mine], versions[key][mine] = answer.rows[key], answer.versions[key]
        return PulledBatch(tuple(a.token for a in answers), answers[0].dense, rows, values, versions, answers[0].stop)

    def _owners(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """Per table, the shard of each row; None with one shard, which owns them all."""
        if self.layout.num_shards == 1:
            return None
        return {key: self.layout.owner(r) for key, r in rows.items()}

    @staticmethod
    def _part(rows: dict[str, torch.Tensor], owners: dict[str, torch.Tensor] | None, shard: int):
        return rows if owners is None else {k: r[owners[k] == shard] for k, r in rows.items()}

    def resolve(self, keys: dict[str, torch.Tensor], event_time_ms: int | None) -> dict[str, torch.Tensor]:
        """Per dynamic field, the rows of a batch's keys: each shard resolves the keys it
        owns (admitting and evicting there), all shards at once."""
        owners = {name: owner_of(k, self.layout.num_shards) for name, k in keys.items()}
        calls = [self._call(s, "resolve", (self.worker, {name: k[owners[name] == s] for name, k in keys.items()},
                                           event_time_ms), True)
                 for s in range(self.layout.num_shards)]
        answers = [self._settled(s, "resolve", call) for s, call in enumerate(calls)]
        rows = {}
        for name, wanted in keys.items():
            rows[name] = torch.empty_like(wanted)
            for s, answer in enumerate(answers):
                rows[name][owners[name] == s] = answer[name]
        return rows

    def push(self, pulled: PulledBatch, gradient: LocalGradient, positions: dict[str, int] | None = None,
             ranges: dict | None = None, labels: torch.Tensor | None = None,
             event_time_ms: int | None = None) -> None:
        """Send every shard its part; returns without waiting for the shards' answers.
        positions: where the batch ends in its sources (shard 0 records them for checkpoints);
        ranges: the batch's [start, end) per source (or a list of ranges), which every shard
        trains at most once;
        labels (with the gradient's scores) and the batch's newest event time: shard 0's
        prequential evaluation."""
        self.collect()
        one_shard = self.layout.num_shards == 1  # every row is shard 0's: nothing to split
        for s in range(self.layout.num_shards):
            sparse = {}
            for key, rows in gradient.rows.items():
                if one_shard:
                    sparse[key] = RowGradient(rows, gradient.row_grads[key], pulled.versions[key])
                    continue
                mine = self.layout.owner(rows) == s
                sparse[key] = RowGradient(rows[mine], gradient.row_grads[key][mine], pulled.versions[key][mine])
            scored = s == 0 and labels is not None and gradient.scores is not None
            contribution = Contribution(self.worker, pulled.tokens[s], gradient.samples,
                                        gradient.dense if s == 0 else {}, sparse, (positions or {}) if s == 0 else {},
                                        sequence=self._pushed, ranges=ranges or {},
                                        labels=labels if scored else None, scores=gradient.scores if scored else None,
                                        event_time_ms=event_time_ms if s == 0 else None,
                                        batch_size=gradient.batch_size)
            while len(self._in_flight[s]) > self.max_in_flight - 1 and self._in_flight[s]:
                self._settle(s, self._in_flight[s].pop(0))
            future = self._call(s, "push", (contribution,), True)
            if self.max_in_flight == 0:
                self._settle(s, future)
            else:
                self._in_flight[s].append(future)
        self._pushed += 1

    def held(self, ranges: dict) -> dict[str, list[tuple[int, int]]]:
        """The parts of a batch's identity any shard holds (applied_ranges.AppliedRanges.held), asked of
        every shard at once: a part one shard holds must not be trained on any."""
        calls = [self._call(s, "held", (self.worker, ranges), True) for s in range(self.layout.num_shards)]
        found: dict[str, list[tuple[int, int]]] = {}
        for s, call in enumerate(calls):
            for source, spans in self._settled(s, "held", call).items():
                found.setdefault(source, []).extend(tuple(span) for span in spans)
        return found

    def settle(self, ranges: dict) -> None:
        """Tell every shard these positions will train nothing more (a joined stream's:
        picasso.sample_identity). After the pushes in flight: a settled impression's sample
        reaches the shards first."""
        self.drain()
        for s in range(self.layout.num_shards):
            self._call(s, "settle", (self.worker, ranges), False)

    def pass_over(self, positions: dict[str, int], ranges: dict) -> bool:
        """A batch with nothing to train (its every message refused): every shard records its
        ranges, and shard 0 its positions, numbered as a push, so they count in order with
        this worker's pushes (gba.TokenControl.pass_over). An incarnation that has not pulled
        yet pulls first: a shard takes nothing from a worker it does not know, and a
        restarted one says so to a pull. False when the job's sample budget is spent."""
        if len(self._pulled_from) < self.layout.num_shards and self.pull({}).stop:
            return False
        for s in range(self.layout.num_shards):
            self._call(s, "pass_over", (self.worker, self._pushed, positions if s == 0 else {}, ranges), False)
        self._pushed += 1
        return True

    def rejoin(self) -> None:
        """Go on as a new incarnation of this worker, after the shards dropped this one: its
        unanswered pushes are taken (refused), and pushes are numbered from 0 again."""
        self.drain()
        old, name = self.worker, self.worker.split("/", 1)[0]
        for s in range(self.layout.num_shards):  # the shards that have not dropped it yet do so now
            self._call(s, "forget", (old,), False)
        self.worker = worker_id(name, uuid.uuid4().hex[:8])
        self._pushed = 0
        self._pulled_from = set()
        log.info("%s rejoined as %s", old, self.worker)

    def renew(self) -> None:
        """Tell every shard this worker is alive, with nothing to push now (a stream with no
        events for longer than the lease). Safe beside the worker's own calls: it sends only
        the worker's name."""
        for s in range(self.layout.num_shards):
            self._call(s, "renew", (self.worker,), False)

    def positions(self) -> dict[str, int]:
        """How far the model is trained into each source: where a rejoining worker reads on."""
        return self._call(0, "positions", (), False)

    def collect(self) -> None:
        """Take the answers of finished pushes (raising a shard's error, if one came back)."""
        for s, futures in enumerate(self._in_flight):
            while futures and futures[0].done():
                self._settle(s, futures.pop(0))

    def drain(self) -> None:
        for s, futures in enumerate(self._in_flight):
            while futures:
                self._settle(s, futures.pop(0))

    def finish(self) -> None:
        self.drain()
        for s in range(self.layout.num_shards):
            self._call(s, "finish", (self.worker,), False)

    def _settle(self, shard: int, future) -> None:
        outcome = self._settled(shard, "push", future)
        if shard == 0:
            self.outcomes.append(outcome)

    def _settled(self, shard: int, method: str, call):
        try:
            return call.result()
        except ParameterServerError:
            raise
        except Exception as err:
            raise ParameterServerError(f"{shard_name(shard)} failed a {method} from {self.worker}: {err}") from err


class _Pull:
    """A pull in flight that waits, up to the call's timeout, for a shard that cannot be
    reached, and asks once more if the shard went away before it answered (a network blip, a
    restart): the worker then learns whether it is the same shard (Pulled.restarted). A pull
    changes nothing a second one would not."""

    def __init__(self, connection: transport.Connection, args: tuple):
        self.connection, self.args = connection, args
        self.call = connection.call_async("pull", *args, wait_for_ready=True)

    def done(self) -> bool:
        return self.call.done()

    def result(self):
        try:
            return self.call.result()
        except transport.TransportError as err:
            if not err.unreachable:
                raise
            log.warning("%s went away during a pull (%s); asking again", self.connection.name, err)
            return self.connection.call_async("pull", *self.args, wait_for_ready=True).result()


def over_grpc(connections: list[transport.Connection]):
    """A `call` for PSClient over one connection per shard."""

    def call(index: int, method: str, args: tuple, asynchronous: bool):
        connection = connections[index]
        if asynchronous and method == "pull":
            return _Pull(connection, args)
        if asynchronous:
            return connection.call_async(method, *args)
        try:
            return connection.call(method, *args)
        except transport.TransportError as err:  # unreachable, or a refusal raised over there
            raise ParameterServerError(str(err)) from None

    return call
