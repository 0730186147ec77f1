"""Exactly-once model state: `picasso stream` killed with SIGKILL at random points, and
restarted each time, ends with the model of a run that was never interrupted."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time

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

KILLS = 6
CYCLE_ARGS = ("--deterministic", "--until-caught-up", "--publish-every", "0", "--batch-messages", "20",
              "--max-cycle-messages", "60", "--json")


def _wait_for_loop(log, starts: int, process, timeout: float = 120) -> None:
    """Until the stream process has started its loop (its start line is in the log)."""
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count("streaming") < starts:
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)


def _final(workdir):
    path = latest_checkpoint(workdir / "checkpoints")
    return path, load_checkpoint(path)


def test_sigkilled_stream_ends_with_the_uninterrupted_model(kafka_bootstrap, tmp_path):
    spec_path = write_spec(tmp_path)
    events, batches = "exactly-once-events", "exactly-once-batches"
    values = json_messages(1200, stream=3)
    fill_topic(kafka_bootstrap, events, values, partitions=2)
    fill_topic(kafka_bootstrap, batches, arrow_messages(600, 40, stream=4), partitions=1)
    topics = ("--topic", f"{events}:json", "--topic", f"{batches}:arrow")

    # The reference: one uninterrupted run.
    reference_dir = tmp_path / "reference"
    done = run_stream_process(stream_command(spec_path, kafka_bootstrap, topics[1], reference_dir, *topics[2:],
                                             *CYCLE_ARGS), tmp_path / "reference.log")
    assert done.returncode == 0, (tmp_path / "reference.log").read_text()[-3000:]
    reference_path, reference = _final(reference_dir)

    # The same messages, killed with SIGKILL at random points: while importing, training,
    # checkpointing or committing offsets.
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    killed_dir = tmp_path / "killed"
    command = stream_command(spec_path, kafka_bootstrap, topics[1], killed_dir, *topics[2:], *CYCLE_ARGS)
    log = tmp_path / "killed.log"
    kills = 0
    for attempt in range(KILLS):
        with open(log, "ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _wait_for_loop(log, attempt + 1, process)
        time.sleep(rng.uniform(0.0, 1.2))  # a cycle takes about half a second
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait(timeout=60)
    done = run_stream_process(command, log)
    assert done.returncode == 0, log.read_text()[-3000:]
    assert kills >= 5, f"only {kills} kills landed (seed {seed})"

    killed_path, killed = _final(killed_dir)
    assert_same_state(load_state(reference_path), load_state(killed_path))
    assert killed.positions == reference.positions

    # The ledger: every message counted once, none skipped, over every restart.
    ledger = killed.metrics["ledger"]["partitions"]
    assert ledger == reference.metrics["ledger"]["partitions"]
    for source, entry in ledger.items():
        n = entry["next_position"]
        assert entry["start"] == 0 and entry["messages"] == n and entry["offset_sum"] == n * (n - 1) // 2, source
    assert sum(e["messages"] for s, e in ledger.items() if s.startswith(events)) == len(values)
    assert ledger[f"{batches}/0"]["samples"] == 600
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["lag"] == 0 and summary["failures"] == 0
