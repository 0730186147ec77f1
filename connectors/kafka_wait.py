"""Before a command reads or writes Kafka: a broker that answers, and the topics it names.

kafka-python, left to itself, takes 30 s (its bootstrap_timeout_ms) to give up on a broker
that is not there, logs a dozen ERROR and WARNING lines a try meanwhile, and then raises a
KafkaTimeoutError that does not say why. Here a plain TCP connection to each bootstrap
server is tried first: it fails at once, with the reason (connection refused, unknown
host). Only a server that takes the connection is asked for its topics. Each failed try is
one line for the caller to print:

    no Kafka broker at 127.0.0.1:9092 (connection refused); retrying in 2 s

The same line, from broker_retry_line, says each retry of a cycle and of a running endless
read (connectors.broker_outage), and each is counted (BROKER_RETRIES: the metric
picasso_kafka_broker_retries_total). The commands keep the clients' own logs quiet (but
under --debug: connectors.kafka_client_logs), so that line is all a log file gets.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kafka.errors import KafkaError

from picasso.connectors.kafka_config import KafkaConnection, topics_missing_message
from picasso.connectors.retry import Backoff

DEFAULT_KAFKA_PORT = 9092  # what kafka-python takes for a server given without a port


@dataclass(frozen=True)
class BrokerWait:
    """How long to wait for a broker, and how often to try."""

    timeout_s: float | None = None  # give up after this long; None: never (a live stream)
    first_backoff_s: float = 1.0  # between tries: doubles up to max_backoff_s
    max_backoff_s: float = 30.0
    try_timeout_s: float = 5.0  # one try: its TCP connection, then its topic lookup
    topic_poll_s: float = 1.0  # between looks for a topic that is waited for

    def __post_init__(self):
        if self.timeout_s is not None and self.timeout_s < 0:
            raise ValueError(f"a broker timeout must be >= 0 s, got {self.timeout_s}")
        if not 0 <= self.first_backoff_s <= self.max_backoff_s:
            raise ValueError(f"the broker retry backoff must satisfy 0 <= first ({self.first_backoff_s}) <= max "
                             f"({self.max_backoff_s})")


class KafkaUnreachable(ValueError):
    """No broker answered within the wait. A ValueError: the command ends as on bad input
    (exit 2, this one line), since what it was given (--bootstrap-servers,
    --kafka-option) reaches no broker."""


class TopicsMissing(ValueError):
    """A topic to read does not exist: bad input (exit 2), naming the topics that do."""


def unreachable_reason(bootstrap_servers: str, timeout_s: float) -> str | None:
    """Why none of the bootstrap servers takes a TCP connection ('connection refused',
    'unknown host', ...); None when one does."""
    reasons = []
    for server in (s.strip() for s in bootstrap_servers.split(",") if s.strip()):
        host, sep, port = server.rpartition(":")
        if not sep:
            host, port = server, str(DEFAULT_KAFKA_PORT)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            return None
        except ValueError:
            reasons.append(f"{server} is not HOST:PORT")
        except ConnectionRefusedError:
            reasons.append("connection refused")
        except socket.gaierror:
            reasons.append("unknown host")
        except TimeoutError:
            reasons.append(f"no answer within {timeout_s:g} s")
        except OSError as err:
            reasons.append((err.strerror or type(err).__name__).lower())
    return "; ".join(dict.fromkeys(reasons)) or "no server given"


class RetryCount:
    """Retries said in this process, from any thread. A reader subtracts the count it
    started from (several runs in one process, as in tests, share it)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0

    def add(self) -> None:
        with self._lock:
            self._count += 1

    @property
    def count(self) -> int:
        with self._lock:
            return self._count


BROKER_RETRIES = RetryCount()


def broker_retry_line(bootstrap_servers: str, reason: str, delay_s: float) -> str:
    """The line of one retry while no broker answers, counted as it is made."""
    BROKER_RETRIES.add()
    return f"no Kafka broker at {bootstrap_servers} ({reason}); retrying in {seconds(delay_s)} s"


def error_line(err: BaseException, limit: int = 300) -> str:
    """'KafkaTimeoutError: Unable to bootstrap from ...': its type once (kafka-python's
    errors name themselves already), its first line."""
    text = str(err).splitlines()[0][:limit] if str(err) else ""
    name = type(err).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


def seconds(value: float) -> str:
    """A delay as a retry line says it: whole seconds from 1 s ('2', '30'), else '0.5'."""
    return f"{value:.0f}" if value >= 1 else f"{value:.2g}"


class BrokerWaiter:
    """The cluster's topics once a broker answers, trying again (one line a try) as
    BrokerWait says. stopped(), when given, is asked while it waits (a SIGTERM meanwhile):
    the wait then ends with None."""

    def __init__(self, connection: KafkaConnection, wait: BrokerWait, say: Callable[[str], None],
                 stopped: Callable[[], bool] | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.connection, self.wait, self.say = connection, wait, say
        self.stopped, self.sleep, self.clock = stopped, sleep, clock

    def topics(self) -> set[str] | None:
        wait, servers = self.wait, self.connection.bootstrap_servers
        started = self.clock()
        backoff = Backoff(wait.first_backoff_s, wait.max_backoff_s)
        while True:
            reason = unreachable_reason(servers, wait.try_timeout_s)
            if reason is None:
                try:
                    return self._list_topics()
                except (KafkaError, OSError) as err:  # it takes connections, but not as a Kafka broker
                    reason = error_line(err)
            left = None if wait.timeout_s is None else wait.timeout_s - (self.clock() - started)
            if left is not None and left <= 0:
                raise KafkaUnreachable(f"no Kafka broker at {servers} ({reason}) within {seconds(wait.timeout_s)} s: "
                                       "is one running there, and are --bootstrap-servers and --kafka-option right?")
            delay = backoff.next_delay() if left is None else min(backoff.next_delay(), left)
            self.say(broker_retry_line(servers, reason, delay))
            if not self.pause(delay):
                return None

    def _list_topics(self) -> set[str]:
        timeout_ms = int(self.wait.try_timeout_s * 1000)
        consumer = self.connection.consumer(bootstrap_timeout_ms=timeout_ms, request_timeout_ms=max(timeout_ms, 1000))
        try:
            return set(consumer.topics())
        finally:
            consumer.close()

    def pause(self, delay_s: float) -> bool:
        """Sleep delay_s (in short steps when it may be stopped); False if stopped() meanwhile."""
        if self.stopped is None:
            self.sleep(delay_s)
            return True
        end = self.clock() + delay_s
        while not self.stopped():
            left = end - self.clock()
            if left <= 0:
                return True
            self.sleep(min(left, 0.2))
        return False


def check_topics(waiter: BrokerWaiter, topics: Iterable[str], wait_for_topic: bool = False) -> bool:
    """Whether every topic exists, once a broker answers (False: stopped meanwhile).

    A topic that does not exist is an error (TopicsMissing) naming it and the topics that
    do, unless wait_for_topic: then it says once that it waits, and for what, and looks
    again every BrokerWait.topic_poll_s until they all exist.
    """
    wanted = list(dict.fromkeys(topics))
    existing = waiter.topics()
    if existing is None:
        return False
    missing = [topic for topic in wanted if topic not in existing]
    if missing and not wait_for_topic:
        raise TopicsMissing(topics_missing_message(missing, existing, waiter.connection.bootstrap_servers))
    if not missing:
        return True
    waited = ", ".join(missing)
    waiter.say(f"waiting for topic {waited} to exist at {waiter.connection.bootstrap_servers} (--wait-for-topic)")
    while missing:
        if not waiter.pause(waiter.wait.topic_poll_s):
            return False
        existing = waiter.topics()  # the broker may go away meanwhile: its retry lines again
        if existing is None:
            return False
        missing = [topic for topic in missing if topic not in existing]
    waiter.say(f"topic {waited} exists now: starting")
    return True
