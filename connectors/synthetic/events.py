"""Impression and click streams from the planted model: data to try the sample join on.

Serving logs an impression when it shows an item, and the click, if any, comes later on
another stream (picasso.sample_join.join_state pairs them up). make_event_stream turns the planted
model's rows (picasso.connectors.synthetic.planted) into those two streams, and keeps what the streams hide:

- impressions: the spec's dense and sparse fields, without the label, plus `request_id`
  ("r" and 16 hex digits, unique within a seed) and `event_time_ms` (epoch ms), in event
  time order. Impression i falls at a uniformly drawn moment of its own 1/rate slot after
  `start_ms`, so the stream runs at the configured rate, with jitter, and stays in order;
- labels: one click (`request_id`, `event_time_ms`, the spec's label = 1) for each
  impression whose planted label is 1, `label_delay` after the impression (exponential
  with a mean of 5 minutes by default). A fixed fraction of clicks is sent twice, the copy
  1-5 seconds after the first, as at-least-once loggers do. Sorted by event time;
- truth: every impression's request id, time, planted label, true click probability and
  click delay, so that a benchmark can join offline and score against the true labels.

Some clicks come after any wait a join would choose. With the default exponential delay
(mean 5 min), a click comes more than 15 minutes after its impression with probability
e^-3, about 5%: a join that waits 15 minutes takes those impressions for negatives
(expected_late_share gives the share for any wait, truth the measured one).

Everything is a pure function of (spec, seed, stream): the features and labels come from
PlantedModel.sample(rows, stream), the times from a generator of their own seeded by
(seed, stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from picasso.kernels.hashing import splitmix64_array
from picasso.sample_join.join_rules import DELAY_COLUMN
from picasso.connectors.synthetic.event_config import EventStreamConfig  # re-exported: the settings, numpy-free
from picasso.connectors.synthetic.planted import PlantedModel

REQUEST_ID = "request_id"
EVENT_TIME = "event_time_ms"
PROBABILITY = "probability"  # truth: the planted model's click probability
DUPLICATED = "duplicated"  # truth: whether the impression's click was sent twice
# The trees of an events root, each a root of date=YYYY-MM-DD partitions: `picasso generate
# --events` writes them and `picasso produce` replays the first two.
IMPRESSIONS, LABELS, TRUTH = "impressions", "labels", "truth"
DUPLICATE_GAP_MS = (1_000, 5_000)  # a duplicate click comes this long after the first, at most
_MAX_ROWS = 2**32  # request ids are unique for up to this many impressions per stream


@dataclass(frozen=True)
class EventStream:
    impressions: pa.Table  # request_id, event_time_ms, dense fields, sparse fields
    labels: pa.Table  # request_id, event_time_ms, <spec label> (always 1)
    truth: pa.Table  # request_id, event_time_ms, <spec label>, probability, label_delay_ms (-1: no click), duplicated

    @property
    def clicks(self) -> int:
        return int(np.count_nonzero(self.truth.column(DELAY_COLUMN).to_numpy() >= 0))


def make_event_stream(planted: PlantedModel, rows: int, stream: int,
                      config: EventStreamConfig = EventStreamConfig()) -> EventStream:
    """`rows` impressions of stream number `stream` (a day, say), their clicks, and the truth."""
    if not 0 < rows <= _MAX_ROWS:
        raise ValueError(f"rows must lie in 1..{_MAX_ROWS}, got {rows}")
    label = planted.spec.label
    table, probabilities = planted.sample(rows, stream)
    clicked = table.column(label).to_numpy().astype(bool)
    rng = np.random.default_rng([planted.config.seed, 4, stream & 0xFFFF_FFFF])

    slots = np.arange(rows) + rng.random(rows)
    times = config.start_ms + np.floor(slots * (1000.0 / config.impressions_per_s)).astype(np.int64)
    ids = pa.array(request_ids(planted.config.seed, stream, rows))
    features = table.drop([label])
    impressions = pa.Table.from_arrays([ids, pa.array(times), *features.columns],
                                       names=[REQUEST_ID, EVENT_TIME, *features.column_names])

    positives = np.flatnonzero(clicked)
    delays = _draw_delays(rng, len(positives), config)
    duplicated = np.sort(rng.choice(len(positives), size=round(config.duplicate_fraction * len(positives)),
                                    replace=False))
    gaps = rng.integers(DUPLICATE_GAP_MS[0], DUPLICATE_GAP_MS[1] + 1, len(duplicated))
    click_rows = np.concatenate([positives, positives[duplicated]])
    click_times = np.concatenate([times[positives] + delays, times[positives[duplicated]] + delays[duplicated] + gaps])
    order = np.argsort(click_times, kind="stable")  # ties: the first click before its copy, by impression
    labels = pa.table({
        REQUEST_ID: ids.take(pa.array(click_rows[order])),
        EVENT_TIME: pa.array(click_times[order]),
        label: pa.array(np.ones(len(order), dtype=np.int64)),
    })

    delay_of = np.full(rows, -1, dtype=np.int64)
    delay_of[positives] = delays
    was_duplicated = np.zeros(rows, dtype=bool)
    was_duplicated[positives[duplicated]] = True
    truth = pa.table({
        REQUEST_ID: ids,
        EVENT_TIME: pa.array(times),
        label: table.column(label),
        PROBABILITY: pa.array(probabilities),
        DELAY_COLUMN: pa.array(delay_of),
        DUPLICATED: pa.array(was_duplicated),
    })
    return EventStream(impressions, labels, truth)


def request_ids(seed: int, stream: int, rows: int) -> list[str]:
    """ "r" + 16 hex digits for each row of a stream.

    splitmix64 is a bijection of 64-bit words, and (stream, row) fill distinct words, so no
    two impressions of one seed share an id, across streams too; random draws could.
    """
    words = (np.uint64(stream & 0xFFFF_FFFF) << np.uint64(32)) | np.arange(rows, dtype=np.uint64)
    salt = splitmix64_array(np.array([seed & 0xFFFF_FFFF_FFFF_FFFF], dtype=np.uint64))[0]
    return [f"r{value:016x}" for value in splitmix64_array(words ^ salt).tolist()]


def _draw_delays(rng: np.random.Generator, clicks: int, config: EventStreamConfig) -> np.ndarray:
    """Click delays in whole ms, at least 1: a click never shares its impression's instant."""
    mean = config.label_delay_mean_ms
    if config.label_delay == "exponential":
        drawn = rng.exponential(mean, clicks)
    elif config.label_delay == "uniform":
        drawn = rng.uniform(0, 2 * mean, clicks)
    else:
        drawn = np.full(clicks, float(mean))
    return np.maximum(1, np.ceil(drawn)).astype(np.int64)


def expected_late_share(config: EventStreamConfig, wait_ms: int) -> float:
    """The share of clicks that come more than wait_ms after their impression, in law."""
    mean = config.label_delay_mean_ms
    if config.label_delay == "exponential":
        return math.exp(-wait_ms / mean)
    if config.label_delay == "uniform":
        return max(0.0, 1 - wait_ms / (2 * mean))
    return 1.0 if mean > wait_ms else 0.0


def late_share(truth: pa.Table, wait_ms: int) -> float:
    """The share of a stream's clicks that came more than wait_ms after their impression."""
    delays = truth.column(DELAY_COLUMN).to_numpy()
    delays = delays[delays >= 0]
    return float((delays > wait_ms).mean()) if len(delays) else 0.0
