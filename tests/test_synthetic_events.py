"""Impression and click streams from the planted model, `picasso generate --events`, and
their joined replay into Kafka (`picasso produce --impressions-topic --labels-topic`)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import small_spec

from picasso.connectors.day_files import partition_dir, write_part
from picasso.connectors.kafka_config import KafkaConnection
from picasso.durations import parse_duration_ms
from picasso.pipelines.cli import main as cli
from picasso.pipelines.runs.generate import generate_event_days, midnight_ms
from picasso.pipelines.runs.produce import EventReplayConfig, EventTimePacer, merged_events, pacing_wait_s
from picasso.sample_join.join_rules import DELAY_COLUMN
from picasso.connectors.synthetic.planted import PlantedModel, SyntheticConfig
from picasso.connectors.synthetic.events import (DUPLICATE_GAP_MS, EventStreamConfig, expected_late_share, late_share,
                                      make_event_stream)

START_MS = 1_793_491_200_000  # 2026-11-01T00:00:00Z
FIFTEEN_MINUTES_MS = 15 * 60_000


@pytest.fixture(scope="module")
def planted() -> PlantedModel:
    return PlantedModel(small_spec(), SyntheticConfig(seed=7))


@pytest.fixture(scope="module")
def big_stream(planted):
    """About 5,000 clicks: enough for the delay statistics, fixed seed so they never flake."""
    return make_event_stream(planted, 20_000, stream=3, config=EventStreamConfig(start_ms=START_MS))


# --- the library -------------------------------------------------------------------------

def test_same_spec_seed_and_stream_give_the_same_events(planted):
    config = EventStreamConfig(start_ms=START_MS, impressions_per_s=50.0)
    first, again = make_event_stream(planted, 2000, 5, config), make_event_stream(planted, 2000, 5, config)
    for name in ("impressions", "labels", "truth"):
        assert getattr(first, name).equals(getattr(again, name)), name
    other_day = make_event_stream(planted, 2000, 6, config)
    other_seed = make_event_stream(PlantedModel(small_spec(), SyntheticConfig(seed=8)), 2000, 5, config)
    ids = set(first.impressions.column("request_id").to_pylist())
    assert len(ids) == 2000  # unique per impression
    assert not ids & set(other_day.impressions.column("request_id").to_pylist())  # and across days
    assert not first.labels.equals(other_seed.labels)
    assert all(len(i) == 17 and i[0] == "r" and int(i[1:], 16) >= 0 for i in list(ids)[:50])


def test_impressions_are_the_planted_rows_without_their_label(planted):
    stream = make_event_stream(planted, 500, 2, EventStreamConfig(start_ms=START_MS))
    rows, _ = planted.sample(500, 2)
    assert "label" not in stream.impressions.column_names
    assert stream.impressions.column_names[:2] == ["request_id", "event_time_ms"]
    assert stream.impressions.drop(["request_id", "event_time_ms"]).equals(rows.drop(["label"]))
    assert stream.truth.column("label").equals(rows.column("label"))


def test_impressions_run_at_the_rate_in_order_with_jitter(planted):
    stream = make_event_stream(planted, 5000, 1, EventStreamConfig(start_ms=START_MS, impressions_per_s=50.0))
    times = stream.impressions.column("event_time_ms").to_numpy()
    gaps = np.diff(times)
    assert (gaps >= 0).all()
    assert START_MS <= times[0] < START_MS + 20 and times[-1] < START_MS + 100_000  # 5,000 at 50/s: 100 s
    assert times[-1] - times[0] > 99_000
    assert gaps.std() > 1 and abs(gaps.mean() - 20) < 0.1  # jittered around 1/rate = 20 ms


def test_labels_are_clicks_on_planted_positives_only_in_time_order(big_stream):
    truth, labels = big_stream.truth, big_stream.labels
    positives = set(np.asarray(truth.column("request_id"))[truth.column("label").to_numpy() == 1])
    assert set(labels.column("request_id").to_pylist()) == positives
    assert labels.column_names == ["request_id", "event_time_ms", "label"]
    assert set(labels.column("label").to_pylist()) == {1}
    assert (np.diff(labels.column("event_time_ms").to_numpy()) >= 0).all()
    # Each click lies its truth delay after its impression (the first copy of a duplicate).
    first_click = {}
    for request, at in zip(labels.column("request_id").to_pylist(), labels.column("event_time_ms").to_pylist()):
        first_click.setdefault(request, at)
    clicked = truth.filter(truth.column(DELAY_COLUMN).to_numpy() >= 0).to_pylist()
    assert all(first_click[row["request_id"]] == row["event_time_ms"] + row[DELAY_COLUMN] for row in clicked)
    assert min(row[DELAY_COLUMN] for row in clicked) >= 1  # never at its impression's instant
    negatives = truth.filter(truth.column("label").to_numpy() == 0)
    assert set(negatives.column(DELAY_COLUMN).to_pylist()) == {-1}


def test_exponential_delays_have_the_mean_and_the_tail_of_the_law(big_stream):
    delays = big_stream.truth.column(DELAY_COLUMN).to_numpy()
    delays = delays[delays >= 0]
    assert len(delays) > 4000
    assert abs(delays.mean() / 300_000 - 1) < 0.05
    # About e^-3 of the clicks come after a 15-minute wait: a join that waits 15 minutes
    # takes those impressions for negatives.
    expected = expected_late_share(EventStreamConfig(), FIFTEEN_MINUTES_MS)
    assert expected == pytest.approx(math.exp(-3))
    assert abs(late_share(big_stream.truth, FIFTEEN_MINUTES_MS) - expected) < 0.01


def test_fixed_and_uniform_delays(planted):
    fixed_config = EventStreamConfig(label_delay="fixed", label_delay_mean_ms=60_000)
    fixed = make_event_stream(planted, 2000, 1, fixed_config)
    delays = fixed.truth.column(DELAY_COLUMN).to_numpy()
    assert set(delays[delays >= 0]) == {60_000}
    assert late_share(fixed.truth, 59_999) == expected_late_share(fixed_config, 59_999) == 1.0
    assert late_share(fixed.truth, 60_000) == expected_late_share(fixed_config, 60_000) == 0.0
    uniform = make_event_stream(planted, 4000, 1, EventStreamConfig(label_delay="uniform", label_delay_mean_ms=60_000))
    delays = uniform.truth.column(DELAY_COLUMN).to_numpy()
    delays = delays[delays >= 0]
    assert delays.min() >= 1 and delays.max() <= 120_000 and abs(delays.mean() / 60_000 - 1) < 0.05


def test_a_fixed_fraction_of_clicks_comes_twice_seconds_apart(planted, big_stream):
    clicks = big_stream.clicks
    duplicated = big_stream.truth.column("duplicated").to_numpy()
    assert duplicated.sum() == round(0.02 * clicks)
    assert big_stream.labels.num_rows == clicks + duplicated.sum()
    times: dict[str, list[int]] = {}
    for request, at in zip(big_stream.labels.column("request_id").to_pylist(),
                           big_stream.labels.column("event_time_ms").to_pylist()):
        times.setdefault(request, []).append(at)
    twice = {request for request, seen in times.items() if len(seen) == 2}
    assert twice == set(np.asarray(big_stream.truth.column("request_id"))[duplicated])
    assert all(DUPLICATE_GAP_MS[0] <= times[r][1] - times[r][0] <= DUPLICATE_GAP_MS[1] for r in twice)
    none = make_event_stream(planted, 2000, 1, EventStreamConfig(duplicate_fraction=0.0))
    assert none.labels.num_rows == none.clicks


@pytest.mark.parametrize("changes, problem", [
    ({"impressions_per_s": 0}, "impression rate must be a positive number"),
    ({"label_delay": "gamma"}, "label_delay must be one of exponential, fixed, uniform"),
    ({"label_delay_mean_ms": 0}, "mean label delay must be a positive"),
    ({"duplicate_fraction": 1.5}, "duplicate fraction must lie in [0, 1]"),
    ({"start_ms": -1}, "start_ms must be whole epoch milliseconds"),
])
def test_a_bad_event_config_is_refused_by_name(changes, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        EventStreamConfig(**changes)


# --- durations ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, ms", [("5m", 300_000), ("30s", 30_000), ("1h", 3_600_000), ("250ms", 250),
                                      ("2d", 172_800_000), ("1h30m", 5_400_000), ("1.5h", 5_400_000),
                                      ("1.001s", 1001), ("0s", 0), (" 15m ", 900_000)])
def test_durations_parse_to_milliseconds(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text, problem", [
    ("15", "duration '15' has no unit: write e.g. '15ms', '15s' or '15m'"),
    (900_000, "expected a duration with a unit (ms, s, m, h or d), e.g. '5m', got 900000"),
    ("", "got an empty string"),
    ("-5m", "duration '-5m' is negative"),
    ("5 m", "bad duration '5 m': expected terms of a number and a unit"),
    ("5min", "bad duration '5min'"),
    ("5M", "bad duration '5M'"),
    ("0.5ms", "duration '0.5ms' is not a whole number of milliseconds"),
    (None, "got None"),
])
def test_bad_durations_are_refused_with_what_is_expected(text, problem):
    with pytest.raises(ValueError) as err:
        parse_duration_ms(text)
    assert problem in str(err.value)


# --- picasso generate --events -----------------------------------------------------------

def test_generate_events_writes_impression_label_and_truth_trees(tmp_path):
    root = tmp_path / "events"
    done = subprocess.run(
        [sys.executable, "-m", "picasso.pipelines.cli", "generate", "--events", "--out", str(root),
         "--start-date", "2026-11-01", "--days", "2", "--rows", "3000", "--rows-per-file", "1000",
         "--format", "jsonl", "--label-delay-mean", "2m", "--duplicate-labels", "0.05", "--json"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    days = json.loads(done.stdout.strip().splitlines()[-1])["days"]
    assert [day["date"] for day in days] == ["2026-11-01", "2026-11-02"]
    for day in days:
        impression_parts = sorted((root / "impressions" / f"date={day['date']}").glob("part-*.jsonl"))
        label_parts = sorted((root / "labels" / f"date={day['date']}").glob("part-*.jsonl"))
        assert len(impression_parts) == day["impression_files"] == 3
        impressions = [json.loads(line) for part in impression_parts for line in part.read_text().splitlines()]
        labels = [json.loads(line) for part in label_parts for line in part.read_text().splitlines()]
        assert len(impressions) == day["impressions"] == 3000
        assert len(labels) == day["label_events"] == day["clicks"] + round(0.05 * day["clicks"])
        assert "label" not in impressions[0] and {"request_id", "event_time_ms", "C1", "I1"} <= set(impressions[0])
        midnight = midnight_ms(day["date"])
        assert all(midnight <= row["event_time_ms"] < midnight + 86_400_000 for row in impressions)
        assert {row["request_id"] for row in labels} <= {row["request_id"] for row in impressions}
        assert all(row["label"] == 1 for row in labels)
        assert abs(day["mean_delay_ms"] / 120_000 - 1) < 0.15
        truth = pq.read_table(root / "truth" / f"date={day['date']}" / "part-00000.parquet")
        assert truth.num_rows == 3000 and int(truth.column("label").to_numpy().sum()) == day["clicks"]
        summary = json.loads((root / "truth" / f"date={day['date']}" / "_planted.json").read_text())
        assert summary["events"]["label_delay_mean_ms"] == 120_000 and summary["events"]["start_ms"] == midnight


def test_generate_event_flags_are_checked(tmp_path, capsys):
    out = str(tmp_path / "out")
    assert cli.main(["generate", "--out", out, "--rows", "10", "--label-delay-mean", "5m", "--json"]) == 2
    assert "--label-delay-mean: only with --events" in capsys.readouterr().out
    assert cli.main(["generate", "--events", "--out", out, "--rows", "10", "--format", "tsv", "--json"]) == 2
    assert "events are written as parquet or jsonl" in capsys.readouterr().out
    too_slow = ["--rows", "10", "--impression-rate", "0.0001", "--json"]
    assert cli.main(["generate", "--events", "--out", out, *too_slow]) == 2
    assert "take 27.8 h of event time, more than a day" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "--events", "--out", out, "--label-delay-mean", "5"])
    assert exit_.value.code == 2
    assert "argument --label-delay-mean: duration '5' has no unit" in capsys.readouterr().err


# --- the joined replay -------------------------------------------------------------------

def _replay_config(root, dates, **changes) -> EventReplayConfig:
    """A config for merged_events, which reads files only: the connection is never used."""
    return EventReplayConfig(connection=KafkaConnection("127.0.0.1:1"), data_root=str(root), dates=tuple(dates),
                             impressions_topic="impressions", labels_topic="labels", **changes)


def test_replay_merges_dates_and_streams_in_event_time(tmp_path):
    # Every click an hour after its impression: the first day's last clicks fall after
    # midnight, among the second day's first impressions.
    events = EventStreamConfig(impressions_per_s=400 / 86_400, label_delay="fixed", label_delay_mean_ms=3_600_000)
    days = generate_event_days(small_spec(), tmp_path, ["2026-11-01", "2026-11-02"], rows=400, events=events)
    merged = list(merged_events(_replay_config(tmp_path, ["2026-11-01", "2026-11-02"])))
    times = [event_ms for event_ms, _, _ in merged]
    assert times == sorted(times)
    topics = [topic for _, topic, _ in merged]
    assert topics.count("impressions") == 800 and topics.count("labels") == sum(d.label_events for d in days)
    second_midnight = midnight_ms("2026-11-02")
    first_day_ids = set(pq.read_table(tmp_path / "truth" / "date=2026-11-01" / "part-00000.parquet")
                        .column("request_id").to_pylist())
    late = [i for i, (at, topic, value) in enumerate(merged)
            if topic == "labels" and at >= second_midnight and json.loads(value)["request_id"] in first_day_ids]
    first_next_impression = topics.index("impressions", next(i for i, t in enumerate(times) if t >= second_midnight))
    assert late and late[-1] > first_next_impression
    assert all(json.loads(value)["event_time_ms"] == at for at, _, value in merged)


def test_replay_puts_impressions_first_at_equal_times_and_refuses_disorder(tmp_path):
    import pyarrow as pa

    date = "2026-11-01"
    write_part(pa.table({"request_id": ["a", "b"], "event_time_ms": [5, 10], "x": [1, 2]}),
               f"{partition_dir(tmp_path / 'impressions', date)}/part-00000.jsonl")
    write_part(pa.table({"request_id": ["a"], "event_time_ms": [5], "label": [1]}),
               f"{partition_dir(tmp_path / 'labels', date)}/part-00000.jsonl")
    merged = [(at, topic, json.loads(value)["request_id"]) for at, topic, value in
              merged_events(_replay_config(tmp_path, [date]))]
    assert merged == [(5, "impressions", "a"), (5, "labels", "a"), (10, "impressions", "b")]
    write_part(pa.table({"request_id": ["a"], "event_time_ms": [4]}),
               f"{partition_dir(tmp_path / 'labels', date)}/part-00001.jsonl")
    with pytest.raises(ValueError, match="not in event-time order"):
        list(merged_events(_replay_config(tmp_path, [date])))
    with pytest.raises(FileNotFoundError, match="has no impressions/ tree"):
        merged_events(_replay_config(tmp_path / "labels", [date]))


class FakeClock:
    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def test_pacing_runs_event_time_speedup_times_faster():
    assert pacing_wait_s(first_event_ms=0, started_s=10.0, event_ms=60_000, now_s=10.0, speedup=60) == 1.0
    assert pacing_wait_s(0, 10.0, 60_000, now_s=12.0, speedup=60) == 0.0  # overdue: at once
    assert pacing_wait_s(0, 10.0, 60_000, now_s=10.0, speedup=0) == 0.0  # 0: no pacing
    clock = FakeClock()
    pacer = EventTimePacer(speedup=10, clock=clock, sleep=clock.sleep)
    for event_ms in (1_000, 1_000, 3_000, 4_000):
        pacer.hold(event_ms)
    assert clock.sleeps == [0.2, 0.1]  # 2 s of event time in 0.2 s, then 1 s in 0.1 s
    clock.now += 5.0  # a slow send: the replay falls behind and catches up without sleeping
    pacer.hold(5_000)
    pacer.hold(60_000)
    assert clock.sleeps == [0.2, 0.1, 0.6]  # 59 s of event time after the first event: due at 105.9


def test_no_pacing_never_reads_the_clock():
    def refuse():
        raise AssertionError("speedup 0 read the clock")

    pacer = EventTimePacer(speedup=0, clock=refuse, sleep=lambda s: refuse())
    for event_ms in (0, 10_000, 1_000_000):
        pacer.hold(event_ms)


def test_produce_replays_generated_events_into_two_topics(tmp_path, kafka_bootstrap, kafka_topic, capsys):
    from kafka import KafkaConsumer, TopicPartition

    dates = ["2026-11-01", "2026-11-02"]
    days = generate_event_days(small_spec(), tmp_path, dates, rows=300, rows_per_file=100,
                               events=EventStreamConfig(impressions_per_s=300 / 86_400, label_delay_mean_ms=3_600_000))
    impressions_topic, labels_topic = f"{kafka_topic}-impressions", f"{kafka_topic}-labels"
    code = cli.main(["produce", "--data", str(tmp_path), *[arg for d in dates for arg in ("--date", d)],
                     "--impressions-topic", impressions_topic, "--labels-topic", labels_topic, "--speedup", "0",
                     "--bootstrap-servers", kafka_bootstrap, "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    expected = {impressions_topic: 600, labels_topic: sum(day.label_events for day in days)}
    assert (result["impressions"], result["labels"]) == (expected[impressions_topic], expected[labels_topic])

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, 0) for topic in expected]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        received: dict[str, list] = {topic: [] for topic in expected}
        deadline = time.monotonic() + 30
        while any(len(received[t]) < n for t, n in expected.items()) and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                received[tp.topic] += messages
    finally:
        consumer.close()
    for topic, count in expected.items():
        messages = received[topic]
        assert len(messages) == count, topic
        event_times = [json.loads(m.value)["event_time_ms"] for m in messages]
        assert [m.timestamp for m in messages] == event_times  # each message stamped with its event time
        assert event_times == sorted(event_times)
    expected_ids = [json.loads(v)["request_id"] for _, topic, v in merged_events(_replay_config(tmp_path, dates))
                    if topic == "labels"]
    assert [json.loads(m.value)["request_id"] for m in received[labels_topic]] == expected_ids
