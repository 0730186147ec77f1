"""A stream's start (pipelines/runs/stream_start.py): warm-started from a backfill's model,
reading from an offset or a time, with a real broker and a real `mlflow server`."""

from __future__ import annotations

import json
import logging
import math
import signal
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from mlflow.tracking import MlflowClient
from kafka_broker import create_topic
from learning_helpers import packed, write_day
from helpers import refusal_in_process
from stream_helpers import SPEC, run_stream_process, start_process, stream_command, wait_for, write_spec

from picasso.checkpoint import checkpoint_metrics, latest_checkpoint, load_checkpoint
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.decoding.message_formats import encode_json
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_readers import open_reader
from picasso.connectors.kafka_times import offsets_at_time
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.pipelines.cli import main as cli
from picasso.pipelines.runs.daily import DailyConfig, run_daily
from picasso.pipelines.runs.stream import StreamConfig, run_stream
from picasso.connectors.partitions import partition_end_ms
from picasso.pipelines.runs.stream_start import StreamStart, begin_stream, parse_timestamp_ms
from picasso.serving.publishing.contract import MLflowTarget
from picasso.serving.publishing.policy import PublishPolicy
from picasso.trainer import TrainConfig, Trainer

DAYS = ("2026-11-01", "2026-11-02", "2026-11-03", "2026-11-04")
BACKFILLED = DAYS[:3]
ROWS_PER_DAY = 300
PARTITIONS = 2
TRAIN = TrainConfig(hidden=(16, 8), device="cpu")
EVERY_VERSION = PublishPolicy(promote_epsilon=1.0)  # 300-row days: a holdout AUC is noise


# -- times ---------------------------------------------------------------------------------


def test_start_times_read_as_utc_milliseconds():
    assert parse_timestamp_ms("1762214400000") == 1_762_214_400_000
    assert parse_timestamp_ms("2026-11-04T00:00:00Z") == partition_end_ms("2026-11-03")
    assert parse_timestamp_ms("2026-11-04") == partition_end_ms("2026-11-03")  # no zone: UTC
    assert parse_timestamp_ms("2026-11-04T01:00:00+01:00") == partition_end_ms("2026-11-03")
    assert partition_end_ms("2026-11-03T23") == partition_end_ms("2026-11-03")  # an hourly partition's end
    assert partition_end_ms("2026-11-03T05") == parse_timestamp_ms("2026-11-03T06:00Z")
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_timestamp_ms("yesterday")


def test_a_start_that_cannot_be_made_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="after-model needs --warm-start"):
        StreamStart(None, "after-model")
    with pytest.raises(ValueError, match="--start-at 'soon'"):
        StreamStart("champion", "soon")
    assert StreamStart("champion").registry and StreamStart("models:/m/3").registry
    assert not StreamStart("/data/checkpoints").registry


# -- offsets at a time ------------------------------------------------------------------------

BASE_MS = 1_790_000_000_000


@pytest.fixture(scope="module")
def stamped_topic(kafka_bootstrap) -> str:
    """60 messages, one a second from BASE_MS, round-robin over two partitions."""
    topic = f"stamped-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for i in range(60):
        producer.send(topic, value=b"%d" % i, partition=i % PARTITIONS, timestamp_ms=BASE_MS + i * 1000)
    producer.flush()
    producer.close()
    return topic


def _offsets(bootstrap: str, topic: str, timestamp_ms: int, client: str = "kafka-python", reader_of=None) -> dict:
    reader = open_reader(KafkaConnection(bootstrap, client=client))
    reader = reader_of(reader) if reader_of else reader
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: offset for tp, offset in offsets_at_time(
            reader, partitions, timestamp_ms, reader.beginning_offsets(partitions),
            reader.latest_offsets(partitions)).items()}
    finally:
        reader.close()


@pytest.mark.parametrize("second, expected", [
    (-5.0, {0: 0, 1: 0}),  # before the first message: the beginning
    (10.0, {0: 5, 1: 5}),  # message 10 (partition 0, offset 5) is stamped exactly then
    (10.5, {0: 6, 1: 5}),  # between 10 and 11: 11 is partition 1's offset 5
    (59.0, {0: 30, 1: 29}),  # the last message
    (59.5, {0: 30, 1: 30}),  # past the last: each partition's end
])
def test_each_partition_starts_at_its_first_message_stamped_at_or_after_the_time(
        kafka_bootstrap, stamped_topic, kafka_client, second, expected):
    assert _offsets(kafka_bootstrap, stamped_topic, BASE_MS + int(second * 1000), kafka_client) == expected


class _Told:
    """A reader whose broker answers offsets-for-times as `answer` says; reads are real."""

    def __init__(self, reader, answer):
        self.reader, self.answer, self.fetches = reader, answer, 0

    def offsets_for_times(self, partitions, timestamp_ms):
        return {tp: self.answer(tp) for tp in partitions}

    def assign(self, tp, position):
        self.fetches += 1
        self.reader.assign(tp, position)

    def __getattr__(self, name):
        return getattr(self.reader, name)


def test_a_right_broker_answer_is_taken_after_two_reads_and_a_wrong_one_is_searched_for(
        kafka_bootstrap, stamped_topic, caplog):
    right = {0: 6, 1: 5}  # 10.5 s in
    readers = []

    def told(answer):
        def make(reader):
            readers.append(_Told(reader, answer))
            return readers[-1]
        return make

    with caplog.at_level(logging.WARNING, logger="picasso.connectors.kafka_times"):
        assert _offsets(kafka_bootstrap, stamped_topic, BASE_MS + 10_500, reader_of=told(
            lambda tp: right[tp.partition])) == right
        assert not caplog.records
        assert readers[-1].fetches == 2 * PARTITIONS  # the message at the answer and the one before, each
        for wrong in (lambda tp: 0, lambda tp: None, lambda tp: 29):
            assert _offsets(kafka_bootstrap, stamped_topic, BASE_MS + 10_500, reader_of=told(wrong)) == right
    assert len(caplog.records) == 3 * PARTITIONS and "does not match its records" in caplog.records[0].message


# -- a stream after a backfill ----------------------------------------------------------------


def _day_rows(day: int):
    table, _ = PlantedModel(SPEC).sample(ROWS_PER_DAY, stream=day)
    return table


def _stamp(date: str, i: int) -> int:
    """The i-th event of a day, spread over the day."""
    return partition_end_ms(date) - 86_400_000 + (i + 1) * (86_400_000 // (ROWS_PER_DAY + 1))


def _produce_days(bootstrap: str, topic: str, days) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for day, date in enumerate(DAYS):
        if date not in days:
            continue
        for i, value in enumerate(encode_json(_day_rows(day))):
            producer.send(topic, value=value, partition=i % PARTITIONS, timestamp_ms=_stamp(date, i))
    producer.flush()
    producer.close()


def _first_offsets_after(bootstrap: str, topic: str, after_ms: int) -> dict[str, int]:
    """Read back from the broker, with a client of its own: each partition's first offset
    stamped after the time, and its end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    first: dict[str, int] = {}
    for record in consumer:
        if record.timestamp > after_ms:
            first.setdefault(f"{topic}/{record.partition}", record.offset)
    consumer.close()
    return first


@pytest.fixture(scope="module")
def backfill(tmp_path_factory, mlflow_server):
    """Three days backfilled with `picasso daily`'s run into one workdir, each version
    promoted: the champion is the last day's."""
    root, workdir = tmp_path_factory.mktemp("days"), tmp_path_factory.mktemp("backfill")
    name = f"handoff-{uuid.uuid4().hex[:6]}"
    target = MLflowTarget(mlflow_server, experiment=name, model_name=name)
    results = []
    for day, date in enumerate(BACKFILLED):
        write_day(root, date, _day_rows(day))
        results.append(run_daily(DailyConfig(data_root=str(root), date=date, workdir=str(workdir), spec=SPEC,
                                             mlflow=target, train=TRAIN, runner="FnApiRunner", batch_size=100,
                                             policy=EVERY_VERSION)))
    assert all(r.status == "published" for r in results), results
    return target, results


def _stream_config(bootstrap: str, topic: str, workdir: Path, start: StreamStart | None, target=None, **more):
    """A stream until caught up; it publishes only when `more` gives it an mlflow target."""
    return StreamConfig(**{"connection": KafkaConnection(bootstrap), "topics": {topic: "json"}, "workdir": str(workdir),
                           "spec": SPEC, "mlflow": None, "train": TRAIN,
                           "dead_letters": DeadLetterPolicy(topic=f"{topic}.dead"), "batch_messages": 100,
                           "until_caught_up": True, "start": start, "warm_start_target": target, **more})


def _ledger(workdir: Path) -> dict:
    return checkpoint_metrics(latest_checkpoint(workdir / "checkpoints"))["ledger"]


def test_a_stream_warm_started_from_the_champion_trains_exactly_what_came_after_the_backfill(
        kafka_bootstrap, backfill, tmp_path):
    target, results = backfill
    topic = f"handoff-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _produce_days(kafka_bootstrap, topic, DAYS)  # the backfilled days and the one after
    champion = load_checkpoint(results[-1].checkpoint)

    start = StreamStart("champion", "after-model")
    summary = run_stream(_stream_config(kafka_bootstrap, topic, tmp_path, start, target))

    expected = _first_offsets_after(kafka_bootstrap, topic, partition_end_ms(BACKFILLED[-1]) - 1)
    assert expected == {f"{topic}/0": 450, f"{topic}/1": 450}  # 3 x 300 messages before, per partition half
    ledger = _ledger(tmp_path)
    assert {source: p["start"] for source, p in ledger["partitions"].items()} == expected
    assert summary.messages == ROWS_PER_DAY  # the fourth day, every message once, none of the first three
    assert sum(p["messages"] for p in ledger["partitions"].values()) == ROWS_PER_DAY
    made = ledger["start"]
    assert made["start_at"] == "after-model" and made["positions"] == expected
    assert made["warm_start"]["version"] == results[-1].version
    assert made["warm_start"]["newest_event_ms"] == partition_end_ms(BACKFILLED[-1])
    assert "partition 2026-11-03" in made["warm_start"]["newest_event_from"]

    # The champion's weights and optimizer went on training: its steps and samples carry on.
    trained = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert trained.state["samples"] == champion.state["samples"] + ROWS_PER_DAY
    assert trained.state["step"] == champion.state["step"] + PARTITIONS * math.ceil(ROWS_PER_DAY / PARTITIONS / 100)
    assert set(trained.positions) == set(expected)  # the backfill's file positions are not the stream's

    first = sorted((tmp_path / "checkpoints").iterdir())[0]  # the start: the champion, unchanged
    started = load_checkpoint(first)
    for key, value in champion.state["model"].items():
        assert torch.equal(started.state["model"][key], value), key

    # The same stream from scratch, from the same offsets: the backfill's days are what it lacks.
    scratch = run_stream(_stream_config(kafka_bootstrap, topic, tmp_path / "scratch",
                                        StreamStart(None, str(partition_end_ms(BACKFILLED[-1]) + 1))))
    assert scratch.messages == ROWS_PER_DAY and _ledger(tmp_path / "scratch")["start"]["positions"] == expected
    warm_auc, scratch_auc = (_next_day_auc(root / "checkpoints") for root in (tmp_path, tmp_path / "scratch"))
    assert warm_auc > scratch_auc + 0.005, (warm_auc, scratch_auc)  # 0.564 against 0.546 when written


def _next_day_auc(checkpoints: Path) -> float:
    """The AUC on rows of the day after the streamed one (a stream of the planted model
    that no run trains on), large enough that the difference is not noise."""
    trainer = Trainer(SPEC, TRAIN)
    trainer.restore(latest_checkpoint(checkpoints))
    rows, _ = PlantedModel(SPEC).sample(20 * ROWS_PER_DAY, stream=len(DAYS))
    return trainer.evaluate(packed(SPEC, rows)).auc


def test_the_start_is_made_once_and_a_restarted_stream_goes_on_from_its_checkpoint(
        kafka_bootstrap, backfill, tmp_path):
    target, results = backfill
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _produce_days(kafka_bootstrap, topic, DAYS[:2])
    # The stream made its start, then was killed before its first cycle.
    config = _stream_config(kafka_bootstrap, topic, tmp_path, StreamStart(str(Path(results[-1].checkpoint).parent),
                                                                             "latest"))
    begin_stream(config)
    started = _ledger(tmp_path)["start"]["positions"]
    assert started == {f"{topic}/0": 300, f"{topic}/1": 300}
    _produce_days(kafka_bootstrap, topic, DAYS[3:])  # arrived while it was down
    assert begin_stream(config) is None  # resubmitted: it has a checkpoint, so no second start

    summary = run_stream(config)
    assert summary.messages == ROWS_PER_DAY  # from where the start said, not from the end now
    assert {s: p["start"] for s, p in _ledger(tmp_path)["partitions"].items()} == started


def test_a_stream_process_killed_after_its_start_is_resubmitted_and_trains_every_message_once(
        kafka_bootstrap, backfill, tmp_path):
    _, results = backfill
    topic = f"killed-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _produce_days(kafka_bootstrap, topic, BACKFILLED)
    champion = load_checkpoint(results[-1].checkpoint)
    workdir, log = tmp_path / "w", tmp_path / "stream.log"
    # --start-at latest: a start made again by the resubmit would begin at the end then, past what arrived.
    command = stream_command(write_spec(tmp_path), kafka_bootstrap, topic, workdir, "--batch-messages", "50",
                             "--publish-every", "0", "--warm-start", str(Path(results[-1].checkpoint).parent),
                             "--start-at", "latest")
    process = start_process(command, log)
    try:
        wait_for(lambda: latest_checkpoint(workdir / "checkpoints") is not None, process, "the start checkpoint")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    started = _ledger(workdir)["start"]["positions"]
    assert started == {f"{topic}/0": 450, f"{topic}/1": 450}
    _produce_days(kafka_bootstrap, topic, DAYS[3:])  # arrived while it was down

    assert run_stream_process([*command, "--until-caught-up"], log).returncode == 0, log.read_text()[-4000:]
    ledger = _ledger(workdir)
    assert ledger["start"]["positions"] == started  # the start was made once
    assert {s: (p["start"], p["next_position"], p["messages"]) for s, p in ledger["partitions"].items()} == {
        s: (450, 600, 150) for s in started}  # every message after the start once
    trained = load_checkpoint(latest_checkpoint(workdir / "checkpoints"))
    assert trained.state["samples"] == champion.state["samples"] + ROWS_PER_DAY


def test_a_start_past_the_topics_end_waits_there_and_trains_what_arrives(kafka_bootstrap, tmp_path, caplog):
    topic = f"future-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _produce_days(kafka_bootstrap, topic, DAYS[:1])
    start = StreamStart(None, "2027-01-01T00:00:00Z")  # a new model, from a time no message has reached
    with caplog.at_level(logging.WARNING, logger="picasso.pipelines.runs.stream_start"):
        summary = run_stream(_stream_config(kafka_bootstrap, topic, tmp_path, start))
    assert summary.messages == 0
    waiting = [r.message for r in caplog.records if "waits at its end" in r.message]
    assert len(waiting) == PARTITIONS and f"{topic}/0" in waiting[0]  # one line a partition
    _produce_days(kafka_bootstrap, topic, DAYS[1:2])
    assert run_stream(_stream_config(kafka_bootstrap, topic, tmp_path, start)).messages == ROWS_PER_DAY


def test_a_warm_start_of_another_spec_or_model_is_refused_naming_what_differs(kafka_bootstrap, backfill, tmp_path):
    target, _ = backfill
    topic = f"other-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    config = _stream_config(kafka_bootstrap, topic, tmp_path, StreamStart("champion"), target)
    other = replace(SPEC, sparse=tuple(replace(f, embedding_dim=2) if f.name == "h" else f for f in SPEC.sparse))
    with pytest.raises(ValueError, match="id feature h: embedding_dim 2 in this run, 4 in the model"):
        run_stream(replace(config, spec=other))
    with pytest.raises(ValueError, match=r"--hidden 16,8 \(this run: 32\)"):
        run_stream(replace(config, train=TrainConfig(hidden=(32,), device="cpu")))
    with pytest.raises(ValueError, match="has no such version"):
        run_stream(replace(config, start=StreamStart(f"models:/{target.model_name}/99")))
    assert latest_checkpoint(tmp_path / "checkpoints") is None  # nothing was started


# -- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize("flags, says", [
    (["--start-at", "after-model"], "--start-at after-model needs --warm-start"),
    (["--start-at", "tomorrow"], "--start-at 'tomorrow': expected one of earliest, latest, committed, after-model"),
])
def test_the_command_refuses_a_start_it_cannot_make_in_one_line(flags, says, tmp_path, capsys):
    status, stderr = refusal_in_process(stream_command(write_spec(tmp_path), "127.0.0.1:1", "events", tmp_path / "w",
                                                       *flags), capsys)
    assert status == 2 and says in stderr, stderr[-2000:]
    assert len(stderr.strip().splitlines()) == 1, stderr


def test_picasso_stream_warm_starts_from_a_registered_version_after_its_newest_event(
        kafka_bootstrap, backfill, mlflow_server, tmp_path):
    target, results = backfill
    topic = f"command-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _produce_days(kafka_bootstrap, topic, DAYS)
    version = f"models:/{target.model_name}/{results[1].version}"  # the second day's: the stream takes the third on
    result = subprocess.run(stream_command(write_spec(tmp_path), kafka_bootstrap, topic, tmp_path / "w",
                                           "--batch-messages", "100", "--until-caught-up", "--publish-every", "0",
                                           "--mlflow-uri", mlflow_server, "--model-name", target.model_name,
                                           "--warm-start", version, "--start-at", "after-model", "--json"),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["messages"] == 2 * ROWS_PER_DAY
    made = _ledger(tmp_path / "w")["start"]
    assert made["warm_start"]["model_uri"] == version
    assert made["positions"] == _first_offsets_after(kafka_bootstrap, topic, partition_end_ms(DAYS[1]) - 1)


# -- and back: a daily run from the stream's model -------------------------------------------


def _daily(root: Path, workdir: Path, target, date: str, **more):
    return run_daily(DailyConfig(data_root=str(root), date=date, workdir=str(workdir), spec=SPEC, mlflow=target,
                                 runner="FnApiRunner", batch_size=100, policy=EVERY_VERSION, **{"train": TRAIN, **more}))


def test_a_daily_run_warm_started_from_the_streams_champion_trains_on_it(kafka_bootstrap, mlflow_server, tmp_path,
                                                                         capsys):
    name = f"roundtrip-{uuid.uuid4().hex[:6]}"
    target = MLflowTarget(mlflow_server, experiment=name, model_name=name)
    root = tmp_path / "days"
    write_day(root, DAYS[0], _day_rows(0))
    assert _daily(root, tmp_path / "daily", target, DAYS[0]).version == "1"
    topic = f"roundtrip-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    _produce_days(kafka_bootstrap, topic, DAYS[:2])
    stream = run_stream(_stream_config(kafka_bootstrap, topic, tmp_path / "stream", StreamStart("champion", "after-model"),
                                       target, publish_every_s=3600.0, mlflow=target))  # its version as it stops
    assert stream.messages == ROWS_PER_DAY and stream.versions == ["2"]
    streamed = MlflowClient(mlflow_server).get_model_version_by_alias(name, "champion")
    assert streamed.version == "2"  # scored progressively, not on a holdout: the newer is promoted

    write_day(root, DAYS[2], _day_rows(2))
    result = _daily(root, tmp_path / "daily", target, DAYS[2], warm_start="champion")
    assert result.status == "published" and result.version == "3"
    assert result.warm_start_from == streamed.tags["picasso.checkpoint_path"]
    from_stream = load_checkpoint(streamed.tags["picasso.checkpoint_path"])
    trained = load_checkpoint(result.checkpoint)
    assert trained.state["samples"] == from_stream.state["samples"] + result.samples
    assert trained.state["step"] > from_stream.state["step"]

    # One lineage: each version names its parent and what it trained since.
    client = MlflowClient(mlflow_server)
    line = {v: client.get_model_version(name, v).tags for v in ("1", "2", "3")}
    assert [line[v]["picasso.parent_version"] for v in ("1", "2", "3")] == ["none", "1", "2"]
    assert line["1"]["picasso.origin"] == "partition 2026-11-01"
    assert line["2"]["picasso.origin"] == f"stream {topic}/0 [150, 300), {topic}/1 [150, 300)"
    assert line["3"]["picasso.origin"] == "partition 2026-11-03"
    capsys.readouterr()
    assert cli.main(["versions", "--mlflow-uri", mlflow_server, "--model-name", name, "--json"]) == 0
    chain = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["chain"]
    assert [(link["version"], link["parent"], link["aliases"]) for link in chain] == [
        ("3", "2", ["candidate", "champion"]), ("2", "1", []), ("1", "none", [])]
    assert chain[1]["origin"] == line["2"]["picasso.origin"] and chain[1]["evaluation"] == "progressive"

    write_day(root, DAYS[3], _day_rows(3))
    with pytest.raises(ValueError, match=r"--hidden 16,8 \(this run: 32\)"):
        _daily(root, tmp_path / "daily", target, DAYS[3], warm_start="champion",
               train=TrainConfig(hidden=(32,), device="cpu"))


def test_a_version_registered_by_hand_or_a_path_without_a_checkpoint_is_refused_with_the_reason(
        kafka_bootstrap, backfill, mlflow_server, tmp_path):
    target, _ = backfill
    client = MlflowClient(mlflow_server)
    hand = f"by-hand-{uuid.uuid4().hex[:6]}"
    client.create_registered_model(hand)
    made = client.get_model_version(target.model_name, "1")
    # From the run's artifacts, as a person registers one: no picasso tags, no checkpoint to train on from.
    client.create_model_version(hand, source=f"runs:/{made.run_id}/model", run_id=made.run_id)
    client.set_registered_model_alias(hand, "champion", "1")
    topic = f"hand-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    config = _stream_config(kafka_bootstrap, topic, tmp_path, StreamStart("champion"),
                            MLflowTarget(mlflow_server, experiment=hand, model_name=hand))
    with pytest.raises(FileNotFoundError, match="carries the serving weights only"):
        run_stream(config)
    with pytest.raises(FileNotFoundError, match="no checkpoint there"):
        run_stream(replace(config, start=StreamStart(str(tmp_path / "nothing"))))
    with pytest.raises(ValueError, match="has no such version"):
        run_stream(replace(config, start=StreamStart("models:/no-such-model@champion")))
    assert latest_checkpoint(tmp_path / "checkpoints") is None
