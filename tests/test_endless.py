"""`picasso stream --endless`: one Beam pipeline over an unbounded Kafka read, training into
the parameter server the command starts in its own process, which checkpoints and publishes
on wall-clock time. Against the Tansu broker, with a producer writing at a steady rate and
bad messages mixed in; checked from the broker's side and MLflow's."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from kafka import KafkaProducer
from kafka_broker import create_topic
from stream_helpers import (assert_same_state, fill_topic, json_messages, produce_values, start_process,
                            stop_when_trained, stream_command, wait_for, wait_until_serving, write_spec)
from test_stream_exactly_once import _assert_dead_letters, _with_bad_messages

from picasso.checkpoint import latest_checkpoint, load_checkpoint, read_applied
from picasso.connectors.testing.loopback import free_port
from picasso.serving.publishing import registry_tags as tags
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard
from picasso.distributed.ps_client import PSClient, ServerRestarted
from picasso.distributed.worker import GBAWorker, WorkerStats
from picasso.models import build_model
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.trainer import Trainer

from helpers import refusal_in_process
from test_trainer import CONFIG, SPEC

PARTITIONS = 2
RATE = 400  # messages a second, round-robin over the partitions
ENDLESS = ("--endless", "--batch-messages", "50", "--checkpoint-every-s", "2", "--publish-every", "3",
           "--model-name", "endless-ctr", "--json")


class SteadyProducer(threading.Thread):
    """Sends good events at RATE a second, with two bad messages in every twenty,
    round-robin over the partitions, until told to stop (or out of events); remembers the
    (topic, partition, offset) of each message once the broker acknowledged it."""

    def __init__(self, bootstrap: str, topic: str, rng: random.Random):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        # Enough for minutes at RATE: a test stops the producer when it has seen what it waits for.
        self.values, self.bad_indices = _with_bad_messages(json_messages(60_000, stream=rng.randrange(100)))
        self.keys: list[tuple[str, int, int]] = []  # the i-th value's (topic, partition, offset)
        self.stop = threading.Event()

    def run(self):
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, acks="all")
        started = time.monotonic()
        futures = []
        for i, value in enumerate(self.values):
            if self.stop.is_set():
                break
            ahead = started + i / RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            futures.append(producer.send(self.topic, value=value, partition=i % PARTITIONS))
        producer.flush()
        for future in futures:
            meta = future.get(timeout=60)
            self.keys.append((meta.topic, meta.partition, meta.offset))
        producer.close()

    def finish(self) -> None:
        self.stop.set()
        self.join()

    @property
    def produced(self) -> dict[tuple[str, int, int], bytes]:
        return dict(zip(self.keys, self.values))

    @property
    def bad(self) -> set[tuple[str, int, int]]:
        return {self.keys[i] for i in self.bad_indices if i < len(self.keys)}

    @property
    def ends(self) -> dict[str, int]:
        """Each partition's position after its last message."""
        ends = Counter()
        for topic, partition, offset in self.keys:
            ends[f"{topic}/{partition}"] = max(ends[f"{topic}/{partition}"], offset + 1)
        return dict(ends)


def _versions_logged(workdir: Path) -> list[dict]:
    path = workdir / "runs" / "stream-versions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_every_message_once(final: Path, producer: SteadyProducer, dead_letter_topic: str, why: str) -> None:
    """Every good message trained exactly once: the ledger holds each partition whole, once,
    and the samples are the good messages (one trained twice would count twice); every bad
    one is on the dead-letter topic once (counted by its source position), and nothing else."""
    assert load_checkpoint(final).positions == producer.ends, why
    assert read_applied(final) == {source: [[0, end]] for source, end in producer.ends.items()}, why
    assert load_checkpoint(final).state["samples"] == len(producer.keys) - len(producer.bad), why
    _assert_dead_letters(producer.bootstrap, dead_letter_topic, producer.produced, producer.bad, why)


def _assert_versions_once(workdir: Path, final: Path, why: str) -> None:
    """Every version complete and recorded once, the last holding the final checkpoint, and
    each one's prequential window exactly the samples since the version before."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    versions = client.search_model_versions("name='endless-ctr'")
    recorded = Counter((r["version"], r["checkpoint"]) for r in _versions_logged(workdir))
    registered = Counter((str(v.version), v.tags[tags.CHECKPOINT_PATH]) for v in versions)
    assert recorded == registered and max(recorded.values()) == 1, f"{recorded} against {registered}; {why}"
    assert str(final) in {v.tags[tags.CHECKPOINT_PATH] for v in versions}, why
    # The newest event each version trained on, as picasso serve reads it for its freshness.
    newest = {r["version"]: r.get("newest_event_ms") for r in _versions_logged(workdir)}
    assert all(newest.values()) and all(v.tags.get(tags.NEWEST_EVENT_MS) == str(newest[str(v.version)])
                                        for v in versions), why
    metrics = sorted((m["samples"], m["window_samples"])
                     for m in (client.get_run(v.run_id).data.metrics for v in versions))
    assert all(window == samples - before for (samples, window), (before, _) in zip(metrics, [(0, 0)] + metrics)), \
        f"(samples, window_samples) by version: {metrics}; {why}"


def test_an_endless_job_killed_twice_trains_every_good_message_once_and_publishes_as_events_arrive(
        kafka_bootstrap, tmp_path, kafka_client):
    """The job is SIGKILLed twice at a random moment and resubmitted as it was each time (its
    parameter server dies with it, and the next one resumes from the newest checkpoint)."""
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    topic = f"endless-{seed}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    workdir, log = tmp_path / "work", tmp_path / "endless.log"
    command = stream_command(write_spec(tmp_path), kafka_bootstrap, topic, workdir, *ENDLESS,
                             "--dead-letter-topic", f"{topic}.dead", "--kafka-client", kafka_client)
    producer = SteadyProducer(kafka_bootstrap, topic, rng)
    producer.start()
    waits = [round(rng.uniform(1.0, 15.0), 1) for _ in range(2)]
    why = f"seed {seed}, kills after {waits} s"
    for wait in waits:
        killed = start_process(command, log)
        time.sleep(wait)
        killed.kill()
        assert killed.wait(timeout=60) == -9, f"the job ended by itself before its kill; {why}"
    process = start_process(command, log)
    try:
        # Versions come out while the events still arrive: the job does not wait for an end.
        wait_for(lambda: len(_versions_logged(workdir)) >= 2 or not producer.is_alive(), process, "two versions")
        assert producer.is_alive(), f"the producer ran out of events before two versions; {why}"
        producer.finish()
    except BaseException:
        process.kill()
        raise
    summary = stop_when_trained(process, workdir, producer.ends, log)
    final = Path(summary["checkpoint"])
    assert summary["positions"] == producer.ends and summary["samples"] == len(producer.keys) - len(producer.bad), why
    _assert_every_message_once(final, producer, f"{topic}.dead", why)
    _assert_versions_once(workdir, final, why)


def test_a_parameter_server_killed_mid_stream_stops_the_job_and_a_resubmit_trains_every_message_once(
        kafka_bootstrap, tmp_path):
    """`picasso ps --endless` on its own, SIGKILLed while the job trains against it and
    started again: it resumes from its newest checkpoint, behind what the job had read, so
    the job must not push into it. The job stops, naming what happened; resubmitted as it
    was, it reads on from the server's positions."""
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    topic = f"endless-ps-{seed}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    spec, port = write_spec(tmp_path), free_port()
    server_dir = tmp_path / "server"
    server_command = [sys.executable, "-m", "picasso.pipelines.cli", "ps", "--endless", "--spec", str(spec),
                      "--workdir", str(server_dir), "--port", str(port), "--hidden", "16,8", "--checkpoint-every-s",
                      "1", "--publish-every", "0", "--json"]
    job_command = stream_command(spec, kafka_bootstrap, topic, tmp_path / "job", "--endless", "--ps",
                                 f"127.0.0.1:{port}", "--batch-messages", "50", "--dead-letter-topic", f"{topic}.dead")
    server_log, job_log = tmp_path / "server.log", tmp_path / "job.log"
    producer = SteadyProducer(kafka_bootstrap, topic, rng)
    why = f"seed {seed}"
    server = start_process(server_command, server_log)
    wait_until_serving(server, port)  # the job is started once the server takes calls
    job = start_process(job_command, job_log)
    processes = [server, job]
    try:
        producer.start()

        def checkpointed() -> bool:  # a checkpoint of trained messages: the kill loses what came after
            path = latest_checkpoint(server_dir / "checkpoints")
            return path is not None and sum(load_checkpoint(path).positions.values()) > 0

        wait_for(checkpointed, server, "a checkpoint of the server")
        time.sleep(rng.uniform(0.0, 3.0))
        server.kill()
        server.wait(timeout=60)
        server = start_process(server_command, server_log)
        processes.append(server)
        assert job.wait(timeout=300) == 1, f"{job_log.read_text()[-3000:]}; {why}"
        stopped = job_log.read_text()
        assert "restarted while" in stopped or "is unreachable" in stopped, f"{stopped[-3000:]}; {why}"
        job = start_process(job_command, job_log)  # resubmitted as it was
        processes.append(job)
        wait_for(lambda: latest_checkpoint(server_dir / "checkpoints") is not None, server, "the server's restart")
        time.sleep(3)  # events arrive while the resubmitted job trains
        producer.finish()

        def trained() -> bool:
            path = latest_checkpoint(server_dir / "checkpoints")
            return load_checkpoint(path).positions == producer.ends

        wait_for(trained, job, "a checkpoint of every message")
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=300) == 0, f"{job_log.read_text()[-3000:]}; {why}"
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=300) == 0, f"{server_log.read_text()[-3000:]}; {why}"
    finally:
        producer.stop.set()
        for process in processes:
            if process.poll() is None:
                process.kill()
    final = Path(json.loads(server_log.read_text().strip().splitlines()[-1])["checkpoint"])
    _assert_every_message_once(final, producer, f"{topic}.dead", why)


@pytest.mark.parametrize("flag", [["--until-caught-up"], ["--max-cycles", "3"], ["--max-seconds", "5"]])
def test_an_endless_job_refuses_the_options_of_a_stream_in_cycles(flag, tmp_path, capsys):
    status, stderr = refusal_in_process(stream_command(write_spec(tmp_path), "127.0.0.1:1", "events", tmp_path / "w",
                                                       "--endless", *flag), capsys)
    assert status == 2 and flag[0] in stderr and "only for a stream in cycles" in stderr, stderr[-2000:]


def test_an_endless_job_on_a_topic_that_does_not_exist_exits_with_its_name(kafka_bootstrap, tmp_path):
    result = subprocess.run(stream_command(write_spec(tmp_path), kafka_bootstrap, "no-such-topic", tmp_path / "w",
                                           "--endless", "--publish-every", "0"),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 2 and "'no-such-topic' does not exist" in result.stderr, result.stderr[-2000:]


def test_ps_is_only_for_an_endless_job(tmp_path, capsys):
    status, stderr = refusal_in_process(stream_command(write_spec(tmp_path), "127.0.0.1:1", "events", tmp_path / "w",
                                                       "--ps", "127.0.0.1:29500"), capsys)
    assert status == 2 and "--ps: only for the endless job" in stderr, stderr[-2000:]


# -- the server's side, in this process ------------------------------------------------------


def _one_shard(trainer: Trainer):
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(1))
    return shard, layout


def test_a_worker_is_refused_by_a_shard_that_restarted_since_its_last_pull():
    shards = [_one_shard(Trainer(SPEC, CONFIG))[0]]
    layout = shards[0].layout
    computer = GradientComputer(build_model(CONFIG.model, SPEC, Trainer(SPEC, CONFIG).plan, CONFIG.hidden))
    worker = GBAWorker(PSClient(layout, "worker0/x", max_in_flight=0, call=in_process(shards)), computer)
    batches = list(planted_batches(SPEC, 300, 100, stream=5))
    assert worker.step(batches[0], WorkerStats())
    shards[0] = _one_shard(Trainer(SPEC, CONFIG))[0]  # the server started again, from its checkpoint
    with pytest.raises(ServerRestarted, match="restarted while worker0/x trained"):
        worker.step(batches[1], WorkerStats())
    assert shards[0].snapshot().samples == 0  # nothing reached the restarted shard


def test_the_servers_window_holds_each_batch_scored_before_it_trained_and_forgets_what_a_version_holds():
    """Test-then-train on the server: with one worker and a step at each push, every batch's
    scores are those a local Trainer gives it just before training on it."""
    shard, layout = _one_shard(Trainer(SPEC, CONFIG))
    computer = GradientComputer(build_model(CONFIG.model, SPEC, Trainer(SPEC, CONFIG).plan, CONFIG.hidden))
    worker = GBAWorker(PSClient(layout, "worker0/x", max_in_flight=0, call=in_process([shard])), computer,
                       prequential=True)
    batches = list(planted_batches(SPEC, 600, 100, stream=5))
    local = Trainer(SPEC, CONFIG)
    expected = []
    for batch in batches[:4]:
        worker.step(batch, WorkerStats())
        expected.append(torch.from_numpy(local.predict(batch)))
        local.train_step(batch)
    window = shard.snapshot().window
    torch.testing.assert_close(window.scores, torch.cat(expected), atol=1e-5, rtol=0)
    assert window.labels.tolist() == torch.cat([b.to_torch().label for b in batches[:4]]).tolist()
    shard.forget_window(shard.step())  # a version now holds these
    for batch in batches[4:]:
        worker.step(batch, WorkerStats())
    assert shard.snapshot().window.labels.numel() == 200


def test_a_repeated_bundle_trains_nothing_twice(kafka_bootstrap, tmp_path):
    """Every bundle run twice (the runner's --direct_runner_bundle_repeat: a dry run first,
    whose pushes reach the server, then the real one): the second push of each batch is
    acknowledged as held, and the model is the one an unrepeated run trains. No batch is
    cut short on time (--max-batch-delay): a re-read cuts where the first read did."""
    topic = f"endless-repeat-{random.randrange(2**31)}"
    values = json_messages(1_500, stream=3)
    fill_topic(kafka_bootstrap, topic, values, PARTITIONS)
    spec = write_spec(tmp_path)
    ends = {f"{topic}/{p}": len(values) // PARTITIONS for p in range(PARTITIONS)}
    # The two jobs run side by side (each its own workdir, server and dead-letter topic;
    # they only read the topic), and are stopped one after the other once trained.
    jobs = {}
    try:
        for repeat in (0, 1):
            workdir, log = tmp_path / f"repeat-{repeat}", tmp_path / f"repeat-{repeat}.log"
            command = stream_command(spec, kafka_bootstrap, topic, workdir, "--endless", "--batch-messages", "100",
                                     "--checkpoint-every-s", "1", "--publish-every", "0", "--deterministic",
                                     "--json", "--max-batch-delay", "600", "--dead-letter-topic",
                                     f"{topic}-{repeat}.dead", f"--direct_runner_bundle_repeat={repeat}")
            jobs[repeat] = (start_process(command, log), workdir, log)
        summaries = {repeat: stop_when_trained(process, workdir, ends, log)
                     for repeat, (process, workdir, log) in jobs.items()}
    finally:
        for process, _, _ in jobs.values():
            if process.poll() is None:
                process.kill()
    states = {}
    for repeat, summary in summaries.items():
        final = Path(summary["checkpoint"])
        assert read_applied(final) == {source: [[0, end]] for source, end in ends.items()}
        states[repeat] = load_checkpoint(final).state
        pushes = summary["pushes"]
        # Repeated, a batch's second push is acknowledged as held (how many bundles the
        # runner repeats, of those the source's resumptions make, is the runner's business).
        assert (pushes["duplicate"] > 0) == bool(repeat) and pushes["refused_partly_trained"] == 0, pushes
    assert states[1]["samples"] == states[0]["samples"] == len(values)
    assert_same_state({k: v for k, v in states[1].items() if k != "rng"}, {k: v for k, v in states[0].items() if k != "rng"})


def test_a_stream_quiet_for_longer_than_the_lease_keeps_its_worker_and_trains_what_comes_next(kafka_bootstrap,
                                                                                               tmp_path):
    """The worker renews its lease while there is nothing to train: the server drops only a
    process that died or froze. Its last batches before the quiet are checkpointed too,
    though no step follows them to take the snapshot at."""
    lease_s = 10.0
    topic, workdir, log = f"endless-quiet-{random.randrange(2**31)}", tmp_path / "work", tmp_path / "endless.log"
    values = json_messages(600, stream=4)
    fill_topic(kafka_bootstrap, topic, values[:300], 1)
    process = start_process(stream_command(write_spec(tmp_path), kafka_bootstrap, topic, workdir, "--endless",
                                           "--batch-messages", "100", "--publish-every", "0", "--checkpoint-every-s",
                                           "1", "--lease", str(lease_s), "--json"), log)
    try:
        wait_for(lambda: _checkpointed_positions(workdir) == {f"{topic}/0": 300}, process, "the first 300 trained")
        time.sleep(lease_s * 1.5)  # quiet: the server would have dropped a silent worker by now
        produce_values(kafka_bootstrap, topic, values[300:], 1)
    except BaseException:
        process.kill()
        raise
    summary = stop_when_trained(process, workdir, {f"{topic}/0": 600}, log)
    assert summary["samples"] == 600 and summary["pushes"].get("refused_dropped_worker", 0) == 0, summary
    assert "dropped worker" not in log.read_text()


def _checkpointed_positions(workdir: Path) -> dict[str, int]:
    path = latest_checkpoint(workdir / "checkpoints")
    return load_checkpoint(path).positions if path else {}


def test_a_broker_down_at_start_is_tried_again_with_a_line_a_try_and_then_trained_from(restartable_broker,
                                                                                        tmp_path):
    broker = restartable_broker
    broker.stop()
    topic, workdir, log = "late-broker", tmp_path / "work", tmp_path / "endless.log"
    # Tries of 1.5 s a backoff of 6 s apart: between two tries the test brings the broker up
    # and makes the topic (a topic missing when the broker answers is bad input, exit 2).
    process = start_process(stream_command(write_spec(tmp_path), broker.bootstrap, topic, workdir, "--endless",
                                           "--batch-messages", "50", "--publish-every", "0", "--checkpoint-every-s",
                                           "1", "--backoff", "6", "--backoff-max", "6", "--kafka-option",
                                           "bootstrap_timeout_ms=1500", "--json"), log)
    try:
        wait_for(lambda: log.read_text().count("cannot be reached") >= 2, process, "two tries", timeout=300)
        broker.start()
        fill_topic(broker.bootstrap, topic, json_messages(300), 1)
    except BaseException:
        process.kill()
        raise
    summary = stop_when_trained(process, workdir, {f"{topic}/0": 300}, log)
    assert summary["samples"] == 300
    text = log.read_text()
    tries = text.count("cannot be reached")
    assert 2 <= tries < 10 and "attempt 1 of 10" in text, text[-3000:]
    assert "Bootstrap" not in text  # the client's own lines, a dozen a try, are kept quiet
