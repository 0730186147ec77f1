"""Loopback servers and in-process stand-ins for tests and benchmarks, not for production.

- loopback.py:     free ports, waiting for an HTTP endpoint, a server process on a loopback port;
- kafka_broker.py: a Kafka-compatible broker (Tansu) on loopback;
- mlflow_server.py: an `mlflow server`, and `mlflow models serve` of a model, on loopback;
- s3_server.py:    an S3-compatible server (moto) on loopback;
- param_server.py: every parameter-server shard in this process, behind the same PSClient.

Nothing in picasso, picasso.kernels or picasso.pipelines imports these.
"""
