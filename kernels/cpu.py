"""The C++ CPU backend: kernels/csrc/packed_embedding.cpp, built on first use.

torch.utils.cpp_extension compiles it against the torch already installed (no build
isolation, so never a second torch) and caches the build under
$PICASSO_KERNEL_CACHE (default ~/.cache/picasso/kernels): later imports load it in
milliseconds, and an edited source is rebuilt.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils import cpp_extension

from picasso.kernels.reference import SparseOptimizer

_SOURCE = Path(__file__).with_name("csrc") / "packed_embedding.cpp"
_NO_FLAGS = torch.zeros(0, dtype=torch.bool)
_NO_LIMITS = torch.zeros(0, dtype=torch.int64)


def _build():
    cache = Path(os.environ.get("PICASSO_KERNEL_CACHE", Path.home() / ".cache" / "picasso" / "kernels"))
    cache.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name="picasso_packed_embedding",
        sources=[str(_SOURCE)],
        extra_cflags=["-O3", "-march=native", "-ffast-math"] if os.uname().machine == "x86_64" else ["-O3"],
        build_directory=str(cache),
        verbose=False,
    )


_ops = _build()
# One int32 per table row, all -1 between calls: the de-duplication scratch of fused_update,
# kept per table size so that no call pays for filling it.
_scratch: dict[int, torch.Tensor] = {}


def _flags(mean_pooled):
    return _NO_FLAGS if mean_pooled is None else mean_pooled.to(torch.bool).contiguous()


def _limits(max_len):
    return _NO_LIMITS if max_len is None else max_len.to(torch.int64).contiguous()


def lookup(weight, ids, offsets, num_fields, mean_pooled=None, max_len=None):
    return _ops.lookup(weight, ids.contiguous(), offsets.contiguous(), num_fields, _flags(mean_pooled), _limits(max_len))


def fused_update(weight, slots, ids, offsets, grad, num_fields, optimizer: SparseOptimizer, step,
                 mean_pooled=None, max_len=None):
    rows = weight.shape[0]
    if rows not in _scratch:
        _scratch[rows] = torch.full((rows,), -1, dtype=torch.int32)
    _ops.fused_update(
        weight, list(slots), ids.contiguous(), offsets.contiguous(), grad.contiguous().float(), num_fields,
        optimizer.name, optimizer.lr, optimizer.eps, optimizer.beta1, optimizer.beta2, int(step),
        _flags(mean_pooled), _limits(max_len), _scratch[rows],
    )
