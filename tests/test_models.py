"""The models: each builds from a spec (one dim, or mixed dims with multi-hot fields),
gives finite logits, passes gradient to every parameter, and learns planted data; the
interaction math matches its definition; the dense part is the whole model after the
lookups."""

from __future__ import annotations

import itertools
from functools import cache

import numpy as np
import pytest
import torch
from torch import nn

from picasso.builtin_specs import builtin_spec
from picasso.embedding import FlatPooled
from picasso.models import MODELS, build_model
from picasso.models.common import CommonDim, PackedModel
from picasso.models.deepfm import fm_interaction
from picasso.packing import PackingPlan
from picasso.spec import parse_spec
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

# The trainer tests' data path (planted model -> decoder -> pack), reused rather than
# copied; it belongs in helpers.py, which this change may not edit.
from helpers import planted_batches

MODEL_NAMES = ["wide_deep", "deepfm", "dlrm", "dcn_v2"]
# criteo: 26 fields, all dim 16, one-hot. criteo:40: dims 8/16/32/64 and multi-hot
# mean-pooled fields, so the projections to one dim (DeepFM, DLRM) are exercised.
SPEC_NAMES = ["criteo", "criteo:40"]
HIDDEN = (32, 16)
# Measured on this data (seed 0): 0.716 (DeepFM on criteo:40, whose FM term is the
# noisiest part) to 0.795, with 0.89-0.90 for the true probabilities and 0.5 for chance.
# Other seeds and streams moved DeepFM on criteo:40 down to 0.680, the others less.
MIN_AUC = 0.65


@cache
def planted(spec_name: str):
    """(training batches, held-out batches) for a spec, made once per module."""
    spec = builtin_spec(spec_name)
    train, _ = planted_batches(spec, rows=40_960, batch_size=256, stream=0)
    held_out, _ = planted_batches(spec, rows=8_000, batch_size=4_000, stream=1, source="day-1")
    return train, held_out


def build(name: str, spec_name: str) -> PackedModel:
    spec = builtin_spec(spec_name)
    torch.manual_seed(0)
    return build_model(name, spec, PackingPlan.from_spec(spec), HIDDEN)


def grad_size(p: torch.Tensor) -> float:
    return 0.0 if p.grad is None else float(p.grad.abs().sum())


def tables(model: PackedModel) -> dict[str, torch.Tensor]:
    """A copy of every embedding table, by lookup and group."""
    return {f"{lookup}.{group}": table.clone() for lookup, embedding in zip(model.lookups, model.embeddings())
            for group, table in embedding.tables.items()}


def test_registry_has_every_model():
    assert set(MODEL_NAMES) <= set(MODELS)
    with pytest.raises(ValueError, match="unknown model"):
        build("fm_but_not_deep", "criteo")


@pytest.mark.parametrize("spec_name", SPEC_NAMES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_forward_is_finite_and_gradients_reach_every_parameter(name, spec_name):
    model = build(name, spec_name)
    batch = planted(spec_name)[0][0].to_torch()
    logits = model(batch)
    assert logits.shape == (batch.num_samples,)
    assert torch.isfinite(logits).all()

    # The same, in the two parts the trainer may run separately (and compile the second).
    pooled = model.lookup(batch)
    flat = pooled.flat if isinstance(pooled, FlatPooled) else None  # Wide&Deep's, DCN-v2's
    for p in pooled if flat is None else [flat, *pooled]:
        p.retain_grad()
    split_logits = model.dense_part(batch.dense, pooled)
    torch.testing.assert_close(split_logits, logits, rtol=0, atol=0)

    # Every parameter belongs to the dense part (Adam's, and what torch.compile covers);
    # the embedding tables are buffers, stepped by their fused optimizer in backward.
    params = {n for n, _ in model.named_parameters()}
    assert params == {f"dense_part.{n}" for n, _ in model.dense_part.named_parameters()}
    before = tables(model)

    nn.functional.binary_cross_entropy_with_logits(split_logits, batch.label).backward()
    no_grad = [n for n, p in model.named_parameters() if grad_size(p) == 0.0]
    assert no_grad == [], f"no gradient reached {no_grad}"
    assert all(grad_size(p) > 0 for p in pooled if p._base is None or p._base is not flat), \
        "a group's embeddings got no gradient"
    # The groups the lookup wrote into the flat input: their columns of its gradient.
    in_flat = [p for p in pooled if flat is not None and p._base is flat]
    assert (flat is not None) == (name in ("wide_deep", "dcn_v2")) and (flat is None or in_flat)
    assert all(flat.grad.as_strided(p.shape, p.stride(), p.storage_offset()).abs().sum() > 0 for p in in_flat), \
        "a group's embeddings got no gradient"
    after = tables(model)
    unchanged = [key for key in before if torch.equal(before[key], after[key])]
    assert unchanged == [], f"tables the backward pass did not step: {unchanged}"


@pytest.mark.parametrize("spec_name", SPEC_NAMES)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_training_on_planted_data_learns(name, spec_name):
    train, held_out = planted(spec_name)
    trainer = Trainer(builtin_spec(spec_name), TrainConfig(model=name, hidden=HIDDEN, log_every=0))
    trainer.train(train)
    metrics = trainer.evaluate(held_out)
    assert metrics.auc > MIN_AUC, metrics


# -- the math ---------------------------------------------------------------------------


def test_fm_interaction_is_the_sum_over_pairs():
    v = torch.randn(5, 7, 3, dtype=torch.float64)
    pairs = sum((v[:, i] * v[:, j]).sum(dim=1) for i, j in itertools.combinations(range(7), 2))
    torch.testing.assert_close(fm_interaction(v), pairs)


def test_common_dim_projects_only_narrower_groups():
    plan = PackingPlan.from_spec(builtin_spec("criteo:40"))
    common = CommonDim(plan)
    assert common.dim == 64
    for group, project in zip(plan.groups, common.project):
        assert isinstance(project, nn.Identity) == (group.embedding_dim == 64), group.name
    pooled = [torch.randn(3, g.num_fields, g.embedding_dim) for g in plan.groups]
    assert common(pooled).shape == (3, 40, 64)
    # One dim already: nothing to learn, nothing changed.
    single = CommonDim(PackingPlan.from_spec(builtin_spec("criteo")))
    assert list(single.parameters()) == []


def test_dlrm_top_mlp_sees_bottom_output_and_every_pair_once():
    model = build("dlrm", "criteo:40")
    part = model.dense_part
    seen = {}
    part.top.register_forward_hook(lambda module, args, out: seen.update(top_in=args[0]))
    batch = planted("criteo:40")[0][0].to_torch()
    pooled = model.lookup(batch)
    part(batch.dense, pooled)

    bottom = part.bottom(batch.dense)
    vectors = [bottom] + list(part.to_common_dim(pooled).unbind(dim=1))
    dots = [(vectors[i] * vectors[j]).sum(dim=1) for i, j in itertools.combinations(range(len(vectors)), 2)]
    expected = torch.cat([bottom, torch.stack(dots, dim=1)], dim=1)
    torch.testing.assert_close(seen["top_in"], expected)


def test_dcn_v2_cross_layer_formula():
    spec = builtin_spec("criteo")
    model = MODELS["dcn_v2"](spec, PackingPlan.from_spec(spec), hidden=(), cross_layers=1)
    batch = planted("criteo")[0][0].to_torch()
    pooled = model.lookup(batch)
    x0 = torch.cat([batch.dense] + [p.flatten(1) for p in pooled], dim=1)
    layer, head = model.dense_part.cross[0], model.dense_part.head
    x1 = x0 * (x0 @ layer.weight.T + layer.bias) + x0
    torch.testing.assert_close(model.dense_part(batch.dense, pooled), (x1 @ head.weight.T + head.bias).squeeze(1))


# -- specs at the edges -------------------------------------------------------------

NO_DENSE = parse_spec(
    {
        "label": "click",
        "sparse": [
            {"name": "a", "embedding_dim": 4, "hash_buckets": 50},
            {"name": "b", "embedding_dim": 8, "hash_buckets": 30, "max_len": 3, "pooling": "mean"},
        ],
    }
)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_spec_without_dense_fields(name):
    model = build_model(name, NO_DENSE, PackingPlan.from_spec(NO_DENSE), HIDDEN)
    batch = planted_batches(NO_DENSE, rows=64, batch_size=64)[0][0].to_torch()
    assert batch.dense.shape == (64, 0)
    logits = model(batch)
    assert logits.shape == (64,) and torch.isfinite(logits).all()
    if name == "dlrm":
        assert model.dense_part.bottom is None


def test_dlrm_refuses_a_spec_with_nothing_to_interact():
    spec = parse_spec({"label": "click", "sparse": [{"name": "a", "embedding_dim": 4, "hash_buckets": 5}]})
    with pytest.raises(ValueError, match="dlrm"):
        build_model("dlrm", spec, PackingPlan.from_spec(spec), HIDDEN)



def test_trainer_can_compile_the_dense_part_and_still_checkpoint(tmp_path):
    """compile_dense wraps dense_part with torch.compile and keeps state_dict keys, so a
    compiled trainer's checkpoint restores into an eager one."""
    spec = load_spec("criteo")
    batches, _ = planted_batches(spec, rows=512, batch_size=256)
    compiled = Trainer(spec, TrainConfig(hidden=(16,), log_every=0, compile_dense=True))
    compiled.train(batches)
    path = compiled.save_checkpoint(tmp_path)
    eager = Trainer(spec, TrainConfig(hidden=(16,), log_every=0))
    eager.restore(path)
    assert set(eager.model.state_dict()) == set(compiled.model.state_dict())
    np.testing.assert_allclose(eager.predict(batches[0]), compiled.predict(batches[0]), rtol=1e-5, atol=1e-6)
