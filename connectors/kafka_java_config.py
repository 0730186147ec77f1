"""A KafkaConnection's settings in the names Kafka's Java consumer takes.

Beam's cross-language ReadFromKafka (connectors/beam_kafka_io.py) runs the Java client, so
the settings picasso holds in kafka-python's names (`--kafka-option`) are written again in
Java's: most are the Java name with dots for underscores; TLS files and SASL credentials
are said differently. A setting that has no Java equivalent here is an error naming it,
never dropped: a reader that silently loses its TLS or SASL settings would either fail
late, on the workers, or talk to the broker in the clear.
"""

from __future__ import annotations

from picasso.connectors.kafka_config import KafkaConnection

# kafka-python names whose Java name is the same with dots for underscores, with the same
# meaning and values.
SAME_MEANING = frozenset({
    "client_id", "security_protocol", "sasl_mechanism", "request_timeout_ms", "session_timeout_ms",
    "heartbeat_interval_ms", "max_poll_interval_ms", "max_poll_records", "fetch_min_bytes", "fetch_max_bytes",
    "fetch_max_wait_ms", "max_partition_fetch_bytes", "isolation_level", "receive_buffer_bytes", "send_buffer_bytes",
    "reconnect_backoff_ms", "reconnect_backoff_max_ms", "retry_backoff_ms", "metadata_max_age_ms",
    "connections_max_idle_ms",
})
# The SASL mechanisms whose login a username and password make (sasl.jaas.config).
LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Translated below rather than renamed.
_TRANSLATED = {"ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname",
               "sasl_plain_username", "sasl_plain_password"}


def java_consumer_config(connection: KafkaConnection) -> dict[str, str]:
    """bootstrap.servers and every option of the connection, in Java's names; all values are
    strings (the expansion service's configuration is a map of strings)."""
    options = dict(connection.options)
    untranslatable = sorted(set(options) - SAME_MEANING - _TRANSLATED)
    if untranslatable:
        raise ValueError(f"--kafka-option {', '.join(untranslatable)}: no Java consumer setting picasso can write "
                         "it as, for Beam's ReadFromKafka (--kafka-io beam); drop it, or read with --kafka-io picasso")
    config = {"bootstrap.servers": connection.bootstrap_servers}
    config.update({key.replace("_", "."): _java_value(options[key]) for key in sorted(SAME_MEANING & set(options))})
    config.update(_tls(options))
    config.update(_sasl(options))
    return config


def _java_value(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _tls(options: dict) -> dict[str, str]:
    config = {}
    if options.get("ssl_cafile"):
        # Java's consumer reads PEM trust stores since Kafka 2.7.
        config |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(options["ssl_cafile"])}
    certfile, keyfile = options.get("ssl_certfile"), options.get("ssl_keyfile")
    if keyfile and keyfile != certfile:
        # Java takes a client's key and its certificate chain from one PEM key store.
        raise ValueError("--kafka-option ssl_keyfile: Beam's Java reader takes the client key and its certificate "
                         "from one PEM file: put both in the file of ssl_certfile and drop ssl_keyfile")
    if certfile:
        config |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(certfile)}
    if options.get("ssl_password"):
        config["ssl.key.password"] = str(options["ssl_password"])
    if options.get("ssl_check_hostname") is False:
        config["ssl.endpoint.identification.algorithm"] = ""  # Java checks the host name unless this is empty
    return config


def _sasl(options: dict) -> dict[str, str]:
    username, password = options.get("sasl_plain_username"), options.get("sasl_plain_password")
    if username is None and password is None:
        return {}
    mechanism = options.get("sasl_mechanism", "PLAIN")
    if mechanism not in LOGIN_MODULES:
        raise ValueError(f"--kafka-option sasl_mechanism={mechanism}: Beam's Java reader is given a username and "
                         f"password login for {', '.join(LOGIN_MODULES)} only")
    # kafka-python's default mechanism is PLAIN, Java's GSSAPI: it is always said.
    return {"sasl.mechanism": mechanism,
            "sasl.jaas.config": f'{LOGIN_MODULES[mechanism]} required username="{_jaas_quoted(username)}" '
                                f'password="{_jaas_quoted(password)}";'}


def _jaas_quoted(value) -> str:
    return str(value or "").replace("\\", "\\\\").replace('"', '\\"')
