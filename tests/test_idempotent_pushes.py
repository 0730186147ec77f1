"""A source range is trained at most once: replayed pushes are acknowledged, not trained,
across a worker's death, a server checkpoint and a restart from it."""

from __future__ import annotations

import pytest
import torch

from picasso.batch import PackedBatch
from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.aggregation import Contribution
from picasso.distributed.gba import GBAConfig, TokenControl
from picasso.distributed.applied_ranges import AppliedRanges
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard, save_ps_checkpoint
from picasso.distributed.ps_client import PSClient
from picasso.distributed.worker import GBAWorker
from picasso.models import build_model
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.trainer import Trainer

from test_trainer import CONFIG, SPEC


def test_the_ledger_merges_what_touches_and_gives_back_what_is_removed():
    ledger = AppliedRanges()
    for start, end in [(0, 10), (20, 30), (10, 20), (40, 50)]:
        ledger.add("s", start, end)
    assert ledger.to_json() == {"s": [[0, 30], [40, 50]]}
    assert ledger.verdict({"s": (5, 25)}) == "held" and ledger.verdict({"s": (30, 40)}) == "new"
    assert ledger.verdict({"s": (25, 45)}) == "partly" and ledger.verdict({"t": (0, 1)}) == "new"
    ledger.remove("s", 10, 20)
    assert ledger.to_json() == {"s": [[0, 10], [20, 30], [40, 50]]}
    assert AppliedRanges.from_json(ledger.to_json()) == ledger
    # A checkpoint without a ledger (local or sync training) holds each source up to its position.
    assert AppliedRanges.from_checkpoint(None, {"s": 70}).verdict({"s": (60, 70)}) == "held"
    assert AppliedRanges.from_checkpoint({"s": [[0, 10]]}, {"s": 70}).verdict({"s": (60, 70)}) == "new"


def _push(control: TokenControl, worker: str, start: int, end: int, sequence: int):
    return control.push(Contribution(worker, control.step, end - start, {"w": torch.tensor([1.0])},
                                     positions={"s": end}, sequence=sequence, ranges={"s": (start, end)}), {})


def test_a_replayed_push_is_acknowledged_and_not_trained():
    control = TokenControl(GBAConfig(global_batches=2))
    control.pull("w/a")
    assert _push(control, "w/a", 0, 10, 0)[0].accepted
    again, gradient = _push(control, "w/a", 0, 10, 1)  # a retried bundle, before the step
    assert not again.accepted and again.duplicate and "already trained: s [0, 10)" in again.reason
    assert gradient is None and control.buffered == 1
    _, stepped = _push(control, "w/a", 10, 20, 2)
    assert stepped is not None and stepped.samples == 20
    assert control.counts["duplicate"] == 1 and control.positions == {"s": 20}
    assert _push(control, "w/a", 10, 20, 3)[0].duplicate  # after the step too
    refused = _push(control, "w/a", 15, 25, 4)[0]  # re-cut differently: cannot be split
    assert not refused.accepted and not refused.duplicate and "partly trained" in refused.reason


def test_a_dropped_workers_buffered_ranges_are_trained_by_whoever_reads_them_again():
    control = TokenControl(GBAConfig(global_batches=2))
    control.pull("w/dead")
    _push(control, "w/dead", 0, 10, 0)  # buffered, never stepped
    control.drop_worker("w/dead")
    assert control.applied().to_json() == {} and control.ledger.to_json() == {}
    control.pull("w/next")
    assert _push(control, "w/next", 0, 10, 0)[0].accepted


def test_the_applied_ranges_are_only_those_in_the_model():
    control = TokenControl(GBAConfig(global_batches=2))
    control.pull("w/a")
    for sequence, start in enumerate((0, 10, 20)):
        _push(control, "w/a", start, start + 10, sequence)
    assert control.ledger.to_json() == {"s": [[0, 30]]}  # claimed: the third is buffered
    assert control.applied().to_json() == {"s": [[0, 20]]}


def test_a_batch_passed_over_fills_its_range_and_its_positions_wait_for_the_batches_before_it():
    """A batch with nothing to train (every message a dead letter) between two that train:
    its range is claimed at once, and counts as in the model, with its positions, only once
    the batch before it has left the buffer."""
    control = TokenControl(GBAConfig(global_batches=2))
    control.pull("w/a")
    _push(control, "w/a", 0, 10, 0)  # buffered
    assert control.pass_over("w/a", 1, {"s": 11}, {"s": (10, 11)})
    assert control.ledger.to_json() == {"s": [[0, 11]]}
    assert control.applied().to_json() == {} and control.positions == {}
    _, stepped = _push(control, "w/a", 11, 21, 2)
    assert stepped is not None and stepped.samples == 20
    assert control.applied().to_json() == {"s": [[0, 21]]} and control.positions == {"s": 21}
    assert control.counts["passed_over"] == 1
    # Passed over again (a re-read): kept as it is, and its positions count.
    assert control.pass_over("w/a", 3, {"s": 11}, {"s": (10, 11)}) and control.applied().to_json() == {"s": [[0, 21]]}


def test_a_batch_passed_over_is_given_back_with_its_dropped_worker_and_refused_from_an_unknown_one():
    control = TokenControl(GBAConfig(global_batches=2))
    assert not control.pass_over("w/never", 0, {"s": 1}, {"s": (0, 1)})  # never pulled: nothing recorded
    control.pull("w/dead")
    _push(control, "w/dead", 0, 10, 0)
    control.pass_over("w/dead", 1, {"s": 11}, {"s": (10, 11)})
    control.drop_worker("w/dead")
    assert control.ledger.to_json() == {} and control.applied().to_json() == {}
    assert not control.pass_over("w/dead", 2, {"s": 12}, {"s": (11, 12)})
    assert control.counts["passed_over"] == 1


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("empty_at", [0, 3, 6])
def test_a_worker_passes_a_batch_of_refused_messages_over_and_the_ledger_holds_its_source_whole(shards, empty_at):
    """A batch whose every message was refused is packed with no rows (pipelines'
    PackMessages): the worker trains nothing for it, and every shard still holds its range;
    shard 0's positions reach the source's end. First, in the middle or last."""
    trainer = Trainer(SPEC, CONFIG)
    computer = GradientComputer(build_model(CONFIG.model, SPEC, trainer.plan, CONFIG.hidden))
    built = [build_shard(trainer, s, shards, GBAConfig(2)) for s in range(shards)]
    servers = [shard for shard, _ in built]
    client = PSClient(built[0][1], "worker0/x", max_in_flight=2, call=in_process(servers))
    batches = list(planted_batches(SPEC, 700, 100, stream=5))  # 6 to train: 3 global steps of M = 2
    batches[empty_at] = PackedBatch(batches[empty_at].data.slice(0, 0))
    assert batches[empty_at].ranges == {"planted-5": (empty_at * 100, empty_at * 100 + 100)}
    stats = GBAWorker(client, computer).train(batches)
    assert stats.samples == 600 and stats.refused == 0
    for server in servers:
        snapshot = server.snapshot()
        assert snapshot.applied == {"planted-5": [[0, 700]]}
    assert servers[0].snapshot().positions == {"planted-5": 700} and servers[0].snapshot().samples == 600


@pytest.mark.parametrize("shards", [1, 2])
def test_replays_across_a_server_checkpoint_and_restart_train_each_sample_once(shards, tmp_path):
    """A worker trains a source; the server checkpoints; a new server restored from that
    checkpoint is sent the whole source again (a pipeline restarted from scratch on an
    at-least-once runner) and then its continuation: only the continuation is trained."""
    root = tmp_path / "checkpoints"
    computer = GradientComputer(build_model(CONFIG.model, SPEC, Trainer(SPEC, CONFIG).plan, CONFIG.hidden))

    def serve(trainer: Trainer):
        applied = load_checkpoint(latest_checkpoint(root)).applied if latest_checkpoint(root) else None
        built = [build_shard(trainer, s, shards, GBAConfig(2), applied=applied) for s in range(shards)]
        servers = [shard for shard, _ in built]
        return servers, built[0][1], PSClient(built[0][1], "worker0/x", max_in_flight=0, call=in_process(servers))

    first = Trainer(SPEC, CONFIG)
    servers, layout, client = serve(first)
    GBAWorker(client, computer).train(planted_batches(SPEC, 600, 100, stream=5))
    save_ps_checkpoint(root, layout, [s.snapshot() for s in servers], first, {})
    trained = load_checkpoint(latest_checkpoint(root))
    assert trained.applied == {"planted-5": [[0, 600]]} and trained.state["samples"] == 600

    resumed = Trainer(SPEC, CONFIG)
    resumed.restore(latest_checkpoint(root))
    servers, layout, client = serve(resumed)
    replay = list(planted_batches(SPEC, 600, 100, stream=5)) + list(planted_batches(SPEC, 400, 100, stream=5,
                                                                                    start=600))
    stats = GBAWorker(client, computer).train(replay)
    assert stats.duplicates == 6 and stats.refused == 6
    snapshot = servers[0].snapshot()
    assert snapshot.samples == 1000 and snapshot.positions == {"planted-5": 1000}
    assert snapshot.applied == {"planted-5": [[0, 1000]]}
    assert all(s.snapshot().step == snapshot.step for s in servers)  # every shard refused the same pushes
