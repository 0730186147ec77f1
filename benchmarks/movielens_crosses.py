"""Feature crosses on MovieLens-100k (benchmarks.movielens): picasso with the crosses the
logistic regression may take, chosen on the validation days alone, against the tuned LR.

The candidates are the LR's own (movielens.CROSS_SETS: pairs of fields, each a cross of
PAIR_BUCKETS hash buckets in the spec's `crosses:` section), each feeding the wide part
alone or both parts (PARTS). Every candidate trains on the fit days and is scored on the
validation days, the mean of --seeds runs; the one with the best validation AUC is then
trained on every training day and scored once on the test days, beside the same runs
without crosses. The test days choose nothing.

These runs train on every training row, as the LR does (SAME_ROWS: `picasso daily
--holdout 0`); the defaults' rows of benchmarks.movielens hold 10% of each day out, as
`picasso daily` does by default to score each day.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from benchmarks.movielens import CROSS_SETS, DailySettings, Split, picasso_run
from picasso.spec import FeatureSpec, parse_spec
from picasso.trainer import EvalMetrics, TrainConfig

PAIR_BUCKETS = 50_000  # at least 5x the pairs' distinct values (item x age: 11,774)
PARTS = ("wide", "both")
DEEP_DIM = 16  # a cross's embedding where it also feeds the deep part: the fields' dim
SAME_ROWS = DailySettings(holdout_fraction=0.0)


def cross_spec(spec: FeatureSpec, pairs, part: str) -> FeatureSpec:
    """The spec with a cross per pair of fields, as a user writes it in `crosses:`."""
    crosses = [{"name": f"{a}_x_{b}", "fields": [a, b], "hash_buckets": PAIR_BUCKETS,
                **({"part": part, "embedding_dim": DEEP_DIM} if part != "wide" else {})} for a, b in pairs]
    return parse_spec({**spec.to_dict(), "crosses": crosses})


@dataclass(frozen=True)
class CrossChoice:
    crosses: str  # the name of the chosen set in CROSS_SETS
    part: str
    spec: FeatureSpec
    validation: list[EvalMetrics]  # the chosen candidate's runs, one per seed
    grid: dict[str, float]  # "crosses, part" -> mean validation AUC

    @property
    def label(self) -> str:
        return f"{self.crosses} ({self.part})"


def runs(root, spec: FeatureSpec, split: Split, seeds: int, on: str) -> list[EvalMetrics]:
    return [picasso_run(root, spec, split, TrainConfig(seed=seed, log_every=0), SAME_ROWS, on=on)
            for seed in range(seeds)]


def mean(metrics: list[EvalMetrics], key: str = "auc") -> float:
    return float(np.mean([getattr(m, key) for m in metrics]))


def choose_crosses(root, spec: FeatureSpec, split: Split, seeds: int) -> CrossChoice:
    """The candidate with the best mean validation AUC (fit days -> validation days)."""
    scored = {}
    for name, pairs in CROSS_SETS.items():
        for part in PARTS if pairs else ():
            crossed = cross_spec(spec, pairs, part)
            scored[(name, part)] = (crossed, runs(root, crossed, split, seeds, "validation"))
    (name, part), (crossed, best) = max(scored.items(), key=lambda kv: mean(kv[1][1]))
    return CrossChoice(name, part, crossed, best, {f"{n}, {p}": mean(r) for (n, p), (_, r) in scored.items()})


@dataclass(frozen=True)
class CrossResult:
    choice: CrossChoice
    validation_without: list[EvalMetrics]
    test_with: list[EvalMetrics]
    test_without: list[EvalMetrics]

    def metrics(self) -> dict:
        return {"crosses_chosen": self.choice.label, "crosses_validation_grid": self.choice.grid,
                "crosses_spec": self.choice.spec.to_dict()["crosses"],
                **{f"picasso_{key}": [vars(m) for m in value] for key, value in (
                    ("crosses_validation", self.choice.validation), ("no_crosses_validation", self.validation_without),
                    ("crosses_test", self.test_with), ("no_crosses_test", self.test_without))}}


def cross_benchmark(root, spec: FeatureSpec, split: Split, seeds: int) -> CrossResult:
    choice = choose_crosses(root, spec, split, seeds)
    return CrossResult(choice, runs(root, spec, split, seeds, "validation"), runs(root, choice.spec, split, seeds, "test"),
                       runs(root, spec, split, seeds, "test"))


def mean_metrics(metrics: list[EvalMetrics]) -> EvalMetrics:
    """The seeds' mean AUC, log loss and mean prediction, as one row of a table."""
    return replace(metrics[0], **{key: mean(metrics, key) for key in ("auc", "logloss", "mean_prediction")})
