"""Kafka messages → PackedBatch on one core, through the transforms `picasso stream` uses.

Every side reads the same messages of a topic from the same broker, with the same
consumer settings, and ends when it has handled all of them:
- raw: a bare kafka-python loop that only iterates the messages (the client's own cost);
- picasso JSON: a bounded Beam pipeline on the FnApiRunner, ReadFromKafka → DecodeMessages
  → PackMessages, one JSON event per message (pipeline start-up included);
- picasso Arrow: the same pipeline over Arrow IPC messages of 1,000 events each;
- naive: a kafka-python consumer, json.loads, a dict per row, validation and id hashing
  per value (memoised, which favours it), tensors per batch.
"""

from __future__ import annotations

import time

import apache_beam as beam
import torch
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from kafka import TopicPartition

from benchmarks.harness import median_seconds, parse_args, report
from benchmarks.kafka_bench import kafka_broker, pin_to_one_core, produce_all
from benchmarks.pack import python_rows_pack
from picasso.builtin_specs import criteo_spec
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_source import FETCH_SETTINGS, ReadFromKafka
from picasso.connectors.message_formats import encode_arrow, encode_json
from picasso.packing import PackingPlan
from picasso.pipelines.decode_messages import DecodeMessages, PackMessages
from picasso.synthetic import PlantedModel

BATCH = 1000  # messages per element / per naive batch


class _CountSamples(beam.DoFn):
    def setup(self):
        self.samples = Metrics.counter("bench", "samples")

    def process(self, packed):
        self.samples.inc(packed.batch.num_samples)


def picasso_pipeline(connection: KafkaConnection, topic: str, fmt: str, spec) -> int:
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    (pipeline
     | ReadFromKafka.bounded(connection, [topic], max_messages=BATCH)
     | DecodeMessages(spec, {topic: fmt})).chunks | PackMessages(spec) | beam.ParDo(_CountSamples())
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("samples"))["counters"]
    return sum(c.committed for c in counters)


def _consumer(connection: KafkaConnection, topic: str):
    consumer = connection.consumer(**FETCH_SETTINGS)  # the settings ReadFromKafka uses
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    return consumer, tp


def raw_consume(connection: KafkaConnection, topic: str, total: int) -> int:
    consumer, tp = _consumer(connection, topic)
    seen = 0
    while seen < total:
        for record in consumer.poll(timeout_ms=1000, max_records=BATCH).get(tp, []):
            seen += 1
    consumer.close()
    return seen


def naive_consume(connection: KafkaConnection, topic: str, total: int, spec, plan, memo: dict) -> int:
    import json

    consumer, tp = _consumer(connection, topic)
    seen = samples = 0
    while seen < total:
        rows = [json.loads(record.value) for record in consumer.poll(timeout_ms=1000, max_records=BATCH).get(tp, [])]
        seen += len(rows)
        if rows:
            arrays = python_rows_pack(spec, plan, rows, memo)
            tensors = {name: torch.from_numpy(values) for name, values in arrays.items()}
            samples += tensors["label"].shape[0]
    consumer.close()
    return samples


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--events", type=int, default=200_000),
        p.add_argument("--bootstrap", default=None, help="a Kafka broker; default: start a local Tansu")))
    spec = criteo_spec()
    plan = PackingPlan.from_spec(spec)
    table, _ = PlantedModel(spec).sample(args.events, stream=0)
    n = args.events
    with kafka_broker(args.bootstrap) as bootstrap:
        connection = KafkaConnection(bootstrap)
        suffix = str(int(time.time()))
        json_topic, arrow_topic = f"ingest-json-{suffix}", f"ingest-arrow-{suffix}"
        produce_all(connection, json_topic, encode_json(table))
        produce_all(connection, arrow_topic, encode_arrow(table, 1000))
        core = pin_to_one_core()

        assert picasso_pipeline(connection, json_topic, "json", spec) == n  # same input, all of it, first
        assert picasso_pipeline(connection, arrow_topic, "arrow", spec) == n
        repeat = max(3, args.repeat)
        raw_s = median_seconds(lambda: raw_consume(connection, json_topic, n), repeat)
        json_s = median_seconds(lambda: picasso_pipeline(connection, json_topic, "json", spec), repeat)
        arrow_s = median_seconds(lambda: picasso_pipeline(connection, arrow_topic, "arrow", spec), repeat)
        memo: dict = {}
        naive_s = median_seconds(lambda: naive_consume(connection, json_topic, n, spec, plan, memo), 3)

    rates = {"raw_consume": n / raw_s, "picasso_json": n / json_s, "picasso_arrow": n / arrow_s, "naive": n / naive_s}
    ratios = {
        "json_vs_raw_consume": rates["picasso_json"] / rates["raw_consume"],
        "arrow_vs_json": rates["picasso_arrow"] / rates["picasso_json"],
        "vs_naive_consumer": rates["picasso_json"] / rates["naive"],
    }
    metrics = {
        "json_events_per_s": rates["picasso_json"],
        "arrow_events_per_s": rates["picasso_arrow"],
        "raw_consume_events_per_s": rates["raw_consume"],
        "naive_events_per_s": rates["naive"],
        "events": n,
        "pinned_core": core,
    }
    rows = [[name, rate, 1e6 / rate] for name, rate in rates.items()]
    report("ingest", ["path", "events/s", "µs/event"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
