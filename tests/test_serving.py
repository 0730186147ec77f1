"""`mlflow models serve -m models:/NAME@champion --env-manager local`: a real HTTP round
trip with raw events, answered as the in-process model answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import mlflow
import numpy as np
import pandas as pd
from publish_helpers import CheckpointMaker, fresh_target, request

from picasso.connectors.local_broker import free_port
from picasso.connectors.local_mlflow import wait_http
from picasso.connectors.mlflow_registry import publish

EVENTS = pd.DataFrame({
    "d1": [0.5, 3.0, None, 1.0],
    "d2": [10.0, None, 2.0, 0.0],
    "h": ["seen-or-not", None, "never-seen-id", 42],  # strings and integers hash alike
    "v": [3, 7, None, 0],
    "bag": [["a", "b"], [], None, ["c"]],
    # "vbag" is missing altogether: an empty bag for every row
})


def test_the_champion_served_over_http_answers_like_the_in_process_model(mlflow_server, tmp_path):
    target = fresh_target(mlflow_server)
    maker = CheckpointMaker(tmp_path / "checkpoints")
    publish(request(maker.next(), 0.70), target)
    publish(request(maker.next(), 0.50), target)  # not promoted: serving must pick version 1
    uri = f"models:/{target.model_name}@champion"
    mlflow.set_tracking_uri(mlflow_server)
    expected = mlflow.pyfunc.load_model(uri).predict(EVENTS)
    assert np.all((expected > 0) & (expected < 1))

    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager", "local", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_DISABLE_TELEMETRY": "true"},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/ping", server, timeout=180, what="mlflow models serve")
        body = json.dumps({"dataframe_split": json.loads(EVENTS.to_json(orient="split", index=False))}).encode()
        call = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                      headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(call, timeout=60) as response:
            answer = json.loads(response.read())
    finally:
        os.killpg(server.pid, 9)
        server.wait(timeout=30)
        log.close()
    np.testing.assert_allclose(np.array(answer["predictions"], dtype=np.float64), expected, rtol=1e-6)
    champion = mlflow.pyfunc.load_model(f"models:/{target.model_name}/1").predict(EVENTS)
    np.testing.assert_array_equal(champion, expected)
