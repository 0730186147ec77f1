"""`picasso serve`'s HTTP side: MLflow's scoring protocol on a Starlette app under uvicorn.

/invocations parses and answers with MLflow's own function (mlflow.pyfunc.scoring_server.
invocations) on the version the follower serves, so a request gets the same numbers, the
same refusals and the same JSON as from `mlflow models serve` of that version; a client
written for MLflow works unchanged. What picasso adds:
- every answer names the version that gave it (header X-Picasso-Model-Version), and a
  request keeps the version it started on, whatever swaps meanwhile;
- more than --max-rows rows is a 413, said in one line (MLflow's own refusal would quote
  the whole request back);
- /ping answers while any version is served; /health says whether it is the one the
  alias points at (503 with the reason when not); /version names the version; /metrics.
"""

from __future__ import annotations

import asyncio
import json
import time

from mlflow.exceptions import MlflowException
from mlflow.pyfunc.scoring_server import invocations
from mlflow.version import VERSION as MLFLOW_VERSION
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from picasso.serving.follower import Follower
from picasso.serving.server_metrics import ServeMetrics
from picasso.serving.versions import LoadedVersion, describe

VERSION_HEADER = "X-Picasso-Model-Version"
JSON = "application/json"


class TooManyRows(MlflowException):
    """A request over --max-rows: HTTP 413."""

    def __init__(self, rows: int, limit: int):
        # Kept apart: invocations() prefixes the message with the whole request.
        self.refusal = f"a request of {rows} rows is over this server's limit of {limit} (--max-rows)"
        super().__init__(self.refusal, error_code="INVALID_PARAMETER_VALUE")

    def get_http_status_code(self) -> int:
        return 413


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
    return invocations(body, content_type, _Scored(loaded, max_rows, metrics), loaded.input_schema)


def build_app(follower: Follower, metrics: ServeMetrics, max_rows: int) -> Starlette:
    async def score(request: Request) -> Response:
        started = time.perf_counter()
        loaded = follower.served  # once: this request finishes on this version, whatever swaps meanwhile
        body = await request.body()
        try:
            result = await asyncio.to_thread(_score, loaded, body, request.headers.get("content-type", ""),
                                             max_rows, metrics)
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
