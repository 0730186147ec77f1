"""`picasso serve`'s HTTP side: MLflow's scoring protocol on a Starlette app under uvicorn.

/invocations parses and answers with MLflow's own function (mlflow.pyfunc.scoring_server.
invocations) on the version the follower serves, so a request gets the same numbers, the
same refusals and the same JSON as from `mlflow models serve` of that version; a client
written for MLflow works unchanged. What picasso adds:
- every answer names the version that gave it (header X-Picasso-Model-Version), and a
  request keeps the version it started on, whatever swaps meanwhile;
- more than --max-rows rows is a 413, said in one line (MLflow's own refusal would quote
  the whole request back), with MLflow's error code for a bad request;
- a body nested deeper than Python's JSON parser goes (its recursion limit, about 1,000
  levels) is a 400 saying so, where MLflow's parser would fail with a RecursionError;
- every accepted connection gets TCP_NODELAY (NoDelayHTTP): a client that keeps its
  connection open is answered at once, not after its own delayed ACK (about 40 ms);
- SIGTERM and SIGINT drain the requests in flight and end run() (GracefulServer), so that
  the caller's cleanup runs and the process exits 0;
- /ping answers while any version is served; /health says whether it is the one the
  alias points at (503 with the reason when not); /version names the version; /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import uvicorn
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc.scoring_server import invocations
from mlflow.version import VERSION as MLFLOW_VERSION
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from picasso.serving.follower import Follower
from picasso.serving.server_metrics import ServeMetrics
from picasso.serving.versions import LoadedVersion, describe

VERSION_HEADER = "X-Picasso-Model-Version"
JSON = "application/json"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# JSON's brackets, and its strings (skipped whole: a bracket inside one is text).
_NESTING = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


class TooManyRows(MlflowException):
    """A request over --max-rows: HTTP 413."""

    def __init__(self, rows: int, limit: int):
        # Kept apart: invocations() prefixes the message with the whole request.
        self.refusal = f"a request of {rows} rows is over this server's limit of {limit} (--max-rows)"
        # The proto's number: MlflowException reads a name given as a string as INTERNAL_ERROR.
        super().__init__(self.refusal, error_code=INVALID_PARAMETER_VALUE)

    def get_http_status_code(self) -> int:
        return 413


class TooDeep(MlflowException):
    """A JSON body nested deeper than the parser goes: HTTP 400, saying how deep."""

    def __init__(self, depth: int):
        super().__init__(f"the request's JSON is nested {depth:,} levels deep, deeper than this server parses "
                         f"(about {sys.getrecursionlimit():,} levels); a scoring request needs a few",
                         error_code=INVALID_PARAMETER_VALUE)


def nesting_depth(body: bytes) -> int:
    """How deep a JSON text's arrays and objects go (read on the refusal path only)."""
    depth = deepest = 0
    for match in _NESTING.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


class _Scored:
    """The served pyfunc as MLflow's invocations() sees it, counting rows and holding the
    row limit; its predict is the pyfunc's own, so MLflow's input checks all run."""

    def __init__(self, loaded: LoadedVersion, max_rows: int, metrics: ServeMetrics):
        self.model, self.max_rows, self.metrics = loaded.model, max_rows, metrics
        self.metadata = loaded.model.metadata

    # `params` by name: invocations() passes a request's params only to a predict that takes them.
    def predict(self, data, params=None):
        rows = len(data) if hasattr(data, "__len__") else 1
        if rows > self.max_rows:
            raise TooManyRows(rows, self.max_rows)
        self.metrics.observe_rows(rows)
        return self.model.predict(data, params=params)


def _score(loaded: LoadedVersion, body: bytes, content_type: str, max_rows: int, metrics: ServeMetrics):
    try:
        return invocations(body, content_type, _Scored(loaded, max_rows, metrics), loaded.input_schema)
    except RecursionError:
        # json.loads goes as deep as the recursion limit and then raises this, which MLflow
        # lets through; a body that is not that deep failed for another reason: a 500.
        depth = nesting_depth(body)
        if depth < sys.getrecursionlimit() // 2:
            raise
        raise TooDeep(depth) from None


class NoDelayHTTP(AutoHTTPProtocol):
    """uvicorn's HTTP protocol, with TCP_NODELAY on the connection's socket. asyncio sets it
    only where the listening socket was made with proto IPPROTO_TCP, and
    socket.create_server makes it with proto 0: without it, Nagle's algorithm holds each
    answer of a kept-alive connection until the client's delayed ACK (about 40 ms)."""

    def connection_made(self, transport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)


class GracefulServer(uvicorn.Server):
    """uvicorn's server, whose run() returns after SIGTERM or SIGINT once the requests in
    flight are answered. uvicorn's own handling raises the signal again after that
    shutdown, which ends the process with -15 before the caller's `finally` runs."""

    stopped_by: int | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        before = {sig: signal.signal(sig, self._stop) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def _stop(self, sig: int, frame) -> None:
        self.stopped_by = self.stopped_by or sig
        self.handle_exit(sig, frame)  # a second SIGINT: uvicorn stops waiting for connections


def http_server(app, **config) -> GracefulServer:
    """The server `picasso serve` runs: its app under uvicorn, with NoDelayHTTP."""
    return GracefulServer(uvicorn.Config(app, http=NoDelayHTTP, lifespan="off", **config))


def build_app(follower: Follower, metrics: ServeMetrics, max_rows: int, scoring_threads: int = 1) -> Starlette:
    # Scoring is Python under the GIL, and torch's own threads already use every core for a
    # large request: more scoring threads than one only contend (8 kept-alive clients at
    # once were answered 84 a second with six threads, 111 with one, on two cores).
    scoring = ThreadPoolExecutor(scoring_threads, thread_name_prefix="picasso-score")

    async def score(request: Request) -> Response:
        started = time.perf_counter()
        metrics.in_flight.inc()
        try:
            return await _answer(request, started)
        finally:
            metrics.in_flight.dec()

    async def _answer(request: Request, started: float) -> Response:
        loaded = follower.served  # once: this request finishes on this version, whatever swaps meanwhile
        body = await request.body()
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                scoring, _score, loaded, body, request.headers.get("content-type", ""), max_rows, metrics)
            response = Response(result.response, status_code=result.status, media_type=result.mimetype)
        except TooManyRows as err:
            response = Response(json.dumps({"error_code": err.error_code, "message": err.refusal}),
                                status_code=413, media_type=JSON)
        except MlflowException as err:
            response = Response(err.serialize_as_json(), status_code=err.get_http_status_code(), media_type=JSON)
        except Exception as err:  # noqa: BLE001 - one request's failure, answered; the server goes on
            response = Response(json.dumps({"error_code": "INTERNAL_ERROR", "message": f"{type(err).__name__}: {err}"}),
                                status_code=500, media_type=JSON)
        response.headers[VERSION_HEADER] = loaded.version
        metrics.observe(response.status_code, time.perf_counter() - started)
        return response

    async def ping(request: Request) -> Response:
        return Response("\n", status_code=200 if follower.served is not None else 503, media_type=JSON)

    async def health(request: Request) -> Response:
        healthy, report = follower.health()
        return Response(json.dumps(report), status_code=200 if healthy else 503, media_type=JSON)

    async def version(request: Request) -> Response:
        loaded = follower.served
        report = {**describe(loaded), "mlflow": MLFLOW_VERSION}
        return Response(json.dumps(report), media_type=JSON, headers={VERSION_HEADER: loaded.version})

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[
        Route("/invocations", score, methods=["POST"]),
        Route("/ping", ping, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ])
