"""JoinLabels, the join's host on a streaming runner, against the core it hosts (JoinState).

Each test drives JoinLabels with TestStream under the DirectRunner in streaming mode: in
each step the impressions, then the labels, then a watermark. The core gets the same
steps, one advance() each, and both must emit the same samples (every column), the same
orphan labels and the same counts.

The streams keep to what the two hosts agree on by design. The core decides the timeouts
of a call after all its events; Beam decides the moment the watermark passes. So an
impression that arrives already past its timeout (time + W behind the watermark) would be
a negative at once in Beam but could still be joined by a label of the same call in the
core: the streams here bring every impression before its timeout.
"""

from dataclasses import asdict, astuple, dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.worker import statesampler
from apache_beam.testing import test_stream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from picasso.pipelines.runs.counters import picasso_counters
from picasso.pipelines.transforms.join_labels import IMPRESSIONS, LABELS, ORPHANS, SAMPLES, JoinLabels
from picasso.sample_join.join_rules import Impressions, JoinCounts, JoinPolicy, Labels
from picasso.sample_join.join_state import JoinState, sample_schema

from test_sample_join import labels

# Nulls, float32 values that a float64 would print otherwise, and lists: the rows must
# come back exactly.
SCHEMA = pa.schema([pa.field("label", pa.float32()), pa.field("x", pa.float32()), pa.field("n", pa.int64()),
                    pa.field("ids", pa.list_(pa.int64()))])
THE_END = 10**9  # a last watermark past every deadline, before TestStream's own end


@pytest.fixture(autouse=True)
def every_bundle_counted(monkeypatch):
    """Beam 2.77's BundleBasedDirectRunner loses the counts of every bundle of a transform
    but its first: it makes a MetricsContainer per bundle, but its state sampler hands back
    the ScopedState it cached at the first bundle, with the first bundle's container (and
    that one is committed only once). Without the cache each bundle counts into its own."""
    cached = statesampler.StateSampler.scoped_state

    def scoped_state(self, name_context, state_name, io_target=None, metrics_container=None):
        if metrics_container is not None:
            self._states_by_name.clear()
        return cached(self, name_context, state_name, io_target, metrics_container)

    monkeypatch.setattr(statesampler.StateSampler, "scoped_state", scoped_state)


@dataclass
class Step:
    impressions: Impressions | None = None
    labels: Labels | None = None
    watermark: int = 0  # ms; strictly rising from step to step


def impressions(keys, times) -> Impressions:
    keys = [int(k) for k in keys]
    rows = pa.table({
        "label": pa.array(np.zeros(len(keys), np.float32)),
        "x": pa.array(np.array([k * 0.1 for k in keys], np.float32)),
        "n": pa.array([None if k % 3 == 0 else k for k in keys], pa.int64()),
        "ids": pa.array([None if k % 4 == 0 else [k % 7, k % 5] for k in keys], pa.list_(pa.int64())),
    }, schema=SCHEMA)
    return Impressions(np.array(keys, np.uint64), np.asarray(times, np.int64), rows)


def rows_of(table: pa.Table) -> list[tuple]:
    assert table.schema.equals(sample_schema(SCHEMA)), table.schema
    return [tuple(tuple(v) if isinstance(v, list) else v for v in row.values()) for row in table.to_pylist()]


def run_both(policy: JoinPolicy, steps: list[Step], rows_per_table: int = 8192) -> JoinCounts:
    """Run the steps through the core and through JoinLabels; assert they agree; return
    the core's counts."""
    core = JoinState(policy, SCHEMA)
    samples, orphans = [], []
    stream = test_stream.TestStream(output_tags={IMPRESSIONS, LABELS})
    for step in steps:
        out = core.advance(step.impressions, step.labels, step.watermark)
        samples += rows_of(out.samples)
        orphans += [astuple(orphan) for orphan in out.orphans]
        if step.impressions is not None:
            stream.add_elements([step.impressions], tag=IMPRESSIONS)
        if step.labels is not None:
            stream.add_elements([step.labels], tag=LABELS)
        for tag in (IMPRESSIONS, LABELS):
            stream.advance_watermark_to(Timestamp(micros=step.watermark * 1000), tag=tag)

    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--streaming"]))
    events = pipeline | stream
    joined = {IMPRESSIONS: events[IMPRESSIONS], LABELS: events[LABELS]} | JoinLabels(policy, SCHEMA, rows_per_table)
    assert_that(joined[SAMPLES] | beam.FlatMap(rows_of), equal_to(samples), label="Samples")
    assert_that(joined[ORPHANS] | beam.Map(astuple), equal_to(orphans), label="Orphans")
    result = pipeline.run()
    result.wait_until_finish()
    assert picasso_counters(result) == {f"join_{name}": n for name, n in asdict(core.counts).items() if n}
    return core.counts


@pytest.mark.parametrize("late", ["drop", "correct"])
def test_a_story_with_every_kind_of_event(late):
    policy = JoinPolicy(wait_ms=10, late_labels=late, horizon_ms=10, orphan_grace_ms=5)
    counts = run_both(policy, [
        # 1 is clicked in time, 5 explicitly not; 3 comes twice; 9's label comes before it.
        Step(impressions([1, 2, 3, 3, 5], [0, 1, 2, 2, 3]),
             labels([1, 9, 5], [5, 6, 4], np.array([1, 1, 0], np.int8)), watermark=3),
        # 9 joins its waiting label; 2 is clicked beyond W; 1's second label is a duplicate.
        Step(impressions([9], [4]), labels([2, 1], [30, 7]), watermark=10),
        # 5 was a negative: its click is late. 7 never comes. 2 and 3 time out.
        Step(None, labels([5, 7], [8, 9]), watermark=12),
        # Within W of 3 (2 + 10), but behind the watermark that made 3 a negative: late.
        Step(None, labels([3], [11]), watermark=13),
        Step(None, labels([3], [13]), watermark=15),  # 3 is settled: a duplicate; 7 leaves as an orphan
        Step(watermark=21),  # 1 is forgotten
        Step(None, labels([1], [39]), watermark=22),  # so its next label waits again ...
        Step(impressions([1], [41]), None, watermark=23),  # ... for 1's next impression
        Step(watermark=THE_END),
    ])
    assert counts.positives and counts.negatives and counts.explicit_negatives and counts.late_labels
    assert counts.duplicate_impressions and counts.duplicate_labels and counts.orphan_labels and counts.forgotten
    assert counts.corrections == (counts.late_labels if late == "correct" else 0)


@pytest.mark.parametrize("late", ["drop", "correct"])
def test_labels_beyond_the_horizon_and_orphans_told_of_forgotten_impressions(late):
    policy = JoinPolicy(wait_ms=10, late_labels=late, horizon_ms=10, orphan_grace_ms=5)  # keep 20, recall 40
    counts = run_both(policy, [
        Step(impressions([1, 2, 3], [0, 0, 1]), labels([5, 5, 5], [2, 3, 40]), watermark=1),  # 5's come before 5
        # 5's first label joins it, its second is a duplicate, the one at 40 (beyond 5's horizon) waits on.
        Step(impressions([5], [4]), None, watermark=4),
        # 1's click is beyond its horizon (1 is still held), 7 never comes, and 3's explicit
        # negative beyond W decides nothing (3 times out at this watermark).
        Step(None, labels([1, 7, 3], [25, 25, 12], np.array([1, 1, 0], np.int8)), watermark=12),
        Step(watermark=31),  # every impression forgotten; 1's and 7's labels are orphans, 1's told of 1
        # 2's click after 2 was forgotten: told; 3's more than 2 (W + horizon) after 3: not told.
        Step(None, labels([2, 3], [30, 42]), watermark=47),
        Step(watermark=THE_END),
    ])
    assert (counts.positives, counts.negatives, counts.explicit_negatives, counts.late_labels) == (1, 3, 0, 0)
    assert (counts.duplicate_labels, counts.orphan_labels, counts.forgotten) == (2, 5, 4)


class _TimerAt10ms(beam.DoFn):
    """Arms an event-time timer at 10 ms on "arm"; answers each later element with
    whether it has fired."""

    FIRED = ReadModifyWriteStateSpec("fired", VarIntCoder())
    TIMER = TimerSpec("at_10ms", TimeDomain.WATERMARK)

    def process(self, element, fired=beam.DoFn.StateParam(FIRED), timer=beam.DoFn.TimerParam(TIMER)):
        _, what = element
        if what == "arm":
            timer.set(Timestamp(micros=10_000))
        else:
            yield what, bool(fired.read())

    @on_timer(TIMER)
    def fire(self, fired=beam.DoFn.StateParam(FIRED)):
        fired.write(1)


def test_a_timer_set_at_t_fires_when_the_watermark_reaches_t():
    """The fact JoinLabels sets its timers by (join_labels._first_ms_past)."""
    stream = test_stream.TestStream().add_elements([(1, "arm")])
    for ms in (9, 10):
        stream.advance_watermark_to(Timestamp(micros=ms * 1000)).add_elements([(1, f"watermark {ms} ms")])
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner", "--streaming"])) as pipeline:
        answers = (pipeline | stream | beam.Map(lambda kv: kv).with_output_types(beam.typehints.KV[int, str])
                   | beam.ParDo(_TimerAt10ms()))
        assert_that(answers, equal_to([("watermark 9 ms", False), ("watermark 10 ms", True)]))


def test_each_timer_fires_at_the_watermark_where_the_core_decides():
    """Beam fires a timer set at T when the watermark reaches T; the core's predicates are
    strict (time + wait < watermark). At each deadline and one ms past it, an event tells
    the two apart: fired one ms early or late, the verdicts differ."""
    policy = JoinPolicy(wait_ms=10, late_labels="correct", horizon_ms=5, orphan_grace_ms=3)
    counts = run_both(policy, [
        Step(impressions([1, 2], [0, 0]), labels([8], [0]), watermark=3),  # 8's label: 0 + 3 < 3 not yet
        Step(impressions([8], [1]), None, watermark=10),  # ... so it joins; 1 and 2: 0 + 10 < 10 not yet
        Step(None, labels([1], [10]), watermark=11),  # a positive; then 2 times out (0 + 10 < 11)
        Step(None, labels([2], [10]), watermark=15),  # late, corrected; 2 kept: 0 + 15 < 15 not yet
        Step(None, labels([2], [11]), watermark=16),  # a duplicate; then 2 is forgotten (0 + 15 < 16)
        Step(None, labels([2], [12]), watermark=THE_END),  # 2 unknown: waits, then an orphan
    ])
    assert (counts.positives, counts.negatives, counts.corrections) == (2, 1, 1)
    assert (counts.duplicate_labels, counts.orphan_labels) == (1, 1)


def random_steps(seed: int, n: int = 150, step_ms: int = 4_000) -> list[Step]:
    """Steps of `step_ms` from a random stream: clicks in and beyond W, explicit negatives,
    labels before their impression, labels that arrive long after their time (late for a
    negative, or after their impression is forgotten), duplicates, and labels with no
    impression at all. Impressions arrive within 1 s of their time, before any timeout."""
    rng = np.random.default_rng(seed)
    keys = rng.permutation(100 * n)[:n] + 1
    times = rng.integers(0, 60_000, n)
    imps = [(int(k), int(t), int(t + rng.integers(0, 1_000))) for k, t in zip(keys, times)]  # (key, time, arrival)
    imps += [(k, t, a + int(rng.integers(0, 5_000))) for k, t, a in (imps[i] for i in rng.integers(0, n, n // 10))]
    labs = []  # (key, time, value, arrival)
    clicked = rng.random(n) < 0.5
    for k, t in zip(keys[clicked], times[clicked]):
        time = int(t + rng.exponential(3_000) - 500)
        lag = rng.integers(3_000, 15_000) if rng.random() < 0.2 else rng.integers(0, 1_000)
        labs.append((int(k), time, int(rng.random() > 0.1), int(time + lag)))
    labs += [labs[i] for i in rng.integers(0, len(labs), len(labs) // 10)]
    strangers = zip(rng.integers(10**6, 2 * 10**6, 10), rng.integers(0, 60_000, 10))  # keys never impressed
    labs += [(int(k), int(t), 1, int(t)) for k, t in strangers]
    steps = []
    for end in range(step_ms, 80_001, step_ms):
        def arriving(events):
            return sorted((e for e in events if end - step_ms <= e[-1] < end), key=lambda e: e[-1])
        step_imps, step_labs = arriving(imps), arriving(labs)
        steps.append(Step(
            impressions([k for k, *_ in step_imps], [t for _, t, _ in step_imps]) if step_imps else None,
            labels([e[0] for e in step_labs], [e[1] for e in step_labs], np.array([e[2] for e in step_labs], np.int8))
            if step_labs else None,
            watermark=end - 1_500,
        ))
    return steps + [Step(watermark=THE_END)]


@pytest.mark.parametrize("late", ["drop", "correct"])
def test_a_random_stream_gives_what_the_core_gives(late):
    policy = JoinPolicy(wait_ms=5_000, late_labels=late, horizon_ms=3_000, orphan_grace_ms=2_000)
    counts = run_both(policy, random_steps(seed=3), rows_per_table=4)  # tables cut within bundles too
    assert counts.positives and counts.negatives and counts.explicit_negatives and counts.late_labels
    assert counts.duplicate_impressions and counts.duplicate_labels and counts.orphan_labels
    assert counts.positives + counts.negatives == counts.impressions  # each impression decided once
