"""A publish's numbers as MLflow takes them: metric names it accepts, nested metrics
flattened to dotted names, and the Metric entities of one batch, series with their steps."""

from __future__ import annotations

import math
import re
import time

from mlflow.entities import Metric


def metric_name(text: str) -> str:
    """A metric name MLflow takes. It refuses names that a path normalisation would change
    (a source URL's "s3://" has an empty segment), so empty and "." segments are dropped
    and ".." ones renamed."""
    name = re.sub(r"[^A-Za-z0-9_\-. /]", "_", text)
    segments = [("__" if segment == ".." else segment) for segment in name.split("/") if segment not in ("", ".")]
    return ("/" if name.startswith("/") else "") + "/".join(segments)[:200]  # a local path keeps its name


def flatten_numbers(values: dict, prefix: str, skip: tuple[str, ...] = ("ledger", "step_metrics")) -> dict[str, float]:
    """Numeric leaves of nested dicts, as dotted names."""
    flat = {}
    for key, value in values.items():
        if key in skip:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_numbers(value, f"{name}.", ()))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


def metric_entities(values: dict[str, float], series: dict[str, list], model_id: str) -> list[Metric]:
    """values at step 0 and each series' finite points at their steps, all naming the model."""
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, 0, model_id=model_id) for k, v in values.items()]
    for name, points in series.items():
        metrics += [Metric(metric_name(name), float(value), now, int(step), model_id=model_id)
                    for step, value in points if value is not None and math.isfinite(float(value))]
    return metrics
