"""Sync training is one big batch: a sync step of W ranks equals one plain Trainer step on
the W local batches concatenated, for the dense weights and every embedding row, on every
model and with row-wise and element-wise Adagrad. The reference is a Trainer, not the
product's own aggregation, so a rule that averaged a row over fewer samples than the
global batch (the "touched-mean" option) would fail here.

GBA's aggregation follows the same rule: with fresh gradients (every worker pulling
before any pushes) it is the same step, which the in-process test checks without gloo.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from picasso.batch import pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.testing.loopback import free_port
from picasso.distributed.aggregation import Contribution, RowGradient, Weighted, aggregate
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.staleness import NO_DECAY
from picasso.distributed.sync import SyncReplica
from picasso.models import MODELS
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import Trainer

from test_trainer import CONFIG, SPEC

BATCH = 32  # a rank's full local batch
FULL_STEPS = 3
# The last global step is short: rank r has SHORT[r] samples (some ranks' batches are short,
# one is empty of nothing: every rank must have a batch for a step). Each sample still weighs
# one over the configured global batch, W * BATCH, as in a Trainer with that loss_batch_size.
SHORT = (BATCH, BATCH // 4, BATCH // 2, 3)
OPTIMIZERS = ("adagrad", "adagrad_elementwise")
SETTINGS = [(model, optimizer) for model in sorted(MODELS) for optimizer in OPTIMIZERS]


def _config(model: str, optimizer: str, loss_batch_size: int):
    return replace(CONFIG, model=model, sparse_optimizer=optimizer, hidden=(16, 8), lr_dense=0.01, lr_sparse=0.05,
                   loss_batch_size=loss_batch_size)


def _steps(world: int):
    """Per global step, each rank's packed local batch and the packed concatenation: rank r
    of step s reads the decoded rows right after rank r-1's."""
    plan = PackingPlan.from_spec(SPEC)
    sizes = [(BATCH,) * world] * FULL_STEPS + [SHORT[:world]]
    table, _ = PlantedModel(SPEC).sample(sum(map(sum, sizes)), 5)
    decoded = RecordDecoder(SPEC).decode_table(table, "planted").table
    steps, at = [], 0
    for step_sizes in sizes:
        locals_ = []
        for size in step_sizes:
            locals_.append(pack(decoded.slice(at, size), SPEC, plan))
            at += size
        steps.append((locals_, pack(decoded.slice(at - sum(step_sizes), sum(step_sizes)), SPEC, plan)))
    return steps


def _rank(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        steps = _steps(world)
        states = {}
        for model, optimizer in SETTINGS:
            replica = SyncReplica(Trainer(SPEC, _config(model, optimizer, BATCH)), rank, world)
            states[f"{model}/{optimizer}"] = []
            for locals_, _ in steps:
                replica.step(locals_[rank])
                state = replica.state()
                states[f"{model}/{optimizer}"].append(
                    {"model": {key: value.clone() for key, value in state["model"].items()},  # not live views
                     "dense_optimizer": state["dense_optimizer"]})
        torch.save(states, f"{out}/states-{rank}.pt")  # every rank's replica, compared in the test
    finally:
        dist.destroy_process_group()


def _assert_same_model(got: dict, want: dict, where: str) -> None:
    assert got.keys() == want.keys(), where
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-6, msg=lambda m: f"{where}: {key}: {m}")


def _reference(model: str, optimizer: str, world: int, steps) -> list[dict]:
    """A plain Trainer on the concatenated global batches, the loss over W * BATCH samples:
    per step, its model (tables and their optimizer slots included) and its dense
    optimizer's state."""
    trainer = Trainer(SPEC, _config(model, optimizer, world * BATCH))
    states = []
    for _, concatenated in steps:
        trainer.train_step(concatenated)
        state = trainer.state()
        states.append({"model": {key: value.clone() for key, value in state["model"].items()},  # not live views
                       "dense_optimizer": copy.deepcopy(state["dense_optimizer"])})
    return states


def _dense_moments(optimizer_state: dict) -> dict[str, torch.Tensor]:
    """The dense optimizer's per-parameter tensors (Adam's moments and step), by place."""
    return {f"{index}/{name}": torch.as_tensor(value) for index, slots in optimizer_state["state"].items()
            for name, value in slots.items()}


def _reference_step(model: str, optimizer: str, world: int, before: dict | None, concatenated) -> dict:
    """One plain Trainer step on a concatenated global batch, from `before` (a sync
    replica's state; None: a new model): each step is compared from the same weights and
    optimizer state, so that rounding differences do not compound over steps (element-wise
    Adagrad divides by an element's own gradient's root at its first step: an ill-conditioned
    quotient that turns a last-bit difference of a near-zero gradient into more)."""
    trainer = Trainer(SPEC, _config(model, optimizer, world * BATCH))
    if before is not None:
        trainer.model.load_state_dict(before["model"])
        trainer.dense_optimizer.load_state_dict(before["dense_optimizer"])
    trainer.train_step(concatenated)
    return trainer.state()["model"]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda world: f"W={world}")
def synced(request, tmp_path_factory) -> tuple[int, list[dict]]:
    """(W, every rank's states per setting and step), from one run of W gloo ranks."""
    world, out = request.param, tmp_path_factory.mktemp("sync")
    mp.spawn(_rank, args=(world, free_port(), str(out)), nprocs=world, join=True)
    return world, [torch.load(out / f"states-{rank}.pt") for rank in range(world)]


def test_a_sync_step_is_one_trainer_step_on_the_concatenated_batch(synced):
    world, by_rank = synced
    steps = _steps(world)
    for model, optimizer in SETTINGS:
        states = by_rank[0][f"{model}/{optimizer}"]
        for step, (_, concatenated) in enumerate(steps):
            want = _reference_step(model, optimizer, world, states[step - 1] if step else None, concatenated)
            _assert_same_model(states[step]["model"], want, f"{model}/{optimizer}, W={world}, step {step}")
        start = Trainer(SPEC, _config(model, optimizer, BATCH)).state()["model"]
        moved = [key for key in start if ".table_" in key and not torch.equal(start[key], states[-1]["model"][key])]
        assert moved, f"{model}/{optimizer}: no table learned"  # the comparison is of trained rows


def test_every_rank_holds_the_same_replica_after_every_step(synced):
    """Rank 0 alone could be right while another rank's replica drifts: each rank's model,
    slots and dense optimizer state equal rank 0's at every step."""
    world, by_rank = synced
    for setting in by_rank[0]:
        for rank in range(1, world):
            for step, (mine, first) in enumerate(zip(by_rank[rank][setting], by_rank[0][setting])):
                where = f"{setting}, W={world}, rank {rank}, step {step}"
                _assert_same_model(mine["model"], first["model"], where)
                _assert_same_model(_dense_moments(mine["dense_optimizer"]), _dense_moments(first["dense_optimizer"]),
                                   f"{where}, dense optimizer")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_whole_sync_run_from_one_start_is_the_trainers_run_on_the_concatenated_batches(synced, model):
    """Compared over all its steps from one start, not re-based on the replica's state at
    every step: an optimizer state that a fault keeps self-consistent (slots or moments
    not carried from step to step) passes a step-by-step comparison but not this one.
    Row-wise Adagrad: element-wise Adagrad's first step divides by each element's own
    gradient's root, which turns last-bit differences into more over a run
    (_reference_step)."""
    world, by_rank = synced
    reference = _reference(model, "adagrad", world, _steps(world))
    for rank in range(world):
        for step, (mine, want) in enumerate(zip(by_rank[rank][f"{model}/adagrad"], reference)):
            where = f"{model}/adagrad, W={world}, rank {rank}, step {step} of one run"
            _assert_same_model(mine["model"], want["model"], where)
            _assert_same_model(_dense_moments(mine["dense_optimizer"]), _dense_moments(want["dense_optimizer"]),
                               f"{where}, dense optimizer")


def _fresh_gba(model: str, optimizer: str, world: int, steps, row_gradient: str = "global-mean") -> dict:
    """GBA with M = W on one shard, in process, every worker pulling before any pushes."""
    trainer = Trainer(SPEC, _config(model, optimizer, BATCH))
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(world, NO_DECAY, row_gradient))
    config = trainer.config
    computer = GradientComputer(config.build_model(SPEC, trainer.plan), BATCH)
    for locals_, _ in steps:
        work = []
        for rank, local in enumerate(locals_):
            tensors = local.to_torch()
            rows = computer.rows_needed(tensors)
            work.append((f"w{rank}", tensors, rows, shard.pull(f"w{rank}", rows, dense=True)))
        for name, tensors, rows, pulled in work:
            gradient = computer.compute(tensors, pulled.dense, rows, pulled.rows)
            sparse = {key: RowGradient(rows[key], gradient.row_grads[key], pulled.versions[key]) for key in rows}
            assert shard.push(Contribution(name, pulled.token, gradient.samples, gradient.dense, sparse,
                                           batch_size=gradient.batch_size)).accepted
    return trainer_state(layout, [shard.snapshot()], trainer)["model"]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_fresh_gba_steps_as_one_big_batch_too(model):
    world = 3
    steps = _steps(world)
    _assert_same_model(_fresh_gba(model, "adagrad", world, steps),
                       _reference(model, "adagrad", world, steps)[-1]["model"], f"{model}, GBA M={world}")


def test_touched_mean_steps_a_row_one_rank_saw_harder_and_is_not_one_big_batch():
    """The option keeps the rule jobs were tuned with: it is not the big batch's step."""
    world = 2
    steps = _steps(world)
    touched = _fresh_gba("wide_deep", "adagrad", world, steps, "touched-mean")
    with pytest.raises(AssertionError):
        _assert_same_model(touched, _reference("wide_deep", "adagrad", world, steps)[-1]["model"], "touched-mean")


def _contribution(worker: str, samples: int, rows: list[int], grads: list[float], batch_size: int = 0) -> Weighted:
    rows_t = torch.tensor(rows)
    part = RowGradient(rows_t, torch.tensor(grads).unsqueeze(1), torch.zeros_like(rows_t))
    contribution = Contribution(worker, 0, samples, {"w": torch.tensor([float(samples)])}, {"t": part},
                                batch_size=batch_size)
    return Weighted(contribution, 1.0, {"t": torch.ones(len(rows))})


def test_the_two_row_gradient_rules_on_two_batches():
    """Batches of 10 and 30 samples; row 1 in both, row 2 in the first only. Each gradient
    is its batch's mean's: a row's summed-loss gradient is samples times it."""
    batch = [_contribution("a", 10, [1, 2], [1.0, 4.0]), _contribution("b", 30, [1], [2.0])]
    one_batch = aggregate(batch)
    assert one_batch.sparse["t"][0].tolist() == [1, 2]
    assert one_batch.sparse["t"][1].flatten().tolist() == [(10 * 1 + 30 * 2) / 40, 10 * 4 / 40]
    assert one_batch.dense["w"].tolist() == [(10 * 10 + 30 * 30) / 40]
    touched = aggregate(batch, "touched-mean")
    assert touched.sparse["t"][1].flatten().tolist() == [(10 * 1 + 30 * 2) / 40, 10 * 4 / 10]
    assert torch.equal(touched.dense["w"], one_batch.dense["w"])  # the rule is the rows' alone


def test_a_short_batch_weighs_its_samples_by_the_configured_global_batch():
    """Configured local batches of 32: a short batch of 8 beside a full one adds 32 to the
    global batch's size, not 8, as a short batch of local training does."""
    full, short = _contribution("a", 32, [1], [1.0], 32), _contribution("b", 8, [1], [1.0], 32)
    gradient = aggregate([full, short])
    assert gradient.sparse["t"][1].item() == (32 + 8) / 64
    assert gradient.dense["w"].tolist() == [(32 * 32 + 8 * 8) / 64]
    unsaid = aggregate([_contribution("a", 32, [1], [1.0]), _contribution("b", 8, [1], [1.0])])
    assert unsaid.sparse["t"][1].item() == 1.0  # without a configured size: the samples present


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_a_bad_batch_size_or_rule_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="batch_size"):
        _contribution("a", 8, [1], [1.0], bad)
    with pytest.raises(ValueError, match="row gradient"):
        aggregate([_contribution("a", 8, [1], [1.0])], "sum")
    with pytest.raises(ValueError, match="row gradient"):
        GBAConfig(2, row_gradient="median")
