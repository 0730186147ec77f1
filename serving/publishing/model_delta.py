"""Deltas between two versions' serving weights: the embedding rows that changed.

A streaming cycle touches a small share of a table's rows (the ids its events carried),
so shipping only those rows, with their indices, is much smaller than the whole model.
Rows are compared bit for bit (as integers of the same width), so a row counts as
unchanged only when every bit is the same, and -0.0 vs 0.0 or NaN payloads are never lost.

Row ids are int32 where they fit and stored once for tables that changed the same rows.
A tensor goes whole into the delta when it is not row-shaped (a scalar), changed shape or
dtype, is new, or changed in more than half its rows (indices would then cost more than
they save): dense layers change every step and always go whole, and they are small.

A dynamic table's map travels as its row_keys (serving/weights.py), whose
changed rows are the rows that changed hands. The delta also names, per map, the ids the
target added and the ids it dropped: its tombstones, for a serving side that keeps its own
id index (the pyfunc rebuilds its index from row_keys and needs neither).

Applying a delta to the base it was made from gives tensors equal bit for bit to the
target, in the target's key order, so saving them (serving/weights.py: save_weights) gives
the target's very bytes; the delta carries both SHA-256s to check that.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from picasso.kernels.id_map_reference import EMPTY_KEY

ROW_KEYS = ".row_keys"  # a dynamic map's buffer of each row's key (picasso.dynamic_rows)

DELTA_FORMAT = 1
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class DeltaStats:
    changed_rows: int  # rows shipped by index
    whole_tensors: int
    delta_bytes: int  # of the saved delta file
    full_bytes: int  # of the saved target weights
    new_ids: int = 0  # ids dynamic tables admitted since the base
    tombstones: int = 0  # ids they evicted


class DeltaMismatch(ValueError):
    """A delta applied to weights other than its base, or giving other than its target."""


def _as_bits(tensor: torch.Tensor) -> torch.Tensor:
    rows = tensor.reshape(tensor.shape[0], -1)
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return rows.view(_BITS[tensor.element_size()])
    return rows


def changed_rows(base: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Indices of the rows (first dimension) whose bits differ."""
    return (_as_bits(base) != _as_bits(target)).any(dim=1).nonzero().flatten()


def _compact(ids: torch.Tensor, rows: int, seen: list[torch.Tensor]) -> torch.Tensor:
    """Row ids as int32 when they fit (half the bytes of int64), and the very tensor of an
    earlier table with the same ids: torch.save writes a shared tensor once, and the wide
    and deep tables of a model change the same rows."""
    ids = ids.to(torch.int32) if rows <= torch.iinfo(torch.int32).max else ids
    for earlier in seen:
        if earlier.dtype == ids.dtype and torch.equal(earlier, ids):
            return earlier
    seen.append(ids)
    return ids


def compute_delta(base: dict[str, torch.Tensor], target: dict[str, torch.Tensor], base_sha256: str,
                  target_sha256: str) -> dict:
    """The delta taking base to target (both serving states)."""
    rows, whole, seen = {}, {}, []
    for key, tensor in target.items():
        old = base.get(key)
        row_shaped = tensor.dim() >= 1 and tensor.shape[0] > 1
        if old is None or not row_shaped or old.shape != tensor.shape or old.dtype != tensor.dtype:
            whole[key] = tensor
            continue
        ids = changed_rows(old, tensor)
        if ids.numel() * 2 > tensor.shape[0]:
            whole[key] = tensor
        elif ids.numel():
            rows[key] = {"ids": _compact(ids, tensor.shape[0], seen), "values": tensor[ids].contiguous()}
    return {"format": DELTA_FORMAT, "base_sha256": base_sha256, "target_sha256": target_sha256,
            "keys": list(target), "rows": rows, "whole": whole, "ids": id_changes(base, target)}


def id_changes(base: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Per dynamic map (its row_keys tensor), the ids in the target and not in the base
    ("added"), and the ids in the base and not in the target ("tombstones"). A free row's
    key is EMPTY_KEY, which is no id."""
    changes = {}
    for key, keys in target.items():
        if not key.endswith(ROW_KEYS):
            continue
        old = base.get(key, torch.zeros(0, dtype=torch.int64))
        old, new = old[old != EMPTY_KEY], keys[keys != EMPTY_KEY]
        changes[key] = {"added": new[~torch.isin(new, old)], "tombstones": old[~torch.isin(old, new)]}
    return changes


def apply_delta(base: dict[str, torch.Tensor], delta: dict) -> dict[str, torch.Tensor]:
    """Target weights from base + delta, keys in the target's order."""
    if delta.get("format") != DELTA_FORMAT:
        raise DeltaMismatch(f"unknown delta format {delta.get('format')!r} (this picasso reads {DELTA_FORMAT})")
    rebuilt = {}
    for key in delta["keys"]:
        if key in delta["whole"]:
            rebuilt[key] = delta["whole"][key].clone()
            continue
        if key not in base:
            raise DeltaMismatch(f"the base has no tensor {key!r}: it is not the weights this delta was made from")
        tensor = base[key].clone()
        if key in delta["rows"]:
            change = delta["rows"][key]
            tensor[change["ids"].long()] = change["values"]
        rebuilt[key] = tensor
    return rebuilt


def save_delta(delta: dict, path: str | Path) -> int:
    torch.save(delta, path)
    return Path(path).stat().st_size


def load_delta(path: str | Path) -> dict:
    return torch.load(path, weights_only=True, map_location="cpu")


def delta_stats(delta: dict, delta_bytes: int, full_bytes: int) -> DeltaStats:
    return DeltaStats(
        changed_rows=sum(int(r["ids"].numel()) for r in delta["rows"].values()),
        whole_tensors=len(delta["whole"]),
        delta_bytes=delta_bytes,
        full_bytes=full_bytes,
        new_ids=sum(int(c["added"].numel()) for c in delta.get("ids", {}).values()),
        tombstones=sum(int(c["tombstones"].numel()) for c in delta.get("ids", {}).values()),
    )
