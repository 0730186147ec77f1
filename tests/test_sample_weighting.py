"""Every sample weighs the same in a step, whether its batch is full or short.

A step's loss is its summed log loss over TrainConfig.loss_batch_size samples (by default
the largest batch trained on), not the batch's mean: with the mean, each sample of a
36-row day weighed 57 times one of a full 2,048-row chunk (benchmarks.movielens).
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
    """Full batches of one size: the default (the largest batch) and an explicit size
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


def test_a_short_batch_after_full_ones_weighs_each_sample_as_they_do():
    batches, short = _batches()
    trainer = Trainer(SPEC, CONFIG)
    for batch in batches:
        trainer.train_step(batch)
    expected = _mean_loss_grads(trainer, short)
    as_mean = copy.deepcopy(trainer)
    as_mean.largest_batch = SHORT  # as if this were its largest batch: the mean's step
    reported = trainer.train_step(short)
    assert trainer.largest_batch == FULL
    got = _dense_grads(trainer.model)
    for name, grad in expected.items():
        assert torch.equal(got[name], grad * (SHORT / FULL)), name
    # What a step reports is the plain summed log loss, whatever it weighs.
    assert reported == as_mean.train_step(short)


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


def test_the_largest_batch_is_checkpointed(tmp_path):
    """A day that starts with a short batch, after a restore, weighs it as the trainer
    that never stopped does."""
    batches, short = _batches()
    trainer = Trainer(SPEC, CONFIG)
    for batch in batches:
        trainer.train_step(batch)
    restored = Trainer(SPEC, CONFIG)
    restored.restore(trainer.save_checkpoint(tmp_path))
    assert restored.largest_batch == FULL
    for t in (trainer, restored):
        t.train_step(short)
    assert_state_equal(restored.state(), trainer.state(), "state")


def test_a_checkpoint_without_it_starts_counting_again(tmp_path):
    """Checkpoints made before the field (and a parameter server's) have no largest
    batch: the next batch sets it, so that batch takes the mean's step."""
    batches, short = _batches()
    trainer = Trainer(SPEC, CONFIG)
    trainer.train_step(batches[0])
    state = trainer.state()
    del state["largest_batch"]
    restored = Trainer(SPEC, CONFIG)
    restored.restore(save_checkpoint(tmp_path, state, SPEC, trainer.positions, {}))
    assert restored.largest_batch == 0
    expected = _mean_loss_grads(restored, short)
    restored.train_step(short)
    assert restored.largest_batch == SHORT
    for name, grad in _dense_grads(restored.model).items():
        assert torch.equal(grad, expected[name]), name
