"""The loss weights of corrected late labels (picasso.sample_join.delayed_feedback)."""

import torch
from helpers import small_spec

from picasso.batch import pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.sample_join.delayed_feedback import importance_weights, late_share
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer


def test_weighted_stream_recovers_the_true_click_rate():
    """Per impression the stream holds p(1-d) in-window positives, (1-p)+p·d negatives and
    p·d corrections; weighted at f = p, its positives' share is p again."""
    for p in (0.02, 0.3, 0.7):
        for d in (0.0, 0.05, 0.5, 1.0):
            f = torch.tensor([p, p])
            w_pos, w_neg = importance_weights(f, torch.tensor([1.0, 0.0]), d).tolist()
            positives = (p * (1 - d) + p * d) * w_pos
            negatives = ((1 - p) + p * d) * w_neg
            assert abs(positives / (positives + negatives) - p) < 1e-6


def test_without_late_labels_every_weight_is_one():
    f = torch.tensor([0.1, 0.5, 0.9])
    assert torch.allclose(importance_weights(f, torch.tensor([1.0, 0.0, 1.0]), 0.0), torch.ones(3))


def test_late_share_is_the_share_of_clicks_after_the_wait():
    assert late_share(90, 10) == 0.1 and late_share(0, 0) == 0.0


def test_a_weighted_batch_trains_and_reports_its_unweighted_loss():
    spec = small_spec(name="weights")
    raw, _ = PlantedModel(spec).sample(256, stream=0)
    batch = pack(RecordDecoder(spec).decode_table(raw, "day").table, spec, PackingPlan.from_spec(spec))
    plain, weighted = (Trainer(spec, TrainConfig(hidden=(8,), device="cpu", seed=3)) for _ in range(2))
    loss_plain = plain.train_step(batch)
    loss_weighted = weighted.train_step(batch.with_late_share(0.5))
    assert abs(loss_plain - loss_weighted) < 1e-3 * loss_plain  # the same weights before the step
    changed = [not torch.equal(a, b) for a, b in zip(plain.model.parameters(), weighted.model.parameters())]
    assert any(changed)  # but another gradient
    assert batch.with_late_share(0.5).late_share == 0.5 and batch.late_share is None
