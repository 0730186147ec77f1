"""Exactly-once, joined: `picasso stream --impressions --labels` killed with SIGKILL at
random points and restarted each time ends with the model, the join and the samples of a
run that was never interrupted, and publishes the version it would have published: each
run publishes once, when it ends (the interval is never due), so the killed ones never do,
and the last one's version covers every cycle of every run (to the default store,
sqlite:///WORKDIR/mlflow.db)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time

import numpy as np
from kafka_broker import create_topic, produce_values
from stream_helpers import SPEC, assert_same_state, load_state, write_spec

from picasso.checkpoint import latest_checkpoint, read_checkpoint_file
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.connectors.synthetic.events import EventStreamConfig, make_event_stream

KILLS = 4
# Each killed process first finishes 0-2 cycles of its own (so the kills fall at different
# checkpoints, not all before the first), then dies within this long: inside a cycle, its
# checkpoint or between cycles.
KILL_WITHIN_S = 1.0
HANG_S = 240.0  # hang guards only
JOIN_ARGS = ("--label-wait", "1m", "--late-labels", "correct", "--deterministic", "--until-caught-up",
             "--batch-messages", "20", "--max-cycle-messages", "60", "--publish-every", "3600", "--hidden", "16,8",
             "--device", "cpu", "--model-name", "joined-exactly-once", "--json")
CYCLE_LINE = re.compile(r"cycle \d+: ")
JOIN_FILES = ("join-records.arrow", "join-features.arrow", "join-state.json", "join-ready.arrow")


def _command(spec_path, bootstrap, topics, workdir) -> list[str]:
    import sys

    return [sys.executable, "-m", "picasso.pipelines.cli", "stream", "--spec", str(spec_path),
            "--impressions", topics[0], "--labels", topics[1], "--workdir", str(workdir),
            "--bootstrap-servers", bootstrap, "--dead-letter-topic", f"{topics[0]}.dead", *JOIN_ARGS]


def _default_store_env() -> dict[str, str]:
    """This process's environment without an MLflow URI, so that each run publishes to its
    own workdir's default store: an earlier test of the session may have exported the
    session server's, where the reference and the killed runs would share one model name."""
    return {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}


def _cycles(log) -> int:
    """Cycles the log reports done (each progress line is `cycle N: ...`)."""
    return len(CYCLE_LINE.findall(log.read_text(errors="replace"))) if log.exists() else 0


def _wait_for_cycles(log, count: int, process) -> bool:
    """Until the log reports `count` cycles; False if the process ended first."""
    deadline = time.monotonic() + HANG_S
    while _cycles(log) < count:
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)
    return True


def test_sigkilled_joined_stream_ends_with_the_uninterrupted_model_and_samples(kafka_bootstrap, tmp_path):
    seed = int(os.environ.get("PICASSO_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (PICASSO_TEST_SEED={seed} replays its kill plan)")
    rng = random.Random(seed)
    events = make_event_stream(PlantedModel(SPEC), 600, stream=5,
                               config=EventStreamConfig(start_ms=1_780_000_000_000, impressions_per_s=2.0,
                                                        label_delay_mean_ms=20_000))
    topics = (f"killed-impressions-{seed}", f"killed-labels-{seed}")
    impressions = [json.dumps(row).encode() for row in events.impressions.to_pylist()]
    impressions[100:100] = [b"{not json"]  # a bad event among them
    create_topic(kafka_bootstrap, topics[0], 2)
    produce_values(kafka_bootstrap, topics[0], impressions, 2)
    create_topic(kafka_bootstrap, topics[1], 1)
    produce_values(kafka_bootstrap, topics[1], [json.dumps(row).encode() for row in events.labels.to_pylist()], 1)
    spec_path = write_spec(tmp_path)

    # The reference runs beside the killed runs (its own workdir, store and consumer group;
    # it only reads the topics): the kills wait for the killed runs' own cycles.
    reference_dir = tmp_path / "reference"
    with open(tmp_path / "reference.log", "wb") as out:
        reference_run = subprocess.Popen([*_command(spec_path, kafka_bootstrap, topics, reference_dir), "--group-id",
                                          "joined-exactly-once-reference"], stdout=out, stderr=subprocess.STDOUT,
                                         env=_default_store_env())

    killed_dir, log = tmp_path / "killed", tmp_path / "killed.log"
    command = _command(spec_path, kafka_bootstrap, topics, killed_dir)
    killed_at = set()  # the cycle counts in the log when kills landed
    # Cycles each run waits for before its kill. A kill after the first waits for at least
    # one, so that kills land after two cycle counts at least: four draws of 0 would kill
    # every run in its start-up.
    waits = [rng.randint(0, 2) for _ in range(KILLS)]
    if not any(waits[1:]):
        waits[rng.randrange(1, KILLS)] = rng.randint(1, 2)
    try:
        for wait in waits:
            with open(log, "ab") as out:
                process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=_default_store_env())
            if _wait_for_cycles(log, _cycles(log) + wait, process):
                time.sleep(rng.uniform(0, KILL_WITHIN_S))
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                killed_at.add(_cycles(log))
            process.wait(timeout=HANG_S)
        with open(log, "ab") as out:
            last = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=HANG_S,
                                  env=_default_store_env())
        reference_code = reference_run.wait(timeout=HANG_S)
    finally:
        if reference_run.poll() is None:
            reference_run.kill()
    assert reference_code == 0, (tmp_path / "reference.log").read_text()[-3000:]
    assert last.returncode == 0, log.read_text()[-3000:]
    assert len(killed_at) >= 2, f"kills landed after {sorted(killed_at)} cycles only: the test proved little"

    reference = latest_checkpoint(reference_dir / "checkpoints")
    final = latest_checkpoint(killed_dir / "checkpoints")
    assert_same_state(load_state(final), load_state(reference), atol=0)
    for name in JOIN_FILES:  # the pending impressions, the waiting labels, the samples not yet trained
        assert read_checkpoint_file(final, name) == read_checkpoint_file(reference, name), name
    join = json.loads(read_checkpoint_file(final, "join-state.json"))
    counts, delays = join["counts"], np.array(events.truth.column("label_delay_ms").to_pylist())
    # Each impression once (a correction is the flagged second sample of a late click), none lost.
    assert counts["impressions"] == len(delays) and counts["duplicate_impressions"] == 0
    assert counts["positives"] == int(np.count_nonzero((delays >= 0) & (delays <= 60_000)))
    assert counts["corrections"] == counts["late_labels"] > 0 and join["watermark"] is not None

    # The one version each made: the same metrics, the join's counts and the prequential
    # window over every sample included (the bytes the join holds are the process's own).
    versions = [_version_metrics(log), _version_metrics(tmp_path / "reference.log")]
    assert versions[0] == versions[1] and versions[0]["window_samples"] == versions[0]["samples"] > 0
    assert versions[0]["join.positives"] == counts["positives"] and versions[0]["join.impressions"] == len(delays)


def _version_metrics(log) -> dict[str, float]:
    """The metrics of the only version of the stream whose --json summary ends the log."""
    from mlflow.tracking import MlflowClient

    summary = json.loads(log.read_text().strip().splitlines()[-1])
    client = MlflowClient(summary["tracking_uri"])
    [version] = client.search_model_versions("name='joined-exactly-once'")
    return {name: value for name, value in client.get_run(version.run_id).data.metrics.items() if "bytes" not in name}
