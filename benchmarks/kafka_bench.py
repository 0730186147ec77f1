"""What the Kafka benchmarks share: a broker, the benchmark pinned to one core, topics,
and timings taken in turns.

The broker is a local Tansu process (or --bootstrap HOST:PORT). It is started before the
benchmark pins itself to one core, so the broker keeps the other one: what is measured is
the client side, on one core.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from picasso.connectors.kafka_config import KafkaConnection, ensure_topic
from picasso.connectors.testing.kafka_broker import TansuBroker


@contextlib.contextmanager
def kafka_broker(bootstrap: str | None):
    """Yields a bootstrap address: the given one, or a Tansu broker started here."""
    if bootstrap:
        yield bootstrap
        return
    broker = TansuBroker().start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def pin_to_one_core() -> int | None:
    """Pin this process to one core (the lowest it may use); returns it."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def produce_all(connection: KafkaConnection, topic: str, values: list[bytes], partitions: int = 1) -> None:
    ensure_topic(connection, topic, partitions)
    producer = connection.producer(linger_ms=20, batch_size=512 * 1024)
    for i, value in enumerate(values):
        producer.send(topic, value=value, partition=i % partitions)
    producer.flush()
    producer.close()


@dataclass(frozen=True)
class Timing:
    wall_s: float  # median over the timed runs
    cpu_s: float  # median process CPU time (every thread of this process; not the broker's)


def timings_in_turns(sides: dict[str, Callable[[], object]], repeat: int, only_first: dict[str, int] | None = None) -> dict[str, Timing]:
    """Time every side once per round, rounds in turn (a, b, c, a, b, c, ...) after one
    warm-up run each, so that a machine shared with other work slows every side alike
    instead of whichever happened to run during the busy minute. `only_first` caps the
    timed runs of slow sides (name -> runs)."""
    for fn in sides.values():
        fn()
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(repeat):
        for name, fn in sides.items():
            if only_first and round_ >= only_first.get(name, repeat):
                continue
            cpu_start, start = _cpu_seconds(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(_cpu_seconds() - cpu_start)
    return {name: Timing(statistics.median(wall[name]), statistics.median(cpu[name])) for name in sides}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
