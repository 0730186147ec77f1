"""picasso and its C++ kernels on a remote Beam worker, by the two usual routes.

--setup_file: Beam runs `setup.py sdist` on the driver and `pip install <sdist>` on each
worker, which builds the kernels at install (setup.py: BuildPyWithKernels). Tested for real:
the sdist is built from this tree and installed into fresh virtual environments, with pip's
build isolation on as on a worker, and offline: the one build requirement, setuptools,
comes from a wheel made here of the installed setuptools, and the install takes --no-deps
(torch and the rest come from the system site-packages the environments see). One
environment builds its kernels at install (a minute or more), one opts out; every check
uses these two installs. Timeouts only guard against a hang.

A container image: the Dockerfile, checked as text (no Docker engine here).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import apache_beam
import pytest
from helpers import venv_seeing_these_packages
from test_kernel_build import build_outputs  # what a rebuild would change

HANG_GUARD_SECONDS = 900
REPO = Path(__file__).resolve().parents[1]
NOT_BUILT = "kernels were not built at install: run python -m picasso.kernels.build"

# The README line proposed for a worker image (README.md, "Set up, test, run"): the set-up
# command without the test and bench extras, which a worker does not need (triton alone is
# about 1 GB). The Dockerfile runs exactly this.
IMAGE_SETUP = "pip install torch==2.13.0 && pip install -e ."
# What the README's set-up command does before it: make a virtual environment and enter it
# (an image has its own Python; a user's machine and CI do not).
VENV_SETUP = "python3 -m venv .venv && . .venv/bin/activate && "

# A tiny fused lookup on the cpu backend (PICASSO_KERNELS=cpu: no fallback to the reference
# kernels), checked against the reference; prints where the kernels are and which picasso ran.
USE_KERNELS = """
import torch
import picasso
from picasso import kernels
from picasso.kernels import cpu, reference
weight = torch.randn(50, 4)
ids, offsets = torch.tensor([1, 2, 3, 7, 7]), torch.tensor([0, 2, 2, 4])
torch.testing.assert_close(kernels.lookup(weight, ids, offsets, 2), reference.lookup(weight, ids, offsets, 2))
print(cpu.build_directory())
print(picasso.__file__)
"""


def run(args: list, env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(arg) for arg in args], env=env, capture_output=True, text=True,
                          timeout=HANG_GUARD_SECONDS, **kwargs)


def offline_env(**extra: str) -> dict[str, str]:
    """This environment without pip's configuration (indexes, find-links, config files)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PIP_") and name not in ("PICASSO_KERNELS_PREBUILT", "PICASSO_SKIP_KERNEL_BUILD")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, **extra}


def wheel_of_installed(name: str, into: Path) -> Path:
    """A wheel of an installed pure-Python distribution, made of its files: the isolated
    build environment installs setuptools, and a test reaches no index."""
    dist = importlib.metadata.distribution(name)
    files = [file for file in dist.files
             if "__pycache__" not in file.parts and not file.parts[0].startswith("..")
             and dist.locate_file(file).is_file()]
    dist_info = next(file.parent for file in files if file.name == "METADATA").as_posix()
    wheel = into / f"{dist.metadata['Name']}-{dist.version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in files:
            if file.parent.as_posix() == dist_info and file.name in ("RECORD", "INSTALLER", "REQUESTED",
                                                                     "direct_url.json"):
                continue
            data = Path(dist.locate_file(file)).read_bytes()
            archive.writestr(file.as_posix(), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{file.as_posix()},sha256={digest},{len(data)}")
        archive.writestr(f"{dist_info}/RECORD", "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n")
    return wheel


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """The sdist, built as Beam builds it on the driver (egg-info kept out of the tree)."""
    out = tmp_path_factory.mktemp("sdist")
    built = run([sys.executable, "setup.py", "egg_info", "--egg-base", out, "sdist", "--dist-dir", out],
                env=offline_env(PICASSO_KERNEL_CACHE=str(out / "driver-cache")), cwd=REPO)
    assert built.returncode == 0, built.stderr
    (archive,) = out.glob("*.tar.gz")
    return archive


@pytest.fixture(scope="module")
def build_requirements(tmp_path_factory) -> Path:
    wheels = tmp_path_factory.mktemp("build-requirements")
    wheel_of_installed("setuptools", wheels)
    return wheels


class Installed:
    """A fresh virtual environment (seeing the system site-packages) with the sdist installed."""

    def __init__(self, root: Path, sdist: Path, build_requirements: Path, **env: str):
        self.cache = root / "kernel-cache"
        self.env = offline_env(PICASSO_KERNEL_CACHE=str(self.cache))
        self.prefix = root / "venv"
        venv_seeing_these_packages(self.prefix, env=self.env)
        self.python = self.prefix / "bin" / "python"
        # pip from the system site-packages, run by the environment's interpreter, as a
        # worker's pip is; isolation on; --no-cache-dir: no wheel built by another install.
        self.install = run([self.python, "-m", "pip", "install", "-v", "--no-deps", "--no-cache-dir", "--no-index",
                            "--find-links", build_requirements, sdist], env={**self.env, **env})
        assert self.install.returncode == 0, self.install.stdout + self.install.stderr

    def build_directories(self) -> list[Path]:
        return sorted(path for path in self.cache.iterdir() if path.is_dir()) if self.cache.exists() else []

    def run(self, args: list, **env: str) -> subprocess.CompletedProcess:
        return run([self.python, *args], env={**self.env, "PICASSO_KERNELS": "cpu", **env})


@pytest.fixture(scope="module")
def built(tmp_path_factory, sdist, build_requirements) -> Installed:
    return Installed(tmp_path_factory.mktemp("built"), sdist, build_requirements)


@pytest.fixture(scope="module")
def skipped(tmp_path_factory, sdist, build_requirements) -> Installed:
    return Installed(tmp_path_factory.mktemp("skipped"), sdist, build_requirements, PICASSO_SKIP_KERNEL_BUILD="1")


def test_the_sdist_carries_the_cpp_sources_and_building_it_builds_nothing(sdist):
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"kernels/csrc/picasso_kernels.cpp", "kernels/csrc/packed_embedding.cpp", "kernels/csrc/hot_cache.cpp",
            "kernels/csrc/id_map.cpp", "kernels/csrc/decode_ids.cpp", "kernels/csrc/key_index.cpp",
            "kernels/csrc/pack_groups.cpp", "kernels/csrc/cross_ids.cpp", "kernels/csrc/hashing.h",
            "kernels/build.py", "pyproject.toml"} <= names
    assert not (sdist.parent / "driver-cache").exists()  # the driver only packs


def test_installing_the_sdist_builds_the_kernels_so_first_use_compiles_nothing(built):
    (directory,) = built.build_directories()
    assert sorted(path.name for path in directory.glob("*.so")) == ["picasso_kernels.so"]
    # Loading only what the install built: this raises rather than compile.
    first_use = built.run(["-c", USE_KERNELS], PICASSO_KERNELS_PREBUILT="1")
    assert first_use.returncode == 0, first_use.stderr
    build_directory, package = first_use.stdout.split()
    assert Path(build_directory) == directory
    assert Path(package).is_relative_to(built.prefix)  # the installed picasso, not this tree


def test_the_install_time_build_is_the_one_first_use_would_make(built):
    """Loading as usual (cpp_extension.load and ninja) finds the install's build up to date:
    same folder, same ninja file (flags, include paths), nothing rebuilt."""
    (directory,) = built.build_directories()
    before = build_outputs(directory)
    first_use = built.run(["-c", USE_KERNELS])
    assert first_use.returncode == 0, first_use.stderr
    assert Path(first_use.stdout.split()[0]) == directory
    assert build_outputs(directory) == before
    assert built.build_directories() == [directory]


def test_the_build_entry_point_confirms_a_build(built):
    (directory,) = built.build_directories()
    confirmed = built.run(["-m", "picasso.kernels.build"])
    assert confirmed.returncode == 0, confirmed.stderr
    assert f"already built in {directory}" in confirmed.stdout


PROBE_SETUP = """
import importlib.util
from pathlib import Path
from setuptools import setup
Path(__file__).with_name("torch-seen").write_text(str(importlib.util.find_spec("torch") is not None))
setup(name="isolation-probe", version="0")
"""


def test_the_environments_see_torch_and_their_builds_do_not_as_on_a_worker(skipped, build_requirements, tmp_path):
    """What the installs above stand for: the environment has torch (from the packages it
    sees), and pip's build isolation hides it from a setup.py, so that picasso's setup.py
    builds the kernels only by undoing the isolation. Also where the tests run inside a venv, whose
    packages the environments see through a .pth (helpers.venv_seeing_these_packages)."""
    assert skipped.run(["-c", "import torch"]).returncode == 0
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "setup.py").write_text(PROBE_SETUP)
    (probe / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n'
                                          'build-backend = "setuptools.build_meta"\n')
    installed = run([skipped.python, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--no-index",
                     "--find-links", build_requirements, probe], env=skipped.env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (probe / "torch-seen").read_text() == "False"


def test_an_install_with_PICASSO_SKIP_KERNEL_BUILD_leaves_them_to_first_use(skipped):
    assert skipped.build_directories() == []
    first_use = skipped.run(["-c", USE_KERNELS], PICASSO_KERNELS_PREBUILT="1")
    assert first_use.returncode != 0
    assert NOT_BUILT in first_use.stderr
    assert skipped.build_directories() == []  # and it compiled nothing


def test_the_build_entry_point_says_when_there_is_no_compiler(tmp_path):
    missing = tmp_path / "no-such-c++"
    result = run([sys.executable, "-m", "picasso.kernels.build"],
                 env=offline_env(PICASSO_KERNEL_CACHE=str(tmp_path / "cache"), CXX=str(missing)))
    assert result.returncode == 2
    assert f"no C++ compiler: {str(missing)!r}" in result.stderr
    assert not (tmp_path / "cache").exists()


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in lines if line and not line.startswith("#")]


def readme_command(after: str) -> str:
    """The first command (an indented line) after the paragraph that starts with `after`
    in README.md."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    return next(line.strip() for line in lines[start + 1:] if line.startswith("    "))


def readme_setup_command() -> str:
    return readme_command("Set up a fresh machine")


def ci_commands() -> list[str]:
    """What .ci/run runs: its lines less comments, shell settings and its guard."""
    return [line for line in (REPO / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.startswith(("#", "set ", "cd ", " ", "if ", "fi"))]


def test_ci_runs_the_readme_set_up_and_test_commands_in_a_fresh_venv():
    assert ci_commands() == [readme_setup_command(), readme_command("Run the tests")]
    assert readme_setup_command().startswith(VENV_SETUP)  # so the tests run in that venv
    assert "pip install torch==2.13.0 " in readme_setup_command()


def test_ci_refuses_a_venv_that_is_there_already(tmp_path):
    """A fresh environment each run, and never one of someone's own removed: .ci/run stops
    before it installs anything where .venv exists (run from a copy of it, in a folder that
    has one)."""
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    (tmp_path / ".venv").mkdir()
    result = run(["bash", tmp_path / ".ci" / "run"], env=offline_env())
    assert result.returncode == 2
    assert "rm -rf .venv" in result.stderr
    assert list((tmp_path / ".venv").iterdir()) == []


def test_the_image_builds_on_the_beam_sdk_image_of_the_installed_beam():
    """The image's SDK is the driver's by construction: the Dockerfile takes the version as
    an argument with no default (a pinned one goes stale with the next apache-beam the
    set-up installs), and the README's build command, run where the driver's apache-beam is
    installed, passes that one."""
    instructions = dockerfile_instructions()
    assert instructions[:2] == [("ARG", "BEAM_VERSION"), ("FROM", "apache/beam_python3.11_sdk:${BEAM_VERSION}")]
    assert [args for instruction, args in instructions if instruction == "FROM"] == [instructions[1][1]]
    builds = [line.strip() for line in (REPO / "README.md").read_text().splitlines()
              if line.strip().startswith("docker build")]
    assert len(builds) == 1
    build = builds[0]
    assert build.startswith("docker build --build-arg BEAM_VERSION=") and build.endswith(" -t picasso-worker .")
    argument = build.removeprefix("docker build ").removesuffix(" -t picasso-worker .")
    # The shell expands it as it would for the reader, with this environment's python first.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    expanded = subprocess.run(["bash", "-c", f"echo {argument}"], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    assert expanded == f"--build-arg BEAM_VERSION={apache_beam.__version__}"


def test_the_image_installs_with_the_readme_set_up_command_and_builds_the_kernels():
    runs = [args for instruction, args in dockerfile_instructions() if instruction == "RUN"]
    assert runs == [IMAGE_SETUP, "python -m picasso.kernels.build"]
    # The README's set-up command, but for its venv and the extras.
    assert readme_setup_command() == VENV_SETUP + IMAGE_SETUP.replace("pip install -e .",
                                                                      'pip install -e ".[test,bench]"')


def test_the_readme_gives_the_image_set_up_command():
    assert f"    {IMAGE_SETUP}\n        python -m picasso.kernels.build" in (REPO / "README.md").read_text()


def test_the_image_builds_its_kernels_for_a_portable_instruction_set():
    settings = " ".join(args for instruction, args in dockerfile_instructions() if instruction == "ENV").split()
    assert "PICASSO_KERNEL_MARCH=x86-64-v3" in settings  # not -march=native: workers have other CPUs
    assert "PICASSO_KERNEL_CACHE=/opt/picasso/kernel-cache" in settings


def test_the_image_starts_the_beam_worker_boot():
    instructions = dockerfile_instructions()
    assert instructions[-1] == ("ENTRYPOINT", '["/opt/apache/beam/boot"]')
