"""The C++ kernels' build at first use: a builder killed mid-build cannot hang the next one,
and two environments keep their own builds. Real processes and real builds (a minute or
more each), so one cache root serves both tests; timeouts only guard against a hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from helpers import venv_seeing_these_packages

HANG_GUARD_SECONDS = 900

# Builds the kernels if need be, checks one against the reference, and says where they are.
USE_KERNELS = """
import torch
from picasso.kernels import cpu, reference
weight = torch.randn(50, 4)
ids, offsets = torch.tensor([1, 2, 3, 7, 7]), torch.tensor([0, 2, 2, 4])
torch.testing.assert_close(cpu.lookup(weight, ids, offsets, 2), reference.lookup(weight, ids, offsets, 2))
print(cpu.build_directory())
"""


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    """One $PICASSO_KERNEL_CACHE for the module: this environment's build is made once."""
    return tmp_path_factory.mktemp("kernel-cache")


def with_cache(root: Path) -> dict[str, str]:
    return {**os.environ, "PICASSO_KERNEL_CACHE": str(root)}


def use_kernels(python: str | Path, root: Path, **env: str) -> subprocess.CompletedProcess:
    """Run USE_KERNELS in the environment of `python` (with the variables env); its stdout
    is the build directory."""
    result = subprocess.run([str(python), "-c", USE_KERNELS], env={**with_cache(root), **env}, capture_output=True,
                            text=True, timeout=HANG_GUARD_SECONDS)
    assert result.returncode == 0, result.stderr
    return result


def build_directories(root: Path) -> set[Path]:
    return {path for path in root.iterdir() if path.is_dir()}


def build_under_way(root: Path) -> Path | None:
    """The build directory once torch holds its lock there and ninja has its build file."""
    return next((d for d in build_directories(root) if (d / "lock").exists() and (d / "build.ninja").exists()), None)


def wait_for_build(process: subprocess.Popen, root: Path) -> Path:
    deadline = time.monotonic() + HANG_GUARD_SECONDS
    while (directory := build_under_way(root)) is None:
        assert process.poll() is None, "the build ended before it could be killed"
        assert time.monotonic() < deadline, "no build started"
        time.sleep(0.05)
    return directory


def build_outputs(directory: Path) -> dict[str, object]:
    """What a rebuild would change: the built files' identity and time, and ninja's log."""
    built = [*directory.glob("*.o"), *directory.glob("*.so")]
    identities = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns) for path in built}
    return {**identities, ".ninja_log": (directory / ".ninja_log").read_bytes()}


def test_a_build_killed_halfway_does_not_hang_the_next_import(cache_root):
    builder = subprocess.Popen([sys.executable, "-c", "import picasso.kernels.cpu"], env=with_cache(cache_root))
    try:
        directory = wait_for_build(builder, cache_root)
    finally:
        builder.send_signal(signal.SIGKILL)  # the builder only: its ninja and compiler live on
        builder.wait()
    stale_lock = directory / "lock"
    assert stale_lock.exists()  # torch's lock, which every later import used to wait on for ever

    next_import = use_kernels(sys.executable, cache_root)

    assert str(stale_lock) in next_import.stderr  # the warning that broke it names it
    assert next_import.stdout.strip() == str(directory)
    assert sorted(path.name for path in directory.glob("*.so")) == ["picasso_kernels.so"]


def test_two_environments_keep_their_own_build_and_never_rebuild(cache_root, tmp_path):
    second_env = tmp_path / "second-env"
    venv_seeing_these_packages(second_env, timeout=HANG_GUARD_SECONDS)
    pythons = {"first": Path(sys.executable), "second": second_env / "bin" / "python"}

    directory_of, outputs_after_first_use = {}, {}
    for env, python in pythons.items():
        directory_of[env] = Path(use_kernels(python, cache_root).stdout.strip())
        outputs_after_first_use[env] = build_outputs(directory_of[env])
    # A new directory for the second env, while the first env's (built here or by the test
    # above) is untouched by the second env's build.
    assert directory_of["first"] != directory_of["second"]
    assert build_directories(cache_root) == set(directory_of.values())
    assert build_outputs(directory_of["first"]) == outputs_after_first_use["first"]

    for env, python in pythons.items():
        use_kernels(python, cache_root)
    for env in pythons:
        assert build_outputs(directory_of[env]) == outputs_after_first_use[env], f"the {env} env rebuilt"


def test_a_process_with_another_ninja_first_on_path_uses_the_environments_and_never_rebuilds(cache_root, tmp_path):
    """Another ninja's log is not this one's: a process started with another ninja first on
    PATH (this environment not activated, the system's ninja) would rebuild the folder, and
    the next process with the environment's ninja would rebuild it back. Here the other
    ninja is one that only notes it was run."""
    directory = Path(use_kernels(sys.executable, cache_root).stdout.strip())
    before = build_outputs(directory)
    other, ran = tmp_path / "other-ninja", tmp_path / "other-ninja-ran"
    other.mkdir()
    (other / "ninja").write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    (other / "ninja").chmod(0o755)
    scripts = sysconfig.get_path("scripts")
    path = [other, *(entry for entry in os.environ.get("PATH", "").split(os.pathsep) if entry != scripts)]
    use_kernels(sys.executable, cache_root, PATH=os.pathsep.join(map(str, path)))
    assert not ran.exists(), "the build ran the ninja first on PATH, not the environment's"
    assert build_outputs(directory) == before
