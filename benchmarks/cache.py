"""Hot-row cache: hit rate against oracles, and exactness on a table 10x its fast tier.

Hit rate. One packed table of --rows rows; each step looks up --lookups Zipf(alpha) ids
(ranks shuffled over the rows, so hot rows are scattered). The cache runs as training
runs it: a HotRowDirectory sees each step's unique ids and counts, and refreshes every
100 steps (every step while slots are free), from a cold start.
- Static streams, alpha in {0.8, 1.05, 1.2}, capacity 1%, 5%, 20% of the rows: the oracle
  caches the true top-K ranks from the first step. Ratio `hit_vs_oracle@ALPHA,CAP%` is the
  cache's hits over the oracle's, over the whole run, warm-up included.
- Drift (alpha 1.05, capacity 5%): every 1,000 steps 10% of the hot set (the top ranks
  that fill the capacity) is replaced by new rows never seen before. The oracle caches the
  top-K rows by their true counts over the last 1,000 steps, recomputed every 100 steps.
  Ratio `hit_vs_oracle@drift`.

Exactness. Wide&Deep on the Criteo-shaped spec with a fast tier of 10% of every table's
rows and the big tier memory-mapped from files, against the same training without a
cache: metric `max_abs_diff_10x` over every table and slot (must be <= 1e-6).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace

import numpy as np
import torch

from benchmarks.harness import parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import builtin_spec
from picasso.cache import CacheConfig
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso import kernels
from picasso.hot_rows import HotRowDirectory
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer

ALPHAS = (0.8, 1.05, 1.2)
CAPACITIES = (0.01, 0.05, 0.20)
DRIFT_EVERY = 1000
DRIFT_SHARE = 0.10
ORACLE_WINDOW = 1000
ORACLE_EVERY = 100


class ZipfStream:
    """Ids by rank: rank r (from 0) has probability ∝ (r + 1)^-alpha; ranks map to rows."""

    def __init__(self, rows: int, ranks: int, alpha: float, seed: int):
        self.rng = np.random.default_rng(seed)
        weights = np.arange(1, ranks + 1, dtype=np.float64) ** -alpha
        self.cdf = np.cumsum(weights / weights.sum())
        self.row_of_rank = self.rng.permutation(rows)[:ranks]
        self.unused_rows = self.rng.permutation(np.setdiff1d(np.arange(rows), self.row_of_rank))

    def ranks(self, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(self.cdf, self.rng.random(n)), self.cdf.size - 1)

    def replace_hot(self, hot: int, share: float) -> None:
        """New items: `share` of the top `hot` ranks get rows never used before."""
        chosen = self.rng.choice(hot, int(hot * share), replace=False)
        self.row_of_rank[chosen], self.unused_rows = self.unused_rows[: chosen.size], self.unused_rows[chosen.size:]


def cache_hits(directory: HotRowDirectory, ids: torch.Tensor) -> int:
    """One training step as the cache sees it (HotCache.prepare, then Trainer._begin):
    count the batch's ids, refresh if due, and serve the batch from the mapping then."""
    _, miss_rows, miss_counts, hit_slots, hit_counts = kernels.map_to_slots(ids, directory.slot_of_row, 0)
    directory.observe(miss_rows, miss_counts, hit_slots, hit_counts)
    if directory.refresh_due:
        directory.plan_refresh()
        _, _, _, _, hit_counts = kernels.map_to_slots(ids, directory.slot_of_row, 0)
    return int(hit_counts.sum())


def static_hit_ratio(rows: int, lookups: int, steps: int, alpha: float, share: float, seed: int) -> tuple[float, float]:
    capacity = int(rows * share)
    stream = ZipfStream(rows, rows, alpha, seed)
    directory = HotRowDirectory(rows, capacity, seed=seed)
    ours = oracle = 0
    for _ in range(steps):
        ranks = stream.ranks(lookups)
        oracle += int((ranks < capacity).sum())  # the true top-K are the first K ranks
        ours += cache_hits(directory, torch.from_numpy(stream.row_of_rank[ranks]))
    return ours / (steps * lookups), oracle / (steps * lookups)


def drift_hit_ratio(rows: int, lookups: int, steps: int, share: float, seed: int) -> tuple[float, float]:
    capacity = int(rows * share)
    # Half the rows are ranked at a time; the rest are the new items still to arrive.
    stream = ZipfStream(rows, rows // 2, 1.05, seed)
    directory = HotRowDirectory(rows, capacity, seed=seed)
    window = np.zeros(rows, dtype=np.int64)  # true counts over the last ORACLE_WINDOW steps
    history: list[np.ndarray] = []
    oracle_cached = np.zeros(rows, dtype=bool)
    ours = oracle = 0
    for step in range(steps):
        if step and step % DRIFT_EVERY == 0:
            stream.replace_hot(capacity, DRIFT_SHARE)
        if step % ORACLE_EVERY == 0 and step:
            oracle_cached[:] = False
            oracle_cached[np.argpartition(-window, capacity)[:capacity]] = True
        ids = stream.row_of_rank[stream.ranks(lookups)]
        oracle += int(oracle_cached[ids].sum())
        ours += cache_hits(directory, torch.from_numpy(ids))
        np.add.at(window, ids, 1)
        history.append(ids)
        if len(history) > ORACLE_WINDOW:
            np.subtract.at(window, history.pop(0), 1)
    return ours / (steps * lookups), oracle / (steps * lookups)


def exactness_on_big_table(rows: int) -> tuple[float, float, dict]:
    """Max |cached - uncached| over every table and slot, after training through refreshes."""
    spec = builtin_spec("criteo")
    plan = PackingPlan.from_spec(spec)
    table, _ = PlantedModel(spec).sample(rows, stream=0)
    decoder = RecordDecoder(spec)
    batches = [pack(decoder.decode_table(b, "bench").table, spec, plan) for b in table.to_batches(max_chunksize=1024)]
    config = TrainConfig(hidden=(256, 128), log_every=0, device="cpu")
    plain = Trainer(spec, replace(config, interleave=False))
    plain.train(batches)
    with tempfile.TemporaryDirectory() as big_tier:
        cached = Trainer(spec, replace(config, cache=CacheConfig(capacity="10%", refresh_every=20, big_tier_dir=big_tier)))
        start = time.perf_counter()
        cached.train(batches)
        seconds = time.perf_counter() - start
        reference, state = plain.model.state_dict(), cached.state()["model"]
        worst = max(float((reference[k].float() - state[k].float()).abs().max()) for k in reference if reference[k].numel())
        return worst, rows / seconds, cached.cache.stats.as_metrics()


def main() -> None:
    def extra(parser):
        parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the table")
        parser.add_argument("--lookups", type=int, default=8192, help="ids looked up per step")
        parser.add_argument("--steps", type=int, default=2000, help="steps per static stream")
        parser.add_argument("--drift-steps", type=int, default=4000)
        parser.add_argument("--train-rows", type=int, default=102_400, help="training rows for the exactness run")

    # --smoke: a small table and few steps; the drift run still sees one drift (after 1,000 steps).
    args = parse_args(__doc__.splitlines()[0], extra, smoke={"rows": 20_000, "lookups": 512, "steps": 100,
                                                                "drift_steps": 1_100, "train_rows": 4096})
    ratios, metrics, rows = {}, {}, []
    for alpha in ALPHAS:
        for share in CAPACITIES:
            ours, oracle = static_hit_ratio(args.rows, args.lookups, args.steps, alpha, share, seed=int(alpha * 100))
            key = f"{alpha},{share * 100:g}%"
            ratios[f"hit_vs_oracle@{key}"] = ours / oracle
            metrics[f"hit_rate@{key}"], metrics[f"oracle_hit_rate@{key}"] = ours, oracle
            rows.append([f"zipf {alpha}", f"{share * 100:g}%", f"{ours:.4f}", f"{oracle:.4f}", f"{ours / oracle:.3f}"])
    ours, oracle = drift_hit_ratio(args.rows, args.lookups, args.drift_steps, 0.05, seed=7)
    ratios["hit_vs_oracle@drift"] = ours / oracle
    metrics["hit_rate@drift"], metrics["oracle_hit_rate@drift"] = ours, oracle
    rows.append(["drift, zipf 1.05", "5%", f"{ours:.4f}", f"{oracle:.4f}", f"{ours / oracle:.3f}"])

    worst, samples_per_s, stats = exactness_on_big_table(args.train_rows)
    metrics.update({"max_abs_diff_10x": worst, "cached_samples_per_s_10x": samples_per_s,
                    **{f"cache_{k}_10x": v for k, v in stats.items()}})
    rows.append(["train, criteo, 10x table", "10%", f"{stats['hit_rate']:.4f}", "", f"max |diff| {worst:.1e}"])
    report("cache", ["stream", "capacity", "cache hit rate", "oracle hit rate", "ratio"], rows, ratios, metrics,
           args.json)


if __name__ == "__main__":
    main()
