"""The weights a model version serves with: the checkpoint's model state without the
sparse optimizer's slots, saved so that equal tensors always give equal bytes.

Serving never steps a table, so the slots (Adagrad's row sums, Adam's moments) would only
make every version bigger. Byte-for-byte saving is what lets `picasso apply-delta` prove
that a version rebuilt from its predecessor plus a delta is the version itself: same
SHA-256.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch

# PackedEmbedding registers its optimizer state as buffers slot0_<group>, slot1_<group>.
_SLOT = re.compile(r"(^|\.)slot\d+_[^.]+$")


def is_optimizer_slot(key: str) -> bool:
    return bool(_SLOT.search(key))


def serving_state(model_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Model state minus optimizer slots; every tensor a contiguous CPU copy with its own
    storage (views of a bigger storage would change what torch.save writes)."""
    return {key: value.detach().to("cpu").contiguous().clone()
            for key, value in model_state.items() if not is_optimizer_slot(key)}


def save_weights(state: dict[str, torch.Tensor], path: str | Path) -> str:
    """Write state with torch.save; returns the file's SHA-256.

    Saved through a file object: given a path, torch.save names the archive's root folder
    after the file, so equal weights under two names would differ in bytes. The hash is
    taken as the bytes go out, rather than by reading hundreds of MB back."""
    with open(path, "wb") as f:
        hashing = _HashingWriter(f)
        torch.save(state, hashing)
    return hashing.digest.hexdigest()


class _HashingWriter:
    """A write-only file that hashes what passes through it."""

    def __init__(self, f):
        self.f = f
        self.digest = hashlib.sha256()

    def write(self, data) -> int:
        self.digest.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True, map_location="cpu")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
