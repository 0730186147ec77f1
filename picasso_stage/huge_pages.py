"""Big host tensors on transparent huge pages, where Linux offers them on request.

An embedding table of 100M rows spans gigabytes, and a training step touches some ten
thousand of its rows at random: with 4 KiB pages nearly every one of those reads also
misses the TLB and walks the page tables, which made the step at 100M rows 1.6-1.8x the
step at 1M (benchmarks.scaling). With 2 MiB pages the walks mostly hit the caches.

Most distributions set transparent huge pages to `madvise`: only memory marked with
MADV_HUGEPAGE gets them, and only if marked before it is first touched. So a big tensor is
made empty, marked, and only then filled. Elsewhere (another OS, huge pages off, memory
the kernel will not give) the mark is a no-op, and the tensor is the same either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

# Below this a tensor spans too few huge pages to matter, and marking costs a system call.
WORTH_BYTES = 8 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h
_HUGE_PAGE = 2 << 20


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """torch.empty(shape) on the host, asked onto huge pages when it is big enough; not yet
    touched, so the caller's fill is the first touch."""
    tensor = torch.empty(shape, dtype=dtype)
    advise(tensor)
    return tensor


def advise(tensor: torch.Tensor) -> bool:
    """Mark the huge pages wholly inside a host tensor's memory MADV_HUGEPAGE; whether the
    kernel took the mark."""
    size = tensor.numel() * tensor.element_size()
    if _LIBC is None or tensor.device.type != "cpu" or size < WORTH_BYTES:
        return False
    start = tensor.data_ptr()
    first = -(-start // _HUGE_PAGE) * _HUGE_PAGE  # madvise takes page-aligned ranges
    length = (start + size - first) // _HUGE_PAGE * _HUGE_PAGE
    if length <= 0:
        return False
    return _LIBC.madvise(ctypes.c_void_p(first), ctypes.c_size_t(length), _MADV_HUGEPAGE) == 0

