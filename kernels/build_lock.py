"""One kernel build at a time per build directory, behind a lock that no dead builder can hold.

torch.utils.cpp_extension.load serialises builds with a `FileBaton`: a file named `lock` in
the build directory, created with O_EXCL before the build and removed after it. Nothing
records who holds it, so a builder killed while building (SIGKILL, the OOM killer) leaves the
file behind, and every later load polls until it vanishes, for ever (a stream process and an
`mlflow models serve` worker both hung on one).

`build_lock` takes an `flock` on a file of our own first. The kernel drops an flock when its
holder dies, however it dies, so a dead builder's lock is free at once. While we hold it, no
other process is inside torch's build for that directory, so a `lock` file there is stale by
definition: it is removed before torch looks for it.

A killed builder's ninja and compilers are its children and outlive it, still writing the
object files our build is about to write (ninja has no lock of its own). The holder records
itself in our lock file and clears the record when its build ends; a record found on taking
the lock means the last build was cut short, and we first wait for its leftovers: processes
working in the build directory (torch runs ninja there, the compilers inherit it) that were
started in the dead builder's session after it. Not its process group: ninja gives each
command a group of its own. They are found through /proc, so on Linux only.

A process that finds the lock taken says so only while the holder is really building: it
has such processes at work (ninja, the compilers). Most of the time the holder is only
loading a build that is there already (torch runs ninja for a moment to check it), and a
"waiting for the kernel build" then would name a build that does not exist.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

LOCK_FILE = "picasso-build.lock"
TORCH_LOCK_FILE = "lock"  # torch's FileBaton, see torch/utils/cpp_extension.py: _jit_compile
_LEFTOVER_POLL_SECONDS = 0.2
_LOCK_POLL_SECONDS = 0.1  # how often a process that found the lock taken tries again


@contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold the build lock of `directory` (which must exist) for the body: a torch build in it."""
    fd = os.open(Path(directory) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _acquire(fd, directory)
        cut_short = _read_record(fd)
        if cut_short:
            _wait_for_leftovers(Builder.parse(cut_short), directory)
        _remove_stale_torch_lock(directory)
        _write_record(fd, Builder.this_process().record())
        yield
        # Reached when the build returned or failed on its own, after ninja exited; a build
        # interrupted in this process keeps its record, as a killed one does.
        _write_record(fd, "")
    finally:
        os.close(fd)  # releases the flock


@dataclass(frozen=True)
class Builder:
    """Who holds the lock: enough to tell its leftover processes from anyone else's."""

    pid: int
    session: int
    started: int  # in clock ticks since boot, as /proc/<pid>/stat has it

    @classmethod
    def this_process(cls) -> Builder:
        return cls(os.getpid(), os.getsid(0), _start_time(os.getpid()))

    @classmethod
    def parse(cls, record: str) -> Builder:
        return cls(*map(int, record.split()))

    def record(self) -> str:
        return f"{self.pid} {self.session} {self.started}"

    def left_behind(self, pid: int, directory: str) -> bool:
        """Whether `pid` works in `directory` for this builder: its build (ninja and the
        compilers), running or, once the builder is dead, left behind."""
        return (pid != os.getpid() and pid != self.pid and os.readlink(f"/proc/{pid}/cwd") == directory
                and os.getsid(pid) == self.session and _start_time(pid) >= self.started)


def _acquire(fd: int, directory: Path) -> None:
    """Take the lock, waiting for its holder; say so once the holder is seen building."""
    said = noted = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if not said:
            holder, building = _holder_at_work(fd, directory)
            if building:
                # A warning, so that it shows without logging set up: a process waiting here
                # is otherwise silent for as long as the build takes.
                log.warning("waiting for the kernel build of process %s in %s (%s)", holder, directory,
                            ", ".join(building))
                said = True
            elif not noted:
                log.debug("the kernel build lock of %s is taken by process %s, which is not building: waiting",
                          directory, holder)
                noted = True
        time.sleep(_LOCK_POLL_SECONDS)


def _holder_at_work(fd: int, directory: Path) -> tuple[str, list[str]]:
    """The holder's pid, and its build processes at work ([]: it is not building)."""
    record = _read_record(fd)
    try:
        holder = Builder.parse(record)
    except (TypeError, ValueError):  # no record yet, or one being written
        return record.split(" ")[0] or "unknown", []
    return str(holder.pid), _leftovers_of(holder, directory)


def _read_record(fd: int) -> str:
    return os.pread(fd, 128, 0).decode(errors="replace").strip()


def _write_record(fd: int, record: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode(), 0)


def _wait_for_leftovers(builder: Builder, directory: Path) -> None:
    leftovers = _leftovers_of(builder, directory)
    log.warning("the kernel build of process %s in %s was cut short; %s", builder.pid, directory,
                f"waiting for its build processes still running ({', '.join(leftovers)})" if leftovers
                else "rebuilding what it left unfinished")
    while leftovers:
        time.sleep(_LEFTOVER_POLL_SECONDS)
        leftovers = _leftovers_of(builder, directory)


def _leftovers_of(builder: Builder, directory: Path) -> list[str]:
    """'name pid' of each process working in `directory` for `builder` (Builder.left_behind)."""
    here = os.path.realpath(directory)
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        try:
            if entry.name.isdigit() and builder.left_behind(int(entry.name), here):
                found.append(f"{Path(entry.path, 'comm').read_text().strip()} {entry.name}")
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _start_time(pid: int) -> int:
    """When `pid` started, in clock ticks since boot (0 where there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    # After the command name, which may hold spaces, in parentheses: field 3 (state) on;
    # starttime is field 22.
    return int(stat.rpartition(")")[2].split()[22 - 3])


def _remove_stale_torch_lock(directory: Path) -> None:
    stale = Path(directory) / TORCH_LOCK_FILE
    if stale.exists():
        log.warning("removing %s, left by a kernel build that was killed", stale)
        stale.unlink(missing_ok=True)
