"""Checkpoints: one directory per save, written whole or not at all.

A checkpoint is written under a temporary name and renamed into place, so a crash leaves
either the previous checkpoint or the new one, never half of one. Its name,
step-<step>-<n>, sorts in the order of saving: n counts the saves under the root, so a
save that moved only the source positions (every record of a chunk refused: no step)
still gets a directory of its own. It holds:
- state.pt: model and optimizer state (embedding rows and their optimizer slots included),
  all taken at the same step, plus the step, the sample count and the RNG state;
- positions.json: how far into each source the training went;
- spec.yaml: the FeatureSpec;
- metrics.json: whatever the trainer measured;
- applied.json (a parameter server's only): per source, the ranges trained, which make
  its pushes idempotent across restarts (picasso.distributed.ledger).
Loading uses torch.load(weights_only=True): a checkpoint never runs code.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from picasso.spec import FeatureSpec, load_spec

_PREFIX = "step-"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    state: dict
    positions: dict[str, int]
    spec: FeatureSpec
    metrics: dict
    applied: dict[str, list[list[int]]] | None = None  # applied.json, when written

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def checkpoint_id(self) -> str:
        return self.path.name


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints under root, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def save_checkpoint(root: str | Path, state: dict, spec: FeatureSpec, positions: dict[str, int], metrics: dict,
                    applied: dict[str, list[list[int]]] | None = None) -> Path:
    """Write a new checkpoint of state (at state["step"]) atomically; returns its directory."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    saves = [int(p.name.rsplit("-", 1)[1]) for p in _checkpoints(root) if p.name.count("-") == 2]
    final = root / f"{_PREFIX}{int(state['step']):012d}-{max(saves, default=0) + 1:06d}"
    tmp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        torch.save(state, tmp / "state.pt")
        with open(tmp / "state.pt", "rb+") as f:
            os.fsync(f.fileno())
        _write(tmp / "positions.json", json.dumps(positions, sort_keys=True, indent=1).encode())
        _write(tmp / "spec.yaml", spec.to_yaml().encode())
        _write(tmp / "metrics.json", json.dumps(metrics, sort_keys=True, indent=1).encode())
        if applied is not None:
            _write(tmp / "applied.json", json.dumps(applied, sort_keys=True).encode())
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    saved = _checkpoints(Path(root))
    return saved[-1] if saved else None


def prune_checkpoints(root: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (keep <= 0 keeps them all)."""
    for old in _checkpoints(Path(root))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def clean_temporaries(root: str | Path) -> None:
    """Remove what a killed save left half-written (never a finished checkpoint)."""
    root = Path(root)
    if root.is_dir():
        for leftover in root.iterdir():
            if leftover.name.startswith(".tmp-"):
                shutil.rmtree(leftover, ignore_errors=True)


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = Path(path)
    return Checkpoint(
        path=path,
        state=torch.load(path / "state.pt", weights_only=True, map_location="cpu"),
        positions=json.loads((path / "positions.json").read_text()),
        spec=load_spec(path / "spec.yaml"),
        metrics=json.loads((path / "metrics.json").read_text()),
        applied=read_applied(path),
    )


def read_applied(path: str | Path) -> dict[str, list[list[int]]] | None:
    """A checkpoint's applied.json (None when it has none), without loading its state."""
    applied = Path(path) / "applied.json"
    return json.loads(applied.read_text()) if applied.exists() else None
