"""`picasso serve`: answer MLflow's scoring protocol for a registered model and follow its
alias, swapping to each new version (by delta where it can) while it keeps answering
(picasso/serving/).

    picasso serve --model models:/picasso-ctr@champion --port 8080 --workdir ./workdir

  0  stopped by Ctrl-C or SIGTERM: the requests in flight answered, the temporary cache
     removed, and a `stopped` line said
  2  nothing to serve: a bad --model, no such store, or no version loaded within
     --start-timeout-s (the reason in one line)
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path

from picasso.pipelines.cli.metrics_args import add_metrics_arg

DEFAULT_PORT = 8080
GIL_SWITCH_S = 0.001
CACHE_PREFIX = "picasso-serve-"
OWNER_FILE = "owner.pid"  # in a temporary cache: the process that made it


def add_serve_command(commands) -> None:
    parser = commands.add_parser(
        "serve", help="serve a registered model over MLflow's scoring protocol, following its alias",
        description="Serve models:/NAME@ALIAS (followed: each new version loads beside the served one and replaces "
                    "it between two requests, by delta when the new version's delta applies to the served one) or a "
                    "pinned models:/NAME/N or runs:/ model, on /invocations, /ping, /health, /version and /metrics. "
                    "Runs until Ctrl-C or SIGTERM.",
        allow_abbrev=False)
    parser.add_argument("--model", required=True, help="models:/NAME@ALIAS (followed), models:/NAME/N or runs:/... "
                        "(pinned)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s; 0.0.0.0 "
                        "for every interface)")
    parser.add_argument("--poll-s", type=float, default=2.0,
                        help="seconds between two looks at the alias in the registry (default %(default)s)")
    parser.add_argument("--max-rows", type=int, default=100_000,
                        help="rows per request at most; more is refused with 413 (default %(default)s)")
    parser.add_argument("--scoring-threads", type=int, default=1,
                        help="requests scored at once; more wait their turn (default %(default)s: scoring holds "
                             "Python's GIL, so more threads contend rather than help, on a small machine)")
    parser.add_argument("--workdir", default=".", help="the work folder whose MLflow store (WORKDIR/mlflow.db) holds "
                        "the model, unless --mlflow-uri names another (default: .)")
    parser.add_argument("--mlflow-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="the registry: default $MLFLOW_TRACKING_URI, else sqlite:///WORKDIR/mlflow.db")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where loaded versions' files are kept (default: a temporary folder, removed at exit)")
    parser.add_argument("--start-timeout-s", type=float, default=300.0,
                        help="how long to wait for a first version to serve before giving up (default %(default)s)")
    add_metrics_arg(parser)


def run_serve(args) -> int:
    # Heavy imports here: the parser of every other command must not pay for them.
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
    from prometheus_client import CollectorRegistry

    from picasso.serving.publishing.contract import MLflowTarget
    from picasso.pipelines.cli.publish import check_existing_store
    from picasso.pipelines.runs.run_metrics import MetricsEndpoint
    from picasso.serving.follower import Follower, ModelRef
    from picasso.serving.pyfunc_model import MAX_ROWS_VARIABLE
    from picasso.serving.server import STOP_SIGNALS, build_app, http_server
    from picasso.serving.server_metrics import ServeMetrics
    from picasso.serving.versions import VersionFailure, VersionLoader, describe

    if args.max_rows < 1 or args.poll_s <= 0 or args.scoring_threads < 1:
        print("error: --max-rows and --scoring-threads must be at least 1 and --poll-s above 0", file=sys.stderr)
        return 2
    try:
        ref = ModelRef.parse(args.model)
        check_existing_store(args.workdir, args.mlflow_uri)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tracking = MLflowTarget.for_workdir(args.workdir, args.mlflow_uri).tracking_uri
    _say_serving_lines()
    # The pyfunc refuses more rows than this with a 400; the server refuses them first, with a 413.
    os.environ[MAX_ROWS_VARIABLE] = str(args.max_rows)
    # A request waiting for the GIL while a version loads in the background gets it within
    # 1 ms rather than Python's default 5: each of the many times it takes the GIL back.
    sys.setswitchinterval(GIL_SWITCH_S)
    # A poll that cannot reach the registry fails at once and is tried at the next poll,
    # rather than in MLflow's retries for minutes (its defaults).
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    cache = args.cache_dir or _temporary_cache()
    client = MlflowClient(tracking, tracking)
    follower = Follower(ref, client, VersionLoader(client, cache / "versions"), args.poll_s, on_swap=_say_swap)
    # What is imported by now (torch, MLflow, pandas, picasso: some 400,000 objects) lives as
    # long as the process: out of the collector's sight, a full collection (which loading a
    # version sets off now and then) takes milliseconds rather than 0.2 s of the GIL,
    # which every request in flight would wait for. The versions' own objects stay in sight.
    gc.collect()
    gc.freeze()
    # Until the server takes them over: a stop while the first version loads ends as one
    # while serving does, with the cache removed.
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_starting)
    stopped = None  # the line said once the cache is removed
    try:
        try:
            first = follower.load_first(args.start_timeout_s, say=_say)
        except (VersionFailure, TimeoutError, MlflowException) as err:  # the last: no such version, say
            print(f"error: nothing to serve: {' '.join(str(err).split())}", file=sys.stderr)
            return 2
        registry = CollectorRegistry()
        metrics = ServeMetrics(follower, registry)
        endpoint = None
        if args.metrics_port is not None:
            endpoint = MetricsEndpoint(args.metrics_port)
            endpoint.registry.register(_Same(registry))
        try:
            # Bound here rather than by uvicorn, which exits the process on a taken port;
            # and --port 0 then says which port it got.
            listening = socket.create_server((args.host, args.port))
        except OSError as err:
            print(f"error: cannot listen on {args.host}:{args.port}: {err.strerror or err}", file=sys.stderr)
            return 2
        port = listening.getsockname()[1]
        app = build_app(follower, metrics, args.max_rows, args.scoring_threads)
        server = http_server(app, log_level="warning", access_log=False)
        follower.start()
        facts = describe(first)
        _say(f"picasso serve: {ref.uri} version {first.version or '(pinned)'} loaded in full "
            f"({facts['bytes_read'] / 1e6:.1f} MB, {facts['load_s']:.1f} s); answering on "
            f"http://{args.host}:{port}/invocations" + (f"; metrics {endpoint.url}" if endpoint else "")
            + (f"; following the alias every {args.poll_s:g} s" if ref.follows else "; pinned"))
        # Until SIGTERM or SIGINT; then the port closes, idle connections close, and run()
        # returns once every request in flight is answered.
        server.run(sockets=[listening])
        by = f" by {signal.Signals(server.stopped_by).name}" if server.stopped_by else ""
        # A second Ctrl-C (uvicorn's force_exit) stops waiting for the requests in flight.
        stopped = f"stopped{by}, " + ("requests in flight cut short" if server.force_exit
                                      else "every request in flight answered")
        return 0
    except _Stopped as stop:
        stopped = f"stopped by {stop.name} before serving"
        return 0
    finally:
        for sig in STOP_SIGNALS:  # the few steps left are not cut short by a second signal
            signal.signal(sig, signal.SIG_IGN)
        follower.stop()
        if args.cache_dir is None:
            shutil.rmtree(cache, ignore_errors=True)
        if stopped:
            _say(f"picasso serve: {stopped}")


class _Stopped(BaseException):
    """SIGTERM or SIGINT before the server runs. A BaseException, as KeyboardInterrupt is,
    so that no `except Exception` on the way (loading a version has several) takes it."""

    def __init__(self, sig: int):
        super().__init__(sig)
        self.name = signal.Signals(sig).name


def _stop_starting(sig: int, frame) -> None:
    raise _Stopped(sig)


def _temporary_cache() -> Path:
    """A new temporary cache, marked with this process's id; and the ones of `picasso
    serve` processes that are gone without removing theirs (SIGKILL, a crash), removed."""
    for stale in Path(tempfile.gettempdir()).glob(f"{CACHE_PREFIX}*"):
        try:
            owner = int((stale / OWNER_FILE).read_text())
        except (OSError, ValueError):  # not one of ours, or being made right now
            continue
        if not _running(owner):
            shutil.rmtree(stale, ignore_errors=True)
    cache = Path(tempfile.mkdtemp(prefix=CACHE_PREFIX))
    (cache / OWNER_FILE).write_text(str(os.getpid()))
    return cache


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _say_swap(old, new) -> None:
    if old is not None:  # the first version has its own line, once the port is open
        _say(f"picasso serve: now serving version {new.version}, loaded by {new.loaded_by} "
             f"({new.bytes_read / 1e6:.2f} MB read, {new.load_s:.2f} s); was version {old.version}")


def _say_serving_lines() -> None:
    """The follower's warnings (a version that failed, the registry down and back) as plain
    lines on stderr, like every other line of this command."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("picasso.serve")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


class _Same:
    """The server's registry, collected again by --metrics-port's endpoint."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()
