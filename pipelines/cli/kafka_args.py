"""The flags and values the Kafka commands share (`picasso stream`, its endless job and
`picasso ps --endless`): the broker and its client, the topics and their formats, and a
stream's start."""

from __future__ import annotations

import argparse
import os

from picasso.connectors.kafka_clients import CLIENTS, KAFKA_PYTHON


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
                        help="Kafka brokers, host:port[,host:port] (default: $KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                        help="any kafka-python client setting, e.g. security_protocol=SASL_SSL, "
                             "sasl_mechanism=PLAIN, ssl_cafile=/path; repeatable")


def add_kafka_client_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kafka-client", choices=CLIENTS, default=KAFKA_PYTHON,
                        help="the client that reads the topics: kafka-python (the default), or confluent "
                             "(librdkafka: the install extra 'confluent'); --kafka-option keeps "
                             "kafka-python's names with either")


def kafka_connection(args):
    # kafka-python (and yaml): for a command that connects, not for its flags.
    import yaml

    from picasso.connectors.kafka_config import KafkaConnection

    options = {}
    for item in args.kafka_option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--kafka-option {item!r}: expected KEY=VALUE")
        options[key.strip()] = yaml.safe_load(value)  # numbers and booleans as such
    return KafkaConnection(args.bootstrap_servers, options, client=getattr(args, "kafka_client", KAFKA_PYTHON))


def topic_formats(items: list[str]) -> dict[str, str]:
    from picasso.connectors.decoding.message_formats import FORMATS  # the decoders (torch): see kafka_connection

    topics = {}
    for item in items:
        topic, _, fmt = item.partition(":")
        fmt = fmt or "json"
        if fmt not in FORMATS:
            raise ValueError(f"--topic {item!r}: format must be one of {', '.join(FORMATS)}")
        topics[topic] = fmt
    return topics


def stream_start(args):
    """--warm-start and --start-at as a StreamStart; None for a stream from scratch at the
    earliest offsets (as before either existed)."""
    from picasso.pipelines.runs.stream_start import StreamStart

    if args.warm_start is None and args.start_at == "earliest":
        return None
    return StreamStart(args.warm_start, args.start_at)
