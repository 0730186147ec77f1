"""Row-wise Adagrad for sparse gradients, in plain torch: what a PyTorch user writes to
give one nn.EmbeddingBag per field the optimizer TorchRec and picasso run by default.

torch.optim has no row-wise Adagrad. Per touched row r with gradient g (dim values):
state[r] += mean(g * g); row -= lr * g / (sqrt(state[r]) + eps). The same arithmetic as
FBGEMM's EXACT_ROWWISE_ADAGRAD and picasso's "adagrad" (kernels/reference.py).
"""

from __future__ import annotations

import torch


class SparseRowWiseAdagrad(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 0.05, eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "sum" not in state:
                    state["sum"] = torch.zeros(param.shape[0], dtype=param.dtype, device=param.device)
                # An EmbeddingBag's sparse gradient repeats a row once per occurrence.
                grad = param.grad.coalesce()
                rows, values = grad.indices()[0], grad.values()
                square = state["sum"].index_add_(0, rows, values.square().mean(1)).index_select(0, rows)
                rate = group["lr"] / (square.sqrt_().add_(group["eps"]))
                param.index_add_(0, rows, values * rate.neg_().unsqueeze(1))
        return None
