"""The weights a model version serves with: the checkpoint's model state without what only
training reads, saved so that equal tensors always give equal bytes.

Serving never steps a table, so the slots (Adagrad's row sums, Adam's moments) would only
make every version bigger; nor does it admit or evict ids, so of a dynamic table's map it
keeps only each row's key (the pyfunc rebuilds the index from them, picasso.dynamic_rows). Byte-for-byte saving is what lets `picasso apply-delta` prove
that a version rebuilt from its predecessor plus a delta is the version itself: same
SHA-256.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch

from picasso.dynamic_rows import TRAINING_ONLY

# PackedEmbedding registers its optimizer state as buffers slot0_<group>, slot1_<group>.
_SLOT = re.compile(r"(^|\.)slot\d+_[^.]+$")


# DynamicRows registers each field's map as dynamic_rows.maps.<i>.<buffer>, and its clock.
_MAP_STATE = re.compile(r"(^|\.)dynamic_rows\.(maps\.\d+\.)?(" + "|".join(TRAINING_ONLY) + ")$")


def is_training_only(key: str) -> bool:
    """State that serving leaves out: optimizer slots, and a dynamic map's all but row_keys."""
    return bool(_SLOT.search(key) or _MAP_STATE.search(key))


def serving_state(model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Model state minus what only training reads; every tensor a contiguous CPU copy with
    its own storage (views of a bigger storage would change what torch.save writes)."""
    return {key: value.detach().to("cpu").contiguous().clone()
            for key, value in model_state.items() if not is_training_only(key)}


def save_weights(state: dict[str, torch.Tensor], path: str | Path) -> str:
    """Write state with torch.save; returns the file's SHA-256.

    Saved through a file object: given a path, torch.save names the archive's root folder
    after the file, so equal weights under two names would differ in bytes. The hash is
    taken as the bytes go out, rather than by reading hundreds of MB back."""
    with open(path, "wb") as f:
        return _save_hashing(state, f)


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """The SHA-256 save_weights would return for state, with nothing written: how serving
    checks weights it rebuilt in memory against the version's."""
    return _save_hashing(state, None)


def _save_hashing(state: dict[str, torch.Tensor], f) -> str:
    hashing = _HashingWriter(f)
    torch.save(state, hashing)
    return hashing.digest.hexdigest()


class _HashingWriter:
    """A write-only file that hashes what passes through it, on to f (None: nowhere)."""

    def __init__(self, f):
        self.f = f
        self.digest = hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.f.write(data) if self.f is not None else len(data)

    def flush(self) -> None:
        if self.f is not None:
            self.f.flush()


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
