"""HTTP calls to a model server (`mlflow models serve` or `picasso serve`), as a client
written for MLflow's scoring protocol makes them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np

VERSION_HEADER = "X-Picasso-Model-Version"


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict
    version: str | None  # the picasso serve header naming the version that answered


def call(url: str, path: str, body: dict | bytes | None = None, timeout: float = 120) -> Answer:
    """GET (body None) or POST a JSON body; an HTTP error is an Answer too."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, _json(response.read()), response.headers.get(VERSION_HEADER))
    except urllib.error.HTTPError as err:
        return Answer(err.code, _json(err.read()), err.headers.get(VERSION_HEADER))


def post(url: str, body: dict | bytes) -> tuple[int, dict]:
    answer = call(url, "/invocations", body)
    return answer.status, answer.body


def _json(text: bytes) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        return {"text": text.decode(errors="replace")}


def probabilities(answer: dict, rows: int) -> np.ndarray:
    """The predictions of a 200 answer: one per row, each a probability (no NaN)."""
    predictions = answer["predictions"]
    values = np.array([p["probability"] if isinstance(p, dict) else p for p in predictions], dtype=np.float64)
    assert len(values) == rows and np.all((values > 0) & (values < 1)), predictions
    return values
