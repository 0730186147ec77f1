"""The `picasso` command line as a user runs it, against the in-process trainer.

The same generated Criteo rows (39 fields: PlantedModel stream 0, as benchmarks.train
draws them) go through each command as a process of its own:
- daily: `picasso daily` on a day partition of Parquet rows, scored on a small day of its
  own (--eval-date), so that every row of the partition trains and the scoring is the
  same for every size;
- cycle stream: `picasso stream --until-caught-up` on a topic of JSON messages (one row
  each), and again on a topic of Arrow messages (BATCH rows each);
- endless job: `picasso stream --endless` on the JSON topic, a checkpoint every second.
Each runs on --rows rows and on --small-rows rows, each in a fresh workdir, so that
rate = (N - n) / (T_N - T_n) samples/s is what a row costs past the command's fixed cost,
and fixed cost = T_n - n / rate (imports, kernels, Beam's start, the broker, MLflow) is
reported apart. --small-rows 0 runs each command once, on N: the line then goes through
(0, 0 s), so the rate holds the fixed cost and the fixed cost reads 0 (--smoke does this:
each process costs seconds of start-up). --repeat R (default 1) runs every command R times,
in rounds that take turns, and takes the medians.

What is timed: for daily and the cycle stream, the process from spawn to exit (it ends
once everything is trained, checkpointed and its one version published); for the endless
job, from spawn until its newest checkpoint holds every message (benchmarks.endless_job's
test, polled 4 times a second), after which it is stopped with SIGTERM, untimed. Not
timed: drawing the rows, writing the partitions, filling the topics, the C++ kernels'
build (made once before any run, then loaded by every process, as benchmarks.backfill
does) and each workdir's MLflow store (a SQLite file made beforehand, benchmarks.freshness
local_target: a one-off of a workdir's first run, which a daily job pays once).

Beside them, in this process: benchmarks.train's picasso trainer (decode, pack, train
past its warm-up batches) and the dense part alone, on the same rows. Every contender has
the same model and training settings (benchmarks.train's: Wide&Deep, MLPs 256-128, batch
1024, element-wise Adagrad), no hot-row cache, the CPU, and one precision (--precision,
passed to the commands).

Also: `picasso --version`'s wall time (the median of a few runs, after one untimed), and
`picasso daily`'s on a one-row partition (its fixed cost as a user sees it).

Ratios (samples/s over samples/s, past the fixed costs): daily_vs_trainer,
stream_vs_daily (the cycle stream on JSON), stream_arrow_vs_daily, endless_vs_daily; and
each goal over its figure for the seconds (target_over_version_s,
target_over_daily_one_row_s, cycle_over_endless_fixed_cost).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from benchmarks.backfill import kernels_ready, picasso
from benchmarks.endless_job import start_job, stop_job, wait_trained
from benchmarks.freshness import local_target
from benchmarks.harness import median_seconds, parse_args, report, sized
from benchmarks.kafka_bench import kafka_broker, produce_all
from benchmarks.train import BATCH, WARMUP_BATCHES, Data, run_dense_only, run_picasso, train_config
from picasso.builtin_specs import criteo_spec
from picasso.connectors.day_files import partition_dir, write_part
from picasso.connectors.decoding.message_formats import encode_arrow, encode_json
from picasso.connectors.kafka_config import KafkaConnection
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.pipelines.cli.train_args import MODEL_FLAGS, flag_value
from picasso.pipelines.runs.generate import dates_from
from picasso.precision import DENSE_PRECISIONS

MODEL = "wide_deep"
RUNNER = "FnApiRunner"  # FACTS.md: the default runner tries a download first
CLI = [sys.executable, "-m", "picasso.pipelines.cli"]  # what benchmarks.backfill.picasso runs
FIRST_DAY = "2026-11-01"
EVAL_ROWS = 2_000  # the evaluation day: small, and the same for every size
VERSION_RUNS = 5
GOALS = {"daily_vs_trainer": 0.85, "stream_vs_daily": 0.9, "endless_vs_daily": 0.9, "daily_one_row_s": 3.0,
         "version_s": 0.5}


@dataclass(frozen=True)
class Days:
    """The partitions the daily runs read, by date."""

    root: Path
    by_rows: dict[int, str]  # rows -> the date of a partition that holds that many
    eval_date: str


@dataclass(frozen=True)
class Topics:
    """The topics the streams read: (format, rows) -> a topic that holds those rows."""

    bootstrap: str
    by_format_rows: dict[tuple[str, int], str]


@dataclass(frozen=True)
class PastFixedCost:
    """One command's wall times on N and on n rows, and what they give."""

    rows: int
    small_rows: int
    seconds: float
    small_seconds: float

    @property
    def samples_per_s(self) -> float:
        # The noise of a busy machine (or a smoke size) can make the larger run no slower.
        return over(self.rows - self.small_rows, max(self.seconds - self.small_seconds, 0.0))

    @property
    def fixed_cost_s(self) -> float:
        return self.small_seconds - over(self.small_rows, self.samples_per_s)


def over(a: float, b: float) -> float:
    """a / b, NaN where b is 0: a figure the run could not give, not a crash at the end."""
    return a / b if b else float("nan")


def model_flags(precision: str) -> list[str]:
    """benchmarks.train's model and training settings as the commands' flags, read from the
    same TrainConfig, so that they cannot drift apart; no hot-row cache, on the CPU."""
    config = train_config(MODEL, precision)
    flags = [item for flag in MODEL_FLAGS
             for item in ("--" + flag.replace("_", "-"), flag_value(flag, getattr(config, flag)))]
    return [*flags, "--device", "cpu", "--cache-capacity", "off"]


def write_days(root: Path, rows: pa.Table, sizes: list[int], held_out: pa.Table) -> Days:
    """A partition of the first `size` rows for each size, and the evaluation day."""
    dates = dates_from(FIRST_DAY, len(sizes) + 1)
    for date, size in zip(dates, sizes):
        write_part(rows.slice(0, size), Path(partition_dir(root, date)) / "part-00000.parquet")
    write_part(held_out, Path(partition_dir(root, dates[-1])) / "part-00000.parquet")
    return Days(root, dict(zip(sizes, dates)), dates[-1])


def fill_topics(bootstrap: str, rows: pa.Table, sizes: list[int]) -> Topics:
    """A topic of JSON and one of Arrow messages for each size (the first `size` rows),
    with the encoders `picasso produce` uses."""
    connection, stamp = KafkaConnection(bootstrap), int(time.time())
    topics = {}
    for size in sizes:
        part = rows.slice(0, size)
        for fmt, values in (("json", encode_json(part)), ("arrow", encode_arrow(part, BATCH))):
            topic = f"cli-{fmt}-{size}-{stamp}"
            produce_all(connection, topic, values)
            topics[fmt, size] = topic
    return Topics(bootstrap, topics)


def checked(name: str, trained: int, rows: int) -> None:
    if trained != rows:  # a contender that trained less would look faster
        raise RuntimeError(f"{name} trained {trained:,} samples of {rows:,}")


def daily_seconds(days: Days, rows: int, workdir: Path, flags: list[str]) -> float:
    local_target(workdir)
    out, _, seconds = picasso(dict(os.environ), "daily", "--data", str(days.root), "--date", days.by_rows[rows],
                              "--eval-date", days.eval_date, "--workdir", str(workdir), "--batch-size", str(BATCH),
                              "--runner", RUNNER, *flags)
    checked("picasso daily", out["samples"], rows)
    return seconds


def stream_args(topics: Topics, fmt: str, rows: int, workdir: Path, flags: list[str]) -> list[str]:
    """`picasso stream`'s flags, the cycle stream's and the endless job's alike: a batch is
    BATCH rows, whether BATCH JSON messages or one Arrow message."""
    topic = topics.by_format_rows[fmt, rows]
    return ["stream", "--topic", f"{topic}:{fmt}", "--bootstrap-servers", topics.bootstrap,
            "--workdir", str(workdir), "--batch-messages", str(BATCH if fmt == "json" else 1),
            "--dead-letter-topic", f"{topic}.dead", "--group-id", f"{topic}.{workdir.name}", "--runner", RUNNER,
            *flags]


def cycle_seconds(topics: Topics, fmt: str, rows: int, workdir: Path, flags: list[str]) -> float:
    local_target(workdir)
    out, _, seconds = picasso(dict(os.environ), *stream_args(topics, fmt, rows, workdir, flags), "--until-caught-up")
    checked(f"picasso stream ({fmt})", out["samples"], rows)
    return seconds


def endless_seconds(topics: Topics, rows: int, workdir: Path, flags: list[str]) -> float:
    local_target(workdir)
    command = [*CLI, *stream_args(topics, "json", rows, workdir, flags), "--endless", "--checkpoint-every-s", "1"]
    started = time.perf_counter()
    process = start_job(command, workdir / "endless.log")
    done = wait_trained(process, workdir, topics.by_format_rows["json", rows], rows)  # one message, one row
    stop_job(process)
    return done - started


def version_seconds(runs: int, warmup: int) -> float:
    """`picasso --version`, the console script a user types where it is installed."""
    script = Path(sys.executable).with_name("picasso")
    command = [str(script), "--version"] if script.exists() else [*CLI, "--version"]
    return median_seconds(lambda: subprocess.run(command, check=True, capture_output=True), runs, warmup)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def measure_in_turns(runs: dict[str, Callable[[int, Path], float]], sizes: list[int], repeat: int,
                     root: Path) -> dict[str, PastFixedCost]:
    """run(rows, fresh workdir) -> seconds for every command, on the large then the small
    size, in rounds (`repeat` of them: a, b, c, a, b, c), so that a busy minute of a shared
    machine slows every command alike rather than whichever ran then; the medians."""
    seconds = {(name, size): [0.0] if size == 0 else [] for name in runs for size in sizes}
    for rep in range(repeat):
        for name, run in runs.items():
            for size in sizes:
                if size == 0:  # --small-rows 0: nothing to run
                    continue
                workdir = root / f"{name}-{size}-{rep}"
                workdir.mkdir(parents=True)
                seconds[name, size].append(run(size, workdir))
                say(f"{name} on {size:,} rows: {seconds[name, size][-1]:.1f} s")
    large, small = sizes
    return {name: PastFixedCost(large, small, statistics.median(seconds[name, large]),
                                statistics.median(seconds[name, small])) for name in runs}


def in_process(spec, rows: pa.Table, held_out: pa.Table, precision: str, repeat: int) -> dict[str, float]:
    """benchmarks.train's picasso trainer and the dense part alone, samples/s (medians)."""
    data = Data(spec, rows.to_batches(max_chunksize=BATCH), held_out)
    trainer = [run_picasso(MODEL, data, precision, None, None).samples_per_s for _ in range(repeat)]
    dense = [run_dense_only(MODEL, data, precision) for _ in range(repeat)]
    return {"trainer": statistics.median(trainer), "dense_only": statistics.median(dense)}


def main() -> None:
    def extra(parser):
        parser.add_argument("--rows", type=int, default=300_000, help="N: the larger run's rows")
        parser.add_argument("--small-rows", type=int, default=20_000, help="n: the smaller run's rows")
        # fp32 by default, as benchmarks.train: figures that compare across machines (the
        # commands' own default, auto, takes bf16 where the CPU has it).
        parser.add_argument("--precision", choices=DENSE_PRECISIONS, default="fp32",
                            help="the dense part's precision, for every contender (passed to the commands)")
        parser.add_argument("--bootstrap", default=None, help="a Kafka broker (default: a Tansu broker started here)")
        parser.set_defaults(repeat=1)

    # --smoke: the trainer's warm-up and two timed batches; each command once (6 processes
    # in all, each with seconds of start-up).
    args = parse_args(__doc__.splitlines()[0], extra,
                      smoke={"rows": (WARMUP_BATCHES + 2) * BATCH, "small_rows": 0})
    if not 0 <= args.small_rows < args.rows:
        raise SystemExit(f"--small-rows must be 0 or more and below --rows ({args.rows}), got {args.small_rows}")
    # Every process below loads this build; PICASSO_KERNELS_PREBUILT=1 makes one that finds
    # none say so rather than compile (benchmarks.backfill).
    env, kernel_metrics = kernels_ready()
    os.environ.update(env)  # the endless job's Popen (benchmarks.endless_job) inherits this environment
    spec = criteo_spec()
    planted = PlantedModel(spec)
    rows, _ = planted.sample(args.rows, stream=0)
    held_out, _ = planted.sample(sized(args, EVAL_ROWS, 500), stream=1)
    sizes = [args.rows, args.small_rows]
    flags = model_flags(args.precision)
    rates = in_process(spec, rows, held_out, args.precision, args.repeat)
    say(f"in process: trainer {rates['trainer']:,.0f}, dense part alone {rates['dense_only']:,.0f} samples/s")
    version_s = version_seconds(sized(args, VERSION_RUNS, 1), sized(args, 1, 0))
    say(f"picasso --version: {version_s:.2f} s")
    with tempfile.TemporaryDirectory(prefix="picasso-cli-bench-") as tmp, kafka_broker(args.bootstrap) as bootstrap:
        root = Path(tmp)
        runnable = sorted({*sizes, 1} - {0})  # 1: the one-row daily run
        days = write_days(root / "data", rows, runnable, held_out)
        topics = fill_topics(bootstrap, rows, [size for size in sizes if size])
        runs = {
            "daily": lambda n, w: daily_seconds(days, n, w, flags),
            "cycle": lambda n, w: cycle_seconds(topics, "json", n, w, flags),
            "cycle_arrow": lambda n, w: cycle_seconds(topics, "arrow", n, w, flags),
            "endless": lambda n, w: endless_seconds(topics, n, w, flags),
        }
        measured = measure_in_turns(runs, sizes, args.repeat, root)
        (root / "one-row").mkdir()
        one_row_s = daily_seconds(days, 1, root / "one-row", flags)
        say(f"daily on one row: {one_row_s:.1f} s")
    print_report(args, measured, rates, version_s, one_row_s, kernel_metrics)


def print_report(args, measured: dict[str, PastFixedCost], rates: dict[str, float], version_s: float,
                 one_row_s: float, kernel_metrics: dict) -> None:
    daily = measured["daily"].samples_per_s
    ratios = {"daily_vs_trainer": over(daily, rates["trainer"]),
              "stream_vs_daily": over(measured["cycle"].samples_per_s, daily),
              "stream_arrow_vs_daily": over(measured["cycle_arrow"].samples_per_s, daily),
              "endless_vs_daily": over(measured["endless"].samples_per_s, daily),
              "target_over_version_s": GOALS["version_s"] / version_s,
              "target_over_daily_one_row_s": GOALS["daily_one_row_s"] / one_row_s,
              "cycle_over_endless_fixed_cost": over(measured["cycle"].fixed_cost_s, measured["endless"].fixed_cost_s)}
    metrics = {"rows": args.rows, "small_rows": args.small_rows, "precision": args.precision, "model": MODEL,
               "batch": BATCH, "repeat": args.repeat, **kernel_metrics,
               "trainer_samples_per_s": rates["trainer"], "dense_only_samples_per_s": rates["dense_only"],
               "version_s": version_s, "daily_one_row_s": one_row_s}
    for name, m in measured.items():
        metrics.update({f"{name}_samples_per_s": m.samples_per_s, f"{name}_fixed_cost_s": m.fixed_cost_s,
                        f"{name}_wall_s": {m.rows: m.seconds, m.small_rows: m.small_seconds}})
    titles = {"daily": "picasso daily (Parquet)", "cycle": "picasso stream, cycles (JSON)",
              "cycle_arrow": "picasso stream, cycles (Arrow)", "endless": "picasso stream --endless (JSON)"}
    rows = [["picasso trainer, in process", rates["trainer"], "-", "-", "-", "-"],
            ["dense part alone, in process", rates["dense_only"], "-", "-", "-", "-"]]
    rows += [[titles[name], m.samples_per_s, m.fixed_cost_s, m.seconds, m.small_seconds,
              f"{over(m.samples_per_s, daily):.3f}"] for name, m in measured.items()]
    rows += [["picasso --version (median)", "-", version_s, "-", "-", "-"],
             ["picasso daily, one row", "-", one_row_s, "-", "-", "-"]]
    n, small = f"{args.rows:,}", f"{args.small_rows:,}"
    report("cli", ["", "samples/s past the fixed cost", "fixed cost (s)", f"wall s, {n} rows",
                   f"wall s, {small} rows", "vs daily"], rows, ratios, metrics, args.json,
           caption=f"{MODEL} at 39 fields, batch {BATCH}, {args.precision}, median of {args.repeat}, kernels "
                   f"{kernel_metrics['kernel_backend']}; goals: "
                   f"daily_vs_trainer >= {GOALS['daily_vs_trainer']}, stream_vs_daily >= {GOALS['stream_vs_daily']}, "
                   f"endless_vs_daily >= {GOALS['endless_vs_daily']}, daily on one row <= "
                   f"{GOALS['daily_one_row_s']:g} s, endless fixed cost <= the cycle stream's, picasso --version <= "
                   f"{GOALS['version_s']:g} s")


if __name__ == "__main__":
    main()
