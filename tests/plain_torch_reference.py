"""A reference for the learning test that owes nothing to picasso's training code: plain
PyTorch (benchmarks.train_rivals.PlainRival, the plain rival of benchmarks.train) on the
rows the modes train, in their order, in batches of the same size, with the same model,
initial weights, optimizers and learning rates.

What it shares with picasso, and why that is fair: the model's initial weights and its
dense part (deep-copied from a picasso model of the same seed, as the benchmark does:
the same model, from the same start), and RecordDecoder for ids (validation and hashing
say which row a token reads; the test is of training). What it does not share: the
lookup (one nn.EmbeddingBag per field and part), the backward, the optimizer steps and
the loop.

The optimizers are the modes' own arithmetic, written in torch: torch.optim.Adam on the
dense part, and on the embeddings row-wise Adagrad (picasso's default, FBGEMM's
EXACT_ROWWISE_ADAGRAD: one accumulator per row, s += mean(g^2), w -= lr * g / (sqrt(s) +
eps)), which torch.optim has no class for, so RowwiseAdagrad below is it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch
from learning_helpers import BATCH, HIDDEN, LR_DENSE, LR_SPARSE, held_out_rows

from benchmarks.train_rivals import EPS, PlainRival
from picasso.spec import FeatureSpec
from picasso.trainer import TrainConfig, Trainer


class RowwiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over the sparse gradients of nn.EmbeddingBag(sparse=True): a row's
    gradient is summed over its occurrences in the batch (coalesce), then one accumulator
    per row takes the mean of its squares."""

    def __init__(self, params, lr: float, eps: float = EPS):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for weight in group["params"]:
                if weight.grad is None:
                    continue
                grad = weight.grad.coalesce()
                rows, values = grad.indices()[0], grad.values()
                state = self.state[weight]
                if "sum" not in state:
                    state["sum"] = torch.zeros(weight.shape[0])
                total = state["sum"][rows] + values.pow(2).mean(dim=1)
                state["sum"][rows] = total
                weight[rows] -= group["lr"] * values / (total.sqrt().unsqueeze(1) + group["eps"])


def plain_torch(spec: FeatureSpec, rows: pa.Table, batch: int = BATCH, precision: str = "auto") -> PlainRival:
    """PlainRival trained once over `rows`, in order, `batch` rows a step, in `precision`
    (auto: what picasso's modes take on this machine by default)."""
    template = Trainer(spec, TrainConfig(hidden=HIDDEN, device="cpu", precision=precision)).model  # the modes' weights
    rival = PlainRival(spec, template, template.precision)
    sparse = [weight for bags in rival.model.parts for weight in bags.parameters()]
    rival.optimizers = [RowwiseAdagrad(sparse, lr=LR_SPARSE), torch.optim.Adam(rival.dense_part.parameters(),
                                                                                lr=LR_DENSE)]
    trained = rival.train(rows.combine_chunks().to_batches(max_chunksize=batch))
    assert trained == rows.num_rows, (trained, rows.num_rows)
    return rival


def plain_torch_predictions(spec: FeatureSpec, rows: pa.Table, precision: str = "auto") -> np.ndarray:
    """Plain PyTorch trained on `rows`: its click probability of each held-out row."""
    held_out, _ = held_out_rows(spec)
    return plain_torch(spec, rows, precision=precision).predict(held_out)
