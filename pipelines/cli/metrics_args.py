"""--metrics-port, the flag of every long-running command (stream, ps, produce) that
serves Prometheus metrics (pipelines/runs/run_metrics.py)."""

from __future__ import annotations

import argparse


def metrics_address(text: str):
    from picasso.pipelines.runs.run_metrics import MetricsAddress

    try:
        return MetricsAddress.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--metrics-port ")) from None


def add_metrics_arg(parser) -> None:
    parser.add_argument("--metrics-port", type=metrics_address, default=None, metavar="[HOST:]PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics while it runs (HOST defaults to "
                             "0.0.0.0, every interface; default: no metrics); the README lists them")
