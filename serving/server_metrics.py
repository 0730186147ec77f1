"""`picasso serve`'s Prometheus metrics: request latency by status, rows per request, the
requests in flight, the version served and its freshness, and swaps with their failures by kind. They go into a
registry the caller gives: the server's own /metrics, and --metrics-port's endpoint."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from picasso.serving.follower import Follower

# Seconds: from a 1-row request's millisecond to a 100,000-row one's seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ROW_BUCKETS = (1, 10, 100, 1_000, 10_000, 100_000)


class ServeMetrics:
    """What /invocations records (observe), and the follower's state, read at each scrape."""

    def __init__(self, follower: Follower, registry: CollectorRegistry):
        self.registry = registry
        self.latency = Histogram("picasso_serve_request_seconds", "time to answer a request to /invocations, by "
                                 "HTTP status", ["status"], buckets=LATENCY_BUCKETS, registry=registry)
        self.rows = Histogram("picasso_serve_request_rows", "rows per request scored", buckets=ROW_BUCKETS,
                              registry=registry)
        # What a SIGTERM waits for before the process exits.
        self.in_flight = Gauge("picasso_serve_requests_in_flight", "requests to /invocations received and not yet "
                               "answered", registry=registry)
        registry.register(_FollowerCollector(follower))

    def observe(self, status: int, seconds: float) -> None:
        self.latency.labels(status=str(status)).observe(seconds)

    def observe_rows(self, rows: int) -> None:
        self.rows.observe(rows)


class _FollowerCollector(Collector):
    def __init__(self, follower: Follower):
        self.follower = follower

    def collect(self) -> Iterator:
        served, record = self.follower.served, self.follower.record
        number = math.nan
        if served is not None:
            try:
                number = float(served.version)
            except ValueError:  # a pinned runs:/ model has no version number
                pass
        yield GaugeMetricFamily("picasso_serve_model_version", "the model version answering requests", value=number)
        if served is not None and served.newest_event_ms is not None:
            yield GaugeMetricFamily("picasso_serve_model_freshness_seconds",
                                    "now minus the event time of the newest event the served version trained on",
                                    value=time.time() - served.newest_event_ms / 1000)
        healthy, _ = self.follower.health()
        yield GaugeMetricFamily("picasso_serve_healthy", "1 while the served version is the one the alias points "
                                "at and the registry answers (what /health says)", value=float(healthy))
        swaps = CounterMetricFamily("picasso_serve_swaps", "versions loaded and served, the first one included, by how "
                                    "they loaded (full, delta)",
                                    labels=["how"])
        for how, count in sorted(record.swaps.items()):
            swaps.add_metric([how], count)
        yield swaps
        failures = CounterMetricFamily("picasso_serve_swap_failures", "versions that failed to load, by kind "
                                       "(registry, artifact, spec, model)", labels=["kind"])
        for kind, count in sorted(record.failures.items()):
            failures.add_metric([kind], count)
        yield failures
