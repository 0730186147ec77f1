"""What a process says when it finds the kernels' build lock taken: "waiting for the kernel
build" only while the holder is really building (processes at work in the build directory
for it), nothing when the holder only loads a build that is there. The holder is a real
process; a `sleep` it starts in the build directory stands for its compiler."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

from picasso.kernels.build_lock import build_lock

HANG_GUARD_SECONDS = 120  # only against a hang: every wait below ends on an event

HOLD = """
import subprocess, sys
from pathlib import Path
from picasso.kernels.build_lock import build_lock

directory = Path(sys.argv[1])
with build_lock(directory):
    compiler = subprocess.Popen(["sleep", "600"], cwd=directory) if sys.argv[2] == "building" else None
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
    if compiler is not None:
        compiler.kill()
        compiler.wait()
"""


def _hold(directory, what: str) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), what], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def _wait_behind(holder: subprocess.Popen, directory, caplog) -> list[logging.LogRecord]:
    """Take the lock in this process while `holder` has it; once this process has said
    something of the wait, let the holder go. The build lock's records, in order."""
    caplog.set_level(logging.DEBUG, logger="picasso.kernels.build_lock")
    taken = threading.Event()

    def take() -> None:
        with build_lock(directory):
            taken.set()

    waiter = threading.Thread(target=take, daemon=True)
    waiter.start()
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while not [r for r in caplog.records if r.name == "picasso.kernels.build_lock"]:
        assert time.monotonic() < deadline and not taken.is_set(), "the waiter said nothing"
        time.sleep(0.02)
    holder.stdin.close()
    assert holder.wait(timeout=HANG_GUARD_SECONDS) == 0
    waiter.join(timeout=HANG_GUARD_SECONDS)
    assert taken.is_set()
    return [r for r in caplog.records if r.name == "picasso.kernels.build_lock"]


def test_a_holder_that_only_loads_is_waited_for_without_a_word(tmp_path, caplog):
    holder = _hold(tmp_path, "loading")
    records = _wait_behind(holder, tmp_path, caplog)
    assert not [r for r in records if r.levelno >= logging.WARNING], [r.getMessage() for r in records]
    assert f"taken by process {holder.pid}, which is not building" in records[0].getMessage()


def test_a_holder_that_builds_is_named_with_its_build_processes(tmp_path, caplog):
    holder = _hold(tmp_path, "building")
    records = _wait_behind(holder, tmp_path, caplog)
    warning = records[0]
    assert warning.levelno == logging.WARNING
    assert f"waiting for the kernel build of process {holder.pid} in {tmp_path} (sleep " in warning.getMessage()
