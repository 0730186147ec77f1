"""Quality metrics for CTR: AUC (exact, ties averaged) and log loss."""

from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve via the rank-sum (Mann-Whitney) statistic.

    Tied scores share their average rank. NaN when only one class is present, or when a
    score is NaN (a model that diverged ranks nothing; np.unique would tie its NaNs into an
    AUC of 0.5, which the run-health gate would take for a model that learned nothing).
    """
    labels = np.asarray(labels, dtype=np.float64) > 0.5
    scores = np.asarray(scores, dtype=np.float64)
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0 or np.isnan(scores).any():
        return float("nan")
    distinct, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    first_rank = np.cumsum(counts) - counts + 1
    average_rank = first_rank + (counts - 1) / 2.0
    rank_sum = average_rank[inverse][labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def logloss(labels: np.ndarray, probabilities: np.ndarray, eps: float = 1e-7) -> float:
    labels = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probabilities, dtype=np.float64), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
