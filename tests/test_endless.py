"""`picasso stream --endless`: one Beam pipeline over an unbounded Kafka read, training into
the parameter server the command starts in its own process, which checkpoints and publishes
on wall-clock time. Against the Tansu broker, with a producer writing at a steady rate and
bad messages mixed in; checked from the broker's side and MLflow's."""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka_broker import create_topic
from stream_helpers import json_messages, start_process, stop_when_trained, stream_command, wait_for, write_spec
from test_stream_exactly_once import _assert_dead_letters, _with_bad_messages

from picasso.checkpoint import load_checkpoint, read_applied
from picasso.connectors.publishing import registry_tags as tags

PARTITIONS = 2
RATE = 400  # messages a second, round-robin over the partitions
ENDLESS = ("--endless", "--batch-messages", "50", "--checkpoint-every-s", "2", "--publish-every", "3",
           "--model-name", "endless-ctr", "--json")


class SteadyProducer(threading.Thread):
    """Sends the values at RATE a second, round-robin over the partitions, until told to
    stop (or out of values); remembers the (topic, partition, offset) and value of each
    message sent, once the broker acknowledged it."""

    def __init__(self, bootstrap: str, topic: str, values: list[bytes]):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.values = bootstrap, topic, values
        self.produced: dict[tuple[str, int, int], bytes] = {}
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
            futures.append((producer.send(self.topic, value=value, partition=i % PARTITIONS), value))
        producer.flush()
        for future, value in futures:
            meta = future.get(timeout=60)
            self.keys.append((meta.topic, meta.partition, meta.offset))
            self.produced[self.keys[-1]] = value
        producer.close()


def _versions_logged(workdir: Path) -> list[dict]:
    path = workdir / "runs" / "stream-versions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_endless_job_killed_twice_trains_every_good_message_once_and_publishes_as_events_arrive(
        kafka_bootstrap, tmp_path):
    """The job is SIGKILLed twice at a random moment and resubmitted as it was each time (its
    parameter server dies with it, and the next one resumes from the newest checkpoint)."""
    kills = 2
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    # Enough for minutes at RATE: the producer stops once the job is past its kills and
    # two versions are out.
    good = json_messages(60_000, stream=rng.randrange(100))
    values, bad_indices = _with_bad_messages(good)
    topic = f"endless-{seed}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    spec = write_spec(tmp_path)
    workdir = tmp_path / "work"
    log = tmp_path / "endless.log"
    command = stream_command(spec, kafka_bootstrap, topic, workdir, *ENDLESS, "--dead-letter-topic", f"{topic}.dead")
    producer = SteadyProducer(kafka_bootstrap, topic, values)
    producer.start()
    waits = [round(rng.uniform(1.0, 15.0), 1) for _ in range(kills)]
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
        producer.stop.set()
        producer.join()
    except BaseException:
        process.kill()
        raise
    sent = len(producer.keys)
    good_sent = sent - sum(1 for i in bad_indices if i < sent)
    ends = Counter()
    for _, partition, offset in producer.keys:
        ends[f"{topic}/{partition}"] = max(ends[f"{topic}/{partition}"], offset + 1)
    summary = stop_when_trained(process, workdir, dict(ends), log)
    final = Path(summary["checkpoint"])
    assert summary["positions"] == dict(ends), why

    # Every good message trained exactly once: the ledger holds each partition whole, once,
    # and the samples are the good messages (a message trained twice would count twice).
    assert read_applied(final) == {source: [[0, end]] for source, end in ends.items()}, why
    assert summary["samples"] == good_sent == load_checkpoint(final).state["samples"], why
    bad = {producer.keys[i] for i in bad_indices if i < sent}
    _assert_dead_letters(kafka_bootstrap, f"{topic}.dead", producer.produced, bad, why)

    # Every version complete and recorded once; the last holds the final checkpoint.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    versions = client.search_model_versions("name='endless-ctr'")
    recorded = Counter((r["version"], r["checkpoint"]) for r in _versions_logged(workdir))
    registered = Counter((str(v.version), v.tags[tags.CHECKPOINT_PATH]) for v in versions)
    assert recorded == registered and max(recorded.values()) == 1, f"{recorded} against {registered}; {why}"
    assert str(final) in {v.tags[tags.CHECKPOINT_PATH] for v in versions}, why
    metrics = sorted((m["samples"], m["window_samples"], m["auc"])
                     for m in (client.get_run(v.run_id).data.metrics for v in versions))
    # Each version's prequential window covers exactly the samples since the version before.
    assert all(window == samples - before for (samples, window, _), (before, _, _) in zip(metrics, [(0, 0, 0)] + metrics)), \
        f"(samples, window_samples, auc) by version: {metrics}; {why}"


@pytest.mark.parametrize("flag", [["--until-caught-up"], ["--max-cycles", "3"], ["--max-seconds", "5"]])
def test_an_endless_job_refuses_the_options_of_a_stream_in_cycles(flag, tmp_path):
    result = subprocess.run(stream_command(write_spec(tmp_path), "127.0.0.1:1", "events", tmp_path / "w",
                                           "--endless", *flag), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and flag[0] in result.stderr and "only for a stream in cycles" in result.stderr, \
        result.stderr[-2000:]


def test_an_endless_job_on_a_topic_that_does_not_exist_exits_with_its_name(kafka_bootstrap, tmp_path):
    result = subprocess.run(stream_command(write_spec(tmp_path), kafka_bootstrap, "no-such-topic", tmp_path / "w",
                                           "--endless", "--publish-every", "0"),
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 2 and "'no-such-topic' does not exist" in result.stderr, result.stderr[-2000:]


def test_ps_is_only_for_an_endless_job(tmp_path):
    result = subprocess.run(stream_command(write_spec(tmp_path), "127.0.0.1:1", "events", tmp_path / "w",
                                           "--ps", "127.0.0.1:29500"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--ps: only for the endless job" in result.stderr, result.stderr[-2000:]
