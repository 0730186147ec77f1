"""MovieLens-100k through Kafka, `picasso produce` and `picasso stream`, against `picasso
daily --dates` on the same rows (`python -m benchmarks.movielens --stream`).

The rows are those a daily run trains on (every training day of benchmarks.movielens'
temporal split, less the slice its holdout hash holds out), in the daily run's order: day
by day, by time within a day. Through a real broker (a Tansu process, as
benchmarks.kafka_bench starts one, or --bootstrap), three streams train on them:

- plain: `picasso produce --topic` replays the rows as labelled JSON events and `picasso
  stream --topic` trains on them;
- joined, once with `--late-labels correct` and once with `drop`: each rating is an
  impression at its time stamp, and each positive a label event after a delay drawn from a
  heavy-tailed mixture (DELAY_MIXTURE: 60% within 2 minutes, 30% within 30, 10% 1 to 6
  hours). `picasso produce --impressions-topic --labels-topic` replays both in event time
  and `picasso stream --impressions --labels --label-wait 30m` joins them. The spec's join
  section remembers an impression for 6 hours (W + its horizon of 5h30m), so that
  `correct` sees the 10% that come after W; with the default horizon (W) every one of
  them would be an orphan, and correct would train exactly what drop trains.

The topics are filled before a stream starts, and it runs until it is caught up (one
cycle, or more with --max-cycle-messages), so every figure is a function of the data and
the settings, not of timing. Each stream publishes one version, at the end; its
checkpoint and the daily model are scored on every row of the test days. Every run takes
the same settings: the defaults, and one batch size (--batch-size: daily's --batch-size,
the streams' --batch-messages).

The daily model is benchmarks.movielens' driver, which trains what `picasso daily --dates`
trains bit for bit; --daily-cli runs the command as well and reports whether its weights
are the same. Reported (the higher, the better for the stream): stream_auc_vs_daily,
joined_auc_vs_daily (correct) and joined_drop_auc_vs_daily, each the stream's test AUC
less the daily model's.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from benchmarks import movielens as ml
from benchmarks.backfill import kernels_ready, picasso
from benchmarks.freshness import version_metrics
from benchmarks.harness import report
from benchmarks.kafka_bench import kafka_broker
from picasso.connectors.day_files import partition_dir, write_part
from picasso.durations import parse_duration_ms
from picasso.pipelines.transforms.decode import holdout_mask
from picasso.spec_refs import load_spec
from picasso.connectors.synthetic.events import EVENT_TIME, IMPRESSIONS, LABELS, REQUEST_ID
from picasso.trainer import EvalMetrics, TrainConfig, Trainer

MINUTE, HOUR = 60_000, 3_600_000
# (share of the labels, shortest delay, longest delay), in ms; uniform within each band
DELAY_MIXTURE = ((0.6, 1, 2 * MINUTE), (0.3, 2 * MINUTE, 30 * MINUTE), (0.1, HOUR, 6 * HOUR))
LABEL_WAIT = "30m"
# run -> (its figure: test AUC less the daily model's, its row's title)
RUNS = {"plain": ("stream_auc_vs_daily", "picasso stream --topic (true labels)"),
        "correct": ("joined_auc_vs_daily", f"joined, W={LABEL_WAIT}, --late-labels correct"),
        "drop": ("joined_drop_auc_vs_daily", f"joined, W={LABEL_WAIT}, --late-labels drop")}
DELAY_SEED = 34
PART = "part-00000.parquet"


# -- the rows and events a stream replays --------------------------------------------------


def trained_rows(rows: pd.DataFrame, root: str | Path, dates: list[str], holdout: float) -> dict[str, pd.DataFrame]:
    """Per date, the rows a daily run trains on, in its order: the day's file (as
    movielens.write_days wrote it) less the rows its holdout hash holds out."""
    days = {}
    for date in dates:
        day = ml.on_days(rows, [date])
        held = holdout_mask(str(Path(partition_dir(root, date)) / PART), 0, len(day), holdout)
        days[date] = day[~held]
    return days


def write_labelled(days: dict[str, pd.DataFrame], out: Path) -> None:
    """What `picasso produce --topic` replays: the rows with their labels."""
    for date, day in days.items():
        write_part(pa.Table.from_pandas(day[["label", *ml.FIELDS]], preserve_index=False),
                   Path(partition_dir(out, date)) / PART)


def label_delays(rng: np.random.Generator, count: int) -> np.ndarray:
    shares, shortest, longest = (np.array(column) for column in zip(*DELAY_MIXTURE))
    band = rng.choice(len(DELAY_MIXTURE), size=count, p=shares)
    return rng.integers(shortest[band], longest[band] + 1)


def write_events(days: dict[str, pd.DataFrame], out: Path) -> np.ndarray:
    """What `picasso produce --impressions-topic --labels-topic` replays (the trees of
    `picasso generate --events`): per date, an impression per rating at its time stamp and
    a label event per positive after its delay, each tree in event-time order within a
    date (the replay merges the dates). Returns every delay."""
    rng = np.random.default_rng(DELAY_SEED)
    delays = []
    for date, day in days.items():
        times = day["timestamp"].to_numpy() * 1000
        ids = np.array([f"{date}/{i}" for i in range(len(day))], dtype=object)
        impressions = day[list(ml.FIELDS)].assign(**{REQUEST_ID: ids, EVENT_TIME: times})
        write_part(pa.Table.from_pandas(impressions, preserve_index=False),
                   Path(partition_dir(out / IMPRESSIONS, date)) / PART)
        positives = np.flatnonzero(day["label"].to_numpy() > 0.5)
        delay = label_delays(rng, len(positives))
        order = np.argsort(times[positives] + delay, kind="stable")
        labels = pd.DataFrame({REQUEST_ID: ids[positives][order], EVENT_TIME: (times[positives] + delay)[order],
                               "label": np.ones(len(positives), dtype=np.int64)})
        write_part(pa.Table.from_pandas(labels, preserve_index=False), Path(partition_dir(out / LABELS, date)) / PART)
        delays.append(delay)
    return np.concatenate(delays)


# -- the runs ------------------------------------------------------------------------------


def stream(run: str, bootstrap: str, scratch: Path, dates: list[str], batch_size: int,
           max_cycle_messages: int | None, env: dict[str, str]) -> dict:
    """Fill the run's topics with `picasso produce`, then `picasso stream` them until caught
    up (each a process in `env`); the stream's summary (its last version, checkpoint, counts)."""
    suffix = f"{run}-{int(time.time())}"  # fresh topics on a broker given with --bootstrap too
    when = [flag for date in dates for flag in ("--date", date)]
    kafka = ["--bootstrap-servers", bootstrap]
    if run == "plain":
        topics = [f"movielens-{suffix}"]
        picasso(env, "produce", "--data", str(scratch / "labelled"), *when, "--topic", topics[0], *kafka)
        reads = ["--topic", topics[0]]
    else:
        topics = [f"movielens-impressions-{suffix}", f"movielens-labels-{suffix}"]
        picasso(env, "produce", "--data", str(scratch / "events"), *when, "--impressions-topic", topics[0],
                "--labels-topic", topics[1], *kafka)
        reads = ["--impressions", topics[0], "--labels", topics[1], "--label-wait", LABEL_WAIT, "--late-labels", run]
    cap = ["--max-cycle-messages", str(max_cycle_messages)] if max_cycle_messages else []
    # One version, when the stream is caught up: publish-every is longer than the run.
    summary, _, seconds = picasso(env, "stream", "--spec", str(ml.SPEC_PATH), *reads, *kafka, *cap,
                                  "--workdir", str(scratch / f"stream-{run}"), "--group-id", f"movielens-{suffix}",
                                  "--batch-messages", str(batch_size), "--until-caught-up",
                                  "--publish-every", "86400", "--device", "cpu")
    return {**summary, "wall_s": seconds}


def _row(name: str, trainer: Trainer, m: EvalMetrics, daily: EvalMetrics) -> list:
    return [name, f"{trainer.samples:,}", str(trainer.step), f"{m.auc:.4f}", f"{m.auc - daily.auc:+.4f}",
            f"{m.logloss:.4f}", f"{m.mean_prediction:.3f}"]


def stream_benchmark(args, rows: pd.DataFrame, split: ml.Split, root: str, scratch: Path) -> None:
    spec = load_spec(ml.SPEC_PATH)
    runs = [run.strip() for run in args.runs.split(",")]
    unknown = set(runs) - set(RUNS)
    if unknown:
        raise SystemExit(f"--runs: unknown {', '.join(sorted(unknown))} (choose from {', '.join(RUNS)})")
    settings = ml.DailySettings(batch_size=args.batch_size)
    days = trained_rows(rows, root, split.train, settings.holdout_fraction)
    write_labelled(days, scratch / "labelled")
    delays = write_events(days, scratch / "events")

    env, _ = kernels_ready()  # every `picasso` process below loads the kernels built here
    started = time.perf_counter()
    daily = ml.train_daily(root, spec, split.train, TrainConfig(device="cpu", log_every=0), settings)
    daily_s = time.perf_counter() - started
    daily_test = ml.evaluate_days(daily, root, split.test)
    late = float(np.mean(delays > parse_duration_ms(LABEL_WAIT)))
    delays_p50, delays_p99 = (float(np.percentile(delays, q)) / 1000 for q in (50, 99))
    metrics = {"daily": {**vars(daily_test), "samples_trained": daily.samples, "steps": daily.step, "seconds": daily_s},
               "batch_size": args.batch_size, "label_wait": LABEL_WAIT,
               "label_delays": {"share_after_wait": late, "p50_s": delays_p50, "p99_s": delays_p99},
               "split": {"train_days": len(split.train), "test_days": len(split.test),
                         "first_test_day": split.test[0], "test_rows": daily_test.samples}}
    table = [_row("picasso daily --dates (driver)", daily, daily_test, daily_test)]
    if args.daily_cli:
        cli = ml.cli_daily(root, ml.SPEC_PATH, split.train, scratch / "daily-cli", settings, env)
        metrics["daily_cli_identical"] = ml.same_weights(cli, daily)
    ratios = {}
    with kafka_broker(args.bootstrap) as bootstrap:
        for run in runs:
            summary = stream(run, bootstrap, scratch, split.train, args.batch_size, args.max_cycle_messages, env)
            trainer = ml.restored(spec, summary["checkpoint"])
            test = ml.evaluate_days(trainer, root, split.test)
            key, name = RUNS[run]
            ratios[key] = test.auc - daily_test.auc
            facts = {"samples_emitted": summary["samples"], "samples_trained": trainer.samples, "steps": trainer.step,
                     "cycles": summary["cycles"], "dead_letters": summary["dead_letters"], "seconds": summary["wall_s"]}
            if run != "plain":  # the join's counts, as the version logged them (not its per-cycle series)
                logged = version_metrics(summary["tracking_uri"], "picasso-ctr", summary["versions"][-1])
                facts["join"] = {k.removeprefix("join."): v for k, v in logged.items()
                                 if k.startswith("join.") and not k.startswith("join.cycle.")}
            metrics[run] = {**vars(test), **facts}
            table.append(_row(name, trainer, test, daily_test))
    metrics.update(ratios)
    report(f"movielens-100k streamed: the last {len(split.test)} days ({split.test[0]}..{split.test[-1]})",
           ["run", "trained samples", "steps", "test AUC", "vs daily", "test log loss", "mean prediction"],
           table, ratios, metrics, args.json,
           caption=f"batch size {args.batch_size} in every run; label delays p50 {delays_p50:.0f} s, p99 "
                   f"{delays_p99 / 3600:.1f} h, {late:.1%} after W={LABEL_WAIT}"
                   + (f"; `picasso daily --dates` identical to the driver: {metrics['daily_cli_identical']}"
                      if args.daily_cli else ""))


def add_stream_args(parser) -> None:
    stream = parser.add_argument_group("--stream: the same rows through Kafka and `picasso stream`")
    stream.add_argument("--stream", action="store_true",
                        help="replay the training days through produce and stream, against daily on the same rows")
    stream.add_argument("--runs", default=",".join(RUNS), help=f"a subset of {','.join(RUNS)}")
    stream.add_argument("--batch-size", type=int, default=ml.DailySettings.batch_size,
                        help="daily's --batch-size and the streams' --batch-messages")
    stream.add_argument("--max-cycle-messages", type=int, default=None, help="cut each stream into more cycles")
    stream.add_argument("--bootstrap", default=None, help="a Kafka broker (default: a Tansu process started here)")
    stream.add_argument("--daily-cli", action="store_true",
                        help="also run `picasso daily --dates` and check that it trains what the driver trains")

