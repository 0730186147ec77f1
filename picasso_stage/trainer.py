"""Trainer: PackedBatches in, model updates out. It knows nothing of Beam.

Local mode: one process. Embedding tables learn with a sparse optimizer fused into the
backward pass (row-wise Adagrad by default; only the rows a batch touched move); the
dense part learns with Adam.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from picasso.batch import PackedBatch
from picasso.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from picasso.embedding import PackedEmbedding
from picasso.kernels import SparseOptimizer
from picasso.metrics import auc, logloss
from picasso.models import build_model
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class TrainConfig:
    model: str = "wide_deep"
    hidden: tuple[int, ...] = (256, 128)
    lr_dense: float = 1e-3  # Adam
    lr_sparse: float = 0.05  # the sparse optimizer's, on embedding rows
    sparse_optimizer: str = "adagrad"  # row-wise adagrad, lazy adam or sgd; fields may override
    seed: int = 0
    log_every: int = 100  # steps between progress lines
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu
    # torch.compile the dense part (interaction + MLP). Off by default: on CPU it saved
    # 1-11% of the dense part's step (benchmarks.dense_compile) for 8-28 s of compiling.
    compile_dense: bool = False


@dataclass(frozen=True)
class EvalMetrics:
    auc: float
    logloss: float
    samples: int
    mean_prediction: float
    mean_label: float


@dataclass
class TrainStats:
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0  # sum of per-sample losses
    seconds: float = 0.0
    positions: dict[str, int] = field(default_factory=dict)

    def merge(self, other: "TrainStats") -> "TrainStats":
        return TrainStats(
            steps=self.steps + other.steps,
            samples=self.samples + other.samples,
            loss_sum=self.loss_sum + other.loss_sum,
            seconds=self.seconds + other.seconds,
            positions=merge_positions(self.positions, other.positions),
        )

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def merge_positions(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Positions are 'next row/offset to read' per source: the furthest one wins."""
    merged = dict(a)
    for source, position in b.items():
        merged[source] = max(position, merged.get(source, position))
    return merged


class Trainer:
    def __init__(self, spec: FeatureSpec, config: TrainConfig = TrainConfig()):
        self.spec = spec
        self.config = config
        self.plan = PackingPlan.from_spec(spec)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device)
        self.model = build_model(config.model, spec, self.plan, config.hidden)
        sparse = SparseOptimizer(config.sparse_optimizer, lr=config.lr_sparse)
        for module in self.model.modules():
            if isinstance(module, PackedEmbedding):
                module.configure_optimizer(sparse)
        self.model.to(self.device)
        if config.compile_dense:
            # Module.compile keeps state_dict keys (torch.compile(module) would prefix them).
            self.model.dense_part.compile()
        # Embedding tables are buffers stepped by their fused optimizer; Adam sees the rest.
        self.dense_optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr_dense)
        self.step = 0
        self.start_step = 0  # the step this trainer was built or restored at
        self.samples = 0
        self.positions: dict[str, int] = {}
        self.restored_from: Path | None = None

    # -- training ---------------------------------------------------------------------

    def train_step(self, batch: PackedBatch) -> float:
        """One optimizer step on one batch; returns the batch's summed log loss.

        An empty batch (every record of its chunk was refused) moves the source positions
        and nothing else.
        """
        self.positions = merge_positions(self.positions, batch.positions)
        if batch.num_samples == 0:
            return 0.0
        tensors = batch.to_torch().to(self.device)
        self.model.train()
        logits = self.model(tensors)
        loss = F.binary_cross_entropy_with_logits(logits, tensors.label, reduction="mean")
        self.dense_optimizer.zero_grad(set_to_none=True)
        loss.backward()  # also steps the embedding tables
        self.dense_optimizer.step()
        self.step += 1
        self.samples += batch.num_samples
        return float(loss.detach()) * batch.num_samples

    def train(self, batches: Iterable[PackedBatch]) -> TrainStats:
        stats = TrainStats()
        start = time.perf_counter()
        for batch in batches:
            stats.loss_sum += self.train_step(batch)
            stats.steps += 1 if batch.num_samples else 0
            stats.samples += batch.num_samples
            stats.positions = merge_positions(stats.positions, batch.positions)
            if self.config.log_every and self.step % self.config.log_every == 0:
                elapsed = time.perf_counter() - start
                log.info("step %d: loss %.4f, %.0f samples/s", self.step, stats.mean_loss, stats.samples / elapsed)
        stats.seconds = time.perf_counter() - start
        return stats

    # -- inference --------------------------------------------------------------------

    @torch.no_grad()
    def predict(self, batch: PackedBatch) -> np.ndarray:
        self.model.eval()
        return torch.sigmoid(self.model(batch.to_torch().to(self.device))).cpu().numpy()

    def evaluate(self, batches: Iterable[PackedBatch]) -> EvalMetrics:
        labels, scores = [], []
        for batch in batches:
            labels.append(batch.data.column("label").to_numpy())
            scores.append(self.predict(batch))
        return evaluation_metrics(np.concatenate(labels or [np.zeros(0)]), np.concatenate(scores or [np.zeros(0)]))

    # -- checkpoints ------------------------------------------------------------------

    def state(self) -> dict:
        return {
            "step": self.step,
            "samples": self.samples,
            "model": self.model.state_dict(),  # tables with their optimizer slots
            "dense_optimizer": self.dense_optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "config": asdict(self.config),
        }

    def save_checkpoint(self, root: str | Path, metrics: dict | None = None) -> Path:
        return save_checkpoint(root, self.state(), self.spec, self.positions, metrics or {})

    def restore(self, path: str | Path) -> None:
        checkpoint = load_checkpoint(path)
        if checkpoint.spec != self.spec:
            raise ValueError(f"checkpoint {path} was trained on another spec ({checkpoint.spec.name})")
        state = checkpoint.state
        self.model.load_state_dict(state["model"])
        self.dense_optimizer.load_state_dict(state["dense_optimizer"])
        torch.set_rng_state(state["rng"])
        self.step, self.samples = int(state["step"]), int(state["samples"])
        self.start_step = self.step
        self.positions = dict(checkpoint.positions)
        self.restored_from = Path(path)

    def warm_start(self, root: str | Path) -> Path | None:
        """Restore the latest checkpoint under root, if there is one."""
        latest = latest_checkpoint(root)
        if latest is not None:
            self.restore(latest)
            log.info("warm start from %s (step %d)", latest, self.step)
        return latest


def evaluation_metrics(labels: np.ndarray, scores: np.ndarray) -> EvalMetrics:
    return EvalMetrics(
        auc=auc(labels, scores),
        logloss=logloss(labels, scores) if labels.size else float("nan"),
        samples=int(labels.size),
        mean_prediction=float(scores.mean()) if scores.size else float("nan"),
        mean_label=float(labels.mean()) if labels.size else float("nan"),
    )
