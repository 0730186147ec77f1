"""Runs whose every path is an s3:// URL, against a real S3-compatible server process on
loopback (moto's standalone server): daily, stream, MLflow's artifacts, and checkpoint
commits that a SIGKILL cannot leave half-loadable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from stream_helpers import SPEC as STREAM_SPEC
from stream_helpers import assert_same_state, fill_topic, json_messages

from picasso import storage
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import MARKER, clean_temporaries, latest_checkpoint, load_checkpoint
from picasso.connectors.beam_files import use_beam_filesystems
from picasso.connectors.dead_letters.policy import DeadLetterPolicy
from picasso.connectors.kafka_config import KafkaConnection
from picasso.serving.publishing.contract import MLflowTarget
from picasso.connectors.testing.mlflow_server import MlflowServer
from picasso.connectors.testing.s3_server import S3Server
from picasso.pipelines.cli import main as cli
from picasso.pipelines.runs.generate import generate_days
from picasso.pipelines.runs.stream import StreamConfig, run_stream
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches, small_spec

TESTS = Path(__file__).parent
DAY_1, DAY_2 = "2026-11-01", "2026-11-02"


def one_botocore_loader():
    """botocore's create_loader, giving one Loader per data path for the whole process.

    Beam's S3 filesystem makes a new S3IO, so a new boto3 session and a new botocore
    Loader, for every call it serves (s3filesystem.py), and each new Loader parses
    botocore's JSON models and endpoint tables again: about 0.1 s of CPU a call, most of
    this module's time. With one Loader they are parsed once and shared, as the clients of
    one session share them (read-only). Every request still goes to the server."""
    import botocore.session

    create, loaders = botocore.session.create_loader, {}

    def shared(search_path_string=None):
        if search_path_string not in loaders:
            loaders[search_path_string] = create(search_path_string)
        return loaders[search_path_string]

    return shared


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, with this process's boto3 (Beam's S3 filesystem) pointed at it."""
    import botocore.session

    with S3Server(tmp_path_factory.mktemp("moto")) as server, pytest.MonkeyPatch.context() as patch:
        patch.setattr(botocore.session, "create_loader", one_botocore_loader())
        for key, value in server.env().items():
            patch.setenv(key, value)
        use_beam_filesystems(PipelineOptions(server.beam_args))
        yield server


@pytest.fixture(scope="module")
def s3_mlflow(s3, tmp_path_factory):
    """An `mlflow server` whose artifacts live on the S3 server."""
    bucket = s3.bucket("picasso-mlflow")
    with MlflowServer(tmp_path_factory.mktemp("mlflow-s3"), artifacts=f"{bucket}/artifacts", env=s3.env()) as uri:
        yield uri, bucket


def _daily(data: str, date: str, workdir: str, mlflow_uri: str, s3: S3Server, capsys) -> dict:
    code = cli.main(["daily", "--data", data, "--date", date, "--workdir", workdir, "--mlflow-uri", mlflow_uri,
                     "--hidden", "32,16", "--batch-size", "1024", "--runner", "FnApiRunner", "--json",
                     *s3.beam_args])
    output = capsys.readouterr().out
    assert code == 0, output[-2000:]
    return json.loads(output.strip().splitlines()[-1])


def test_daily_runs_with_every_path_on_s3(s3, s3_mlflow, capsys):
    mlflow_uri, artifacts = s3_mlflow
    bucket = s3.bucket("picasso-daily")
    data, workdir = f"{bucket}/data", f"{bucket}/work"
    generate_days(criteo_spec(), data, [DAY_1, DAY_2], rows=6_000, rows_per_file=2_000)
    # One part with a broken line: its dead letter goes to the workdir on S3 too.
    storage.write_text(f"{data}/date={DAY_1}/part-00099.jsonl", "{broken\n")

    first = _daily(data, DAY_1, workdir, mlflow_uri, s3, capsys)
    assert first["status"] == "published" and first["version"] == "1"
    assert first["checkpoint"].startswith(f"{workdir}/checkpoints/step-")
    assert storage.exists(storage.join(first["checkpoint"], MARKER))
    assert first["samples"] + first["holdout_samples"] == 6_000 and first["dead_letters"] == 1
    letters = [line for path in storage.files_under(f"{workdir}/dead_letters/date={DAY_1}")
               for line in storage.read_text(path).splitlines()]
    assert len(letters) == 1 and "part-00099.jsonl" in letters[0]
    assert json.loads(storage.read_text(f"{workdir}/runs/daily-{DAY_1}.json"))["version"] == "1"
    assert any(storage.name(path) == "weights.pt" for path in storage.files_under(artifacts))
    assert not storage.children(f"{workdir}/publish/pending")  # the outbox emptied on S3

    second = _daily(data, DAY_2, workdir, mlflow_uri, s3, capsys)
    assert second["warm_start_from"] == first["checkpoint"] and second["version"] == "2"
    assert second["step"] > first["step"]
    again = _daily(data, DAY_1, workdir, mlflow_uri, s3, capsys)  # done: read back from S3
    assert again["skipped"] and again["version"] == "1"


def test_stream_runs_with_every_path_on_s3(s3, s3_mlflow, kafka_bootstrap):
    mlflow_uri, _ = s3_mlflow
    workdir = f"{s3.bucket('picasso-stream')}/work"
    topic = "s3-stream-events"
    fill_topic(kafka_bootstrap, topic, json_messages(600) + [b"{broken"], partitions=2)
    config = StreamConfig(
        connection=KafkaConnection(kafka_bootstrap), topics={topic: "json"}, workdir=workdir, spec=STREAM_SPEC,
        mlflow=MLflowTarget(mlflow_uri, experiment="s3-stream", model_name="s3-stream-model"),
        train=TrainConfig(hidden=(16, 8), device="cpu"), dead_letters=DeadLetterPolicy(topic="s3-stream.dead"), batch_messages=100,
        max_cycle_messages=200, publish_every_s=0.5, until_caught_up=True, group_id="s3-stream-group",
        beam_args=tuple(s3.beam_args),
    )
    summary = run_stream(config)
    assert summary.failures == 0 and summary.lag == 0
    assert sum(p["messages"] for p in summary.ledger["partitions"].values()) == 601
    checkpoint = latest_checkpoint(config.folders.checkpoints)
    assert checkpoint.startswith(f"{workdir}/checkpoints/step-")
    loaded = load_checkpoint(checkpoint)
    assert loaded.positions == {f"{topic}/0": 301, f"{topic}/1": 300}
    versions = [json.loads(line) for line in storage.read_text(config.folders.stream_versions).splitlines()]
    assert versions and versions[-1]["checkpoint"] == checkpoint

    # A restart resumes from the checkpoint on S3 and finds nothing left to train.
    resumed = run_stream(config)
    assert resumed.failures == 0 and resumed.cycles == 0 and resumed.ledger == summary.ledger


def test_a_command_that_runs_no_pipeline_reaches_s3_through_boto3s_own_settings(s3):
    """`picasso generate` gives Beam no pipeline options: the endpoint comes from the env."""
    bucket = s3.bucket("picasso-generate")
    done = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "generate", "--out", f"{bucket}/data",
                           "--rows", "500", "--json"], env={**os.environ, **s3.env()}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert storage.children(f"{bucket}/data/date={DAY_1}") == ["_planted.json", "part-00000.parquet"]


# -- a SIGKILL in the middle of a checkpoint save ------------------------------------------------

SPEC = small_spec()
CONFIG = TrainConfig(hidden=(16, 8), lr_dense=1e-2, lr_sparse=0.1, log_every=0, device="cpu")
_SAVER = """
import sys, time
import botocore.session
from apache_beam.options.pipeline_options import PipelineOptions
from picasso import checkpoint, storage
from picasso.connectors.beam_files import use_beam_filesystems
from picasso.trainer import Trainer
from test_object_storage import CONFIG, SPEC, batches, one_botocore_loader

botocore.session.create_loader = one_botocore_loader()  # as in this module's s3 fixture
root, ready = sys.argv[1], sys.argv[2]
use_beam_filesystems(PipelineOptions(sys.argv[3:]))
trainer = Trainer(SPEC, CONFIG)
trainer.train(batches()[:2])
trainer.save_checkpoint(root)
trainer.train(batches()[2:])

# Stall the second save where a crash hurts most: every file written but its commit.
# A local save writes through checkpoint._write, one at a URL through storage.write_bytes.
def stalling(write):
    def write_or_stall(path, data):
        if storage.name(path) == checkpoint.MARKER:
            open(ready, "w").close()
            time.sleep(3600)
        write(path, data)
    return write_or_stall

checkpoint._write = stalling(checkpoint._write)
storage.write_bytes = stalling(storage.write_bytes)
trainer.save_checkpoint(root)
"""


def batches():
    return planted_batches(SPEC, rows=512, batch_size=128)[0]


@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_save_killed_before_its_commit_is_never_loaded(where, s3, tmp_path):
    root = f"{s3.bucket('picasso-kill')}/checkpoints" if where == "s3" else str(tmp_path / "checkpoints")
    ready = tmp_path / "stalled"
    saver = subprocess.Popen([sys.executable, "-c", _SAVER, root, str(ready), *s3.beam_args],
                             env={**os.environ, "PYTHONPATH": str(TESTS)})
    deadline = time.monotonic() + 300  # a bound for a hung saver, not a speed the test needs
    while not ready.exists():
        assert saver.poll() is None, f"the saver exited with {saver.returncode} before its second save"
        assert time.monotonic() < deadline, "the saver never reached its second commit"
        time.sleep(0.1)
    saver.send_signal(signal.SIGKILL)
    saver.wait(timeout=30)

    # The killed save left its files, but no reader takes them.
    first = latest_checkpoint(root)
    assert load_checkpoint(first).step == 2
    if where == "s3":
        assert len(storage.children(root)) == 2  # the whole-but-uncommitted prefix is there
        with pytest.raises(ValueError, match="not a committed checkpoint"):
            load_checkpoint(storage.join(root, max(storage.children(root))))
    clean_temporaries(root)
    assert storage.children(root) == [storage.name(first)]

    # The restart continues from the last commit and ends where an uninterrupted run does.
    resumed = Trainer(SPEC, CONFIG)
    assert resumed.warm_start(root) == first
    resumed.train(batches()[resumed.step:])
    uninterrupted = Trainer(SPEC, CONFIG)
    uninterrupted.train(batches()[:2])
    uninterrupted.train(batches()[2:])
    assert_same_state(load_checkpoint(resumed.save_checkpoint(root)).state, uninterrupted.state())


# -- picasso.storage: one behaviour on a local disk and on the object store -------------------

@pytest.mark.parametrize("where", ["s3", "local"])
def test_storage_behaves_the_same_on_a_local_disk_and_an_object_store(where, s3, tmp_path):
    root = f"{s3.bucket(f'picasso-storage-{where}')}/root" if where == "s3" else str(tmp_path / "root")
    assert storage.children(root) == [] and storage.files_under(root) == [] and not storage.exists(root)
    storage.write_text(storage.join(root, "a", "one.txt"), "1")
    storage.write_bytes(storage.join(root, "a", "deep", "two.bin"), b"\x00\x02")
    storage.write_text(storage.join(root, "top.txt"), "top")
    assert storage.children(root) == ["a", "top.txt"] and storage.children(storage.join(root, "a")) == ["deep", "one.txt"]
    assert storage.exists(storage.join(root, "a")) and not storage.exists(storage.join(root, "b"))
    assert storage.name(storage.join(root, "a", "one.txt")) == "one.txt"
    assert storage.parent(storage.join(root, "a", "one.txt")) == storage.join(root, "a")

    storage.copy_tree(storage.join(root, "a"), storage.join(root, "copy"))
    assert storage.read_bytes(storage.join(root, "copy", "deep", "two.bin")) == b"\x00\x02"
    with storage.open_read(storage.join(root, "copy", "one.txt")) as f:
        assert f.read() == b"1"
    storage.append_line(storage.join(root, "log.jsonl"), "x")
    storage.append_line(storage.join(root, "log.jsonl"), "y")
    assert storage.read_text(storage.join(root, "log.jsonl")) == "x\ny\n"
    storage.write_text(storage.join(root, "top.txt"), "replaced")  # whole, at once
    assert storage.read_text(storage.join(root, "top.txt")) == "replaced"

    storage.delete(storage.join(root, "top.txt"))
    storage.delete(storage.join(root, "top.txt"))  # absent: nothing to do
    storage.delete_tree(storage.join(root, "a"))
    assert storage.children(root) == ["copy", "log.jsonl"]


def test_a_url_without_a_backend_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(storage, "_make_remote", None)
    monkeypatch.setattr(storage, "_remote", None)
    with pytest.raises(RuntimeError, match="no filesystem serves URLs in this process"):
        storage.read_bytes("s3://anything/at/all")


def test_a_workdir_on_an_object_store_needs_an_mlflow_server():
    with pytest.raises(ValueError, match="cannot hold the default SQLite MLflow store"):
        MLflowTarget.for_workdir("s3://bucket/work")


def test_a_local_workdir_on_a_cluster_runner_is_warned_of(s3, caplog):
    # With the S3 server's options, which the module's other tests rely on, kept.
    use_beam_filesystems(PipelineOptions(["--runner=DataflowRunner", *s3.beam_args]), workdir="/var/picasso",
                         data="gs://bucket/days")
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "--workdir /var/picasso is a local path" in warned[0]
    caplog.clear()
    use_beam_filesystems(PipelineOptions(["--runner=FnApiRunner", *s3.beam_args]), workdir="/var/picasso")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
