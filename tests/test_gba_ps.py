"""The parameter server: in process against the Trainer, then as real processes on loopback
(shards and workers started with `python -m picasso.pipelines.cli.distributed`)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

from picasso.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from picasso.connectors.testing.loopback import free_port
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.aggregation import Contribution, RowGradient
from picasso.distributed.gba import GBAConfig, WorkerDropped
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.param_server import ShardService
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.ps_client import PSClient
from picasso.distributed.worker import GBAWorker
from picasso.models import build_model
from picasso.packing import PackingPlan
from picasso.pipelines.cli import distributed as distributed_cli
from picasso.connectors.synthetic.planted_batches import planted_batches as planted_stream
from picasso.trainer import Trainer

from helpers import planted_batches
from test_trainer import CONFIG, SPEC, assert_state_equal


# -- in process: the shards' arithmetic is the Trainer's -------------------------------------

def _in_process(trainer: Trainer, shards: int, gba: GBAConfig):
    built = [build_shard(trainer, s, shards, gba) for s in range(shards)]
    servers = [shard for shard, _ in built]
    return servers, built[0][1], in_process(servers)


@pytest.mark.parametrize("settings", [{"sparse_optimizer": "adagrad"}, {"sparse_optimizer": "adam"},
                                      {"sparse_optimizer": "adagrad", "weight_decay": 0.01, "embedding_l2": 0.05}],
                         ids=["adagrad", "adam", "adagrad, L2 on dense weights and embedding rows"])
def test_one_worker_without_aggregation_trains_like_the_trainer(settings, tmp_path):
    """M = 1, one worker, every push answered before the next pull: each step is the
    Trainer's step, on two shards, and the checkpoint the shards make restores into a
    Trainer that trains on exactly like the one that never left local mode. With L2 too:
    the shards decay what the Trainer decays."""
    config = replace(CONFIG, **settings)
    batches, _ = planted_batches(SPEC, 320, 64)
    local = Trainer(SPEC, config)
    for batch in batches[:4]:
        local.train_step(batch)

    start = Trainer(SPEC, config)
    servers, layout, call = _in_process(start, shards=2, gba=GBAConfig.plain_async())
    client = PSClient(layout, "worker0/a", max_in_flight=0, call=call)
    model = build_model(config.model, SPEC, PackingPlan.from_spec(SPEC), config.hidden)
    stats = GBAWorker(client, GradientComputer(model)).train(batches[:4])
    assert stats.batches == 4 and stats.refused == 0

    state = trainer_state(layout, [s.snapshot() for s in servers], start)
    assert state["step"] == local.step and state["samples"] == local.samples
    expected = local.state()
    for key, value in expected["model"].items():
        torch.testing.assert_close(state["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)

    resumed = Trainer(SPEC, config)
    resumed.restore(save_checkpoint(tmp_path, state, SPEC, {}, {}))
    assert set(resumed.state()["model"]) == set(expected["model"])
    for trainer in (local, resumed):
        trainer.train_step(batches[4])
    for key, value in local.state()["model"].items():
        torch.testing.assert_close(resumed.state()["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_workers_stop_when_the_sample_budget_is_spent():
    trainer = Trainer(SPEC, CONFIG)
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(1), sample_budget=200)
    model = build_model(CONFIG.model, SPEC, trainer.plan, CONFIG.hidden)
    client = PSClient(layout, "worker0/a", max_in_flight=0, call=in_process([shard]))
    stats = GBAWorker(client, GradientComputer(model)).train(planted_batches(SPEC, 640, 64)[0])
    assert stats.batches == 4 and shard.control.counts["accepted_samples"] == 256  # the 4th crossed 200


def test_pushes_after_the_budget_is_spent_are_refused():
    """Two workers pull before either pushes, the budget is one batch: the second push is
    refused, so the model holds exactly the budget's samples."""
    trainer = Trainer(SPEC, CONFIG)
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(1), sample_budget=64)
    computer = GradientComputer(build_model(CONFIG.model, SPEC, trainer.plan, CONFIG.hidden))
    clients = [PSClient(layout, f"worker{r}/a", max_in_flight=0, call=in_process([shard])) for r in range(2)]
    batch = planted_batches(SPEC, 64, 64)[0][0].to_torch()
    rows = computer.rows_needed(batch)
    pulled = [client.pull(rows) for client in clients]
    assert not any(p.stop for p in pulled)
    for client, p in zip(clients, pulled):
        client.push(p, computer.compute(batch, p.dense, rows, p.values))
    assert [o.accepted for c in clients for o in c.outcomes] == [True, False]
    assert shard.control.counts["refused_budget_spent"] == 1 and shard.samples == 64
    assert clients[0].pull(rows).stop


def test_a_shard_records_a_workers_positions_in_push_order():
    """Pushes numbered 1 then 0 reach the shard out of order: the model takes both at once
    (plain async), the checkpoint's positions only once push 0 is in."""
    trainer = Trainer(SPEC, CONFIG)
    shard, layout = build_shard(trainer, 0, 1, GBAConfig.plain_async())
    client = PSClient(layout, "worker0/a", max_in_flight=0, call=in_process([shard]))
    model = build_model(CONFIG.model, SPEC, trainer.plan, CONFIG.hidden)
    computer = GradientComputer(model)
    pushes = []
    batches = planted_batches(SPEC, 128, 64)[0]
    for number, (batch, position) in enumerate(zip(batches, (64, 128))):
        tensors = batch.to_torch()
        rows = computer.rows_needed(tensors)
        pulled = client.pull(rows)
        pushes.append((pulled, computer.compute(tensors, pulled.dense, rows, pulled.values), {"src": position}, number))
    second, first = pushes[1], pushes[0]
    for pulled, gradient, positions, number in (second, first):
        sparse = {key: RowGradient(rows, gradient.row_grads[key], pulled.versions[key])
                  for key, rows in gradient.rows.items()}
        shard.push(Contribution("worker0/a", pulled.tokens[0], gradient.samples, gradient.dense, sparse, positions,
                                sequence=number))
        if number == 1:
            assert shard.control.step == 1 and shard.snapshot().positions == {}  # waits for push 0
    assert shard.control.step == 2 and shard.snapshot().positions == {"src": 128}


def test_a_dropped_worker_that_is_still_alive_rejoins_and_trains_what_it_lost():
    """The shards drop worker0 after its 3rd push (as when it stalls past its lease): that
    push was still buffered (M = 2), so it leaves the global batch. At its next pull the
    worker learns it was dropped, rejoins under a new incarnation and reads its source on
    from the server's positions: every sample is trained once, the 3rd batch included."""
    servers, layout, call = _in_process(Trainer(SPEC, CONFIG), shards=2, gba=GBAConfig(2))
    pushes = []

    def stalls_after_three(index, fn, args, asynchronous):
        answer = call(index, fn, args, asynchronous)
        if fn == "push" and index == 0:
            pushes.append(args[0].worker)
            if len(pushes) == 3:
                for shard in servers:
                    shard.drop_worker(args[0].worker)
        return answer

    client = PSClient(layout, "worker0/first", max_in_flight=0, call=stalls_after_three)
    computer = GradientComputer(build_model(CONFIG.model, SPEC, PackingPlan.from_spec(SPEC), CONFIG.hidden))
    source = planted_stream(SPEC, 600, 100, stream=7)
    reread = []

    def read_on(positions):
        reread.append(positions["planted-7"])
        return planted_stream(SPEC, 600 - positions["planted-7"], 100, 7, positions["planted-7"])

    stats = GBAWorker(client, computer).train(source, read_on)
    assert stats.rejoined == 1 and reread == [200]  # batches 1-2 were stepped, batch 3 discarded
    assert client.worker.startswith("worker0/") and client.worker != "worker0/first"
    control = servers[0].control
    assert control.dropped == {"worker0/first"} and control.counts["discarded_failed_worker"] == 1
    assert servers[0].samples == 600 and control.positions == {"planted-7": 600} and control.step == 3
    assert pushes[3:] == [client.worker] * 4  # batches 3 to 6, under the new incarnation


def test_a_dropped_worker_without_a_source_to_reread_says_so():
    servers, layout, call = _in_process(Trainer(SPEC, CONFIG), shards=1, gba=GBAConfig(1))
    client = PSClient(layout, "worker0/first", max_in_flight=0, call=call)
    computer = GradientComputer(build_model(CONFIG.model, SPEC, PackingPlan.from_spec(SPEC), CONFIG.hidden))
    servers[0].drop_worker("worker0/first")
    with pytest.raises(WorkerDropped, match="worker0/first was dropped by parameter-server shard ps0"):
        GBAWorker(client, computer).train(planted_stream(SPEC, 100, 100, stream=7))


def test_split_and_merge_are_inverse():
    trainer = Trainer(SPEC, CONFIG)
    trainer.train_step(planted_batches(SPEC, 64, 64)[0][0])
    state = trainer.state()["model"]
    for shards in (1, 2, 3):
        _, layout = build_shard(trainer, 0, shards, GBAConfig(1))
        assert_state_equal(layout.merge(layout.split(state)), state)
        with pytest.raises(ValueError, match="missing"):
            layout.split({k: v for k, v in state.items() if k != layout.tables[0].key})


def test_a_shard_refuses_rows_it_does_not_own():
    servers, layout, _ = _in_process(Trainer(SPEC, CONFIG), shards=2, gba=GBAConfig(1))
    key = layout.tables[0].key
    with pytest.raises(ValueError, match="another shard owns"):
        servers[0].pull("w/a", {key: torch.tensor([1])}, dense=False)
    with pytest.raises(ValueError, match=r"must be in \[0"):
        servers[1].pull("w/a", {key: torch.tensor([10**9 + 1])}, dense=False)


# -- real processes on loopback ---------------------------------------------------------------


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "picasso.pipelines.cli.distributed", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_log(process: subprocess.Popen, text: str) -> None:
    """Read a process's log until a line holds `text` (or the process has ended)."""
    for line in process.stderr:
        if text in line:
            return


def _finish(process: subprocess.Popen, timeout: float = 600) -> tuple[int, dict | None, str]:
    """The process's exit status, its --json summary and its stderr. The timeout is a hang
    guard: a straggler's 30,000 rows took over 90 s on a busy 2-core machine."""
    out, err = process.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    return process.returncode, json.loads(lines[-1]) if lines else None, err


@pytest.fixture()
def tiny_spec(tmp_path) -> str:
    path = tmp_path / "tiny.yaml"
    SPEC.save(path) if hasattr(SPEC, "save") else path.write_text(SPEC.to_yaml())
    return str(path)


def _ps(spec: str, workdir, port: int, shards: int, workers: int, *extra: str) -> subprocess.Popen:
    return _start("ps", "--spec", spec, "--workdir", str(workdir), "--port", str(port), "--shards", str(shards),
                  "--workers", str(workers), "--hidden", "16,8", "--lr-dense", "0.01", "--timeout", "30", "--json",
                  *extra)


def _worker(port: int, rank: int, rows: int, *extra: str) -> subprocess.Popen:
    return _start("gba-worker", "--port", str(port), "--rank", str(rank), "--rows", str(rows), "--batch-size", "100",
                  "--timeout", "30", "--json", *extra)


def test_plain_async_steps_on_every_push(tiny_spec, tmp_path):
    """The baseline mode: M = 1 and no staleness control, whatever --workers says; its
    checkpoint restores into a Trainer. (gba on two shards: test_gba_switch.py.)"""
    port = free_port()
    server = _ps(tiny_spec, tmp_path, port, 1, 2, "--mode", "async")
    workers = [_worker(port, rank, 500) for rank in range(2)]
    for code, stats, err in [_finish(w) for w in workers]:
        assert code == 0 and stats["batches"] == 5 and stats["refused"] == 0, err
    code, summary, err = _finish(server)
    assert code == 0, err
    assert summary["global_batches"] == 1 and summary["decay"] == "none"
    assert summary["step"] == 10 and summary["samples"] == 1000 and summary["counts"]["accepted"] == 10
    trainer = Trainer(SPEC, replace(CONFIG, hidden=(16, 8), lr_dense=0.01, lr_sparse=0.05))
    trainer.restore(latest_checkpoint(tmp_path / "checkpoints"))
    assert trainer.step == 10 and trainer.samples == 1000


def test_a_worker_counted_as_lost_whose_first_pull_comes_late_is_not_lost():
    """A worker whose first pull comes more than a lease after its start line (slow to
    load its data on a busy machine) counts as lost meanwhile, and no longer once it has
    pulled: the server's summary names as lost only workers never brought to training."""
    shard, _ = build_shard(Trainer(SPEC, CONFIG), 0, 1, GBAConfig(1))
    service = ShardService(shard, num_workers=2, lease_s=0.01, join_timeout_s=600)
    late, _ = service.join("worker1", "late")
    service.start_line(late)
    time.sleep(0.05)  # past its lease: never pulled, so far
    service.settle()
    assert service.lost == {"worker1"}  # worker0 has its join timeout still
    assert not shard.pull(late, {}, dense=False).stop
    service.settle()
    assert service.lost == set() and not service.stopped.is_set()


def test_a_dropped_worker_keeps_the_job_open_for_a_lease_to_come_back():
    """The others finished while a worker was dropped: the job waits a lease for it before
    counting it done, so that one that only stalled rejoins and trains its source to its
    end instead of finding the server gone; one that never comes back ends the job then."""
    shard, _ = build_shard(Trainer(SPEC, CONFIG), 0, 1, GBAConfig(1))
    service = ShardService(shard, num_workers=2, lease_s=0.2, join_timeout_s=600)
    workers = [service.join(f"worker{rank}", "first")[0] for rank in range(2)]
    for worker in workers:
        service.start_line(worker)
        shard.pull(worker, {}, dense=False)
    shard.control.drop_worker(workers[1])  # as drop_silent does past its lease
    service.finish(workers[0])
    service.settle()
    assert not service.stopped.is_set()  # worker1 may be back at its next call
    time.sleep(0.3)  # a lease since the drop: given up
    service.settle()
    assert service.stopped.is_set()


def test_dead_workers_are_dropped_and_the_others_train_on(tiny_spec, tmp_path):
    """worker1 dies while training: dropped when its lease runs out. worker2 dies after
    the group met but before its first pull (it is still planting 2M rows): counted as
    lost after a lease. worker0 trains on, and the server ends and checkpoints."""
    port = free_port()
    server = _ps(tiny_spec, tmp_path, port, 1, 3, "--lease", "2")
    survivor = _worker(port, 0, 800, "--straggler", "0:3")
    doomed = _worker(port, 1, 100_000)
    early = _worker(port, 2, 2_000_000)
    _wait_for_log(server, "shard 0: serving")
    early.send_signal(signal.SIGKILL)
    _wait_for_log(doomed, "training from step")
    doomed.send_signal(signal.SIGKILL)
    worker_code, stats, worker_err = _finish(survivor)
    code, summary, err = _finish(server)
    assert worker_code == 0 and code == 0, worker_err + err
    assert [w.split("/")[0] for w in summary["dropped_workers"]] == ["worker1"]
    assert summary["lost_workers"] == ["worker2"]
    assert stats["samples"] == 800
    counts = summary["counts"]
    counted = counts["accepted"] - counts["discarded_failed_worker"]
    assert counted // summary["global_batches"] == summary["step"]  # a dead worker's buffered batch did not count
    assert load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")).step == summary["step"]


def test_a_worker_that_stalls_past_its_lease_rejoins(tiny_spec, tmp_path):
    """worker1 is frozen (SIGSTOP) until the server has dropped it, then thawed: it finds
    out at its next pull, rejoins under a new incarnation, reads its source on from the
    server's positions, and the job ends with both sources trained to the end. worker0,
    slowed down, trains on throughout."""
    port = free_port(count=2)
    # No hard staleness limit: a gradient dropped as too stale would advance the positions
    # without its samples, and the count below could not be exact.
    # A lease that a busy machine's steady worker never outlasts between two calls; the
    # frozen one outlasts it for certain.
    server = _ps(tiny_spec, tmp_path, port, 2, 2, "--lease", "5", "--decay", "exp:limit=none")
    steady = _worker(port, 0, 30_000, "--straggler", "0:4")
    frozen = _worker(port, 1, 2_000)
    _wait_for_log(frozen, "training from step")
    frozen.send_signal(signal.SIGSTOP)
    _wait_for_log(server, "shard 0: dropped worker worker1/")
    frozen.send_signal(signal.SIGCONT)
    results = [_finish(w) for w in (steady, frozen)]
    code, summary, err = _finish(server)
    assert code == 0, err
    for worker_code, stats, worker_err in results:
        assert worker_code == 0, worker_err
    assert results[0][1]["rejoined"] == 0 and results[1][1]["rejoined"] == 1
    assert [w.split("/")[0] for w in summary["dropped_workers"]] == ["worker1"]
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert checkpoint.positions == {"planted-100": 30_000, "planted-101": 2_000}  # nothing skipped
    # A batch the old incarnation had pushed out of order is acknowledged, not trained twice.
    assert checkpoint.state["samples"] == 32_000 and summary["contributed"]["worker1"] >= 20


def test_a_worker_without_a_server_says_so(tmp_path):
    code, _, err = _finish(_start("gba-worker", "--port", str(free_port()), "--rank", "0", "--timeout", "2"), timeout=60)
    assert code != 0 and "no parameter server at 127.0.0.1:" in err


def test_a_worker_whose_server_dies_says_so(tiny_spec, tmp_path):
    port = free_port()
    server = _ps(tiny_spec, tmp_path, port, 1, 1)
    # Started once the server serves, the worker finds it at once, and may give up on a
    # call the dead server never answers after 5 s rather than 30 (what it says is the same).
    _wait_for_log(server, "shard 0: serving")
    worker = _worker(port, 0, 200_000, "--timeout", "5")
    _wait_for_log(worker, "training from step")
    server.send_signal(signal.SIGKILL)
    server.wait(timeout=30)
    code, _, err = _finish(worker)
    assert code != 0 and "error: parameter-server shard ps0" in err


@pytest.mark.parametrize("text", ["3", "a:2", "1:0.5", "-1:2"])
def test_bad_straggler_is_named(text):
    with pytest.raises(SystemExit):
        distributed_cli.main(["gba-worker", "--port", "1", "--rank", "0", "--straggler", text])


@pytest.mark.parametrize("flags, message", [
    (["--decay", "exp:limit=x"], "limit takes a number"),
    (["--global-batches", "0"], "global_batches"),
    (["--workers", "0"], "must be >= 1"),
    (["--shard-index", "3"], "outside"),
])
def test_bad_server_flags_are_named(flags, message, tiny_spec, tmp_path):
    argv = ["ps", "--spec", tiny_spec, "--workdir", str(tmp_path), "--port", "1", "--workers", "2", *flags]
    with pytest.raises(SystemExit, match=message):
        distributed_cli.main(argv)


def test_a_checkpoint_of_another_model_is_refused(tiny_spec, tmp_path):
    trainer = Trainer(SPEC, replace(CONFIG, hidden=(16, 8)))
    trainer.save_checkpoint(tmp_path / "checkpoints")
    with pytest.raises(SystemExit, match="cannot resume"):
        distributed_cli.main(["ps", "--spec", tiny_spec, "--workdir", str(tmp_path), "--port", "1", "--workers", "1",
                     "--hidden", "32,8"])
