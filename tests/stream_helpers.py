"""Shared pieces of the stream tests: a small spec on disk, messages, and running
`picasso stream` as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from helpers import small_spec
from kafka_broker import create_topic, produce_values

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.decoding.message_formats import encode_arrow, encode_json
from picasso.connectors.synthetic.planted import PlantedModel

SPEC = small_spec(name="stream-test")


def write_spec(directory: Path) -> Path:
    path = directory / "spec.yaml"
    path.write_text(SPEC.to_yaml())
    return path


def json_messages(count: int, stream: int = 0) -> list[bytes]:
    table, _ = PlantedModel(SPEC).sample(count, stream=stream)
    return encode_json(table)


def arrow_messages(rows: int, rows_per_message: int, stream: int = 1) -> list[bytes]:
    table, _ = PlantedModel(SPEC).sample(rows, stream=stream)
    return encode_arrow(table, rows_per_message)


def fill_topic(bootstrap: str, topic: str, values: list[bytes], partitions: int) -> None:
    create_topic(bootstrap, topic, partitions)
    produce_values(bootstrap, topic, values, partitions)


def stream_command(spec_path: Path, bootstrap: str, topic: str, workdir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "picasso.pipelines.cli", "stream", "--spec", str(spec_path), "--topic", topic,
            "--workdir", str(workdir), "--bootstrap-servers", bootstrap, "--hidden", "16,8", "--device", "cpu",
            *extra]


def run_stream_process(command: list[str], log: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    with open(log, "ab") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)


def load_state(checkpoint: Path) -> dict:
    return torch.load(Path(checkpoint) / "state.pt", weights_only=True)


def assert_same_state(a: dict, b: dict, atol: float = 1e-6) -> None:
    """Trainer states (model, optimizer slots, step, RNG, whatever the trainer saves) equal
    to atol, key by key."""
    assert a["step"] == b["step"] and a["samples"] == b["samples"]
    _assert_close(a, b, "state", atol)


def _assert_close(a, b, where: str, atol: float) -> None:
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{where}[{i}]", atol)
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for key in a:
            _assert_close(a[key], b[key], f"{where}.{key}", atol)
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape, where
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=lambda m: f"{where}: {m}")
    else:
        assert a == b, where


# -- the endless job ---------------------------------------------------------------------


def start_process(command: list[str], log: Path) -> subprocess.Popen:
    """The command as a process writing to log, with no MLflow URI from the test session's
    environment: a stream that publishes does so to its work folder's own store."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    with open(log, "ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 600) -> None:
    """Until condition() holds; fails if the process exits first. The timeout is a bound for
    a hung process, never a measure of speed."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the process exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.5)


def wait_until_serving(server: subprocess.Popen, port: int) -> None:
    """Until the parameter server process at port takes calls (a busy machine may take a
    minute to start a process; a job finding no server within its timeout exits, as it
    should)."""
    from picasso.distributed.param_server import ServerAddress

    connection = ServerAddress("127.0.0.1", port).connect(0)
    try:
        wait_for(lambda: connection.wait_ready(1.0), server, "the server taking calls")
    finally:
        connection.close()


def stop_when_trained(process: subprocess.Popen, workdir: Path, positions: dict[str, int], log: Path) -> dict:
    """Once the endless job's newest checkpoint holds `positions` (every message read),
    stop it as an operator would (SIGTERM); its --json summary."""
    def trained() -> bool:
        path = latest_checkpoint(workdir / "checkpoints")
        return path is not None and load_checkpoint(path).positions == positions

    try:
        wait_for(trained, process, f"a checkpoint at {positions}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            process.kill()
    return json.loads(log.read_text().strip().splitlines()[-1])
