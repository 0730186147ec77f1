"""DenseAdam: Adam for the dense part, step for step torch.optim.Adam's arithmetic.

Why not torch.optim.Adam itself: constructing any torch.optim optimizer imports
torch._dynamo (its methods are wrapped by torch._disable_dynamo, which imports the compiler
on first call), and that import alone is 1.5 s of every process that trains: a daily run,
each partition's scoring, a GBA worker, a parameter server. Nothing here compiles, unless
TrainConfig.compile_dense asks for it.

What stays the same:
- the arithmetic: torch.optim.Adam's single-tensor path, the one it takes on CPU, with
  coupled L2 weight decay (grad + weight_decay * param), so results are bit for bit
  torch's (tests/test_dense_adam.py);
- the state_dict layout: per parameter index, `step` (a float32 CPU scalar), `exp_avg` and
  `exp_avg_sq`, and torch's param_groups keys, so checkpoints written by either load into
  the other.

One thing differs on purpose: load_state_dict takes the slots and step counts but keeps the
hyper-parameters this optimizer was built with. torch.optim's would take the saved
learning rate and weight decay too, and a run warm-started with new --lr-dense or
--weight-decay would silently go on with the old ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


class DenseAdam:
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Adam's {name} must be a finite number >= 0, got {value!r}")
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"Adam's betas must lie in [0, 1), got {betas!r}")
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), tuple(betas), float(eps), float(weight_decay)
        # Per parameter index, made on the parameter's first step with a gradient (as torch's).
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        for index, param in enumerate(self.params):
            grad = param.grad
            if grad is None:  # a parameter this step did not reach: no state, no move
                continue
            state = self.state.get(index)
            if state is None:
                state = self.state[index] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            state["step"] += 1
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = state["step"].item()
            step_size = self.lr / (1 - beta1**step)
            denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict:
        group = {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay,
                 "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                 "fused": None, "decoupled_weight_decay": False, "params": list(range(len(self.params)))}
        return {"state": {index: dict(state) for index, state in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Slots and step counts from a state_dict of this class or of torch.optim.Adam."""
        groups = state_dict["param_groups"]
        saved = [index for group in groups for index in group["params"]]
        if len(saved) != len(self.params):
            raise ValueError(f"the saved Adam state is for {len(saved)} parameters, this model has {len(self.params)}")
        if any(group.get("amsgrad") or group.get("maximize") for group in groups):
            raise ValueError("the saved Adam state uses amsgrad or maximize, which DenseAdam does not")
        state = {}
        for position, index in enumerate(saved):
            held = state_dict["state"].get(index)
            if held is None:
                continue
            param = self.params[position]
            step = held["step"]
            state[position] = {
                "step": (step if torch.is_tensor(step) else torch.tensor(float(step))).detach().to("cpu", torch.float32).clone(),
                "exp_avg": held["exp_avg"].detach().to(param.device, param.dtype).clone(),
                "exp_avg_sq": held["exp_avg_sq"].detach().to(param.device, param.dtype).clone(),
            }
            for name in ("exp_avg", "exp_avg_sq"):
                if state[position][name].shape != param.shape:
                    raise ValueError(f"the saved Adam {name} of parameter {position} has shape "
                                     f"{tuple(state[position][name].shape)}, the parameter {tuple(param.shape)}")
        self.state = state
