"""Host tensors for embedding tables and their optimizer slots: in memory, or made on disk.

In memory (the default) a table is a huge-pages tensor (huge_pages) filled in one call.
Under `files_under(folder)` (a Trainer whose hot-row cache has a `big_tier_dir`), every
table and slot made in the block is a file in `folder`, memory-mapped: the big tier of
the hot-row cache (cache.py), for tables larger than RAM. Such a table is never whole in
memory, not even while it is made:
- a slot starts as a sparse file, which reads as zeros: nothing is written;
- a table is filled in chunks of CHUNK_BYTES, each chunk's pages dropped from this
  process's resident memory once written (the data stays in the file, through the page
  cache, which the kernel writes back and reclaims as it needs).
The chunks draw from torch's generator in the table's row order, as the one call over the
whole table in memory does (torch fills a CPU tensor serially), so a seeded table is the
same bytes either way (tests/test_big_tier.py).

A file-backed tensor keeps its mapping alive (the numpy memmap it views); `path_of` says
which file it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from picasso import huge_pages

CHUNK_BYTES = 64 << 20  # filled, then dropped from resident memory, at a time

_folder: contextvars.ContextVar[Path | None] = contextvars.ContextVar("picasso_big_tier_folder", default=None)
_PAGE = mmap.PAGESIZE


@contextlib.contextmanager
def files_under(folder: str | Path | None) -> Iterator[None]:
    """Make every table and slot of the block a file in `folder` (None: in memory, as
    outside the block)."""
    if folder is None:
        yield
        return
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    token = _folder.set(folder)
    try:
        yield
    finally:
        _folder.reset(token)


def uniform(rows: int, width: int, low: float, high: float, name: str) -> torch.Tensor:
    """A (rows, width) float32 table of values drawn uniformly from [low, high)."""
    folder = _folder.get()
    if folder is None:
        # Filled after it is asked onto huge pages: a big table's random rows then cost
        # fewer TLB misses (huge_pages).
        return huge_pages.empty(rows, width).uniform_(low, high)
    table = _file_tensor(folder, name, (rows, width))
    step = max(1, CHUNK_BYTES // max(1, width * 4))
    for start in range(0, rows, step):
        table[start:start + step].uniform_(low, high)
        _drop_resident(table, start * width * 4, min(rows, start + step) * width * 4)
    return table


def zeros(shape: tuple[int, ...], name: str) -> torch.Tensor:
    """A float32 tensor of zeros (an optimizer slot)."""
    folder = _folder.get()
    if folder is None:
        return huge_pages.empty(*shape).zero_()
    return _file_tensor(folder, name, shape)  # a new sparse file reads as zeros


def file_copy(tensor: torch.Tensor, folder: str | Path, name: str) -> torch.Tensor:
    """A file-backed copy in `folder` of a float32 host tensor made in memory (a table of
    an embedding built outside files_under, which the cache's big tier then holds)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    copy = _file_tensor(Path(folder), name, tuple(tensor.shape))
    copy.copy_(tensor)
    return copy


def path_of(tensor: torch.Tensor) -> Path | None:
    """The file a tensor made under files_under lives in; None for a tensor in memory."""
    return getattr(tensor, "_picasso_big_tier_file", None)


def discard(tensor: torch.Tensor) -> None:
    """Remove the file of a file-backed tensor that is no longer used (its mapping lives on
    while the tensor does; the disk space is freed with it)."""
    path = path_of(tensor)
    if path is not None:
        path.unlink(missing_ok=True)


def _file_tensor(folder: Path, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    path = folder / f"{name}-{uuid.uuid4().hex[:12]}.f32"
    if int(np.prod(shape)) == 0:  # mmap cannot map an empty file
        return torch.zeros(shape)
    # mode w+ makes the file its size by writing its last byte: a sparse file, zeros.
    mapped = np.memmap(path, dtype=np.float32, mode="w+", shape=tuple(shape))
    tensor = torch.from_numpy(mapped)
    tensor._picasso_big_tier_file = path
    tensor._picasso_big_tier_map = mapped
    return tensor


def _drop_resident(tensor: torch.Tensor, start: int, end: int) -> None:
    """Unmap the pages of bytes [start, end) of a file-backed tensor from this process: they
    stay in the file (a shared mapping's dirty pages are the page cache's), and a later
    read maps them again."""
    mapping = getattr(getattr(tensor, "_picasso_big_tier_map", None), "_mmap", None)
    if mapping is None or not hasattr(mapping, "madvise"):
        return  # no madvise here (Python's mmap on another OS): the kernel reclaims them itself
    first = start // _PAGE * _PAGE
    if end > first:
        mapping.madvise(mmap.MADV_DONTNEED, first, end - first)
