"""Kafka messages → PackedBatch on one core, through the transforms `picasso stream` uses.

Every side reads the same messages of a topic from the same broker, with the same
consumer settings, and ends when it has handled all of them:
- raw: a bare consumer loop that only iterates the messages (the client's own cost: its
  transport, and an object per message), with confluent-kafka (librdkafka) and with
  kafka-python;
- picasso JSON: a bounded Beam pipeline on the FnApiRunner, ReadFromKafka → DecodeMessages
  → PackMessages, one JSON event per message (pipeline start-up included), as `picasso
  stream` runs it with each `--kafka-client`: kafka-python (its record batches taken
  whole, as columns: connectors.kafka_blocks) and confluent (librdkafka's queue);
- picasso Arrow: the same pipelines over Arrow IPC messages of 1,000 events each;
- naive: a kafka-python consumer, json.loads, a dict per row, validation and id hashing
  per value (memoised, which favours it), tensors per batch.

confluent_vs_kafka_python: picasso's JSON path with the confluent client over the same with
kafka-python (@arrow: the Arrow paths). json_vs_raw_consume: picasso's JSON path with the
confluent client over the bare confluent loop, the client alone.

The sides are timed in turns (see kafka_bench.timings_in_turns); each reports the median
wall time (the ratios) and the median CPU time of this process.
"""

from __future__ import annotations

import os
import time

import apache_beam as beam
import torch
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from kafka import TopicPartition

from benchmarks.harness import parse_args, report, sized
from benchmarks.kafka_bench import kafka_broker, pin_to_one_core, produce_all, timings_in_turns
from benchmarks.pack import python_rows_pack
from picasso.builtin_specs import criteo_spec
from picasso.connectors.kafka_clients import CONFLUENT
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.kafka_source import FETCH_SETTINGS, ReadFromKafka
from picasso.connectors.librdkafka_config import librdkafka_consumer_config
from picasso.connectors.decoding.message_formats import encode_arrow, encode_json
from picasso.packing import PackingPlan
from picasso.pipelines.transforms.decode import DecodeMessages
from picasso.pipelines.transforms.pack import PackMessages
from picasso.connectors.synthetic.planted import PlantedModel

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


def raw_confluent_consume(connection: KafkaConnection, topic: str, total: int) -> int:
    from confluent_kafka import Consumer, TopicPartition as ConfluentPartition

    config = librdkafka_consumer_config(connection, **FETCH_SETTINGS)  # the settings ReadFromKafka uses
    consumer = Consumer({**config, "group.id": "ingest-bench", "enable.auto.commit": False})
    consumer.assign([ConfluentPartition(topic, 0, 0)])
    seen = 0
    while seen < total:
        for _ in consumer.consume(BATCH, timeout=1.0):
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
        p.add_argument("--bootstrap", default=None, help="a Kafka broker; default: start a local Tansu")),
        smoke={"events": 2_000, "repeat": 1})
    spec = criteo_spec()
    plan = PackingPlan.from_spec(spec)
    table, _ = PlantedModel(spec).sample(args.events, stream=0)
    n = args.events
    with kafka_broker(args.bootstrap) as bootstrap:
        connection = KafkaConnection(bootstrap)
        confluent = KafkaConnection(bootstrap, client=CONFLUENT)
        suffix = str(int(time.time()))
        json_topic, arrow_topic = f"ingest-json-{suffix}", f"ingest-arrow-{suffix}"
        produce_all(connection, json_topic, encode_json(table))
        produce_all(connection, arrow_topic, encode_arrow(table, 1000))
        core = pin_to_one_core()

        for each in (connection, confluent):  # same input, all of it, first
            assert picasso_pipeline(each, json_topic, "json", spec) == n
            assert picasso_pipeline(each, arrow_topic, "arrow", spec) == n
        memo: dict = {}
        timings = timings_in_turns({
            "raw_consume": lambda: raw_confluent_consume(connection, json_topic, n),
            "raw_consume_kafka_python": lambda: raw_consume(connection, json_topic, n),
            "picasso_json": lambda: picasso_pipeline(confluent, json_topic, "json", spec),
            "picasso_json_kafka_python": lambda: picasso_pipeline(connection, json_topic, "json", spec),
            "picasso_arrow": lambda: picasso_pipeline(confluent, arrow_topic, "arrow", spec),
            "picasso_arrow_kafka_python": lambda: picasso_pipeline(connection, arrow_topic, "arrow", spec),
            "naive": lambda: naive_consume(connection, json_topic, n, spec, plan, memo),
        }, repeat=sized(args, max(3, args.repeat), args.repeat), only_first={"naive": 3})  # --smoke: 1 round

    rates = {name: n / timing.wall_s for name, timing in timings.items()}
    ratios = {
        "confluent_vs_kafka_python": rates["picasso_json"] / rates["picasso_json_kafka_python"],
        "confluent_vs_kafka_python@arrow": rates["picasso_arrow"] / rates["picasso_arrow_kafka_python"],
        "json_vs_raw_consume": rates["picasso_json"] / rates["raw_consume"],
        "arrow_vs_json": rates["picasso_arrow"] / rates["picasso_json"],
        "vs_naive_consumer": rates["picasso_json_kafka_python"] / rates["naive"],
    }
    metrics = {
        "json_events_per_s": rates["picasso_json"],
        "arrow_events_per_s": rates["picasso_arrow"],
        "json_events_per_s_kafka_python": rates["picasso_json_kafka_python"],
        "arrow_events_per_s_kafka_python": rates["picasso_arrow_kafka_python"],
        "raw_consume_events_per_s": rates["raw_consume"],
        "raw_consume_events_per_s_kafka_python": rates["raw_consume_kafka_python"],
        "naive_events_per_s": rates["naive"],
        "events": n,
        "pinned_core": core,
        # CPU time of this process (the broker's is not in it): steadier than wall time
        # on a machine shared with other work, which the load average tells.
        "cpu_us_per_event": {name: 1e6 * timing.cpu_s / n for name, timing in timings.items()},
        "load_average_1m": os.getloadavg()[0],
    }
    rows = [[name, rates[name], 1e6 / rates[name], 1e6 * timing.cpu_s / n] for name, timing in timings.items()]
    report("ingest", ["path", "events/s", "µs/event", "CPU µs/event"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
