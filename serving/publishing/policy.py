"""When a registered version becomes the champion, and how hard publishing tries.

Every version gets the alias `candidate`. It is promoted to `champion` when its AUC is at
least the champion's AUC minus epsilon (a small epsilon lets a fresher model through
when it is as good as the old one up to noise). A version that is not promoted says why
in its `picasso.promotion_reason` tag.

AUCs are compared only when both were measured the same way (a holdout slice of the
training partition, a later partition, or a stream's progressive validation): a model
scores lower on the future than on a slice of its own period, so a version scored on the
next partition would lose to a champion scored on a holdout for no fault of its own. When
the ways differ, the newer version is promoted, as when the champion has no AUC at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from picasso.connectors.retry import RetryPolicy

CANDIDATE, CHAMPION = "candidate", "champion"


@dataclass(frozen=True)
class PublishPolicy:
    promote_epsilon: float = 0.005
    auto_promote: bool = True
    deltas: bool = True  # store each version's changed rows against the previous version
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Each HTTP request to MLflow: its timeout, and MLflow's own retries of it. Ours (retry)
    # wrap the whole publish; MLflow's default (7 retries, backoff factor 2) would hang for
    # minutes on a server that is down.
    http_timeout_s: float = 120.0
    http_retries: int = 1

    def __post_init__(self):
        if not math.isfinite(self.promote_epsilon) or self.promote_epsilon < 0:
            raise ValueError(f"promote epsilon must be a finite number >= 0, got {self.promote_epsilon}")
        if self.http_timeout_s <= 0 or self.http_retries < 0:
            raise ValueError("http timeout must be > 0 and http retries >= 0")


@dataclass(frozen=True)
class Promotion:
    promote: bool
    reason: str


def evaluation_kind(evaluation: str) -> str:
    """The way an AUC was measured, without the partition: "day=2026-11-02" -> "day"."""
    return evaluation.partition("=")[0]


def decide_promotion(auc: float, champion_auc: float | None, champion_version: str | None,
                     policy: PublishPolicy, evaluation: str | None = None,
                     champion_evaluation: str | None = None) -> Promotion:
    """evaluation, champion_evaluation: how each AUC was measured (the picasso.evaluation
    tag); None for a version that does not say, whose AUC is compared as it is."""
    if not policy.auto_promote:
        return Promotion(False, "auto-promotion is off")
    if auc is None or not math.isfinite(auc):
        return Promotion(False, f"no AUC to judge the version by (auc={auc})")
    if champion_version is None:
        return Promotion(True, "no champion yet")
    if champion_auc is None or not math.isfinite(champion_auc):
        return Promotion(True, f"champion version {champion_version} has no AUC")
    if evaluation and champion_evaluation and evaluation_kind(evaluation) != evaluation_kind(champion_evaluation):
        return Promotion(True, f"champion v{champion_version} was scored on {champion_evaluation} and this version "
                               f"on {evaluation}: AUCs measured differently are not compared, the newer is promoted")
    bar = champion_auc - policy.promote_epsilon
    if auc >= bar:
        return Promotion(True, f"auc {auc:.5f} >= champion v{champion_version} auc {champion_auc:.5f} "
                               f"- epsilon {policy.promote_epsilon}")
    return Promotion(False, f"auc {auc:.5f} < champion v{champion_version} auc {champion_auc:.5f} "
                            f"- epsilon {policy.promote_epsilon}")
