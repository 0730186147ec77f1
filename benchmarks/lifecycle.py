"""Lifecycle: a backfill, then a stream that starts from its champion where its data ends.

For each seed (a planted model of its own, and the trainers' seed), `picasso daily`'s run
(pipelines.runs.daily) backfills --backfill-days days of the planted model's rows, one
version a day, into a local MLflow store. A topic holds the same days as messages stamped
within their day, and the day after them. Two streams (pipelines.runs.stream, what
`picasso stream` runs, until caught up) then read that topic:
- warm: `--warm-start champion --start-at after-model`: the backfill's champion, from the
  first message after its newest event (a daily version's: the end of its last partition);
- scratch: a new model from the same offsets (`--start-at` the warm stream's start time).
Both are scored on the day after the streamed one, which neither trained on.

Reported, per seed and over the seeds:
- handoff_auc_vs_scratch: the warm stream's AUC on the day after over the scratch
  stream's (the goal: at least 1.0), with its spread (min and max over the seeds);
- handoff_duplicates: messages the warm stream trained that the champion holds already
  (stamped at or before its newest event), plus any it trained twice;
- handoff_gap: messages after the champion's newest event the warm stream never trained.
Both are counted from the broker: each partition's records are read back with a client of
their own and their timestamps compared with the champion's newest event, against the
offsets the stream's ledger says it trained. The goal for both is 0.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from benchmarks.freshness import local_target
from benchmarks.harness import parse_args, report
from benchmarks.kafka_bench import kafka_broker
from benchmarks.movielens import evaluate_days, restored
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import checkpoint_metrics, latest_checkpoint
from picasso.connectors.day_files import partition_dir, write_part
from picasso.connectors.decoding.message_formats import encode_json
from picasso.connectors.kafka_config import KafkaConnection, ensure_topic, source_name
from picasso.connectors.partitions import partition_end_ms
from picasso.connectors.synthetic.planted import PlantedModel, SyntheticConfig
from picasso.pipelines.runs.daily import DailyConfig, run_daily
from picasso.pipelines.runs.generate import dates_from
from picasso.pipelines.runs.stream import StreamConfig, run_stream
from picasso.pipelines.runs.stream_start import StreamStart
from picasso.trainer import TrainConfig

FIRST_DAY = "2026-11-01"
PARTITIONS = 2


@dataclass(frozen=True)
class Handoff:
    """One seed's backfill and its two streams."""

    seed: int
    champion: str  # the backfill's champion version
    warm_auc: float
    scratch_auc: float
    messages: int  # what each stream trained
    duplicates: int
    gap: int


def stamp_ms(date: str, i: int, rows: int) -> int:
    """The i-th of a day's `rows` events, spread over the day (UTC)."""
    return partition_end_ms(date) - 86_400_000 + (i + 1) * (86_400_000 // (rows + 1))


def produce_days(connection: KafkaConnection, topic: str, days: list[tuple[str, object]]) -> None:
    producer = connection.producer(linger_ms=5)
    for date, table in days:
        for i, value in enumerate(encode_json(table)):
            producer.send(topic, value=value, partition=i % PARTITIONS, timestamp_ms=stamp_ms(date, i, len(table)))
    producer.flush()
    producer.close()


def broker_counts(bootstrap: str, topic: str, newest_ms: int) -> dict[str, tuple[int, int]]:
    """Per source, read back from the broker record by record: the first offset stamped
    after newest_ms (the end where none is), and the end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    first, ends = {}, {}
    for record in consumer:
        source = source_name(topic, record.partition)
        ends[source] = record.offset + 1
        if record.timestamp > newest_ms:
            first.setdefault(source, record.offset)
    consumer.close()
    return {source: (first.get(source, end), end) for source, end in ends.items()}


def duplicates_and_gap(counts: dict[str, tuple[int, int]], ledger: dict) -> tuple[int, int]:
    """What the stream's ledger says it trained, [start, next_position) a source, against the broker."""
    duplicates = gap = 0
    for source, (first_after, end) in counts.items():
        trained = ledger["partitions"].get(source, {"start": end, "next_position": end, "messages": 0})
        start, stop = trained["start"], trained["next_position"]
        duplicates += max(0, first_after - start) + max(0, trained["messages"] - (stop - start))
        gap += max(0, start - first_after) + max(0, end - stop)
    return duplicates, gap


def held_out_auc(spec, checkpoint: str, data: Path, date: str) -> float:
    return evaluate_days(restored(spec, checkpoint), data, [date]).auc


def handoff(seed: int, args, bootstrap: str, workdir: Path) -> Handoff:
    spec = criteo_spec()
    planted = PlantedModel(spec, SyntheticConfig(seed=seed))
    days = dates_from(FIRST_DAY, args.backfill_days + 2)
    backfilled, streamed, held_out = days[:-2], days[-2], days[-1]
    tables = {date: planted.sample(args.rows_per_day, stream=i)[0] for i, date in enumerate(days)}
    data, target = workdir / "days", local_target(workdir)
    for date in (*backfilled, held_out):
        write_part(tables[date], Path(partition_dir(data, date)) / "part-00000.parquet")
    train = TrainConfig(device="cpu", seed=seed)
    versions = [run_daily(DailyConfig(data_root=str(data), date=date, workdir=str(workdir / "backfill"), spec=spec,
                                      mlflow=target, train=train, runner="FnApiRunner")) for date in backfilled]

    connection = KafkaConnection(bootstrap)
    topic = f"lifecycle-{seed}-{int(time.time())}"
    ensure_topic(connection, topic, PARTITIONS)
    produce_days(connection, topic, [(date, tables[date]) for date in (*backfilled, streamed)])

    def stream(name: str, start: StreamStart) -> dict:
        config = StreamConfig(connection=connection, topics={topic: "json"}, workdir=str(workdir / name), spec=spec,
                              mlflow=None, train=train, until_caught_up=True, start=start,
                              warm_start_target=target, group_id=f"lifecycle-{name}")
        run_stream(config)
        checkpoint = latest_checkpoint(workdir / name / "checkpoints")
        return {"checkpoint": checkpoint, "ledger": checkpoint_metrics(checkpoint)["ledger"]}

    warm = stream("warm", StreamStart("champion", "after-model"))
    made = warm["ledger"]["start"]["warm_start"]
    newest = made["newest_event_ms"]
    scratch = stream("scratch", StreamStart(None, str(newest + 1)))  # the same offsets, a new model
    assert scratch["ledger"]["start"]["positions"] == warm["ledger"]["start"]["positions"]
    duplicates, gap = duplicates_and_gap(broker_counts(bootstrap, topic, newest), warm["ledger"])
    return Handoff(seed, f"{made['version']} of {[v.version for v in versions]}",
                   held_out_auc(spec, warm["checkpoint"], data, held_out),
                   held_out_auc(spec, scratch["checkpoint"], data, held_out),
                   sum(p["messages"] for p in warm["ledger"]["partitions"].values()), duplicates, gap)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--seeds", type=int, default=3, help="planted models (and trainer seeds), one handoff each"),
        p.add_argument("--backfill-days", type=int, default=3),
        p.add_argument("--rows-per-day", type=int, default=20_000),
        p.add_argument("--bootstrap", default=None, help="a Kafka broker (default: a Tansu broker started here)")),
        smoke={"seeds": 1, "backfill_days": 1, "rows_per_day": 500})
    handoffs = []
    with kafka_broker(args.bootstrap) as bootstrap:
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                handoffs.append(handoff(seed, args, bootstrap, Path(tmp)))
    ratios_by_seed = [h.warm_auc / h.scratch_auc for h in handoffs]
    rows = [[h.seed, h.champion, f"{h.warm_auc:.4f}", f"{h.scratch_auc:.4f}", f"{r:.4f}", h.messages, h.duplicates,
             h.gap] for h, r in zip(handoffs, ratios_by_seed)]
    ratio = statistics.median(ratios_by_seed)
    metrics = {"handoff_auc_vs_scratch_min": min(ratios_by_seed), "handoff_auc_vs_scratch_max": max(ratios_by_seed),
               "handoff_duplicates": sum(h.duplicates for h in handoffs), "handoff_gap": sum(h.gap for h in handoffs),
               "seeds": args.seeds, "backfill_days": args.backfill_days, "rows_per_day": args.rows_per_day,
               "per_seed": [h.__dict__ for h in handoffs]}
    report("lifecycle", ["seed", "champion (of versions)", "warm AUC", "scratch AUC", "warm / scratch",
                         "messages streamed", "duplicates", "gap"], rows,
           {"handoff_auc_vs_scratch": ratio}, metrics, args.json,
           caption=f"AUC on the day after the streamed one; median over {args.seeds} seeds "
                   f"{ratio:.4f} (min {min(ratios_by_seed):.4f}, max {max(ratios_by_seed):.4f}); duplicates and gap "
                   f"summed over the seeds, counted from the broker")


if __name__ == "__main__":
    main()
