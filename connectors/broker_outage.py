"""A running read whose broker went away: one line a retry, in picasso's words.

An unbounded read (the endless job's, connectors.kafka_source) never fails for want of a
broker: its client reconnects on its own, quietly (connectors.kafka_client_logs), and its
polls bring nothing meanwhile. So that the job still says what is happening, a BrokerWatch
looks after each poll that brought nothing: when the client holds no connection
(PartitionReader.connected), a TCP connection to the bootstrap servers says whether the
broker is gone (connectors.kafka_wait.unreachable_reason), and while it is, one line each
time a backoff runs out (1 s, doubling to 30 s), as a command says at start:

    no Kafka broker at 127.0.0.1:9092 (connection refused); retrying in 2 s

and one once the broker answers again. The polls go on all the while, so the read goes on
as soon as the client is back.

One watch per process and bootstrap servers: the reads of several partitions, or of
several worker threads, say one line a retry between them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from picasso.connectors.kafka_wait import broker_retry_line, unreachable_reason
from picasso.connectors.retry import Backoff

log = logging.getLogger(__name__)

FIRST_BACKOFF_S, MAX_BACKOFF_S = 1.0, 30.0  # a command's broker wait's, at start (kafka_wait.BrokerWait)
CHECK_EVERY_S = 1.0  # a connected client is asked at most this often; a refused TCP try is at once
PROBE_TIMEOUT_S = 5.0  # a TCP try to a bootstrap server (kafka_wait.BrokerWait.try_timeout_s)


class BrokerWatch:
    """What one process says of its reads' broker. after_poll() is called after each poll
    of an unbounded read; lines go to say (a warning of this module's logger)."""

    def __init__(self, bootstrap_servers: str, say: Callable[[str], None] = log.warning,
                 clock: Callable[[], float] = time.monotonic,
                 probe: Callable[[str, float], str | None] = unreachable_reason):
        self.servers, self.say, self.clock, self.probe = bootstrap_servers, say, clock, probe
        self.backoff = Backoff(FIRST_BACKOFF_S, MAX_BACKOFF_S)
        self.down = False  # since a line said so, and until the broker answers again
        self.next_check_s = float("-inf")
        self._lock = threading.Lock()

    def after_poll(self, records: int, connected: Callable[[], bool | None]) -> None:
        """records: what the poll brought; connected(): whether the client holds a
        connection to a broker now (None: it cannot tell, and nothing is said)."""
        with self._lock:
            if records:
                if self.down:
                    self._back()
                return
            now = self.clock()
            if now < self.next_check_s:
                return
            if not self.down and connected() is not False:
                self.next_check_s = now + CHECK_EVERY_S
                return
            reason = self.probe(self.servers, PROBE_TIMEOUT_S)
            if reason is None:  # it takes connections: the client reconnects at its next poll
                if self.down:
                    self._back()
                self.next_check_s = now + CHECK_EVERY_S
                return
            delay = self.backoff.next_delay()
            self.down, self.next_check_s = True, now + delay
            self.say(broker_retry_line(self.servers, reason, delay))

    def _back(self) -> None:
        self.down = False
        self.backoff.reset()
        self.say(f"the Kafka broker at {self.servers} answers again: reading on")


_WATCHES: dict[str, BrokerWatch] = {}
_WATCHES_LOCK = threading.Lock()


def broker_watch(bootstrap_servers: str) -> BrokerWatch:
    """This process's watch of these servers."""
    with _WATCHES_LOCK:
        watch = _WATCHES.get(bootstrap_servers)
        if watch is None:
            watch = _WATCHES[bootstrap_servers] = BrokerWatch(bootstrap_servers)
        return watch
