"""The picasso counters of a finished Beam run (rows in, dead letters, ...)."""

from __future__ import annotations

from apache_beam.metrics.metric import MetricsFilter


def picasso_counters(result) -> dict[str, int]:
    """Committed totals of every counter in the "picasso" namespace, summed over steps."""
    counters = result.metrics().query(MetricsFilter().with_namespace("picasso"))["counters"]
    totals: dict[str, int] = {}
    for counter in counters:
        totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + counter.committed
    return totals
