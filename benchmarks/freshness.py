"""Freshness: how old is the newest event a published model version has trained on?

A producer thread sends Criteo-shaped JSON events at a fixed rate while `picasso stream`
(the same StreamRunner the command runs) trains and publishes a version every
--publish-every seconds to an MLflow store. For each version, freshness is its publish time
minus the send time of the newest event in its checkpoint. Reported: p50 and p99 against
the publish interval; the targets are p50 ≤ 1.5 × interval + 5 s and p99 ≤ 3 × interval,
and each ratio is target / measured (≥ 1 meets it).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import parse_args, report
from benchmarks.kafka_bench import kafka_broker
from picasso.builtin_specs import criteo_spec
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.message_formats import encode_json
from picasso.connectors.mlflow_registry import MLflowTarget
from picasso.pipelines.stream import StreamConfig, StreamRunner
from picasso.synthetic import PlantedModel
from picasso.trainer import TrainConfig


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


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--publish-every", type=float, default=10.0),
        p.add_argument("--seconds", type=float, default=75.0, help="how long events are produced"),
        p.add_argument("--rate", type=float, default=2000.0, help="events per second"),
        p.add_argument("--bootstrap", default=None)))
    spec = criteo_spec()
    events = int(args.rate * args.seconds)
    table, _ = PlantedModel(spec).sample(events, stream=7)
    values = encode_json(table)
    with kafka_broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        connection = KafkaConnection(bootstrap)
        topic = f"freshness-{int(time.time())}"
        ensure_topic(connection, topic, 1)
        workdir = Path(tmp)
        target = MLflowTarget(f"sqlite:///{workdir / 'mlflow.db'}", artifact_location=(workdir / "art").as_uri())
        from mlflow.tracking import MlflowClient

        MlflowClient(target.tracking_uri).search_experiments()  # create the store before the clock starts
        config = StreamConfig(connection=connection, topics={topic: "json"}, workdir=str(workdir), spec=spec,
                              mlflow=target, train=TrainConfig(device="cpu"), publish_every_s=args.publish_every,
                              idle_sleep_s=0.2, max_seconds=args.seconds)
        stop = threading.Event()
        producer = threading.Thread(target=produce_at_rate, args=(connection, topic, values, args.rate, stop))
        producer.start()
        summary = StreamRunner(config).run()
        stop.set()
        producer.join()
        versions = [json.loads(line) for line in config.versions_path.read_text().splitlines()]

    ages = np.array([(v["published_ms"] - v["newest_event_ms"]) / 1000 for v in versions if v["newest_event_ms"]])
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
    report("freshness", ["percentile", "age of newest trained event (s)", "target (s)"], rows, ratios, metrics,
           args.json)


if __name__ == "__main__":
    main()
