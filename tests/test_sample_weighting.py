"""Every sample weighs the same in a step, whether its batch is full or short.

A step's loss is its summed log loss over TrainConfig.loss_batch_size samples (the run's
configured batch size: every command sets it from its --batch-size), not the batch's
mean: with the mean, each sample of a 36-row day weighed 57 times one of a full 2,048-row
chunk (benchmarks.movielens). GBA and sync weigh samples the same way: test_sync_one_batch.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from picasso.checkpoint import save_checkpoint
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches
from test_trainer import CONFIG, SPEC, assert_state_equal

FULL, SHORT = 64, 16  # SHORT / FULL is a power of two: scaling by it is exact in floats


def _batches():
    batches, _ = planted_batches(SPEC, 3 * FULL, FULL)
    short, _ = planted_batches(SPEC, SHORT, SHORT, stream=7, source="day-1")
    return batches, short[0]


def _dense_grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _mean_loss_grads(trainer: Trainer, batch) -> dict[str, torch.Tensor]:
    """The dense gradients a batch-mean loss gives, on a copy of the trainer's model."""
    model = copy.deepcopy(trainer.model)
    model.zero_grad(set_to_none=True)
    tensors = batch.to_torch()
    model.backward(tensors, model.lookup(tensors))  # no loss_batch: the batch's mean
    return _dense_grads(model)


@pytest.mark.parametrize("bad", [0, -5, 2.5, True, "64"])
def test_a_bad_loss_batch_size_fails_at_start_naming_it(bad):
    with pytest.raises(ValueError, match="loss_batch_size"):
        TrainConfig(loss_batch_size=bad)


def test_equal_batches_step_exactly_as_the_batch_mean():
    """Full batches of one size: the default (each batch's mean) and an explicit size
    equal to it both take the mean's step, bit for bit."""
    batches, _ = _batches()
    by_default = Trainer(SPEC, CONFIG)
    explicit = Trainer(SPEC, replace(CONFIG, loss_batch_size=FULL))
    for batch in batches:
        expected = _mean_loss_grads(by_default, batch)
        loss = by_default.train_step(batch)
        assert explicit.train_step(batch) == loss
        got = _dense_grads(by_default.model)
        assert got.keys() == expected.keys()
        for name in expected:
            assert torch.equal(got[name], expected[name]), name
    assert_state_equal(by_default.state()["model"], explicit.state()["model"], "model")


def _assert_step_scaled(trainer: Trainer, batch, scale: float) -> float:
    """Train the batch; its dense gradients must be its mean loss's times `scale` exactly
    (scale a power of two). Returns the summed loss the step reported."""
    expected = _mean_loss_grads(trainer, batch)
    reported = trainer.train_step(batch)
    got = _dense_grads(trainer.model)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        assert torch.equal(got[name], grad * scale), name
    return reported


def test_a_short_batch_after_full_ones_weighs_each_sample_as_they_do():
    batches, short = _batches()
    trainer = Trainer(SPEC, replace(CONFIG, loss_batch_size=FULL))
    for batch in batches:
        _assert_step_scaled(trainer, batch, 1.0)
    as_mean = Trainer(SPEC, CONFIG)  # None: the batch's own mean
    as_mean.model.load_state_dict(trainer.model.state_dict())
    reported = _assert_step_scaled(trainer, short, SHORT / FULL)
    # What a step reports is the plain summed log loss, whatever it weighs.
    assert reported == as_mean.train_step(short)


def test_no_batch_changes_how_later_ones_weigh():
    """A stream of small polls, then one oversized batch: each weighs its samples by one
    over the configured size, and the full batch after them still steps as its mean."""
    batches, short = _batches()
    oversized, _ = planted_batches(SPEC, 2 * FULL, 2 * FULL, stream=9, source="backlog")
    trainer = Trainer(SPEC, replace(CONFIG, loss_batch_size=FULL))
    for _ in range(3):
        _assert_step_scaled(trainer, short, SHORT / FULL)
    _assert_step_scaled(trainer, oversized[0], 2.0)
    _assert_step_scaled(trainer, batches[0], 1.0)
    _assert_step_scaled(trainer, short, SHORT / FULL)


def test_a_warm_start_with_another_batch_size_weighs_by_the_new_one(tmp_path):
    """The size is the run's setting, not the checkpoint's: a model trained on full
    batches of FULL, resumed with batches of SHORT, steps each full SHORT batch as its
    mean, and a batch of half of it at half its mean's weight."""
    batches, short = _batches()
    trained = Trainer(SPEC, replace(CONFIG, loss_batch_size=FULL))
    for batch in batches:
        trained.train_step(batch)
    resumed = Trainer(SPEC, replace(CONFIG, loss_batch_size=SHORT))
    resumed.restore(trained.save_checkpoint(tmp_path))
    half, _ = planted_batches(SPEC, SHORT // 2, SHORT // 2, stream=8, source="day-2")
    _assert_step_scaled(resumed, short, 1.0)
    _assert_step_scaled(resumed, half[0], 0.5)


def test_sparse_rows_move_by_the_weighted_gradient():
    """Plain SGD on the tables: a short batch moves each row it touches by exactly
    SHORT / FULL of what the same batch moves it by as a mean (a power of two: exact)."""
    _, short = _batches()
    config = replace(CONFIG, sparse_optimizer="sgd", lr_sparse=0.5)
    weighted = Trainer(SPEC, replace(config, loss_batch_size=FULL))
    mean = Trainer(SPEC, replace(config, loss_batch_size=SHORT))  # its own size: the mean
    before = {k: v.clone() for k, v in weighted.model.state_dict().items() if ".table_" in k}
    weighted.train_step(short)
    mean.train_step(short)
    moved_any = False
    for key, start in before.items():
        step_weighted = weighted.model.get_buffer(key) - start
        step_mean = mean.model.get_buffer(key) - start
        torch.testing.assert_close(step_weighted, step_mean * (SHORT / FULL), rtol=1e-5, atol=2e-8, msg=key)  # rounding of w - lr·g
        moved_any |= bool(step_mean.abs().sum() > 0)
    assert moved_any


def test_an_explicit_size_weighs_a_batch_by_its_share_of_it():
    batches, _ = _batches()
    trainer = Trainer(SPEC, replace(CONFIG, loss_batch_size=4 * FULL))
    expected = _mean_loss_grads(trainer, batches[0])
    trainer.train_step(batches[0])
    for name, grad in _dense_grads(trainer.model).items():
        assert torch.equal(grad, expected[name] * 0.25), name


def test_a_checkpoint_that_recorded_the_largest_batch_still_restores(tmp_path):
    """Checkpoints made while the size was the largest batch trained on carry it: it is
    ignored, and the restored trainer weighs by its own setting."""
    batches, short = _batches()
    trainer = Trainer(SPEC, replace(CONFIG, loss_batch_size=FULL))
    trainer.train_step(batches[0])
    state = trainer.state()
    state["largest_batch"] = 4 * FULL
    restored = Trainer(SPEC, replace(CONFIG, loss_batch_size=FULL))
    restored.restore(save_checkpoint(tmp_path, state, SPEC, trainer.positions, {}))
    _assert_step_scaled(restored, short, SHORT / FULL)
    trainer.train_step(short)
    assert_state_equal(restored.state()["model"], trainer.state()["model"], "model")


def test_every_command_weighs_by_its_batch_size_flag(tmp_path):
    """The size is the flag's, never left to the batches: daily's --batch-size and the
    stream's --batch-messages (their configs fill it in where a caller left it None)."""
    from picasso.pipelines.cli.daily import daily_config
    from picasso.pipelines.cli.main import parse_args
    from picasso.pipelines.cli.stream import stream_config

    daily = parse_args(["daily", "--data", str(tmp_path), "--date", "2026-01-01", "--workdir", str(tmp_path / "d"),
                        "--batch-size", "96"])
    assert daily_config(daily, str(tmp_path), "2026-01-01").train.loss_batch_size == 96
    stream = parse_args(["stream", "--bootstrap-servers", "127.0.0.1:1", "--topic", "events",
                         "--workdir", str(tmp_path / "s"), "--batch-messages", "48", "--publish-every", "0"])
    assert stream_config(stream).train.loss_batch_size == 48
