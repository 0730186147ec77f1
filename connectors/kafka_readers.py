"""open_reader: a stream's PartitionReader (connectors.kafka_clients), on the client its
connection names.

It sits above both readers (connectors.kafka_python_reader, connectors.confluent_reader),
which are built on the contract (kafka_clients) and the connection (kafka_config): the
contract and the connection then never import a reader back.
"""

from __future__ import annotations

from picasso.connectors.kafka_clients import CONFLUENT, PartitionReader
from picasso.connectors.kafka_config import KafkaConnection


def open_reader(connection: KafkaConnection, **overrides) -> PartitionReader:
    """A reader on the connection's client; overrides: kafka-python settings (fetch sizes)."""
    if connection.client == CONFLUENT:
        from picasso.connectors.confluent_reader import ConfluentReader

        return ConfluentReader(connection, **overrides)
    from picasso.connectors.kafka_python_reader import KafkaPythonReader

    return KafkaPythonReader(connection, **overrides)
