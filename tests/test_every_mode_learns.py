"""Every way picasso trains learns, and learns what a daily run learns from the same rows.

Each mode trains on the same planted rows (learning_helpers: two planted streams
interleaved, 16,000 rows, the signal in the sparse fields alone), in the same order where
the mode can read them so, with the same model, learning rates and global batch. Of its
final checkpoint the test asks:

1. every embedding row the training rows look up has moved from its initial value and
   has a non-zero Adagrad slot, in every table (the deep and the wide embeddings);
2. its AUC on held-out rows of another stream is within TOLERANCE of the daily run's
   (`picasso daily --date`, trained once per spec), and at least halfway from 0.5 to the
   planted model's ceiling (the AUC of the true probabilities on those rows).

The dynamic table's case is held to a daily run of its own spec: on the same rows, a
dynamic table (a row per admitted token) ranks 0.002 to 0.008 better than the fixed
table, which hashes tokens into buckets they share; the spec, not the mode, makes that.
So is the case of a spec with feature crosses (a wide-only cross and one that feeds both
parts), whose tables must train as the fields' do.

A stream that scores each batch before training it used to leave the model in eval mode,
where the lookup steps no row: only the dense part learned (0.52 to 0.54 AUC here, 0.13
below daily). Tests that compare a run with another run cannot see that; these can.

Over four seeds of the planted streams every mode stayed within 0.005 of daily: a range,
sync and the cycle streams (with the cache, bf16 or a dynamic table) within 0.0011, GBA
within 0.0014, the joined streams, whose labels and sample order differ, within 0.0048
(late labels dropped) and 0.0027 (corrected). TOLERANCE is twice the widest.

What each mode reads, where it cannot read the daily rows in their order:
- a sync rank and a GBA worker read one planted stream each: with two, a global batch is
  the same rows as the daily batch (for GBA, as the workers' timing allows). One GBA
  worker reads the two streams in two jobs, one after the other;
- a joined stream trains the rows in the order their labels decide them, mixed by its
  shuffle buffer, with late clicks dropped or corrected; a tail of further impressions
  carries its watermark past the training rows and fills the buffer, so that it trains
  about as many samples as daily.

The endless job (`picasso stream --endless`) reads the cycle stream's topic in the same
batches; with one worker and a global step at each push, it trains them in their order.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest
from kafka_broker import create_topic, produce_values
from learning_helpers import (BATCH, BLOCK, MODEL_FLAGS, ROWS_PER_STREAM, STREAMS, TRAINING_ROWS, ceiling,
                              held_out_auc, held_out_rows, learning_spec, planted_rows, timed_events, training_rows,
                              untrained_rows, write_day)
from stream_helpers import fill_topic, run_stream_process, start_process, stop_when_trained, stream_command
from test_gba_ps import _finish, _ps, _worker

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.decoding.message_formats import encode_arrow
from picasso.connectors.testing.loopback import free_port
from picasso.spec import FeatureSpec
from picasso.connectors.synthetic.events import EventStreamConfig

SPEC, DYNAMIC_SPEC, CROSSES_SPEC = learning_spec(), learning_spec(dynamic=True), learning_spec(crosses=True)
TOLERANCE = 0.01
DAY, FIRST_HALF, SECOND_HALF, HELD_OUT_DAY = "2026-03-01", "2026-03-02", "2026-03-03", "2026-04-01"
ROWS_PER_MESSAGE = 50  # Arrow messages of the labelled-events topic: BATCH rows are 10 of them
PROCESS_TIMEOUT = 600  # generous: a bound for a hung process, never a measure of speed
# Per parameter-server call, and for the workers to find the server and join: a machine
# busy with other work may take many seconds to start a process.
RPC_TIMEOUT = ("--timeout", "120")
# The joined stream: W = 5 s at 100 impressions a second of event time, clicks after 2.2 s
# on average, so that about 10% come after W (dropped, or corrected) and 1% after the
# horizon (2 W: orphans).
WAIT = "5s"
EVENTS = EventStreamConfig(start_ms=1_780_000_000_000, impressions_per_s=100.0, label_delay_mean_ms=2_200)
TAIL_ROWS, TAIL_STREAM = 2_000, 102


@dataclass(frozen=True)
class Planted:
    """The day partitions and spec files every case reads."""

    data: Path
    specs: dict[str, Path]

    def spec_path(self, spec: FeatureSpec) -> Path:
        return self.specs[spec.name]


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Planted:
    root = tmp_path_factory.mktemp("every-mode")
    specs = {}
    for spec in (SPEC, DYNAMIC_SPEC, CROSSES_SPEC):
        specs[spec.name] = root / f"{spec.name}.yaml"
        specs[spec.name].write_text(spec.to_yaml())
    rows = training_rows(SPEC)  # the dynamic spec plants the very same rows
    write_day(root / "data", DAY, rows)
    half = TRAINING_ROWS // 2  # a whole number of batches each
    write_day(root / "data", FIRST_HALF, rows.slice(0, half))
    write_day(root / "data", SECOND_HALF, rows.slice(half))
    write_day(root / "data", HELD_OUT_DAY, held_out_rows(SPEC)[0])
    return Planted(root / "data", specs)


@pytest.fixture(scope="module")
def labelled_topic(kafka_bootstrap) -> str:
    """The training rows as Arrow messages, in order, on one partition."""
    topic = f"every-mode-{uuid.uuid4().hex[:8]}"
    fill_topic(kafka_bootstrap, topic, encode_arrow(training_rows(SPEC), ROWS_PER_MESSAGE), partitions=1)
    return topic


@pytest.fixture(scope="module")
def joined_topics(kafka_bootstrap) -> tuple[str, str]:
    """The training rows, then a tail of other rows, as JSON impressions in event time,
    and their clicks on a topic of their own."""
    rows = pa.concat_tables([training_rows(SPEC), planted_rows(SPEC, TAIL_ROWS, TAIL_STREAM)[0]])
    events = timed_events(SPEC, rows, EVENTS)
    topics = f"every-mode-impressions-{uuid.uuid4().hex[:8]}", f"every-mode-clicks-{uuid.uuid4().hex[:8]}"
    for topic, table in zip(topics, (events.impressions, events.labels)):
        create_topic(kafka_bootstrap, topic)
        produce_values(kafka_bootstrap, topic, [json.dumps(row, separators=(",", ":")).encode()
                                                for row in table.to_pylist()])
    return topics


@dataclass
class Run:
    """One case's run: its spec, its own work folder, and the module's inputs (fixtures
    that start a broker are asked for only by the cases that need them)."""

    spec: FeatureSpec
    workdir: Path
    planted: Planted
    fixture: Callable[[str], object]  # a fixture's value by name

    @property
    def spec_path(self) -> Path:
        return self.planted.spec_path(self.spec)

    def checkpoint(self) -> Path:
        path = latest_checkpoint(self.workdir / "checkpoints")
        assert path is not None, f"no checkpoint in {self.workdir}"
        return Path(path)


def _run(command: list[str], workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "run.log"
    done = run_stream_process(command, log, timeout=PROCESS_TIMEOUT)
    assert done.returncode == 0, log.read_text()[-4000:]


def _picasso(*args: str) -> list[str]:
    return [sys.executable, "-m", "picasso.pipelines.cli", *args]


def daily(run: Run, *flags: str) -> Path:
    """`picasso daily`, without the hot-row cache (one of the stream cases has it)."""
    _run(_picasso("daily", "--spec", str(run.spec_path), "--data", str(run.planted.data), "--workdir",
                  str(run.workdir), "--mlflow-uri", f"sqlite:///{run.workdir / 'mlflow.db'}", "--batch-size",
                  str(BATCH), "--cache-capacity", "off", "--device", "cpu", *MODEL_FLAGS, *flags), run.workdir)
    return run.checkpoint()


@dataclass(frozen=True)
class Learned:
    checkpoint: Path
    auc: float


@dataclass
class DailyReferences:
    """`picasso daily --date` on all the training rows, scored on the held-out day: run
    once per spec, the first time a case asks."""

    planted: Planted
    root: Path
    fixture: Callable[[str], object]
    runs: dict[str, Learned] = field(default_factory=dict)
    # Modes train side by side (trained_modes): one run per spec, by whoever asks first.
    locks: dict[str, threading.Lock] = field(default_factory=dict)
    locking: threading.Lock = field(default_factory=threading.Lock)

    def of(self, spec: FeatureSpec) -> Learned:
        with self.locking:
            lock = self.locks.setdefault(spec.name, threading.Lock())
        with lock:
            if spec.name not in self.runs:
                run = Run(spec, self.root / spec.name, self.planted, self.fixture)
                checkpoint = daily(run, "--date", DAY, "--eval-date", HELD_OUT_DAY)
                self.runs[spec.name] = Learned(checkpoint, held_out_auc(spec, checkpoint))
            return self.runs[spec.name]


@pytest.fixture(scope="module")
def references(planted, tmp_path_factory, request) -> DailyReferences:
    return DailyReferences(planted, tmp_path_factory.mktemp("daily-references"), request.getfixturevalue)


# -- the modes: each trains from scratch in its own work folder, returns its last checkpoint


def daily_date(run: Run) -> Path:
    return run.fixture("references").of(run.spec).checkpoint


def daily_dates(run: Run) -> Path:
    # A range scores each day on a holdout slice of its own (it takes no --eval-date): 1% of
    # the rows, so it trains on 99% of the daily rows, in their order.
    return daily(run, "--dates", f"{FIRST_HALF}..{SECOND_HALF}", "--holdout", "0.01", "--publish-every", "2")


def cycle_stream(run: Run, flags: tuple[str, ...] = ()) -> Path:
    """`picasso stream --topic`, in cycles of 4 batches of BATCH rows until caught up."""
    command = stream_command(run.spec_path, run.fixture("kafka_bootstrap"), f"{run.fixture('labelled_topic')}:arrow",
                             run.workdir, "--batch-messages", str(BATCH // ROWS_PER_MESSAGE), "--max-cycle-messages",
                             str(4 * BATCH // ROWS_PER_MESSAGE), "--publish-every", "0", "--until-caught-up",
                             "--group-id", f"every-mode-{uuid.uuid4().hex[:8]}", "--cache-capacity", "off",
                             *MODEL_FLAGS, *flags)
    _run(command, run.workdir)
    return run.checkpoint()


def endless_job(run: Run) -> Path:
    """`picasso stream --endless` on the same topic and batches, against the parameter
    server it starts (one worker, a step at each push: the daily batches in their order),
    stopped with SIGTERM once its checkpoint holds every message."""
    topic = run.fixture("labelled_topic")
    command = stream_command(run.spec_path, run.fixture("kafka_bootstrap"), f"{topic}:arrow", run.workdir,
                             "--endless", "--batch-messages", str(BATCH // ROWS_PER_MESSAGE), "--publish-every", "0",
                             "--checkpoint-every-s", "2", "--dead-letter-topic", f"{topic}.dead",
                             "--cache-capacity", "off", "--json", *MODEL_FLAGS)
    run.workdir.mkdir(parents=True, exist_ok=True)
    log = run.workdir / "run.log"
    stop_when_trained(start_process(command, log), run.workdir, {f"{topic}/0": TRAINING_ROWS // ROWS_PER_MESSAGE},
                      log)
    return run.checkpoint()


def joined_stream(run: Run, late_labels: str) -> Path:
    impressions, clicks = run.fixture("joined_topics")
    _run(_picasso("stream", "--spec", str(run.spec_path), "--impressions", impressions, "--labels", clicks,
                  "--label-wait", WAIT, "--late-labels", late_labels, "--bootstrap-servers",
                  run.fixture("kafka_bootstrap"), "--workdir", str(run.workdir), "--group-id",
                  f"every-mode-{uuid.uuid4().hex[:8]}", "--dead-letter-topic", f"{impressions}.dead",
                  "--batch-messages", str(BATCH), "--max-cycle-messages", str(4 * BATCH), "--publish-every", "0",
                  "--until-caught-up", "--cache-capacity", "off", "--device", "cpu", *MODEL_FLAGS), run.workdir)
    return run.checkpoint()


def _gba_job(run: Run, workers: int, *worker_flags: str) -> None:
    """A parameter server with M = `workers` (it resumes from the work folder's latest
    checkpoint) and that many workers, worker r on planted stream STREAMS[0] + r."""
    port = free_port()
    server = _ps(str(run.spec_path), run.workdir, port, 1, workers, *MODEL_FLAGS, *RPC_TIMEOUT)
    started = [_worker(port, rank, ROWS_PER_STREAM, "--stream-base", str(STREAMS[0]), *RPC_TIMEOUT, *worker_flags)
               for rank in range(workers)]
    for process in [*started, server]:
        code, _, err = _finish(process, timeout=PROCESS_TIMEOUT)
        assert code == 0, err[-4000:]


def gba_one_worker(run: Run) -> Path:
    """One worker reads one stream: a job per stream, the second resumed from the first's
    checkpoint, so that it trains the daily rows (each stream's in turn) in daily batches.
    (One job on all the rows of one stream would train other rows.)"""
    for stream in STREAMS:
        _gba_job(run, 1, "--stream", str(stream), "--batch-size", str(BATCH))
    return run.checkpoint()


def gba_two_workers(run: Run) -> Path:
    _gba_job(run, 2, "--batch-size", str(BLOCK))
    return run.checkpoint()


def sync(run: Run) -> Path:
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(len(STREAMS)), "--master-port",
          str(free_port()), "-m", "picasso.pipelines.cli.distributed", "sync-worker", "--spec", str(run.spec_path),
          "--workdir", str(run.workdir), *MODEL_FLAGS, "--rows", str(ROWS_PER_STREAM), "--batch-size", str(BLOCK),
          "--stream-base", str(STREAMS[0])], run.workdir)
    return run.checkpoint()


@dataclass(frozen=True)
class Mode:
    name: str
    train: Callable[[Run], Path]
    spec: FeatureSpec = SPEC
    # Settings its checkpoint must record (TrainConfig's, as saved): it trained as named.
    saved: dict = field(default_factory=dict)
    # The module's fixtures its training reads (Run.fixture), made before any mode trains.
    reads: tuple[str, ...] = ()


LABELLED_TOPIC = ("kafka_bootstrap", "labelled_topic")
MODES = [
    Mode("daily --date", daily_date, reads=("references",)),
    Mode("daily --dates", daily_dates),
    Mode("stream --topic", cycle_stream, reads=LABELLED_TOPIC),
    # A fifth of each table hot, refreshed every other step: rows move between the tiers
    # while they train.
    Mode("stream --topic, hot-row cache", partial(cycle_stream, flags=("--cache-capacity", "20%",
                                                                        "--cache-refresh-every", "2")),
         saved={"cache": {"capacity": "20%", "refresh_every": 2}}, reads=LABELLED_TOPIC),
    Mode("stream --topic, a dynamic table", cycle_stream, spec=DYNAMIC_SPEC, reads=LABELLED_TOPIC),
    Mode("stream --topic, feature crosses", cycle_stream, spec=CROSSES_SPEC, reads=LABELLED_TOPIC),
    Mode("stream --topic, bf16", partial(cycle_stream, flags=("--precision", "bf16")), saved={"precision": "bf16"},
         reads=LABELLED_TOPIC),
    Mode("endless job", endless_job, reads=LABELLED_TOPIC),
    Mode("joined stream, late labels dropped", partial(joined_stream, late_labels="drop"),
         reads=("kafka_bootstrap", "joined_topics")),
    Mode("joined stream, late labels corrected", partial(joined_stream, late_labels="correct"),
         reads=("kafka_bootstrap", "joined_topics")),
    Mode("gba, 1 worker", gba_one_worker),
    Mode("gba, 2 workers", gba_two_workers),
    Mode("sync, 2 ranks", sync),
]
# Modes trained at once. Nearly every mode is one process busy on one core for most of its
# run, and CI has two cores: two side by side take about half as long as one after another.
LANES = 2


@pytest.fixture(scope="module")
def trained_modes(request, planted, references, tmp_path_factory) -> dict[str, Future]:
    """The last checkpoint of every mode this session runs a case of, trained LANES at a
    time, each from scratch in its own work folder as it would be alone, and the daily
    references beside them; by mode name, as a future (its failure is its case's)."""
    selected = [item.callspec.params["mode"] for item in request.session.items
                if getattr(item, "module", None) is sys.modules[__name__] and hasattr(item, "callspec")]
    fixtures = {name: request.getfixturevalue(name) for mode in selected for name in mode.reads}
    pool = ThreadPoolExecutor(LANES)
    try:
        for spec in {mode.spec.name: mode.spec for mode in selected}.values():
            pool.submit(references.of, spec)
        yield {mode.name: pool.submit(mode.train, Run(mode.spec, tmp_path_factory.mktemp("mode"), planted,
                                                      fixtures.__getitem__))
               for mode in selected}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_the_mode_trains_every_table_and_ranks_held_out_rows_as_daily_does(mode, references, trained_modes):
    spec = mode.spec
    checkpoint = trained_modes[mode.name].result()
    reference, best = references.of(spec), ceiling(spec)
    learned, state = held_out_auc(spec, checkpoint), load_checkpoint(checkpoint).state
    print(json.dumps({"mode": mode.name, "auc": round(learned, 4), "daily_auc": round(reference.auc, 4),
                      "difference": round(learned - reference.auc, 4), "ceiling": round(best, 4),
                      "samples": state["samples"]}))

    assert _subset(state.get("config", {}), mode.saved), state.get("config")
    # A range and a joined stream leave some of the rows out (a holdout slice; samples still
    # in the shuffle buffer or undecided), but every id comes dozens of times in them: no
    # row looked up goes untrained for that.
    assert untrained_rows(spec, checkpoint, training_rows(spec)) == {}
    assert abs(learned - reference.auc) <= TOLERANCE, (learned, reference.auc)
    assert learned >= 0.5 + (best - 0.5) / 2, (learned, best)


def _subset(saved: dict, expected: dict) -> bool:
    """Whether every key of `expected` (nested) has its value in `saved`."""
    return all(_subset(saved.get(key) or {}, value) if isinstance(value, dict) else saved.get(key) == value
               for key, value in expected.items())
