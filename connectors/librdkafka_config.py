"""A KafkaConnection's settings in the names librdkafka (confluent-kafka) takes.

picasso holds its client settings in kafka-python's names (`--kafka-option`), whichever
client reads; the confluent reader (connectors/confluent_reader.py) takes them in
librdkafka's. A setting with no librdkafka equivalent here is an error naming it, never
dropped: a reader that silently lost its TLS or SASL settings would fail late, or talk to
the broker in the clear.
"""

from __future__ import annotations

from picasso.connectors.kafka_config import KafkaConnection

# kafka-python name -> librdkafka name, with the same meaning and values.
RENAMED = {
    "client_id": "client.id",
    "group_id": "group.id",
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
    "ssl_crlfile": "ssl.crl.location",
    "session_timeout_ms": "session.timeout.ms",
    "heartbeat_interval_ms": "heartbeat.interval.ms",
    "max_poll_interval_ms": "max.poll.interval.ms",
    "request_timeout_ms": "socket.timeout.ms",  # librdkafka's timeout of a request to a broker
    "fetch_min_bytes": "fetch.min.bytes",
    "fetch_max_bytes": "fetch.max.bytes",
    "fetch_max_wait_ms": "fetch.wait.max.ms",
    "max_partition_fetch_bytes": "max.partition.fetch.bytes",
    "isolation_level": "isolation.level",
    "auto_offset_reset": "auto.offset.reset",
    "check_crcs": "check.crcs",
    "receive_buffer_bytes": "socket.receive.buffer.bytes",
    "send_buffer_bytes": "socket.send.buffer.bytes",
    "reconnect_backoff_ms": "reconnect.backoff.ms",
    "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "retry_backoff_ms": "retry.backoff.ms",
    "metadata_max_age_ms": "metadata.max.age.ms",
    "connections_max_idle_ms": "connections.max.idle.ms",
}
# kafka-python's wait for a first answer from the cluster: librdkafka has no such phase, so
# it bounds each lookup the confluent reader makes instead (metadata, offsets).
LOOKUP_TIMEOUT = "bootstrap_timeout_ms"


def librdkafka_consumer_config(connection: KafkaConnection, **overrides) -> dict:
    """bootstrap.servers and every option of the connection (overrides win), in librdkafka's names."""
    options = {**connection.options, **overrides}
    unknown = sorted(set(options) - set(RENAMED) - {"ssl_check_hostname", LOOKUP_TIMEOUT})
    if unknown:
        raise ValueError(f"--kafka-option {', '.join(unknown)}: no librdkafka setting picasso can write it as, "
                         "for --kafka-client confluent; drop it, or read with --kafka-client kafka-python")
    config = {RENAMED[key]: value for key, value in options.items() if key in RENAMED}
    if "ssl_check_hostname" in options:
        config["ssl.endpoint.identification.algorithm"] = "https" if options["ssl_check_hostname"] else "none"
    config["bootstrap.servers"] = connection.bootstrap_servers
    return config
