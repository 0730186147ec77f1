"""Freshness: how old is the newest event a published model version has trained on?

A producer thread sends Criteo-shaped JSON events at a fixed rate while `picasso stream`
(the same StreamRunner the command runs) trains and publishes a version every
--publish-every seconds to an MLflow store. For each version, freshness is its publish time
minus the send time of the newest event in its checkpoint. Reported: p50 and p99 against
the publish interval; the targets are p50 ≤ 1.5 × interval + 5 s and p99 ≤ 3 × interval,
and each ratio is target / measured (≥ 1 meets it).

With --joined, the producer sends the planted model's impressions and delayed clicks
(picasso.connectors.synthetic.events) to two topics, paced in event time --speedup times faster than
the wall clock, and the stream joins them with W = --label-wait. A version then holds a
final label for every impression older than its join's watermark less W, so its age is
measured from there, in event time; the join's W is in it by design, and what is reported
against the targets is the age beyond W, in wall-clock seconds (event time / speedup).

Age says nothing of whether a version learned from the events it holds, so beside each
version's age is its prequential AUC (each batch scored before it was trained on, over
the batches since the version before), and the final version is set against a daily run
(pipelines.runs.daily, what `picasso daily` runs) on the very events the stream read, in
the same order and with the same batch size. In the joined case those are the
impressions with their planted labels, the last of which the stream still holds (waiting
W for their label, or in its sample buffer). Both models are scored on the same held-out
rows (--held-out-rows, HELD_OUT_ROWS by default) drawn from another stream of the planted
model, whose true probabilities give the ceiling. stream_auc_vs_daily is the stream's AUC less the daily
run's (the target: at least -0.01).
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from mlflow.tracking import MlflowClient

from benchmarks.endless_job import endless_versus_cycle
from benchmarks.harness import parse_args, print_table, report
from benchmarks.kafka_bench import kafka_broker
from benchmarks.movielens import evaluate_days, restored
from picasso import storage
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint
from picasso.connectors.day_files import partition_dir, write_part
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.decoding.message_formats import encode_json
from picasso.serving.publishing.contract import MLflowTarget
from picasso.durations import parse_duration_ms
from picasso.sample_join.join_spec import JoinSpec
from picasso.metrics import auc
from picasso.pipelines.runs.daily import DailyConfig, run_daily
from picasso.pipelines.runs.generate import dates_from
from picasso.pipelines.runs.joined_stream_state import JoinedTopics
from picasso.pipelines.runs.produce import EventTimePacer
from picasso.pipelines.runs.stream import StreamConfig, StreamRunner
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.connectors.synthetic.events import EVENT_TIME, REQUEST_ID, EventStreamConfig, make_event_stream
from picasso.trainer import TrainConfig

HELD_OUT_ROWS = 20_000
HELD_OUT_STREAM = 8  # the streams replay stream 7 of the planted model


def produce_at_rate(connection: KafkaConnection, topic: str, values: list[bytes], rate: float, stop: threading.Event):
    producer = connection.producer(linger_ms=5)
    started = time.perf_counter()
    for i, value in enumerate(values):
        if stop.is_set():
            break
        ahead = started + i / rate - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)
        producer.send(topic, value=value)
    producer.flush()
    producer.close()


def produce_events_in_event_time(connection: KafkaConnection, events: list[tuple[int, str, bytes]], speedup: float,
                                 stop: threading.Event, started: list[float]):
    """Send (event_ms, topic, value) in order, event time `speedup` times the wall clock;
    each message stamped with its event time. started gets the wall time of the first send."""
    producer = connection.producer(linger_ms=5)
    pacer = EventTimePacer(speedup)
    for event_ms, topic, value in events:
        if stop.is_set():
            break
        pacer.hold(event_ms)
        if not started:
            started.append(time.time())
        producer.send(topic, value=value, timestamp_ms=event_ms)
    producer.flush()
    producer.close()


def joined_freshness(args) -> None:
    spec = criteo_spec()
    wait_ms = parse_duration_ms(args.label_wait)
    event_rate = args.rate / args.speedup / 1.25  # impressions per event-time second; clicks add about a quarter
    rows = int(event_rate * args.seconds * args.speedup)
    start_ms = 1_780_000_000_000
    stream = make_event_stream(PlantedModel(spec), rows, stream=7,
                               config=EventStreamConfig(start_ms=start_ms, impressions_per_s=event_rate))
    with kafka_broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        connection = KafkaConnection(bootstrap)
        imps, labs = f"freshness-impressions-{int(time.time())}", f"freshness-clicks-{int(time.time())}"
        for topic in (imps, labs):
            ensure_topic(connection, topic, 1)
        events = sorted([(t, imps, v) for t, v in zip(stream.impressions.column("event_time_ms").to_pylist(),
                                                      encode_json(stream.impressions))]
                        + [(t, labs, v) for t, v in zip(stream.labels.column("event_time_ms").to_pylist(),
                                                        encode_json(stream.labels))], key=lambda e: e[0])
        workdir = Path(tmp)
        target = local_target(workdir)
        config = StreamConfig(connection=connection, topics={imps: "json", labs: "json"}, workdir=str(workdir),
                              spec=spec, mlflow=target, train=TrainConfig(device="cpu"),
                              publish_every_s=args.publish_every, idle_sleep_s=0.2, max_seconds=args.seconds,
                              joined=JoinedTopics(imps, labs, JoinSpec(wait_ms=wait_ms, late_labels=args.late_labels)))
        stop, started = threading.Event(), []
        producer = threading.Thread(target=produce_events_in_event_time,
                                    args=(connection, events, args.speedup, stop, started))
        producer.start()
        summary = StreamRunner(config).run()
        stop.set()
        producer.join()
        versions = [v for v in read_versions(config) if v.get("watermark_ms") is not None]
        aucs = logged_aucs(target, versions)
        # The daily run gets the impressions the stream read, with their planted labels.
        read = summary.ledger["partitions"][f"{imps}/0"]["next_position"]
        labelled = stream.impressions.drop([REQUEST_ID, EVENT_TIME]).append_column(spec.label,
                                                                                   stream.truth.column(spec.label))
        versus = versus_daily(spec, labelled.slice(0, read), versions[-1]["checkpoint"], workdir, target,
                              config.batch_messages, args.held_out_rows)
    first_ms = events[0][0]

    def event_time_at(wall_ms: int) -> float:
        return first_ms + (wall_ms / 1000 - started[0]) * args.speedup * 1000

    beyond = np.array([(event_time_at(v["published_ms"]) - v["watermark_ms"]) / args.speedup / 1000 for v in versions])
    interval = args.publish_every
    p50, p99 = float(np.percentile(beyond, 50)), float(np.percentile(beyond, 99))
    metrics = {
        "beyond_wait_p50_s": p50, "beyond_wait_p99_s": p99, "label_wait_s": wait_ms / 1000,
        "label_wait_wall_s": wait_ms / 1000 / args.speedup, "speedup": args.speedup,
        "age_p50_event_s": p50 * args.speedup + wait_ms / 1000, "age_p99_event_s": p99 * args.speedup + wait_ms / 1000,
        "publish_interval_s": interval, "versions": len(beyond), "samples_trained": summary.samples,
        "impressions_produced": rows, "cycles": summary.cycles, "rate_events_per_s": args.rate,
    }
    ratios = {"p50_target_over_measured": (1.5 * interval + 5) / p50, "p99_target_over_measured": 3 * interval / p99}
    rows_out = [["p50", p50, 1.5 * interval + 5], ["p99", p99, 3 * interval]]
    report_learning(versions, beyond, aucs, versus, "age beyond the label wait (wall s)", metrics, ratios)
    report("freshness (joined)", ["percentile", "age beyond the label wait (wall s)", "target (s)"], rows_out, ratios,
           metrics, args.json)


def read_versions(config: StreamConfig) -> list[dict]:
    """The stream's version log, one entry per version in order."""
    return [json.loads(line) for line in storage.read_text(config.folders.stream_versions).splitlines()]


def version_metrics(tracking_uri: str, model_name: str, version: str) -> dict[str, float]:
    """The metrics a published version's run logged."""
    client = MlflowClient(tracking_uri)
    return client.get_run(client.get_model_version(model_name, version).run_id).data.metrics


def logged_aucs(target: MLflowTarget, versions: list[dict]) -> list[tuple[float | None, int]]:
    """Each version's prequential AUC and the samples it was taken over (the batches since
    the version before, each scored before it was trained on)."""
    logged = [version_metrics(target.tracking_uri, target.model_name, v["version"]) for v in versions]
    # None where nothing was scored (a joined stream's first version, its buffer filling):
    # JSON has no NaN.
    return [(m["auc"] if math.isfinite(m.get("auc", math.nan)) else None, int(m.get("window_samples", 0)))
            for m in logged]


def report_learning(versions: list[dict], ages: np.ndarray, aucs: list[tuple[float | None, int]], versus: dict,
                    age_title: str, metrics: dict, ratios: dict) -> None:
    """Each version's age beside its AUC (a table), and the final version against daily
    (into metrics and ratios: stream_auc_vs_daily, higher is better)."""
    detail = [{"version": v["version"], "age_s": float(age), "prequential_auc": auc_, "window_samples": window}
              for v, age, (auc_, window) in zip(versions, ages, aucs)]
    print_table("each version: its age and what it had learned", ["version", age_title, "prequential AUC",
                                                                  "samples scored"],
                [[d["version"], d["age_s"], "-" if d["prequential_auc"] is None else f"{d['prequential_auc']:.4f}",
                  f"{d['window_samples']:,}"] for d in detail],
                caption=f"final version on {versus['held_out_rows']:,} held-out rows: AUC "
                        f"{versus['stream']['auc']:.4f}, daily on the same events {versus['daily']['auc']:.4f}, "
                        f"ceiling {versus['ceiling_auc']:.4f}")
    metrics.update(version_detail=detail, versus_daily=versus, stream_auc_vs_daily=versus["stream_auc_vs_daily"])
    ratios["stream_auc_vs_daily"] = versus["stream_auc_vs_daily"]


def versus_daily(spec, trained: pa.Table, stream_checkpoint: str, workdir: Path, target: MLflowTarget,
                 batch_size: int, held_out_rows: int) -> dict:
    """The stream's final model against a daily run on `trained` (the events it read,
    labelled, in its order), both scored on the same held-out rows of another stream."""
    train_day, held_day = dates_from("2026-11-01", 2)
    data = workdir / "daily-data"
    held_out, probabilities = PlantedModel(spec).sample(held_out_rows, stream=HELD_OUT_STREAM)
    for date, table in ((train_day, trained), (held_day, held_out)):
        write_part(table, Path(partition_dir(data, date)) / "part-00000.parquet")
    daily_dir = workdir / "daily"
    # The whole day trains (the held-out day evaluates), one chunk of batch_size a step, as
    # the stream's batches of batch_messages; no version: only its checkpoint is scored.
    run_daily(DailyConfig(data_root=str(data), date=train_day, workdir=str(daily_dir), spec=spec, mlflow=target,
                          train=TrainConfig(device="cpu"), batch_size=batch_size, eval_date=held_day, publish=False))
    scores = {}
    for name, checkpoint in (("stream", stream_checkpoint), ("daily", latest_checkpoint(daily_dir / "checkpoints"))):
        trainer = restored(spec, checkpoint)
        scores[name] = {"auc": evaluate_days(trainer, data, [held_day]).auc, "samples_trained": trainer.samples,
                        "steps": trainer.step}
    return {**scores, "held_out_rows": held_out_rows,
            "ceiling_auc": auc(held_out.column(spec.label).to_numpy(), probabilities),
            "stream_auc_vs_daily": scores["stream"]["auc"] - scores["daily"]["auc"]}


def local_target(workdir: Path) -> MLflowTarget:
    """An MLflow store of its own in workdir (SQLite)."""
    target = MLflowTarget(f"sqlite:///{workdir / 'mlflow.db'}", artifact_location=(workdir / "art").as_uri())
    MlflowClient(target.tracking_uri).search_experiments()  # create the store before the clock starts
    return target


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--publish-every", type=float, default=None, help="default 10 s; 5 s with --endless"),
        p.add_argument("--seconds", type=float, default=75.0, help="how long events are produced"),
        p.add_argument("--rate", type=float, default=2000.0, help="events per second"),
        p.add_argument("--bootstrap", default=None),
        p.add_argument("--held-out-rows", type=int, default=HELD_OUT_ROWS, help="rows both final models are scored on"),
        p.add_argument("--joined", action="store_true", help="impressions and delayed clicks, joined"),
        p.add_argument("--speedup", type=float, default=60.0, help="--joined: event time over wall time"),
        p.add_argument("--label-wait", default="15m", help="--joined: W"),
        p.add_argument("--late-labels", default="drop", choices=["drop", "correct"]),
        p.add_argument("--endless", action="store_true", help="the endless job beside the cycle stream "
                       "(benchmarks/endless_job.py): freshness, throughput, exactly-once under kills, memory"),
        p.add_argument("--endless-minutes", type=float, default=10.0, help="--endless: the memory run's length"),
        p.add_argument("--backlog", type=int, default=100_000, help="--endless: events waiting, for throughput"),
        p.add_argument("--batch-messages", type=int, default=1000, help="--endless: events a batch, both jobs"),
        p.add_argument("--startup-s", type=float, default=15.0, help="--endless: a job's start before events flow"),
        p.add_argument("--seed", type=int, default=0, help="--endless: when the kills land")),
        # --smoke: a few seconds of events and a version every 2 s, so that more than one is published.
        smoke={"seconds": 6.0, "rate": 500.0, "publish_every": 2.0, "held_out_rows": 2_000})
    if args.endless:
        args.publish_every = 5.0 if args.publish_every is None else args.publish_every
        endless_versus_cycle(args)
        return
    args.publish_every = 10.0 if args.publish_every is None else args.publish_every
    if args.joined:
        joined_freshness(args)
        return
    spec = criteo_spec()
    events = int(args.rate * args.seconds)
    table, _ = PlantedModel(spec).sample(events, stream=7)
    values = encode_json(table)
    with kafka_broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        connection = KafkaConnection(bootstrap)
        topic = f"freshness-{int(time.time())}"
        ensure_topic(connection, topic, 1)
        workdir = Path(tmp)
        target = local_target(workdir)
        config = StreamConfig(connection=connection, topics={topic: "json"}, workdir=str(workdir), spec=spec,
                              mlflow=target, train=TrainConfig(device="cpu"), publish_every_s=args.publish_every,
                              idle_sleep_s=0.2, max_seconds=args.seconds)
        stop = threading.Event()
        producer = threading.Thread(target=produce_at_rate, args=(connection, topic, values, args.rate, stop))
        producer.start()
        summary = StreamRunner(config).run()
        stop.set()
        producer.join()
        versions = [v for v in read_versions(config) if v["newest_event_ms"]]
        aucs = logged_aucs(target, versions)
        trained = summary.ledger["partitions"][f"{topic}/0"]["next_position"]  # the first events, in order
        versus = versus_daily(spec, table.slice(0, trained), versions[-1]["checkpoint"], workdir, target,
                              config.batch_messages, args.held_out_rows)

    ages = np.array([(v["published_ms"] - v["newest_event_ms"]) / 1000 for v in versions])
    interval = args.publish_every
    p50, p99 = float(np.percentile(ages, 50)), float(np.percentile(ages, 99))
    gaps = np.diff([v["published_ms"] / 1000 for v in versions])
    metrics = {
        "freshness_p50_s": p50, "freshness_p99_s": p99, "publish_interval_s": interval,
        "measured_publish_gap_s": float(np.median(gaps)) if len(gaps) else None,
        "versions": len(versions), "events_trained": summary.samples, "events_produced": events,
        "cycles": summary.cycles, "rate_events_per_s": args.rate,
    }
    ratios = {"p50_target_over_measured": (1.5 * interval + 5) / p50, "p99_target_over_measured": 3 * interval / p99}
    rows = [["p50", p50, 1.5 * interval + 5], ["p99", p99, 3 * interval]]
    report_learning(versions, ages, aucs, versus, "age of newest trained event (s)", metrics, ratios)
    report("freshness", ["percentile", "age of newest trained event (s)", "target (s)"], rows, ratios, metrics,
           args.json)


if __name__ == "__main__":
    main()
