"""Lookups over one plan share a kernel call per group (Wide&Deep's deep and wide tables,
DeepFM's first-order weights): training with them shared ends exactly where training with
each embedding on its own does, a checkpoint of either loads into the other, and a
hot-row cache's fast tiers take each embedding's own lookup."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
import torch

from picasso import kernels
from picasso.builtin_specs import builtin_spec
from picasso.cache import CacheConfig
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches

# criteo:40: four groups of dims 8/16/32/64, multi-hot mean-pooled fields with max_len.
SPEC = builtin_spec("criteo:40")
CONFIG = TrainConfig(hidden=(16, 8), log_every=1000, interleave=False)
STEPS = 6


@cache
def batches():
    return planted_batches(SPEC, rows=STEPS * 128, batch_size=128)[0]


def trained(config: TrainConfig, share: bool) -> Trainer:
    trainer = Trainer(SPEC, config)
    trainer.model.share_lookups = share
    for batch in batches():
        trainer.train_step(batch)
    return trainer


def assert_same_state(a: Trainer, b: Trainer) -> None:
    state_a, state_b = a.model.state_dict(), b.model.state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key


@pytest.mark.parametrize("optimizer", kernels.OPTIMIZERS)
def test_wide_deep_trains_the_same_with_shared_lookups(optimizer):
    config = replace(CONFIG, sparse_optimizer=optimizer)
    shared, alone = trained(config, share=True), trained(config, share=False)
    assert_same_state(shared, alone)
    # Both tables moved, and both counted their steps (Adam's bias correction reads them).
    model = shared.model
    assert int(model.embedding.steps) == int(model.wide_embedding.steps) == STEPS
    assert all(t.abs().sum() > 0 for t in model.wide_embedding.tables.values())  # from zero


@pytest.mark.parametrize("model", ["wide_deep", "dcn_v2"])
def test_a_lookup_into_the_flat_input_trains_as_the_concatenated_input_does(model):
    """Wide&Deep's and DCN-v2's lookups write the deep groups into the dense part's flat
    input and step from its gradient in place: the same training as concatenating them,
    and the same scores."""
    config = replace(CONFIG, model=model, sparse_optimizer="adam")
    flat = trained(config, share=True)
    concatenated = Trainer(SPEC, config)
    concatenated.model.flat_lookup = False
    for batch in batches():
        concatenated.train_step(batch)
    assert_same_state(flat, concatenated)
    assert (flat.predict(batches()[0]) == concatenated.predict(batches()[0])).all()


def test_deepfm_trains_the_same_with_shared_lookups():
    config = replace(CONFIG, model="deepfm", sparse_optimizer="adam")
    assert_same_state(trained(config, share=True), trained(config, share=False))


def test_a_step_makes_one_lookup_and_one_update_call_per_group(monkeypatch):
    counts = {"lookup_many": 0, "fused_update_many": 0}

    def counted(name):
        op = getattr(kernels, name)

        def call(weights, *args):
            assert len(weights) == 2  # the deep and the wide table of one group
            counts[name] += 1
            return op(weights, *args)

        return call

    trainer = Trainer(SPEC, CONFIG)
    for name in counts:
        monkeypatch.setattr(kernels, name, counted(name))
    trainer.train_step(batches()[0])
    groups = len(trainer.plan.groups)
    assert groups > 1 and counts == {"lookup_many": groups, "fused_update_many": groups}


def test_predictions_and_checkpoints_are_the_same_either_way():
    """The state keeps today's layout (a deep and a wide table per group): a model trained
    with shared lookups loads into one without, and predicts the same in both paths."""
    shared = trained(CONFIG, share=True)
    fresh = Trainer(SPEC, CONFIG)
    fresh.model.share_lookups = False
    fresh.model.load_state_dict(shared.model.state_dict())
    assert any(key.startswith("wide_embedding.table_") for key in shared.model.state_dict())
    for batch in batches()[:2]:
        assert (shared.predict(batch) == fresh.predict(batch)).all()


def test_with_a_hot_row_cache_each_embedding_looks_up_its_own_fast_tier():
    config = replace(CONFIG, cache=CacheConfig(capacity="10%", refresh_every=2))
    assert_same_state(trained(config, share=True), trained(config, share=False))
