"""DenseAdam steps exactly as torch.optim.Adam, and their checkpoints load into each other."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from picasso.dense_adam import DenseAdam


def _params(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in ((7, 5), (5,), (3, 2, 4))]


def _gradients(params, step: int, skip_second_every: int = 3):
    """Random gradients; the second parameter gets none every few steps (a branch unused)."""
    generator = torch.Generator().manual_seed(1000 + step)
    for index, param in enumerate(params):
        missing = index == 1 and step % skip_second_every == 0
        param.grad = None if missing else torch.randn(param.shape, generator=generator)


def _run(optimizer, params, steps: range) -> None:
    for step in steps:
        _gradients(params, step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("lr", [1e-3, 0.05])
def test_steps_are_torch_adams_bit_for_bit(weight_decay, lr):
    ours, theirs = _params(0), _params(0)
    _run(DenseAdam(ours, lr=lr, weight_decay=weight_decay), ours, range(25))
    _run(torch.optim.Adam(theirs, lr=lr, weight_decay=weight_decay), theirs, range(25))
    for mine, torch_param in zip(ours, theirs):
        assert torch.equal(mine, torch_param)


@pytest.mark.parametrize("direction", ["torch into ours", "ours into torch"])
def test_checkpoints_load_into_each_other_and_training_goes_on_identically(direction):
    first, second = _params(1), _params(1)
    make_first, make_second = (torch.optim.Adam, DenseAdam) if direction == "torch into ours" else (DenseAdam, torch.optim.Adam)
    before = make_first(first, lr=0.01, weight_decay=0.001)
    _run(before, first, range(10))
    for target, source in zip(second, first):
        target.data.copy_(source.data)
    after = make_second(second, lr=0.01, weight_decay=0.001)
    after.load_state_dict(copy.deepcopy(before.state_dict()))  # as through a checkpoint file
    _run(before, first, range(10, 20))
    _run(after, second, range(10, 20))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_a_parameter_without_a_gradient_gets_no_state_and_does_not_move():
    params = _params(2)
    frozen = params[2].detach().clone()
    optimizer = DenseAdam(params, lr=0.1)
    for step in range(3):
        _gradients(params, step)
        params[2].grad = None
        optimizer.step()
    assert 2 not in optimizer.state and torch.equal(params[2], frozen)
    assert float(optimizer.state[0]["step"]) == 3


def test_loading_keeps_the_hyper_parameters_it_was_built_with():
    """A warm start with a new learning rate or weight decay uses them (torch's would take the saved ones)."""
    params = _params(3)
    old = DenseAdam(params, lr=0.1, weight_decay=0.0)
    _run(old, params, range(2))
    new = DenseAdam(params, lr=0.001, weight_decay=0.5)
    new.load_state_dict(old.state_dict())
    assert (new.lr, new.weight_decay) == (0.001, 0.5)
    assert torch.equal(new.state[0]["exp_avg"], old.state[0]["exp_avg"])
    assert new.state[0]["exp_avg"] is not old.state[0]["exp_avg"]  # a copy: stepping one leaves the other


@pytest.mark.parametrize("settings, named", [
    ({"lr": -1.0}, "lr"), ({"lr": float("nan")}, "lr"), ({"weight_decay": -0.1}, "weight_decay"),
    ({"weight_decay": True}, "weight_decay"), ({"eps": float("inf")}, "eps"), ({"betas": (0.9, 1.0)}, "betas"),
])
def test_bad_hyper_parameters_are_refused_by_name(settings, named):
    with pytest.raises(ValueError, match=named):
        DenseAdam(_params(0), **settings)


def test_a_state_for_another_model_is_refused():
    params = _params(4)
    optimizer = DenseAdam(params)
    _run(optimizer, params, range(1))
    with pytest.raises(ValueError, match="for 3 parameters, this model has 2"):
        DenseAdam(params[:2]).load_state_dict(optimizer.state_dict())
    swapped = [params[1], params[0], params[2]]
    with pytest.raises(ValueError, match="shape"):
        DenseAdam(swapped).load_state_dict(optimizer.state_dict())


def test_training_never_imports_the_compiler():
    """What this class is for: a Trainer's steps leave torch._dynamo unimported (1.5 s a process)."""
    script = (
        "import sys\n"
        "from helpers import planted_batches, small_spec\n"
        "from picasso.trainer import Trainer, TrainConfig\n"
        "spec = small_spec()\n"
        "trainer = Trainer(spec, TrainConfig(hidden=(8,), interleave=False))\n"
        "trainer.train(planted_batches(spec, rows=128, batch_size=64)[0])\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
