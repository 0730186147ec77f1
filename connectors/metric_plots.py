"""Plots of a model's metrics over its versions, as SVG.

Written by hand rather than with matplotlib: importing matplotlib alone costs about a
second, a third of the publish budget, for a few polylines. The MLflow UI shows SVG
artifacts as images.
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT, PAD = 360, 180, 36


def _panel(name: str, labels: list[str], values: list[float], x0: int) -> list[str]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    parts = [f'<g transform="translate({x0},0)">',
             f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">{escape(name)}</text>',
             f'<rect x="{PAD}" y="24" width="{WIDTH - 2 * PAD}" height="{HEIGHT - PAD - 24}" fill="none" stroke="#999"/>']
    if finite:
        low, high = min(finite), max(finite)
        span = (high - low) or 1.0
        step = (WIDTH - 2 * PAD) / max(len(values) - 1, 1)

        def y(v: float) -> float:
            return 24 + (HEIGHT - PAD - 24) * (1 - (v - low) / span)

        points = [(PAD + i * step, y(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
        parts.append('<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="'
                     + " ".join(f"{px:.1f},{py:.1f}" for px, py in points) + '"/>')
        parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="#1f77b4"/>' for px, py in points]
        parts.append(f'<text x="{PAD - 4}" y="28" text-anchor="end" font-size="10">{high:.4g}</text>')
        parts.append(f'<text x="{PAD - 4}" y="{HEIGHT - PAD}" text-anchor="end" font-size="10">{low:.4g}</text>')
    for i in sorted({0, len(labels) - 1}):
        if labels:
            x = PAD + i * (WIDTH - 2 * PAD) / max(len(labels) - 1, 1)
            parts.append(f'<text x="{x:.1f}" y="{HEIGHT - PAD + 14}" text-anchor="middle" font-size="10">'
                         f'{escape(labels[i])}</text>')
    parts.append("</g>")
    return parts


def metrics_svg(history: list[dict], metrics: tuple[str, ...] = ("auc", "logloss", "calibration")) -> str:
    """One panel per metric; history is oldest first, each entry {"label": ..., metric: value}."""
    labels = [str(entry.get("label", i + 1)) for i, entry in enumerate(history)]
    body = []
    for i, name in enumerate(metrics):
        body += _panel(name, labels, [entry.get(name) for entry in history], i * WIDTH)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH * len(metrics)}" height="{HEIGHT}" '
            f'font-family="sans-serif">' + "".join(body) + "</svg>\n")


def label_delay_svg(delays_ms, wait_ms: int, bins: int = 30) -> str:
    """A histogram of label delays (seconds), with the wait W as a red line: how much of
    the clicks' mass falls beyond it, at a glance."""
    delays = sorted(d / 1000 for d in delays_ms)
    wait_s = wait_ms / 1000
    top = max([wait_s * 1.5] + ([delays[int(0.99 * (len(delays) - 1))]] if delays else []))
    width = top / bins
    counts = [0] * bins
    for d in delays:
        counts[min(int(d / width), bins - 1)] += 1
    high = max(counts) or 1
    inner_w, inner_h = 2 * WIDTH - 2 * PAD, HEIGHT - PAD - 24
    bar = inner_w / bins
    parts = [f'<text x="{WIDTH}" y="16" text-anchor="middle" font-size="13">label delay (s) of {len(delays):,} '
             f'labels; wait W = {wait_s:g} s</text>',
             f'<rect x="{PAD}" y="24" width="{inner_w}" height="{inner_h}" fill="none" stroke="#999"/>']
    for i, count in enumerate(counts):
        h = inner_h * count / high
        parts.append(f'<rect x="{PAD + i * bar:.1f}" y="{24 + inner_h - h:.1f}" width="{bar * 0.9:.1f}" '
                     f'height="{h:.1f}" fill="#1f77b4"/>')
    x = PAD + inner_w * min(wait_s / top, 1)
    parts.append(f'<line x1="{x:.1f}" y1="24" x2="{x:.1f}" y2="{24 + inner_h}" stroke="#d62728" stroke-width="2"/>')
    for value, anchor in ((0, "start"), (top, "end")):
        parts.append(f'<text x="{PAD + inner_w * value / top:.1f}" y="{HEIGHT - PAD + 14}" text-anchor="{anchor}" '
                     f'font-size="10">{value:.4g}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * WIDTH}" height="{HEIGHT}" '
            f'font-family="sans-serif">' + "".join(parts) + "</svg>\n")
