"""The broker down at start and in mid-run: cycles fail cleanly and retry with backoff,
the checkpoint stays whole, and training resumes once the broker is back.

The broker is a Tansu process of the test's own (see kafka_broker.restartable_broker). It
keeps data in memory, so after each restart the test replays the same messages into the
same partitions (they land at the same offsets), as a real Kafka would still hold them.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from stream_helpers import SPEC, fill_topic, json_messages

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.kafka_config import KafkaConnection
from picasso.pipelines.runs.stream import StreamConfig, StreamRunner
from picasso.trainer import TrainConfig

TOPIC = "restart-events"
MESSAGES = 600


def trained_messages(workdir) -> int:
    """The messages the newest checkpoint holds, by its ledger (0: no checkpoint yet)."""
    path = latest_checkpoint(workdir / "checkpoints")
    if path is None:
        return 0
    ledger = json.loads((Path(path) / "metrics.json").read_text())["ledger"]["partitions"]
    return sum(entry["messages"] for entry in ledger.values())


def _wait(condition, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_stream_survives_the_broker_going_away_and_coming_back(restartable_broker, tmp_path):
    broker = restartable_broker
    values = json_messages(MESSAGES, stream=5)
    workdir = tmp_path / "work"
    config = StreamConfig(
        connection=KafkaConnection(broker.bootstrap, {"request_timeout_ms": 5000, "bootstrap_timeout_ms": 2000}),
        topics={TOPIC: "json"}, workdir=str(workdir), spec=SPEC, mlflow=None,
        train=TrainConfig(hidden=(16, 8), device="cpu"),
        batch_messages=25, max_cycle_messages=50, idle_sleep_s=0.2,
        backoff_s=0.2, backoff_max_s=1.0, stall_timeout_s=2.0, max_seconds=240,
    )
    runner = StreamRunner(config)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("summary", runner.run()), daemon=True)

    broker.stop()  # down before the stream starts
    thread.start()
    _wait(lambda: runner.summary.failures >= 2, "failed cycles while the broker is down")
    assert trained_messages(workdir) == 0

    broker.start()
    fill_topic(broker.bootstrap, TOPIC, values, partitions=2)
    _wait(lambda: trained_messages(workdir) >= 100, "training once the broker is up")

    failures = runner.summary.failures
    broker.stop()  # gone in mid-run
    _wait(lambda: runner.summary.failures >= failures + 2, "failed cycles after the broker went away")
    trained_while_down = trained_messages(workdir)
    assert trained_while_down < MESSAGES
    load_checkpoint(latest_checkpoint(workdir / "checkpoints"))  # whole, and loadable

    broker.start()
    fill_topic(broker.bootstrap, TOPIC, values, partitions=2)  # the same messages at the same offsets
    _wait(lambda: trained_messages(workdir) == MESSAGES, "training to catch up after the restart")
    runner.stop()
    thread.join(timeout=60)
    assert not thread.is_alive()

    summary = outcome["summary"]
    assert summary.failures >= 4 and "SpanMismatch" not in (summary.last_error or "")
    # Outside failures are retried, however many, and never make good events dead letters.
    assert summary.stopped is None and summary.dead_letters == 0
    checkpoint = load_checkpoint(latest_checkpoint(workdir / "checkpoints"))
    ledger = checkpoint.metrics["ledger"]["partitions"]
    for source, entry in ledger.items():
        n = entry["next_position"]
        assert entry["messages"] == n == MESSAGES // 2 and entry["offset_sum"] == n * (n - 1) // 2, source
    assert checkpoint.state["samples"] == MESSAGES
