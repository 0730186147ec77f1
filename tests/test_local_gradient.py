"""A GBA worker's gradients (GradientComputer) come from the fused kernels local training
runs, and equal what the step they stand for would use: autograd through the plain-torch
reference lookup (the worker's computation before it moved onto the kernels), and a plain
SGD Trainer step on the full tables."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from picasso.batch import TorchBatch
from picasso.distributed.local_gradient import GradientComputer
from picasso.kernels import load_backend
from picasso.models import MODELS, build_model
from picasso.packing import PackingPlan
from picasso.trainer import Trainer

from helpers import planted_batches
from test_trainer import CONFIG, SPEC

PLAN = PackingPlan.from_spec(SPEC)
TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}


def autograd_through_the_reference(computer: GradientComputer, batch: TorchBatch, dense, rows, values):
    """The oracle: (dense gradients, row gradients) by autograd, with each bag looked up in a
    compact table of the pulled rows through the differentiable reference lookup."""
    reference = load_backend("reference")
    model = computer.model
    with torch.no_grad():
        for name, value in dense.items():
            computer.params[name].copy_(value)
    compact = {key: values[key].detach().clone().requires_grad_(True) for key in rows}
    pooled = []
    for lookup in computer.lookups:
        embedding = getattr(model, lookup.prefix)
        local_ids = torch.searchsorted(rows[lookup.key], batch.ids[lookup.group])
        pooled.append(reference.lookup(compact[lookup.key], local_ids, batch.offsets[lookup.group], lookup.num_fields,
                                       getattr(embedding, f"mean_{lookup.group}"),
                                       getattr(embedding, f"max_len_{lookup.group}")))
    model.zero_grad(set_to_none=True)
    F.binary_cross_entropy_with_logits(model.dense_part(batch.dense, pooled), batch.label).backward()
    dense_grads = {name: p.grad.clone() for name, p in computer.params.items() if p.grad is not None}
    return dense_grads, {key: t.grad for key, t in compact.items()}


def batch_with_long_bags(samples: int, seed: int) -> TorchBatch:
    """Bags of 0 to 2 x max_len ids (the decoders would refuse the long ones, so only a batch
    made by hand has ids cut by truncation), drawn from a few rows per field, so that ids
    repeat within and across bags."""
    g = torch.Generator().manual_seed(seed)
    ids, offsets = {}, {}
    for group in PLAN.groups:
        bounds = [*group.row_offsets, group.num_rows]
        longest = 2 * torch.tensor(group.max_len)
        lengths = (torch.rand(samples, group.num_fields, generator=g) * (longest + 1)).long()
        field_of_id = torch.arange(group.num_fields).repeat(samples).repeat_interleave(lengths.flatten())
        first_row = torch.tensor(bounds[:-1])[field_of_id]
        ids[group.name] = first_row + torch.randint(0, 4, (field_of_id.numel(),), generator=g)
        offsets[group.name] = (torch.cumsum(lengths.flatten(), 0) - lengths.flatten()).to(torch.int32)
    label = torch.randint(0, 2, (samples,), generator=g).float()
    return TorchBatch(label, torch.rand(samples, len(SPEC.dense), generator=g), ids, offsets)


def pulled_from(model: torch.nn.Module, computer: GradientComputer, batch: TorchBatch):
    """What a worker pulls for `batch` from a server holding `model`'s parameters."""
    rows = computer.rows_needed(batch)
    dense = {name: p.detach().clone() for name, p in model.named_parameters()}
    values = {key: model.get_buffer(key)[wanted].clone() for key, wanted in rows.items()}
    return dense, rows, values


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_gradients_match_autograd_through_the_reference_lookup(model_name):
    """Multi-hot sum and mean fields, truncated and empty bags, repeated ids, and models
    with one lookup or two (wide_deep, deepfm)."""
    server = build_model(model_name, SPEC, PLAN, CONFIG.hidden)
    computer = GradientComputer(build_model(model_name, SPEC, PLAN, CONFIG.hidden))
    for seed in range(3):
        batch = batch_with_long_bags(48, seed)
        dense, rows, values = pulled_from(server, computer, batch)
        expected_dense, expected_rows = autograd_through_the_reference(computer, batch, dense, rows, values)
        got = computer.compute(batch, dense, rows, values)
        assert set(got.dense) == set(expected_dense) and set(got.row_grads) == set(expected_rows)
        for name, grad in expected_dense.items():
            torch.testing.assert_close(got.dense[name], grad, **TOLERANCE, msg=name)
        for key, grad in expected_rows.items():
            assert torch.equal(got.rows[key], rows[key])
            torch.testing.assert_close(got.row_grads[key], grad, **TOLERANCE, msg=key)


@pytest.mark.parametrize("model_name", ["wide_deep", "dlrm"])
def test_gradients_are_what_a_plain_sgd_trainer_step_applies(model_name):
    """A Trainer with plain SGD on its tables moves each row the batch touches by
    -lr x its gradient, and leaves the dense gradients in .grad: the worker's, taken
    against the Trainer's parameters before the step, are the same."""
    config = replace(CONFIG, model=model_name, sparse_optimizer="sgd", lr_sparse=0.1)
    computer = GradientComputer(build_model(model_name, SPEC, PLAN, config.hidden))
    trainer = Trainer(SPEC, config)
    for packed in planted_batches(SPEC, 192, 64)[0]:
        batch = packed.to_torch()
        dense, rows, values = pulled_from(trainer.model, computer, batch)
        got = computer.compute(batch, dense, rows, values)
        trainer.train_step(packed)
        stepped = {name: p.grad for name, p in trainer.model.named_parameters() if p.grad is not None}
        assert set(got.dense) == set(stepped)
        for name, grad in stepped.items():
            torch.testing.assert_close(got.dense[name], grad, **TOLERANCE, msg=name)
        for key, wanted in rows.items():
            moved = trainer.model.get_buffer(key)[wanted] - values[key]
            torch.testing.assert_close(moved, -config.lr_sparse * got.row_grads[key], atol=1e-7, rtol=1e-4, msg=key)
