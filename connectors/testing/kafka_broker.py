"""A local Kafka-compatible broker (Tansu) on loopback, for tests and benchmarks.

It starts the command line `picasso broker` starts (connectors/local_broker.py), on a free
port, and its stop() kills it outright: tests want clients to see their broker vanish.
"""

from __future__ import annotations

from picasso.connectors.local_broker import tansu_command, wait_for_started_broker
from picasso.connectors.testing.loopback import LoopbackServer


class TansuBroker(LoopbackServer):
    """One Tansu broker process on a fixed loopback port."""

    name = "tansu"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "TansuBroker":
        process = self._spawn(tansu_command("127.0.0.1", self.port))
        wait_for_started_broker("127.0.0.1", self.port, process)
        return self
