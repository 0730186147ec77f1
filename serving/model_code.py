"""What the logged pyfunc model carries besides its weights: a copy of the picasso code
serving runs, so that it loads where picasso is not installed, and the pinned pip
requirements it is served with.

The code is exactly the modules the pyfunc needs (served_modules(): the pyfunc, the picasso
modules it imports, theirs in turn and the packages on the way, read from their files by
code_closure.py) and the C++ sources the kernels build from on first use, laid out as the
installed package is (picasso/..., picasso/kernels/..., picasso/connectors/...). Nothing of
training's outside systems (Kafka, Beam, dead-letter sinks, synthetic data), publishing, or
the `picasso serve` server goes with it: a version carries what it runs, and an edit to
those never changes what a version ships.
"""

from __future__ import annotations

import shutil
from importlib.metadata import version
from pathlib import Path, PurePosixPath

from picasso.serving.code_closure import import_closure, source_module

# Where serving starts: the model file MLflow loads (models from code).
SERVED_FROM = "picasso.serving.pyfunc_model"
# Files besides modules that the served code reads, by package: the C++ sources the CPU
# kernels are built from on first use (setup.py's package_data).
PACKAGE_DATA = {"picasso.kernels": ("csrc/*.cpp", "csrc/*.h")}

# What the pyfunc needs at serving time, and nothing of the trainer's (Beam, Kafka),
# pinned to the versions it was logged with. torch is pinned without its local build tag
# (2.13.0, not 2.13.0+cpu): the index serves the plain version.
SERVING_PACKAGES = ("torch", "pyarrow", "numpy", "pandas", "pyyaml")


def serving_requirements() -> list[str]:
    return [f"{name}=={version(name).split('+')[0]}" for name in SERVING_PACKAGES]


def served_modules() -> list[str]:
    """The picasso modules a version ships, by name, sorted."""
    return sorted(import_closure(SERVED_FROM))


def served_files() -> list[str]:
    """The files a version ships, relative to its code folder (picasso/batch.py,
    picasso/kernels/csrc/id_map.cpp, ...), sorted."""
    return sorted(_served_sources())


def stage_code(directory: Path) -> Path:
    """The served files, copied into directory/picasso: the folder the model is logged with
    (code_paths), which MLflow puts on sys.path where it loads the model."""
    for relative, source in _served_sources().items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return directory / "picasso"


def _served_sources() -> dict[str, Path]:
    """Each served file's path in the code folder, and the installed file it is copied from."""
    sources = {}
    for name, module in import_closure(SERVED_FROM).items():
        folder = PurePosixPath(*name.split("."))
        sources[str(folder / "__init__.py" if module.is_package else folder.with_suffix(".py"))] = module.file
    for package, patterns in PACKAGE_DATA.items():
        installed = source_module(package).file.parent
        for pattern in patterns:
            for file in installed.glob(pattern):
                sources[str(PurePosixPath(*package.split("."), *file.relative_to(installed).parts))] = file
    return sources
