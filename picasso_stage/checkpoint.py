"""Checkpoints: one folder per save, written whole or not at all.

The root may be a local path or a URL (picasso.storage). A save is committed so that a
reader takes only whole checkpoints, whatever moment a crash picks:
- on a local disk, the files are written and fsynced under a temporary name, which is
  then renamed into place;
- on an object store, which has no rename, the files are written under a fresh prefix
  and a small commit marker, COMMITTED (each file's name and size), is written last. A
  reader takes only prefixes that have their marker: a crash before it leaves nothing a
  reader trusts, a crash after it leaves a whole checkpoint. The next writer removes
  prefixes without a marker (clean_temporaries).
Local checkpoints carry the marker too, so a folder copied between the two kinds stays
committed.

Its name, step-<step>-<n>, sorts in the order of saving: n counts the saves under the
root (committed or not, so every save gets a fresh prefix), so a save that moved only the
source positions (every record of a chunk refused: no step) still gets a folder of its own.
It holds:
- state.pt: model and optimizer state (embedding rows and their optimizer slots included),
  all taken at the same step, plus the step, the sample count and the RNG state;
- positions.json: how far into each source the training went;
- spec.yaml: the FeatureSpec;
- metrics.json: whatever the trainer measured;
- applied.json (a parameter server's only): per source, the ranges trained, which make
  its pushes idempotent across restarts (picasso.distributed.applied_ranges).
Loading uses torch.load(weights_only=True): a checkpoint never runs code.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from picasso import storage
from picasso.spec import FeatureSpec
from picasso.spec_refs import load_spec

_PREFIX = "step-"
MARKER = "COMMITTED"


class CheckpointError(ValueError):
    """A folder that is not a committed checkpoint."""


@dataclass(frozen=True)
class Checkpoint:
    path: str  # a local path or a URL
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
        return storage.name(self.path)


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


def _prefixes(root: str) -> dict[str, bool]:
    """On an object store: each checkpoint prefix under root, and whether it is committed
    (holds its marker), from one listing."""
    prefix = root.rstrip("/") + "/"
    found: dict[str, bool] = {}
    for path in storage.files_under(root):
        name, _, rest = path[len(prefix):].partition("/")
        if name.startswith(_PREFIX):
            found[name] = found.get(name, False) or rest == MARKER
    return found


def _checkpoints(root: str | Path) -> list[str]:
    """Committed checkpoints under root, oldest first."""
    if storage.is_url(root):
        return [storage.join(root, name) for name, committed in sorted(_prefixes(str(root)).items()) if committed]
    local = Path(root)
    if not local.is_dir():
        return []
    # A local folder of that name was renamed into place whole (and older versions of
    # picasso wrote no marker), so its name is its commit.
    return sorted(str(p) for p in local.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def _files(state: dict, spec: FeatureSpec, positions: dict, metrics: dict, applied,
           extra: dict[str, bytes] | None) -> dict[str, bytes]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    files = {
        "state.pt": buffer.getvalue(),
        "positions.json": json.dumps(positions, sort_keys=True, indent=1).encode(),
        "spec.yaml": spec.to_yaml().encode(),
        "metrics.json": json.dumps(metrics, sort_keys=True, indent=1).encode(),
    }
    if applied is not None:
        files["applied.json"] = json.dumps(applied, sort_keys=True).encode()
    for name in extra or {}:
        if name in files or name == MARKER or "/" in name:
            raise ValueError(f"a checkpoint's extra file may not be named {name!r}")
    return {**files, **(extra or {})}


def _marker(files: dict[str, bytes]) -> bytes:
    return json.dumps({"files": {name: len(data) for name, data in files.items()}}, sort_keys=True).encode()


def _save_number(name: str) -> int | None:
    """n of step-<step>-<n>[-...]: which save, under its root, made it."""
    parts = name.split("-")
    return int(parts[2]) if name.startswith(_PREFIX) and len(parts) >= 3 and parts[2].isdigit() else None


def _next_name(root: str | Path, step: int) -> str:
    saves = [n for n in map(_save_number, storage.children(root)) if n is not None]
    return f"{_PREFIX}{step:012d}-{max(saves, default=0) + 1:06d}"


def save_checkpoint(root: str | Path, state: dict, spec: FeatureSpec, positions: dict[str, int], metrics: dict,
                    applied: dict[str, list[list[int]]] | None = None, extra: dict[str, bytes] | None = None) -> str:
    """Write a new checkpoint of state (at state["step"]), committed whole; returns its path.
    `extra` files (name -> bytes: a stream's pending impressions, say) are committed with it."""
    files = _files(state, spec, positions, metrics, applied, extra)
    name = _next_name(root, int(state["step"]))
    if storage.is_url(root):
        final = storage.join(root, name)
        for file_name, data in files.items():
            storage.write_bytes(storage.join(final, file_name), data)
        storage.write_bytes(storage.join(final, MARKER), _marker(files))  # last: the commit
    else:
        final = str(_save_local(Path(root), name, files))
    clean_temporaries(root, before=name)  # what earlier saves a crash cut short left
    return final


def _save_local(root: Path, name: str, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for file_name, data in [*files.items(), (MARKER, _marker(files))]:
            _write(tmp / file_name, data)
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def latest_checkpoint(root: str | Path) -> str | None:
    saved = _checkpoints(root)
    return saved[-1] if saved else None


def prune_checkpoints(root: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (keep <= 0 keeps them all)."""
    for old in _checkpoints(root)[:-keep] if keep > 0 else []:
        storage.delete_tree(old)


def clean_temporaries(root: str | Path, before: str | None = None) -> None:
    """Remove what a killed save left half-written (never a committed checkpoint): local
    temporary folders; on an object store, prefixes without their marker. Only the one
    writer of a root calls it: before it saves, or after (`before`: only what saves older
    than that checkpoint name left)."""
    def older(name: str) -> bool:
        if before is None:
            return True
        number = _save_number(name)
        return number is not None and number < _save_number(before)

    if storage.is_url(root):
        for name, committed in _prefixes(str(root)).items():
            if not committed and older(name):
                storage.delete_tree(storage.join(root, name))
        return
    local = Path(root)
    if local.is_dir():
        for leftover in local.iterdir():
            if leftover.name.startswith(".tmp-") and older(leftover.name.removeprefix(".tmp-")):
                shutil.rmtree(leftover, ignore_errors=True)


def checkpoint_metrics(path: str | Path) -> dict:
    """A checkpoint's metrics.json alone, without loading its state."""
    return json.loads(storage.read_text(storage.join(str(path), "metrics.json")))


def load_checkpoint(path: str | Path) -> Checkpoint:
    path = str(path)
    if storage.is_url(path):
        # The marker lists the files: no call asks the store whether applied.json is there.
        listed = _marker_files(path)
        applied = json.loads(storage.read_text(storage.join(path, "applied.json"))) if "applied.json" in listed else None
    else:
        applied = read_applied(path)
    return Checkpoint(
        path=path,
        state=torch.load(io.BytesIO(storage.read_bytes(storage.join(path, "state.pt"))), weights_only=True,
                         map_location="cpu"),
        positions=json.loads(storage.read_text(storage.join(path, "positions.json"))),
        spec=load_spec(storage.join(path, "spec.yaml")),
        metrics=checkpoint_metrics(path),
        applied=applied,
    )


def _marker_files(path: str) -> dict[str, int]:
    """The files a committed checkpoint's marker lists; CheckpointError where it has none."""
    try:
        return json.loads(storage.read_text(storage.join(path, MARKER)))["files"]
    except FileNotFoundError:
        raise CheckpointError(f"{path} is not a committed checkpoint (it has no {MARKER} marker: a save that "
                              "did not finish)") from None


def read_checkpoint_file(path: str | Path, name: str) -> bytes | None:
    """One of a checkpoint's extra files (see save_checkpoint); None where it has none."""
    path = str(path)
    if storage.is_url(path):
        return storage.read_bytes(storage.join(path, name)) if name in _marker_files(path) else None
    file = storage.join(path, name)
    return storage.read_bytes(file) if storage.exists(file) else None


def read_applied(path: str | Path) -> dict[str, list[list[int]]] | None:
    """A checkpoint's applied.json (None when it has none), without loading its state."""
    applied = storage.join(path, "applied.json")
    return json.loads(storage.read_text(applied)) if storage.exists(applied) else None
