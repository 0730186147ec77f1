"""A local S3-compatible server (moto's standalone server) on loopback, for tests and
benchmarks of runs whose state lives on an object store.

moto ships in the `test` and `bench` extras (`moto[server]`); nothing is downloaded at run
time. Credentials are any non-empty strings: the server checks none.
"""

from __future__ import annotations

import os
import sys

from picasso.connectors.testing.loopback import LoopbackServer, wait_http

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "picasso-test", "AWS_SECRET_ACCESS_KEY": "picasso-test",
               "AWS_DEFAULT_REGION": REGION}


class S3Server(LoopbackServer):
    """One moto server process; `bucket()` makes a bucket on it."""

    name = "moto"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> "S3Server":
        process = self._spawn([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                              env={**os.environ, **CREDENTIALS})
        wait_http(f"{self.endpoint}/moto-api/", process, timeout, what="moto server")
        return self

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def beam_args(self) -> list[str]:
        """The pipeline options that point Beam's S3 filesystem here (credentials: env())."""
        return [f"--s3_endpoint_url={self.endpoint}", f"--s3_region_name={REGION}"]

    def env(self) -> dict[str, str]:
        """What boto3 clients other than Beam's (MLflow's artifact store) need to find it."""
        return {**CREDENTIALS, "MLFLOW_S3_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint}

    def bucket(self, name: str) -> str:
        import boto3  # a test extra (with moto), needed only here

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                              aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        client.create_bucket(Bucket=name)
        return f"s3://{name}"
