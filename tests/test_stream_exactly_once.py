"""Exactly-once: `picasso stream` killed with SIGKILL again and again, and restarted each
time, ends with the model of a run that was never interrupted, writes every dead letter,
and registers one model version per checkpoint it published.

The json topic carries bad messages among its events, and the killed runs publish a
version every cycle to the default MLflow store (SQLite in the workdir). Kills land at
random points, and at chosen ones. A chosen point is found by running the process a few
milliseconds at a time, frozen (SIGSTOP) in between, and looking at what it has done so
far; the kill lands while it is frozen, so it lands exactly in the state seen:
- amid a cycle's dead-letter writes: some of the cycle's dead letters are on the broker,
  not all (so the cycle has not had every acknowledgement, and has no checkpoint);
- inside a publish: its outbox entry is there (after a random delay);
- between registering a version and recording it: the version exists in MLflow, and its
  outbox entry is still pending (when the steps catch that moment within a few publishes;
  otherwise inside the next publish).
Afterwards, from the broker's side and MLflow's: every bad message is on the dead-letter
topic (once by its source topic, partition and offset), the ledger's counts are
the broker's, and MLflow holds one version per checkpoint, each recorded once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from kafka_broker import create_topic
from stream_helpers import (
    arrow_messages,
    assert_same_state,
    fill_topic,
    json_messages,
    load_state,
    run_stream_process,
    stream_command,
    write_spec,
)

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.kafka_config import latest_offsets
from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.serving.publishing import registry_tags as tags

CAP = 60  # --max-cycle-messages: a cycle reads [position, position + CAP) of each partition
CYCLE_ARGS = ("--deterministic", "--until-caught-up", "--batch-messages", "20", "--max-cycle-messages", str(CAP),
              "--json")
MODEL = "exactly-once-ctr"
# One process per entry, each killed: at a chosen point (see the docstring), or at random.
# A chosen kill lands in the first cycle or publish it can, so the chosen ones come first,
# while the topic is still far from done; a random kill may come after many cycles, and
# the last ones may find the topic done (the process then ends by itself: no kill).
# Each chosen kind once and two random kills: every kill is a process started and killed,
# about half a minute of the suite's time on a busy machine.
KILL_PLAN = ("dead_letters", "publish", "registered", "random", "random")
RANDOM_KILL_S = 3.0  # a random kill lands this long at most after the process starts its loop
PUBLISH_DELAY_S = 0.4  # a publish kill lands this long at most after the publish began
REGISTERED_TRIES = 3  # publishes watched for the moment between registering and recording
STEP_S = 0.005  # how long a process runs between two looks at it, when a kill point is sought
HANG_S = 240.0  # hang guards only

PUBLISH_STAGES = {"none": "publish: logging the run and model", "registered": "publish: registered, not promoted",
                  "promoted": "publish: promoted, not yet recorded"}
AMID_DEAD_LETTERS = "amid a cycle's dead-letter writes"


def _wait_for_loop(log, starts: int, process, timeout: float = 120) -> None:
    """Until the stream process has started its loop (its start line is in the log)."""
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count("streaming") < starts:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def _final(workdir):
    path = latest_checkpoint(workdir / "checkpoints")
    return path, load_checkpoint(path)


# -- the messages ------------------------------------------------------------------------


def _bad_message(n: int, event: bytes) -> bytes:
    """The n-th bad message: invalid JSON, a label out of range, JSON that is not an object."""
    row = json.loads(event)
    kinds = (event[:-7], json.dumps({**row, "label": 3}).encode(), b'["not", "an", "object"]', b"null",
             json.dumps({**row, "label": -1}).encode(), b'"text"', b"")
    return kinds[n % len(kinds)]


def _with_bad_messages(good: list[bytes]) -> tuple[list[bytes], list[int]]:
    """The events with a bad message at two places in every twenty (round-robin over two
    partitions: every tenth message of each); the values and the bad ones' indices."""
    values, bad = [], []
    for event in good:
        while len(values) % 20 in (7, 16):
            bad.append(len(values))
            values.append(_bad_message(len(bad), event))
        values.append(event)
    return values, bad


def _read_topic(bootstrap: str, topic: str) -> list:
    """Every record of the topic, by partition and offset, read with a consumer of the test's own."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = latest_offsets(consumer, partitions)
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        records = []
        deadline = time.monotonic() + 60  # a hang guard
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, f"{topic}: read {len(records)} of {sum(ends.values())} records"
            for batch in consumer.poll(timeout_ms=500).values():
                records += batch
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def _letter_key(letter: MessageDeadLetter) -> tuple[str, int, int]:
    return letter.topic, letter.partition, letter.offset


class DeadLetterWatch:
    """The dead-letter topic as the test sees it while the stream runs: each letter's source
    key by its offset on the topic (a process wrote the offsets that appeared while it lived)."""

    def __init__(self, bootstrap: str, topic: str):
        create_topic(bootstrap, topic)  # one partition, as the stream would make it
        self.tp = TopicPartition(topic, 0)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=1)
        self.consumer.assign([self.tp])
        self.consumer.seek(self.tp, 0)
        self.keys: dict[int, tuple[str, int, int]] = {}
        self.end = 0

    def catch_up(self) -> int:
        """Read up to the topic's end now; returns the end."""
        deadline = time.monotonic() + 30  # a hang guard
        while True:
            records = self.consumer.poll(timeout_ms=5)
            for batch in records.values():
                self.keys |= {r.offset: _letter_key(MessageDeadLetter.from_record(r)) for r in batch}
            end = self.consumer.highwater(self.tp)
            if not records and end is not None and self.consumer.position(self.tp) >= end:
                self.end = end
                return end
            assert time.monotonic() < deadline, "the dead-letter topic did not answer"

    def settle(self) -> int:
        """After a kill: until what the dead process sent last has landed (the end stays put)."""
        end = self.catch_up()
        while True:
            time.sleep(0.2)
            if self.catch_up() == end:
                return end
            end = self.end

    def written_since(self, offset: int) -> set[tuple[str, int, int]]:
        return {key for at, key in self.keys.items() if at >= offset}

    def close(self) -> None:
        self.consumer.close()


# -- a stream process, frozen and looked at ----------------------------------------------


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "X"


def _freeze(process) -> bool:
    """SIGSTOP, and wait until the process is stopped; False if it has exited."""
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGSTOP)  # not reaped yet (only poll() reaps it), so still this process
    deadline = time.monotonic() + 10  # a hang guard
    while (state := _state(process.pid)) not in ("T", "t", "Z", "X"):
        assert time.monotonic() < deadline, f"the stream process did not stop (state {state})"
        time.sleep(0.0005)
    return state in ("T", "t")


def _thaw(process) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)


def _step_until(process, found) -> bool:
    """Run the process STEP_S at a time until found() is true of it, frozen: True, and it is
    left frozen. False if it exits first."""
    deadline = time.monotonic() + HANG_S
    while _freeze(process):
        if found():
            return True
        _thaw(process)
        assert time.monotonic() < deadline, "no kill point came"
        time.sleep(STEP_S)
    return False


def _run_until(process, found, timeout: float = HANG_S) -> bool:
    """Let the process run until found() (True) or its exit (False)."""
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if found():
            return True
        assert time.monotonic() < deadline, "no kill point came"
        time.sleep(STEP_S)
    return False


def _version_state(db: Path, checkpoint_path: str) -> str | None:
    """What the MLflow store holds for a checkpoint, read straight from its SQLite file:
    "none", "registered" (a version, not promoted yet) or "promoted". None when the store is
    locked (the stream is frozen in a write). Only steers kills: the checks use MlflowClient."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05)) as store:
            found = store.execute("select name, version from model_version_tags where key = ? and value = ?",
                                  (tags.CHECKPOINT_PATH, checkpoint_path)).fetchone()
            if found is None:
                return "none"
            promoted = store.execute("select 1 from model_version_tags where key = ? and name = ? and version = ?",
                                     (tags.PROMOTION, *found)).fetchone()
            return "promoted" if promoted else "registered"
    except sqlite3.Error:
        return None


class KilledStream:
    """Starts `picasso stream` again and again in one workdir and kills it, each time at a
    point of KILL_PLAN's kind, and says where each kill landed."""

    def __init__(self, command: list[str], log: Path, workdir: Path, watch: DeadLetterWatch,
                 bad: set[tuple[str, int, int]], rng: random.Random):
        self.command, self.log, self.workdir, self.watch, self.bad, self.rng = command, log, workdir, watch, bad, rng
        self.pending_dir = workdir / "publish" / "pending"
        self.starts = 0
        self.start, self.before = 0, set()  # of the process now running: the dead-letter topic's end, the outbox

    def pending(self) -> list[str]:
        """Outbox entries, oldest first; a half-made one (.tmp-) included."""
        return sorted(os.listdir(self.pending_dir)) if self.pending_dir.is_dir() else []

    def cycle_bad(self) -> set[tuple[str, int, int]]:
        """The bad messages of the cycle after the last checkpoint."""
        path = latest_checkpoint(self.workdir / "checkpoints")
        positions = json.loads((Path(path) / "positions.json").read_text()) if path else {}
        return {key for key in self.bad if 0 <= key[2] - positions.get(f"{key[0]}/{key[1]}", 0) < CAP}

    def publish_stage(self) -> str | None:
        """Where the publish of the oldest outbox entry stands (see _version_state)."""
        entries = [name for name in self.pending() if not name.startswith(".")]
        if not entries:
            return None
        try:
            request = json.loads((self.pending_dir / entries[0] / "request.json").read_text())
        except FileNotFoundError:  # being removed
            return None
        return _version_state(self.workdir / "mlflow.db", request["checkpoint_path"])

    def queued(self, whole: bool = False) -> list[str]:
        """Outbox entries the process now running queued (whole: only complete ones)."""
        return [name for name in self.pending() if name not in self.before and not (whole and name.startswith("."))]

    def kill_once(self, kind: str) -> str | None:
        """One process, killed at a point of this kind; where it landed, or None if the
        process finished first."""
        self.start, self.before = self.watch.settle(), set(self.pending())
        with open(self.log, "ab") as out:
            process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        self.starts += 1
        try:
            _wait_for_loop(self.log, self.starts, process)
            landed, seen = self._seek(process, kind)
            if landed:
                process.send_signal(signal.SIGKILL)  # frozen, or running for a random kill
        except BaseException:
            process.kill()
            raise
        finally:
            _thaw(process)
            process.wait(timeout=120)
        if not landed:
            return None
        self.watch.settle()
        return seen or self._where()

    def _seek(self, process, kind: str) -> tuple[bool, str | None]:
        """Bring the process to a kill point of this kind: (whether it is there, what was
        seen there when that is surer than what is left to see after the kill)."""
        if kind == "random":
            time.sleep(self.rng.uniform(0.0, RANDOM_KILL_S))
            return process.poll() is None, None
        if kind == "dead_letters":
            return _step_until(process, self._amid_dead_letters), AMID_DEAD_LETTERS
        if kind == "registered":
            # A short window, which the steps can miss (a look at the store may find it
            # locked): after a few publishes without a sight of it, the kill lands inside
            # the next publish instead, so that the process never runs the topic to its end.
            def registered_or_over() -> bool:
                return not self.queued(whole=True) or self.publish_stage() in ("registered", "promoted")

            for _ in range(REGISTERED_TRIES):
                if not (_run_until(process, lambda: self.queued(whole=True))
                        and _step_until(process, registered_or_over)):
                    return False, None
                if self.queued(whole=True):
                    return True, None  # frozen: the version is in MLflow, its entry still pending
                _thaw(process)
            kind = "publish"
        assert kind == "publish", kind
        delay = self.rng.uniform(0.0, PUBLISH_DELAY_S)
        while _run_until(process, self.queued):
            time.sleep(delay)
            if _freeze(process) and self.queued(whole=True):
                return True, None
            _thaw(process)
            delay = 0.0  # that publish was over: catch the next one as it begins
        return False, None

    def _written(self, cycle: set) -> int:
        """How many of the cycle's dead letters the process now running wrote."""
        return len(cycle & self.watch.written_since(self.start))

    def _amid_dead_letters(self) -> bool:
        cycle = self.cycle_bad()
        self.watch.catch_up()
        return 0 < self._written(cycle) < len(cycle)

    def _where(self) -> str:
        """Where a kill landed, from what the dead process left."""
        if self.queued():  # it queued a publish and did not finish it
            return PUBLISH_STAGES.get(self.publish_stage(), "publish: queueing or removing its outbox entry")
        if self._amid_dead_letters():
            return AMID_DEAD_LETTERS
        if self._written(self.cycle_bad()):
            return "after a cycle's dead letters, before its checkpoint"
        return "elsewhere: start, planning, reading, training, checkpoint or commit"


def test_sigkilled_stream_ends_with_the_uninterrupted_model(kafka_bootstrap, tmp_path, kafka_client):
    seed = int(os.environ.get("PICASSO_TEST_SEED") or random.randrange(1 << 30))
    print(f"seed {seed} (PICASSO_TEST_SEED={seed} replays its kill plan)")
    spec_path = write_spec(tmp_path)
    events, batches = f"exactly-once-events-{kafka_client}", f"exactly-once-batches-{kafka_client}"
    values, bad_indices = _with_bad_messages(json_messages(1200, stream=3))
    fill_topic(kafka_bootstrap, events, values, partitions=2)
    fill_topic(kafka_bootstrap, batches, arrow_messages(600, 40, stream=4), partitions=1)
    bad = {(events, i % 2, i // 2) for i in bad_indices}  # produce_values goes round-robin by index
    topics = ("--topic", f"{events}:json", "--topic", f"{batches}:arrow")
    client = ("--kafka-client", kafka_client)  # the reads' client, both runs

    # The reference: one uninterrupted run, which publishes nothing. It runs beside the
    # killed ones (its own workdir, dead-letter topic and consumer group; it only reads the
    # topics), which it cannot disturb: the chosen kill points are found frozen, and the
    # random ones are random anyway.
    reference_dir, reference_log = tmp_path / "reference", tmp_path / "reference.log"
    with open(reference_log, "ab") as out:
        reference_run = subprocess.Popen(
            stream_command(spec_path, kafka_bootstrap, topics[1], reference_dir, *topics[2:], *CYCLE_ARGS, *client,
                           "--publish-every", "0", "--dead-letter-topic", f"{events}-reference-dead",
                           "--group-id", "exactly-once-reference"), stdout=out, stderr=subprocess.STDOUT)

    # The same messages, killed with SIGKILL at random points (while importing, training,
    # checkpointing, committing offsets or publishing) and at chosen ones; each cycle
    # publishes a version to the default store, sqlite:///WORKDIR/mlflow.db.
    rng = random.Random(seed)
    killed_dir, dead_topic = tmp_path / "killed", f"{events}-dead"
    command = stream_command(spec_path, kafka_bootstrap, topics[1], killed_dir, *topics[2:], *CYCLE_ARGS, *client,
                             "--publish-every", "0.001", "--model-name", MODEL, "--dead-letter-topic", dead_topic)
    log = tmp_path / "killed.log"
    watch = DeadLetterWatch(kafka_bootstrap, dead_topic)
    try:
        killer = KilledStream(command, log, killed_dir, watch, bad, rng)
        landed = [killer.kill_once(kind) for kind in KILL_PLAN]
        reference_code = reference_run.wait(timeout=300)
    finally:
        watch.close()
        if reference_run.poll() is None:
            reference_run.kill()
    assert reference_code == 0, reference_log.read_text()[-3000:]
    reference_path, reference = _final(reference_dir)
    phases = Counter(phase for phase in landed if phase)
    why = f"seed {seed}; kills by plan {list(zip(KILL_PLAN, landed))}"
    print(f"kills by phase: {dict(phases)}")
    done = run_stream_process(command, log)
    assert done.returncode == 0, f"{why}\n{log.read_text()[-3000:]}"
    assert all(phase for kind, phase in zip(KILL_PLAN, landed) if kind != "random"), why
    # The chosen points are found while the process is frozen, so these do not depend on speed.
    assert phases[AMID_DEAD_LETTERS] >= 1, why
    assert sum(n for phase, n in phases.items() if phase.startswith("publish")) >= 2, why

    killed_path, killed = _final(killed_dir)
    try:
        assert_same_state(load_state(reference_path), load_state(killed_path))
    except AssertionError as err:
        raise AssertionError(f"{err}; {why}") from err
    assert killed.positions == reference.positions, why

    # The ledger: every message counted once, none skipped, over every restart.
    ledger = killed.metrics["ledger"]["partitions"]
    assert ledger == reference.metrics["ledger"]["partitions"], why
    for source, entry in ledger.items():
        n = entry["next_position"]
        assert entry["start"] == 0 and entry["messages"] == n and entry["offset_sum"] == n * (n - 1) // 2, \
            f"{source}; {why}"
    assert sum(e["messages"] for s, e in ledger.items() if s.startswith(events)) == len(values), why
    assert ledger[f"{batches}/0"]["samples"] == 600, why
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["lag"] == 0 and summary["failures"] == 0 and summary["pending"] == 0, why

    # From the broker's side: what was produced, and the dead letters (each once).
    produced = {(r.topic, r.partition, r.offset): r.value or b""
                for topic in (events, batches) for r in _read_topic(kafka_bootstrap, topic)}
    bad_values = {values[i] for i in bad_indices}
    assert {key for key, value in produced.items() if key[0] == events and value in bad_values} == bad, why
    _assert_dead_letters(kafka_bootstrap, f"{events}-reference-dead", produced, bad, why)
    dead = _assert_dead_letters(kafka_bootstrap, dead_topic, produced, bad, why)
    _assert_ledger_counts_the_broker(ledger, produced, dead, why)
    json_sources = [s for s in ledger if s.startswith(events)]
    assert sum(ledger[s]["samples"] for s in json_sources) == len(values) - len(bad), why

    assert not killer.pending(), why
    _assert_one_version_per_checkpoint(summary["tracking_uri"], killed_dir, killed_path, why)
    print(f"{log.read_text().count('publish failed')} failed publishes logged")


def _assert_dead_letters(bootstrap: str, topic: str, produced: dict, bad: set, why: str) -> set:
    """Every bad message on the dead-letter topic once, as it was produced (a letter's
    identity is its source position), and nothing else there; returns their (topic,
    partition, offset) keys."""
    letters = [MessageDeadLetter.from_record(r) for r in _read_topic(bootstrap, topic)]
    counted = Counter(_letter_key(letter) for letter in letters)
    keys = set(counted)
    assert keys == bad, f"{topic}: {len(bad - keys)} bad messages missing, {len(keys - bad)} others there; {why}"
    twice = sorted(key for key, times in counted.items() if times > 1)
    assert not twice, f"{topic}: {len(twice)} of {len(bad)} bad messages lettered more than once, {twice[:5]}; {why}"
    for letter in letters:
        assert (letter.value or b"") == produced[_letter_key(letter)] and letter.records == 1 and letter.reason, \
            f"{letter}; {why}"
    print(f"{topic}: {len(letters)} dead letters for {len(bad)} bad messages")
    return keys


def _assert_ledger_counts_the_broker(ledger: dict, produced: dict, dead: set, why: str) -> None:
    """Per partition: the ledger's messages are the broker's, its refused records the
    dead-letter topic's (de-duplicated), and its samples the rest."""
    messages = Counter(f"{topic}/{partition}" for topic, partition, _ in produced)
    dead_letters = Counter(f"{topic}/{partition}" for topic, partition, _ in dead)
    assert set(ledger) == set(messages), why
    for source, entry in ledger.items():
        assert entry["messages"] == messages[source] and entry["refused"] == dead_letters[source], \
            f"{source}: ledger {entry}, broker {messages[source]} messages, {dead_letters[source]} dead letters; {why}"
        if entry["records"] == entry["messages"]:  # json: one record a message
            assert entry["samples"] == entry["messages"] - dead_letters[source], f"{source}: {entry}; {why}"


def _assert_one_version_per_checkpoint(tracking_uri: str, workdir: Path, last_checkpoint: Path, why: str) -> None:
    """MLflow holds one complete version per checkpoint published, the last one included,
    and the stream's log of its versions records each once."""
    from mlflow.tracking import MlflowClient

    versions = MlflowClient(tracking_uri).search_model_versions(f"name='{MODEL}'")
    checkpoints = {v.tags[tags.CHECKPOINT_PATH] for v in versions}
    assert len(versions) == len(checkpoints) == len({v.tags[tags.CHECKPOINT_ID] for v in versions}), \
        f"{sorted((v.tags[tags.CHECKPOINT_ID], v.version) for v in versions)}; {why}"
    assert all(tags.PROMOTION in v.tags for v in versions), why
    assert str(last_checkpoint) in checkpoints, why
    # Each version's metrics cover every sample trained since the version before, however
    # many processes died in between (the window is in the checkpoints).
    client = MlflowClient(tracking_uri)
    covered = sorted((m["samples"], m["window_samples"]) for m in (client.get_run(v.run_id).data.metrics
                                                                    for v in versions))
    assert all(window == samples - before for (samples, window), (before, _) in zip(covered, [(0, 0)] + covered)), \
        f"(samples, window_samples) by version: {covered}; {why}"
    lines = (workdir / "runs" / "stream-versions.jsonl").read_text().splitlines()
    recorded = Counter((r["version"], r["checkpoint"]) for r in map(json.loads, lines))
    registered = Counter((str(v.version), v.tags[tags.CHECKPOINT_PATH]) for v in versions)
    assert recorded == registered, \
        f"stream-versions.jsonl lacks {sorted(registered - recorded)}, repeats {sorted(recorded - registered)}; {why}"
    print(f"{len(versions)} versions")
