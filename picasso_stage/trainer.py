"""Trainer: PackedBatches in, model updates out. It knows nothing of Beam.

Local mode: one process. Embedding tables learn with a sparse optimizer fused into the
backward pass (row-wise Adagrad by default; only the rows a batch touched move); the
dense part learns with Adam.

A step has stages: prepare (PackedBatch to tensors; with the hot-row cache, de-duplicate
ids and gather the rows that are not hot), then install (refresh the cache when due, load
the gathered rows), compute (forward, backward with the fused sparse update, dense
optimizer step) and commit (write the batch's staged rows back). With interleaving on,
batch i+1 is made and prepared in a worker thread, on idle CPU time, while batch i computes.

Over 400 lines, as one class: the step's stages share the Trainer's state (the model, the
optimizers, the cache, the positions), and split across modules they would pass it all
around. Its contracts (EvalMetrics, StepResult, TrainStats) come first; TrainConfig, its
settings, is train_config.py's (torch-free, for the command line), re-exported here.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager, nullcontext
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from picasso import big_tier
from picasso.batch import PackedBatch, TorchBatch
from picasso.cache import HotCache, PreparedBatch
from picasso.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from picasso.dynamic_rows import RowResets
from picasso.embedding import PackedEmbedding
from picasso.interleave import StepPipeline, worth_interleaving
from picasso.metrics import auc, logloss
from picasso.packing import PackingPlan
from picasso.precision import say_precision
from picasso.spec import FeatureSpec, spec_differences
from picasso.train_config import TrainConfig, resolve_device  # re-exported: its contract, torch-free

log = logging.getLogger(__name__)

# source: pulling batches from train()'s iterator (decoding and packing, when it does them
# lazily); wait: the compute waiting for the next batch to be prepared (interleaving only).
STAGES = ("source", "prepare", "wait", "install", "compute", "commit", "refresh")


@dataclass(frozen=True)
class EvalMetrics:
    auc: float
    logloss: float
    samples: int
    mean_prediction: float
    mean_label: float
    positives: int = 0  # rows whose label counts as a click (> 0.5): AUC needs both classes

    @property
    def evaluable(self) -> bool:
        """Both classes were there: the AUC means something."""
        return 0 < self.positives < self.samples


@dataclass(frozen=True)
class StepResult:
    step: int  # the trainer's step count after it (unchanged by an empty batch)
    samples: int
    loss_sum: float  # summed per-sample log loss
    positions: dict[str, int]


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

    def add(self, result: "StepResult") -> None:
        self.steps += 1 if result.samples else 0
        self.samples += result.samples
        self.loss_sum += result.loss_sum
        self.positions = merge_positions(self.positions, result.positions)

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")


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
        say_precision(config.precision, config.model, *config._device_bf16())
        # With the cache's big tier on disk, the tables and slots are made as its files,
        # never whole in memory (big_tier).
        with big_tier.files_under(config.cache.big_tier_dir if config.cache else None):
            self.model = config.build_model(spec, self.plan)
            sparse = config.sparse_optimizer_settings()
            for module in self.model.modules():
                if isinstance(module, PackedEmbedding):
                    module.configure_optimizer(sparse)
        # Built before the move to the device: with a cache, the tables stay on the host
        # as its big tier and only the fast tier goes to the device.
        self.cache = HotCache(self.model.embeddings(), config.cache, self.device, config.seed) if config.cache else None
        self.model.to(self.device)
        if config.compile_dense:
            # Module.compile keeps state_dict keys (torch.compile(module) would prefix them).
            self.model.dense_part.compile()
        # Embedding tables are buffers stepped by their fused optimizer; Adam sees the rest.
        self.dense_optimizer = config.dense_optimizer_for(self.model.parameters())
        self.step = 0
        self.start_step = 0  # the step this trainer was built or restored at
        self.samples = 0
        self.positions: dict[str, int] = {}
        self.restored_from: str | None = None
        self.stage_seconds = dict.fromkeys(STAGES, 0.0)
        self._copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.interleaves = worth_interleaving(self.device) if config.interleave is None else config.interleave
        # Per-step metrics, one point per `log_every` steps (averaged over them), for the
        # run's charts: name -> [(step, value)].
        self.step_metrics: dict[str, list[tuple[int, float]]] = {}
        self._last_record: tuple[int, dict[str, float]] = (0, self._totals())

    # -- training ---------------------------------------------------------------------

    def train_step(self, batch: PackedBatch) -> float:
        """One optimizer step on one batch; returns the batch's summed log loss.

        An empty batch (every record of its chunk was refused) moves the source positions
        and nothing else.
        """
        return self._finish(self._begin(self._prepare(batch))).loss_sum

    def train_step_scored(self, batch: PackedBatch) -> tuple[float, np.ndarray]:
        """train_step, and the batch's click probabilities before it (a stream's test-then-
        train metrics). They are the step's own forward pass where that is predict's, score
        for score: no dropout, and no dynamic table (a step admits new keys, predict does
        not); else predict runs first, a second forward pass."""
        if not batch.num_samples:
            return self.train_step(batch), np.zeros(0, dtype=np.float32)
        if self.config.dropout or "dynamic_rows" in self.model._modules:
            scores = self.predict(batch)
            return self.train_step(batch), scores
        loss_sum = self.train_step(batch)
        return loss_sum, self.model.scores_before_update.cpu().numpy()

    def pipeline(self) -> StepPipeline:
        """Steps as a pipeline (picasso.interleave.StepPipeline): push(batch) starts a step
        and returns the StepResults of the steps that finished; drain() computes the last.
        With interleaving on, the next batch is prepared beside each step."""
        return StepPipeline(self._prepare, self._begin, self._finish, enabled=self.interleaves,
                            on_wait=self._waited)

    def _waited(self, seconds: float) -> None:
        self.stage_seconds["wait"] += seconds

    def train(self, batches: Iterable[PackedBatch]) -> TrainStats:
        stats = TrainStats()
        start = time.perf_counter()

        def account(results: list[StepResult]) -> None:
            for result in results:
                stats.add(result)
                if self.config.log_every and result.samples and result.step % self.config.log_every == 0:
                    elapsed = time.perf_counter() - start
                    log.info("step %d: loss %.4f, %.0f samples/s%s", result.step, stats.mean_loss,
                             stats.samples / elapsed, self._cache_progress())

        def timed(source: Iterable[PackedBatch]):
            """The batches, timing each pull (it may decode and pack, beside a step)."""
            source = iter(source)
            while True:
                pulled = time.perf_counter()
                batch = next(source, None)
                self.stage_seconds["source"] += time.perf_counter() - pulled
                if batch is None:
                    return
                yield batch

        with self.pipeline() as pipeline:
            for result in pipeline.run(timed(batches)):
                account([result])
        stats.seconds = time.perf_counter() - start
        return stats

    # -- the stages of a step ---------------------------------------------------------

    def _prepare(self, batch: PackedBatch) -> "_Step":
        start = time.perf_counter()
        host, resets = None, {}
        if batch.num_samples:
            # Dynamic fields' keys become rows here, once per batch and in batch order:
            # the maps change as they admit and evict.
            host, resets = self.model.resolve(batch.to_torch(), training=True)
        step = self._stage(_Step(batch, host, resets))
        self.stage_seconds["prepare"] += time.perf_counter() - start
        return step

    def _stage(self, step: "_Step", observe: bool = True) -> "_Step":
        """The step's tensors on the device; with a cache, its rows mapped and gathered
        (`observe`: count its lookups, once per batch)."""
        if step.host is None:
            return step
        # On a GPU the batch and its missing rows cross on their own stream, beside the
        # running step.
        with torch.cuda.stream(self._copy_stream) if self._copy_stream is not None else nullcontext():
            tensors = step.host
            if self.cache is not None:
                step.cached = self.cache.prepare(tensors, observe)
                tensors = step.cached.tensors
            step.tensors = tensors.to(self.device)
        return step

    def _begin(self, step: "_Step") -> "_Step":
        """Refresh the cache when due and load the batch's rows, then give the rows new
        keys took their first values; no prepare may run meanwhile, and the step before
        has finished."""
        if self.cache is not None and step.cached is not None:
            self._install(step)
        if step.resets:
            if self._copy_stream is not None:  # the step's ids crossed on the copy stream
                torch.cuda.current_stream(self.device).wait_stream(self._copy_stream)
            self.model.reset_new_rows(step.tensors.ids, step.resets)
        return step

    def _install(self, step: "_Step") -> None:
        if self.cache.refresh_due:
            start = time.perf_counter()
            self.cache.refresh()
            self.stage_seconds["refresh"] += time.perf_counter() - start
        if step.cached.epoch != self.cache.epoch:  # prepared against the mapping before a refresh
            self._stage(step, observe=False)  # its lookups are counted already
        start = time.perf_counter()
        if self._copy_stream is not None:  # the rows install copies arrived on the copy stream
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self._copy_stream)
            for group in step.cached.groups.values():
                for values in group.staged:
                    for value in values:
                        value.record_stream(current)  # not reused by the copy stream meanwhile
        self.cache.install(step.cached)
        self.stage_seconds["install"] += time.perf_counter() - start

    def _finish(self, step: "_Step") -> "StepResult":
        batch = step.batch
        self.positions = merge_positions(self.positions, batch.positions)
        if batch.num_samples == 0:
            return StepResult(self.step, 0, 0.0, batch.positions)
        start = time.perf_counter()
        tensors = step.tensors
        if self._copy_stream is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self._copy_stream)
            for tensor in (tensors.label, tensors.dense, *tensors.ids.values(), *tensors.offsets.values()):
                tensor.record_stream(compute)  # the copy stream must not reuse them while this runs
        self.dense_optimizer.zero_grad(set_to_none=True)
        loss_batch = self.config.loss_batch_size  # None: the batch's mean
        # Training mode before the lookup, whatever a caller did before (a predict, an
        # evaluate): in eval mode the lookup takes the path that steps no row, and only the
        # dense part would learn.
        self.model.train()
        # Also steps the embedding tables (with autograd on, even inside a caller's no_grad).
        with torch.enable_grad():
            loss_sum = self.model.backward(tensors, self.model.lookup(tensors), loss_batch)
        self.dense_optimizer.step()
        self.stage_seconds["compute"] += time.perf_counter() - start
        if step.cached is not None:
            start = time.perf_counter()
            self.cache.commit(step.cached)
            self.stage_seconds["commit"] += time.perf_counter() - start
        self.step += 1
        self.samples += batch.num_samples
        if self.step % (self.config.log_every or 100) == 0:
            self._record_step_metrics()
        return StepResult(self.step, batch.num_samples, loss_sum, batch.positions)

    def _totals(self) -> dict[str, float]:
        totals = {f"{stage}_s": seconds for stage, seconds in self.stage_seconds.items()}
        if self.cache is not None:
            stats = self.cache.stats
            totals.update(lookups=stats.lookups, hits=stats.hits, rows_moved=stats.rows_moved,
                          bytes_moved=stats.bytes_moved)
        return totals

    def step_metrics_so_far(self) -> dict[str, list[tuple[int, float]]]:
        """The per-step series, with a last point for the steps since the last full interval."""
        if self.step > self._last_record[0]:
            self._record_step_metrics()
        return self.step_metrics

    def _record_step_metrics(self) -> None:
        last_step, last = self._last_record
        steps = self.step - last_step
        if steps <= 0:  # restored to an earlier step
            self._last_record = (self.step, self._totals())
            return
        now = self._totals()
        delta = {name: now[name] - last.get(name, 0.0) for name in now}
        points = {f"{stage}_s_per_step": delta[f"{stage}_s"] / steps for stage in STAGES}
        if self.cache is not None:
            points["cache_hit_rate"] = delta["hits"] / delta["lookups"] if delta["lookups"] else float("nan")
            points["cache_rows_moved_per_step"] = delta["rows_moved"] / steps
            points["cache_bytes_moved_per_step"] = delta["bytes_moved"] / steps
        for name, value in points.items():
            self.step_metrics.setdefault(name, []).append((self.step, value))
        self._last_record = (self.step, now)

    def _cache_progress(self) -> str:
        if self.cache is None:
            return ""
        stats = self.cache.stats
        return f", cache hit rate {stats.hit_rate:.3f}, {stats.rows_moved / max(stats.steps, 1):.0f} rows moved/step"

    def performance_metrics(self) -> dict[str, float]:
        """Per-step stage times (seconds) and, with a cache, its counts since it was built."""
        steps = max(self.step - self.start_step, 1)
        metrics = {f"{stage}_s_per_step": seconds / steps for stage, seconds in self.stage_seconds.items()}
        if self.cache is not None:
            metrics.update({f"cache_{name}": value for name, value in self.cache.stats.as_metrics().items()})
        if "dynamic_rows" in self.model._modules:
            metrics.update(self.model.dynamic_rows.metrics())
        return metrics

    # -- inference --------------------------------------------------------------------

    @torch.no_grad()
    def predict(self, batch: PackedBatch) -> np.ndarray:
        """Click probabilities of the batch's samples. Changes nothing a training step reads:
        the model is left in the mode it was found in, no dynamic key is admitted, and the
        cache stages the batch's rows apart from a training batch's (HotCache.install)."""
        with evaluating(self.model):
            tensors = self.model.resolve(batch.to_torch())[0]
            if self.cache is not None and batch.num_samples:
                prepared = self.cache.prepare(tensors, observe=False)
                self.cache.install(prepared, training=False)
                tensors = prepared.tensors
            return torch.sigmoid(self.model(tensors.to(self.device))).cpu().numpy()

    def evaluate(self, batches: Iterable[PackedBatch]) -> EvalMetrics:
        labels, scores = [], []
        for batch in batches:
            labels.append(batch.data.column("label").to_numpy())
            scores.append(self.predict(batch))
        return evaluation_metrics(np.concatenate(labels or [np.zeros(0)]), np.concatenate(scores or [np.zeros(0)]))

    # -- checkpoints ------------------------------------------------------------------

    def state(self) -> dict:
        if self.cache is not None:
            self.cache.flush()  # the tables alone then hold every row's latest value
        state = {
            "step": self.step,
            "samples": self.samples,
            "model": self.model.state_dict(),  # tables with their optimizer slots
            "dense_optimizer": self.dense_optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "config": asdict(self.config),
        }
        if self.cache is not None:
            state["cache"] = self.cache.state_dict()
        return state

    def save_checkpoint(self, root: str | Path, metrics: dict | None = None, extra: dict[str, bytes] | None = None) -> str:
        path = save_checkpoint(root, self.state(), self.spec, self.positions, metrics or {}, extra=extra)
        if "dynamic_rows" in self.model._modules:  # its counts are per checkpoint: per version
            self.model.dynamic_rows.reset_stats()
        return path

    def restore(self, path: str | Path) -> None:
        checkpoint = load_checkpoint(path)
        if checkpoint.spec != self.spec:
            raise ValueError(f"checkpoint {path} was trained on another spec than this run's "
                             f"({spec_differences(checkpoint.spec, self.spec)})")
        state = checkpoint.state
        self._check_architecture(path, state.get("config", {}))
        self.model.load_state_dict(state["model"])  # copies into the tables (the big tier, with a cache)
        if self.cache is not None:
            if "cache" in state:
                self.cache.load_state_dict(state["cache"])
            else:  # a checkpoint saved without a cache: keep the hot set, re-read its rows
                self.cache.reload()
        self.dense_optimizer.load_state_dict(state["dense_optimizer"])
        torch.set_rng_state(state["rng"])
        self.step, self.samples = int(state["step"]), int(state["samples"])
        self.start_step = self.step
        self.positions = dict(checkpoint.positions)
        self.restored_from = str(path)

    def _check_architecture(self, path, saved: dict) -> None:
        """Refuse, by flag, a checkpoint of another model or other MLP sizes: its weights
        have other shapes (torch would say only which tensors differ). The other settings
        (learning rates, regularisation, the cache) may change from one run to the next."""
        differ = []
        if "model" in saved and saved["model"] != self.config.model:
            differ.append(f"--model {saved['model']} (this run: {self.config.model})")
        if "hidden" in saved and tuple(saved["hidden"]) != tuple(self.config.hidden):
            differ.append(f"--hidden {','.join(map(str, saved['hidden']))} "
                          f"(this run: {','.join(map(str, self.config.hidden))})")
        if differ:
            raise ValueError(f"checkpoint {path} was trained with {' and '.join(differ)}: train on with its "
                             "settings, or start another model (--warm-start none, or another workdir)")

    def warm_start(self, root: str | Path) -> str | None:
        """Restore the latest checkpoint under root, if there is one."""
        latest = latest_checkpoint(root)
        if latest is not None:
            self.restore(latest)
            log.info("warm start from %s (step %d)", latest, self.step)
        return latest


@dataclass
class _Step:
    """A batch on its way through the stages of a step."""

    batch: PackedBatch
    host: TorchBatch | None  # the batch's tensors, dynamic keys mapped to rows; None when empty
    resets: dict[str, RowResets]  # the rows new keys took (dynamic_rows)
    tensors: TorchBatch | None = None  # on the device; ids are fast-tier indices with a cache
    cached: PreparedBatch | None = None


@contextmanager
def evaluating(model: torch.nn.Module):
    """The model in eval mode within, and back in the mode it was found in after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def evaluation_metrics(labels: np.ndarray, scores: np.ndarray) -> EvalMetrics:
    return EvalMetrics(
        auc=auc(labels, scores),
        logloss=logloss(labels, scores) if labels.size else float("nan"),
        samples=int(labels.size),
        mean_prediction=float(scores.mean()) if scores.size else float("nan"),
        mean_label=float(labels.mean()) if labels.size else float("nan"),
        positives=int((labels > 0.5).sum()),
    )
