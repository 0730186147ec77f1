"""Dynamic tables that evict by event time (`evict_after: 2h`): the batch's event time as
each source gives it, the clock it drives, and eviction, LFU and restarts on that clock."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

import apache_beam as beam
import pyarrow as pa
import pytest
import torch
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from test_dynamic_tables import batch_of, item_map, live_keys, make_spec, max_difference

from picasso.builtin_specs import CHURN_CAPACITY, churn_spec
from picasso.checkpoint import load_checkpoint
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.partitions import partition_range, partition_time_ms
from picasso.serving.publishing.contract import MLflowTarget
from picasso.dynamic_rows import EventTimeMissing
from picasso.pipelines.runs.backfill import run_range
from picasso.pipelines.runs.daily import DailyConfig
from picasso.pipelines.transforms.decode import DecodedChunk
from picasso.pipelines.transforms.message_spans import DecodedMessageChunk, MessageSpan
from picasso.pipelines.runs.join_cycle import PackSamples
from picasso.pipelines.runs.generate import generate_days
from picasso.pipelines.transforms.pack import PackFeatures, PackMessages
from picasso.spec import DynamicTable, parse_spec
from picasso.connectors.synthetic.churn import ChurnConfig
from picasso.trainer import TrainConfig, Trainer

HOUR = 3_600_000
T0 = 1_793_491_200_000  # 2026-11-01T00:00Z


def timed(spec, items, hour: float | None, position: int = 1):
    """A batch of these items whose rows' newest event time is `hour` hours after T0."""
    batch = batch_of(spec, items, position)
    return batch if hour is None else batch.with_event_time(T0 + int(hour * HOUR))


def event_spec(**settings):
    return make_spec({"capacity": 10, "evict_after": "2h", **settings})


def test_rows_unseen_for_evict_after_in_event_time_are_freed_whatever_the_steps():
    spec = event_spec(keep_rows=1)
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    field = item_map(trainer)
    trainer.train_step(timed(spec, [1, 2, 3], 0))
    for step in range(20):  # many steps within the two hours: nothing ages
        trainer.train_step(timed(spec, [4], 1 + step / 100))
    assert set(live_keys(field)) == {1, 2, 3, 4}
    trainer.train_step(timed(spec, [4], 2))  # 1-3 last seen exactly 2h ago: kept
    assert set(live_keys(field)) == {1, 2, 3, 4}
    trainer.train_step(timed(spec, [5], 2.5))  # 1-3 now older than 2h
    assert set(live_keys(field)) == {4, 5} and field.stats.evicted_by_age == 3
    trainer.train_step(timed(spec, [6], 9))  # 4 and 5 both expire, but keep_rows keeps the newer
    assert set(live_keys(field)) == {5, 6}
    assert int(trainer.model.dynamic_rows.event_time) == T0 + 9 * HOUR


def test_the_clock_never_goes_back_and_a_batch_without_a_time_reads_it():
    spec = event_spec()
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    field = item_map(trainer)
    trainer.train_step(timed(spec, [1], 5))
    trainer.train_step(timed(spec, [2], 1))  # older events: stamped at the clock, 5h
    trainer.train_step(timed(spec, [3], None))  # no time: the clock as it stands
    rows = live_keys(field)
    assert [int(field.last_seen[rows[k]]) for k in (1, 2, 3)] == [T0 + 5 * HOUR] * 3
    trainer.train_step(timed(spec, [4], 7.5))
    assert set(live_keys(field)) == {4}


def test_a_first_batch_without_an_event_time_is_a_clear_error_that_changes_nothing():
    spec = event_spec()
    trainer = Trainer(spec, TrainConfig(hidden=(8,), interleave=False))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(EventTimeMissing, match=r"field\(s\) item evict by event time .* evict_after_steps"):
        trainer.train_step(timed(spec, [1, 2], None))
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    trainer.train_step(timed(spec, [1, 2], 0))  # the next batch with a time trains
    assert set(live_keys(item_map(trainer))) == {1, 2}


def test_a_field_on_steps_beside_one_on_event_time_keeps_its_own_clock():
    spec = parse_spec({"name": "two_clocks", "label": "y", "dense": ["d"], "sparse": [
        {"name": "item", "embedding_dim": 4, "dynamic": {"capacity": 10, "evict_after": "1h"}},
        {"name": "c", "embedding_dim": 4, "hash_buckets": 30},
        {"name": "tags", "embedding_dim": 8, "max_len": 3, "dynamic": {"capacity": 10, "evict_after_steps": 1}}]})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    items, tags = trainer.model.dynamic_rows.maps
    for items_of, tags_of in (([1], [["a"]]), ([2], [["b"]]), ([2], [["b"]])):  # all at one event time
        trainer.train_step(batch_of(spec, items_of, 1, tags=tags_of).with_event_time(T0))
    assert set(live_keys(items)) == {1, 2}  # no event time has passed
    assert tags.live_rows == 1 and tags.stats.evicted_by_age == 1  # "a" is two steps old


def test_lfu_spares_the_rows_of_the_batch_before_on_the_event_clock():
    spec = make_spec({"capacity": 4, "evict_after": "1d"})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    trainer.train_step(timed(spec, [1, 1, 1, 2, 3, 3, 4, 4], 0))  # counts 3, 1, 2, 2
    trainer.train_step(timed(spec, [4], 1))
    trainer.train_step(timed(spec, [5, 6], 2))  # 4 was used by the batch before: never a victim
    assert set(live_keys(item_map(trainer))) == {1, 4, 5, 6}


def test_a_restart_carries_the_event_clock(tmp_path):
    spec = make_spec({"capacity": 30, "admit_after": 2, "evict_after": "90m"})
    batches = [timed(spec, [(i * 3 + j) % 40 for j in range(12)], i / 2, position=i + 1) for i in range(16)]
    plain = Trainer(spec, TrainConfig(hidden=(8,)))
    plain.train(batches)
    first = Trainer(spec, TrainConfig(hidden=(8,)))
    first.train(batches[:7])
    resumed = Trainer(spec, TrainConfig(hidden=(8,)))
    resumed.restore(first.save_checkpoint(tmp_path))
    assert int(resumed.model.dynamic_rows.event_time) == T0 + 3 * HOUR
    resumed.train(batches[7:])
    expected, got = plain.state()["model"], resumed.state()["model"]
    assert max_difference(expected, got) <= 1e-6
    assert item_map(plain).stats.evicted_by_age > 0


# -- where a batch's event time comes from ------------------------------------------------

def test_a_day_file_batch_carries_its_partitions_start():
    spec = event_spec()
    table = RecordDecoder(spec).decode_table(pa.table({"y": [1], "d": [0.5], "item": [7], "c": [1],
                                                       "tags": [["a"]]}), "s").table
    assert partition_time_ms("s3://bucket/data/date=2026-11-01/part-0.parquet") == T0
    assert partition_time_ms("/data/date=2026-11-01/hour=05/part-0.csv") == T0 + 5 * HOUR
    assert partition_time_ms("/data/loose/part-0.csv") is None
    assert partition_time_ms("/data/date=2026-02-30/part-0.csv") is None  # no such day
    pack_features = PackFeatures(spec)
    hourly = pack_features.pack_chunk(DecodedChunk(table, {"/data/date=2026-11-01/hour=05/part-0.csv": 1}))
    assert hourly.event_time_ms == T0 + 5 * HOUR
    assert pack_features.pack_chunk(DecodedChunk(table, {"/data/part-0.csv": 1})).event_time_ms is None


def test_a_kafka_batch_carries_its_newest_message_time():
    spec = event_spec()
    table = RecordDecoder(spec).schema.empty_table()
    span = MessageSpan("events/0", start=0, next_position=3, messages=3, records_in=0, records_refused=0,
                       newest_timestamp_ms=T0 + 42)
    assert PackMessages(spec).pack_chunk(DecodedMessageChunk(table, span)).batch.event_time_ms == T0 + 42
    unknown = MessageSpan("events/0", 0, 3, 3, 0, 0, newest_timestamp_ms=None)
    assert PackMessages(spec).pack_chunk(DecodedMessageChunk(table, unknown)).batch.event_time_ms is None


def test_joined_samples_carry_their_tables_event_timestamp():
    spec = event_spec()
    table = RecordDecoder(spec).decode_table(pa.table({"y": [1, 0], "d": [0.5, 0.1], "item": [7, 8], "c": [1, 2],
                                                       "tags": [["a"], []]}), "s").table
    at = dt.datetime(2026, 11, 1, 3, tzinfo=dt.timezone.utc).timestamp()
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as pipeline:
        times = (pipeline | beam.Create([table]) | beam.Map(lambda t: beam.window.TimestampedValue(t, at))
                 | PackSamples(spec) | beam.Map(lambda batch: batch.event_time_ms))
        assert_that(times, equal_to([T0 + 3 * HOUR]))
    # A table outside event time (a bounded source's default timestamp) carries none.
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as pipeline:
        times = pipeline | beam.Create([table]) | PackSamples(spec) | beam.Map(lambda batch: batch.event_time_ms)
        assert_that(times, equal_to([None]))


def test_the_event_time_survives_the_trip_to_torch_and_other_metadata():
    spec = event_spec()
    batch = timed(spec, [1, 2], 4)
    assert batch.event_time_ms == T0 + 4 * HOUR == batch.to_torch().event_time_ms
    assert batch.with_event_time(None).event_time_ms == T0 + 4 * HOUR  # None keeps what it had
    assert batch.with_late_share(0.1).event_time_ms == T0 + 4 * HOUR
    plain = batch_of(spec, [1], 1)
    assert plain.event_time_ms is None and plain.to_torch().event_time_ms is None


def test_a_range_of_day_partitions_evicts_the_items_a_day_left_behind(mlflow_server, tmp_path):
    """Through the daily pipeline: each partition's batches carry its start, so at day 3
    the items last seen on day 1 are more than a day old and leave."""
    churn = churn_spec()
    item = dataclasses.replace(churn.sparse_field("item"),
                               dynamic=DynamicTable(capacity=CHURN_CAPACITY, evict_after="1d"))
    spec = dataclasses.replace(churn, sparse=tuple(item if f.name == "item" else f for f in churn.sparse))
    days = partition_range("2026-11-01..2026-11-03")
    generate_days(spec, tmp_path / "data", days, rows=800, churn=ChurnConfig())
    name = f"event-time-{uuid.uuid4().hex[:8]}"
    template = DailyConfig(data_root=str(tmp_path / "data"), date=days[0], workdir=str(tmp_path / "work"), spec=spec,
                           mlflow=MLflowTarget(tracking_uri=mlflow_server, experiment=f"test-{name}", model_name=name),
                           train=TrainConfig(hidden=(8,)), batch_size=200)
    results = run_range(template, days, publish_every=3)
    states = [load_checkpoint(r.checkpoint).state["model"] for r in results]
    starts = [T0 + day * 24 * HOUR for day in range(3)]
    assert [int(s["dynamic_rows.event_time"]) for s in states] == starts
    last_seen = states[-1]["dynamic_rows.maps.0.last_seen"]
    live = last_seen[last_seen >= 0]
    assert set(live.tolist()) == set(starts[1:])  # day 1's rows that days 2 and 3 did not see are gone
    assert (states[1]["dynamic_rows.maps.0.last_seen"] == starts[0]).sum() > (last_seen == starts[0]).sum() == 0
