"""The disk's own rates under a folder: the limit a big tier on disk can approach.

Sequential: a file of `size` bytes written in 8 MiB blocks and fsynced (write MB/s), then
its pages dropped from the page cache (posix_fadvise DONTNEED, which a process may do to
its own file's clean pages) and read back (read MB/s). Random: 4 KiB pages written at
random offsets of the same file and fsynced: the pattern of a step that writes scattered
rows back, each one dirtying a page (random 4 KiB write MB/s). On a virtual machine the
host's own cache may serve the reads: the read rate is then the host's, not the disk's.
Used by benchmarks.scaling; a helper, not a benchmark of its own.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

_BLOCK = 8 << 20
_PAGE = 4096


def disk_rates(folder: str | Path | None, size: int = 1 << 30, random_pages: int = 20_000) -> dict[str, float]:
    """{"disk_write_mb_s", "disk_read_mb_s", "disk_random_4k_write_mb_s"} under `folder`
    (None: the system's temporary folder)."""
    size = max(_BLOCK, size // _BLOCK * _BLOCK)
    block = np.random.default_rng(0).integers(0, 255, _BLOCK, dtype=np.uint8).tobytes()
    with tempfile.TemporaryDirectory(prefix="picasso-disk-", dir=folder) as scratch:
        path = Path(scratch) / "rates.bin"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            start = time.perf_counter()
            for _ in range(size // _BLOCK):
                os.write(fd, block)
            os.fsync(fd)
            write_s = time.perf_counter() - start
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
            os.lseek(fd, 0, os.SEEK_SET)
            start = time.perf_counter()
            while os.read(fd, _BLOCK):
                pass
            read_s = time.perf_counter() - start
            offsets = np.random.default_rng(1).integers(0, size // _PAGE, random_pages) * _PAGE
            page = block[:_PAGE]
            start = time.perf_counter()
            for offset in offsets.tolist():
                os.pwrite(fd, page, offset)
            os.fsync(fd)
            random_s = time.perf_counter() - start
        finally:
            os.close(fd)
    mb = 1e6
    return {"disk_write_mb_s": size / write_s / mb, "disk_read_mb_s": size / read_s / mb,
            "disk_random_4k_write_mb_s": random_pages * _PAGE / random_s / mb}
