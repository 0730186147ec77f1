"""The Kafka clients' own log lines: quiet in every process of a command, shown under --debug.

kafka-python logs each failed connection as ERROR and WARNING lines, several a second for
as long as a broker is away, and each connection at INFO; librdkafka's lines (the confluent
reader) come to the logger "kafka.librdkafka", under kafka-python's. picasso says one line a
retry of its own instead: connectors.kafka_wait before a command starts, a cycle's retry line
(pipelines/runs/cycle_failures.py), and connectors.broker_outage while an endless read runs.

The command says which, once (cli/noise.show_debug), in its own process and in its
environment, which the processes it starts inherit (Beam's worker processes on this machine,
whose logging Beam sets up afresh): every client applies it again as it is made
(kafka_config.KafkaConnection.settings; the confluent reader). A program that uses the
connectors without the command line keeps its logging as it is.
"""

from __future__ import annotations

import logging
import os

CLIENT_LOGGER = "kafka"  # kafka-python's loggers, and librdkafka's (kafka.librdkafka) below them
ENVIRONMENT = "PICASSO_KAFKA_CLIENT_LOGS"
QUIET, SHOWN = "quiet", "shown"


def show_client_logs(shown: bool) -> None:
    """The command's choice (--debug: shown), here and in the processes it starts."""
    os.environ[ENVIRONMENT] = SHOWN if shown else QUIET
    apply_client_logs()


def apply_client_logs() -> None:
    """The choice of the command this process belongs to, if any. Shown: the client's
    warnings and errors (its INFO line for every connection tells nobody anything)."""
    setting = os.environ.get(ENVIRONMENT)
    if setting in (QUIET, SHOWN):
        logging.getLogger(CLIENT_LOGGER).setLevel(logging.WARNING if setting == SHOWN else logging.CRITICAL)
