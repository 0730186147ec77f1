"""Serving latency: p50 and p99 of `mlflow models serve` over HTTP against the in-process pyfunc call.

A Wide&Deep model on the Criteo spec trains one cycle of planted events (--train-events)
and is published as version 1 to a local MLflow store (SQLite in a temporary directory).
A real `mlflow models serve` process (one worker, --env-manager local) then scores raw
Criteo events, 1, 100 and 10,000 rows a request, posted to /invocations as
dataframe_split JSON; the same pandas frames go to `mlflow.pyfunc.load_model(uri).predict`.
An HTTP request is timed from the encoded body to the parsed probabilities (the round
trip on a new connection, the server's JSON parsing and scoring, JSON decoding of the
answer). Building the body (`frame.to_json`) is the client's business and depends on it,
so it is timed apart: client_encode_s@ROWS, the median of 3. Both sides are warmed and
checked to give the same predictions, then timed in turns (HTTP, in-process, HTTP, ...)
with the same number of requests, so whatever else the machine does falls on both alike.

Baseline: the in-process call runs the same model, decoder and rows with no HTTP, JSON or
second process, so what it does not pay is what serving adds. Ratio
`in_process_over_http_p50@ROWS` is the in-process p50 over the HTTP p50 (below 1; higher
is better). first_request_s is the fresh server's very first request (1 row, before any
warm-up), tenth_request_s the median of its requests 2 to 10.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

from benchmarks.harness import parse_args, report, sized
from benchmarks.publish import Cycles
from picasso.builtin_specs import criteo_spec
from picasso.connectors.publishing.contract import MLflowTarget, PublishRequest
from picasso.connectors.publishing.publication import publish
from picasso.connectors.testing.mlflow_server import served_model
from picasso.synthetic import PlantedModel

ROW_COUNTS = (1, 100, 10_000)
SIDES = ("http", "in_process")
REQUEST_STREAM = 1_000  # a planted stream the model never trained on
FIRST_REQUESTS = 10  # the fresh server's first requests: the first against the median of the others


def publish_model(work: Path, train_events: int) -> tuple[MLflowTarget, str]:
    """Train one cycle and publish it to a local store in `work`; the target and models:/ URI."""
    target = MLflowTarget.for_workdir(work, model_name="serving-bench")
    cycles = Cycles("criteo", train_events)
    checkpoint = cycles.train_cycle(work / "checkpoints")
    metrics = {"auc": 0.7, "logloss": 0.6, "calibration": 1.0, "samples": cycles.trainer.samples}
    ref = publish(PublishRequest(str(checkpoint), metrics), target)
    return target, ref.model_uri


@contextmanager
def model_server(target: MLflowTarget, uri: str, work: Path) -> Iterator[str]:
    """The served model's base URL; on a failure, the server's last words on stderr."""
    log_path = work / "serve.log"
    try:
        with served_model(uri, target.tracking_uri, log_path) as (url, _):
            yield url
    except BaseException:
        # The server's own words are the only clue to why it did not start or answer.
        print(log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
        raise


def request_rows(rows: int) -> pd.DataFrame:
    """Raw Criteo events as a client sends them: the feature columns, no label."""
    spec = criteo_spec()
    table, _ = PlantedModel(spec).sample(rows, stream=REQUEST_STREAM)
    return table.drop_columns([spec.label]).to_pandas()


def encode(frame: pd.DataFrame) -> bytes:
    """The request body: the frame as dataframe_split JSON."""
    return ('{"dataframe_split": ' + frame.to_json(orient="split", index=False) + "}").encode()


def post(url: str, body: bytes) -> np.ndarray:
    """One POST /invocations: an encoded body in, probabilities out."""
    call = urllib.request.Request(f"{url}/invocations", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(call, timeout=300) as response:
        return np.asarray(json.loads(response.read())["predictions"], dtype=np.float64)


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def first_requests(url: str, frame: pd.DataFrame) -> tuple[float, float]:
    """The fresh server's first request, and the median of the next ones, before any warm-up:
    what the first caller after a deploy waits, against what later callers wait."""
    body = encode(frame)
    times = [seconds(lambda: post(url, body)) for _ in range(FIRST_REQUESTS)]
    return times[0], float(np.median(times[1:]))


def check_same_answers(url: str, model, frame: pd.DataFrame) -> None:
    """A benchmark of wrong answers would be worthless: one answer per row, the in-process one."""
    served = post(url, encode(frame))
    expected = np.asarray(model.predict(frame), dtype=np.float64)
    assert len(served) == len(frame) == len(expected), (len(served), len(frame), len(expected))
    assert np.isfinite(served).all(), "the server answered NaN or inf"
    np.testing.assert_allclose(served, expected, rtol=1e-6)


def request_count(rows: int, repeat: int) -> int:
    return max(5, repeat) if rows >= 10_000 else max(20, 20 * repeat)


def encode_seconds(frame: pd.DataFrame) -> float:
    return float(np.median([seconds(lambda: encode(frame)) for _ in range(3)]))


def time_in_turns(url: str, model, frame: pd.DataFrame, requests: int) -> dict[str, list[float]]:
    """Warm both sides, then alternate them request by request, so drift in the machine's
    load (another process, a frequency change) does not favour one side."""
    body = encode(frame)  # every request sends the same rows
    calls = {"http": lambda: post(url, body), "in_process": lambda: model.predict(frame)}
    for _ in range(3 if len(frame) < 10_000 else 1):
        for call in calls.values():
            call()
    times = {side: [] for side in SIDES}
    for _ in range(requests):
        for side in SIDES:
            times[side].append(seconds(calls[side]))
    return times


def percentiles(times: list[float]) -> tuple[float, float]:
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--train-events", type=int, default=10_000, help="planted events the served model trains on"),),
        smoke={"train_events": 2048, "repeat": 1})
    frames = {rows: request_rows(rows) for rows in sized(args, ROW_COUNTS, ROW_COUNTS[:2])}  # --smoke: no 10,000
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        work = Path(tmp)
        target, uri = publish_model(work, args.train_events)
        mlflow.set_tracking_uri(target.tracking_uri)  # publish puts back the caller's URI; load from the store
        model = mlflow.pyfunc.load_model(uri)
        started = time.perf_counter()
        with model_server(target, uri, work) as url:
            start_s = time.perf_counter() - started
            first_s, tenth_s = first_requests(url, frames[1])
            timings, encode_s = {}, {}
            for rows, frame in frames.items():
                check_same_answers(url, model, frame)
                timings[rows] = time_in_turns(url, model, frame, request_count(rows, args.repeat))
                encode_s[rows] = encode_seconds(frame)

    table, ratios = [], {}
    metrics = {"server_start_s": start_s, "first_request_s": first_s, "tenth_request_s": tenth_s,
               "train_events": args.train_events}
    for rows, by_side in timings.items():
        metrics[f"requests@{rows}"], metrics[f"client_encode_s@{rows}"] = len(by_side["http"]), encode_s[rows]
        p50 = {}
        for side in SIDES:
            p50[side], p99 = percentiles(by_side[side])
            metrics[f"{side}_p50_s@{rows}"], metrics[f"{side}_p99_s@{rows}"] = p50[side], p99
            table.append([f"{rows:,}", side, 1000 * p50[side], 1000 * p99, len(by_side[side])])
        ratios[f"in_process_over_http_p50@{rows}"] = p50["in_process"] / p50["http"]
    report("serving", ["rows", "side", "p50 ms", "p99 ms", "requests"], table, ratios, metrics, args.json,
           caption=f"server start {start_s:.1f} s; first request {1000 * first_s:.1f} ms, "
                   f"requests 2-{FIRST_REQUESTS} median {1000 * tenth_s:.1f} ms")


if __name__ == "__main__":
    main()
