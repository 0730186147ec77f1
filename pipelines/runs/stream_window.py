"""What a stream's next version reports, and the checkpoint files that carry it.

A published version's metrics cover everything since the version before: each batch's
labels and scores, taken before the batch was trained on (prequential evaluation), and
for a joined stream the join's counts, label delays and per-cycle series. Kept in memory
only, they would cover just the process that published: after a crash and a restart the
batches and join counts of the cycles before it were gone from the next version. So each
checkpoint carries the window as it stands when it is written, and a stream restored from
a checkpoint goes on with that window, unless a version of that very checkpoint was
queued already (its version holds the window: StreamPublisher.adopt starts a new one).

A window costs 8 bytes a scored sample in each checkpoint (and a joined one 8 a matched
label), until the next publish; a stream that never publishes keeps none.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa

from picasso.sample_join.join_rules import JoinCounts
from picasso.trainer import evaluation_metrics

SCORED_FILE = "stream-window.arrow"  # the prequential labels and scores since the last publish
JOIN_FILE = "join-window.arrow"  # a joined stream's counts, delays and series since the last publish
_META = b"picasso.window"  # the schema metadata key of a window's scalars (JSON)


@dataclass
class ScoredWindow:
    """Each batch's labels and scores since the last publish, in training order."""

    labels: list[np.ndarray] = field(default_factory=list)
    scores: list[np.ndarray] = field(default_factory=list)

    def add(self, labels: np.ndarray, scores: np.ndarray) -> None:
        self.labels.append(labels)
        self.scores.append(scores)

    def metrics(self) -> dict[str, float]:
        metrics = evaluation_metrics(*self.arrays())
        return {"auc": metrics.auc, "logloss": metrics.logloss, "window_samples": metrics.samples,
                "window_positives": metrics.positives,
                "mean_prediction": metrics.mean_prediction, "mean_label": metrics.mean_label}

    def to_bytes(self) -> bytes:
        labels, scores = self.arrays()
        return _ipc(pa.table({"label": labels, "score": scores}), {})

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.labels:
            return np.zeros(0, np.float32), np.zeros(0, np.float32)
        # Kept as the one array: every checkpoint writes the window, and would otherwise
        # join the same batches again each cycle until the next publish.
        self.labels, self.scores = [np.concatenate(self.labels)], [np.concatenate(self.scores)]
        return self.labels[0], self.scores[0]

    @classmethod
    def from_bytes(cls, data: bytes) -> "ScoredWindow":
        table, _ = _read_ipc(data)
        window = cls()
        if table.num_rows:
            window.add(table.column("label").to_numpy(), table.column("score").to_numpy())
        return window


@dataclass
class JoinWindow:
    """A joined stream's join since the last publish: its counts, the delays of the labels
    it matched, and one point per cycle of each count and of what it held."""

    counts: JoinCounts = field(default_factory=JoinCounts)
    delays_ms: list[np.ndarray] = field(default_factory=list)
    series: dict[str, list] = field(default_factory=dict)  # join.cycle.<name> -> [[cycle, its value], ...]

    def add_cycle(self, cycle: int, counts: JoinCounts, delays_ms: list[np.ndarray], held: dict[str, int]) -> None:
        # Logged with the cycle's number as its step: several cycles may end at one
        # training step (the first ones fill the sample buffer), and MLflow keeps one
        # point per metric and step.
        for name, value in {**asdict(counts), **held}.items():
            self.series.setdefault(f"join.cycle.{name}", []).append([cycle, value])
        self.counts.add(counts)
        self.delays_ms += delays_ms

    def delays(self) -> np.ndarray:
        if not self.delays_ms:
            return np.zeros(0, np.int64)
        self.delays_ms = [np.concatenate(self.delays_ms)]  # as ScoredWindow's arrays: joined once
        return self.delays_ms[0]

    def to_bytes(self) -> bytes:
        return _ipc(pa.table({"delay_ms": self.delays().astype(np.int64)}),
                    {"counts": asdict(self.counts), "series": self.series})

    @classmethod
    def from_bytes(cls, data: bytes) -> "JoinWindow":
        table, scalars = _read_ipc(data)
        delays = table.column("delay_ms").to_numpy()
        return cls(JoinCounts(**scalars["counts"]), [delays] if len(delays) else [], scalars["series"])


def _ipc(table: pa.Table, scalars: dict) -> bytes:
    table = table.replace_schema_metadata({_META: json.dumps(scalars, sort_keys=True).encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _read_ipc(data: bytes) -> tuple[pa.Table, dict]:
    table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
    return table, json.loads((table.schema.metadata or {}).get(_META, b"{}"))
