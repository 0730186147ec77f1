"""The daily run under a multi-process FnApiRunner trains one model on every row once; a
retried training bundle trains afresh; the stream refuses such options at start.

Decoding and packing run in both worker processes; the packed batches are then brought to
one trainer, in the order of their positions (pipelines/transforms/train.py), so two workers train
the model one does: every step in one trainer, every row counted once, the same AUC.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import apache_beam as beam
import pytest
import torch
from apache_beam.options.pipeline_options import PipelineOptions

from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.day_files import partition_dir
from picasso.connectors.dead_letters.letters import DeadLetter
from picasso.connectors.kafka_config import KafkaConnection
from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.runs.daily import DailyConfig, run_daily
from picasso.pipelines.runs.generate import generate_days
from picasso.pipelines.runs.stream import StreamConfig, StreamRunner, one_worker_in_this_process
from picasso.pipelines.transforms.train import PicassoTrain
from picasso.pipelines.transforms.train_handlers import TrainerHandler
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches, small_spec

DATE = "2026-11-05"
PARTS, ROWS_PER_PART, BATCH = 4, 5_000, 1_024  # 20 chunks of 1,024 rows at most: a step each
TWO_PROCESSES = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")
# A few bad rows in every part, so that each worker has some to refuse: line -> what it becomes.
BAD_LINES = {
    7: lambda record: "{not json",
    1_500: lambda record: json.dumps({**record, "label": None}),
    4_321: lambda record: json.dumps({**record, "I3": "many"}),
}


@pytest.fixture(scope="module")
def day(tmp_path_factory):
    """A JSON-lines day of several parts, with BAD_LINES refused in each."""
    root = tmp_path_factory.mktemp("mp-days")
    generate_days(criteo_spec(), root, [DATE], rows=PARTS * ROWS_PER_PART, rows_per_file=ROWS_PER_PART, fmt="jsonl")
    parts = sorted(Path(partition_dir(root, DATE)).glob("part-*.jsonl"))
    assert len(parts) == PARTS
    for part in parts:
        lines = part.read_text().splitlines()
        for i, spoil in BAD_LINES.items():
            lines[i] = spoil(json.loads(lines[i]))
        part.write_text("\n".join(lines) + "\n")
    return root, parts


def _daily(root, workdir, server, beam_args=()):
    config = DailyConfig(
        data_root=str(root),
        date=DATE,
        workdir=str(workdir),
        spec=criteo_spec(),
        mlflow=MLflowTarget(tracking_uri=server, experiment="test-mp", model_name=f"ctr-{uuid.uuid4().hex[:8]}"),
        train=TrainConfig(hidden=(64, 32)),
        batch_size=BATCH,
        runner="FnApiRunner",
        beam_args=beam_args,
    )
    return run_daily(config)


@pytest.fixture(scope="module")
def runs(day, mlflow_server, tmp_path_factory):
    root, _ = day
    one = _daily(root, tmp_path_factory.mktemp("one-worker"), mlflow_server)
    workdir = tmp_path_factory.mktemp("two-workers")
    two = _daily(root, workdir, mlflow_server, TWO_PROCESSES)
    return one, two, workdir


def test_two_worker_processes_train_every_row_once_in_one_model(runs, day):
    one, two, _ = runs
    _, parts = day
    rows = PARTS * ROWS_PER_PART
    bad = PARTS * len(BAD_LINES)
    counters = two.counters
    assert counters["rows_in"] == two.rows_in == rows
    assert counters["dead_letters"] == two.dead_letters == bad
    assert counters["rows_in"] == counters["train_rows"] + counters["holdout_rows"] + counters["dead_letters"]
    assert counters["train_rows"] == two.samples and counters["holdout_rows"] == two.holdout_samples
    assert two.samples > 0 and two.holdout_samples > 0

    # One trainer took every step, with every training row, and read every file to its end.
    checkpoint = load_checkpoint(two.checkpoint)
    assert two.step == checkpoint.step == PARTS * -(-ROWS_PER_PART // BATCH)
    assert checkpoint.state["samples"] == two.samples
    assert checkpoint.positions == {str(part): ROWS_PER_PART for part in parts}

    # The one-worker run of the same day: the same rows, held out and refused alike.
    assert {k: one.counters[k] for k in counters} == counters
    assert (one.step, one.samples, one.holdout_samples) == (two.step, two.samples, two.holdout_samples)
    assert abs(two.auc - one.auc) < 0.005, (one.auc, two.auc)
    assert two.auc > 0.6, two.auc  # it learned


def test_two_worker_processes_write_each_dead_letter_once(runs, day):
    _, _, workdir = runs
    _, parts = day
    letters = [
        DeadLetter.from_json(line)
        for path in (workdir / "dead_letters" / f"date={DATE}").glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert sorted((letter.source, letter.position) for letter in letters) == sorted(
        (str(part), i) for part in parts for i in BAD_LINES
    )


def test_a_retried_training_bundle_trains_a_fresh_trainer_once(tmp_path):
    """--direct_runner_bundle_repeat=1 runs every bundle once more before the real run, in the
    same process, as a runner retrying a failed bundle would: the trainer of the dry run
    must not be trained again, nor the retry start from the checkpoint the dry run wrote."""
    spec, config = small_spec(), TrainConfig(hidden=(16,), log_every=0)
    batches, _ = planted_batches(spec, rows=1_200, batch_size=200)
    options = PipelineOptions(["--runner=FnApiRunner", "--direct_runner_bundle_repeat=1"])
    with beam.Pipeline(options=options) as pipeline:
        pipeline | beam.Create(batches, reshuffle=False) | PicassoTrain(
            TrainerHandler.for_run(spec, config, tmp_path / "checkpoints"))
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert checkpoint.step == len(batches) and checkpoint.state["samples"] == 1_200
    reference = Trainer(spec, config)
    reference.train(batches)
    for name, value in reference.model.state_dict().items():
        assert torch.equal(checkpoint.state["model"][name], value), name


def test_a_run_with_no_batch_still_checkpoints(tmp_path):
    spec = small_spec()
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        pipeline | beam.Create([]) | PicassoTrain(TrainerHandler.for_run(
            spec, TrainConfig(hidden=(16,), log_every=0), tmp_path / "checkpoints"))
    assert load_checkpoint(latest_checkpoint(tmp_path / "checkpoints")).step == 0


@pytest.mark.parametrize("beam_args", [TWO_PROCESSES, ("--direct_num_workers=2",), ("--direct_num_workers=0",),
                                       ("--direct_running_mode=multi_processing",)])
def test_the_stream_refuses_beam_workers_outside_its_process(tmp_path, beam_args):
    # No broker at this address: the refusal comes before any connection.
    config = StreamConfig(connection=KafkaConnection("127.0.0.1:9"), topics={"clicks": "json"},
                          workdir=str(tmp_path), spec=criteo_spec(), mlflow=None, beam_args=beam_args)
    with pytest.raises(ValueError, match="picasso stream runs its Beam cycles in one worker in its own process") as err:
        StreamRunner(config).run()
    assert "its model lives across cycles in this process" in str(err.value)
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("beam_args", [(), ("--direct_num_workers=1", "--direct_running_mode=multi_threading")])
def test_the_stream_takes_one_worker_in_its_process(beam_args):
    one_worker_in_this_process(PipelineOptions(["--runner=FnApiRunner", *beam_args]))  # no error


def test_picasso_stream_refuses_at_start_with_the_reason(tmp_path, capsys):
    from picasso.pipelines.cli.main import main

    # No broker at this address: the refusal comes before any connection.
    code = main(["stream", "--topic", "clicks", "--workdir", str(tmp_path), "--bootstrap-servers", "127.0.0.1:9",
                 "--publish-every", "0", "--json", *TWO_PROCESSES])
    assert code == 2
    error = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert "--direct_num_workers=2 --direct_running_mode=multi_processing" in error
    assert "its model lives across cycles in this process" in error
