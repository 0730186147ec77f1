"""What the logged pyfunc model carries besides its weights: a copy of the picasso code
serving imports, so that it loads where picasso is not installed, and the pinned pip
requirements it is served with."""

from __future__ import annotations

import shutil
from importlib.metadata import version
from pathlib import Path

import picasso
from picasso import connectors, kernels, models, serving

# What the pyfunc needs at serving time, and nothing of the trainer's (Beam, Kafka),
# pinned to the versions it was logged with. torch is pinned without its local build tag
# (2.13.0, not 2.13.0+cpu): the index serves the plain version.
SERVING_PACKAGES = ("torch", "pyarrow", "numpy", "pandas", "pyyaml")


def serving_requirements() -> list[str]:
    return [f"{name}=={version(name).split('+')[0]}" for name in SERVING_PACKAGES]


def stage_code(directory: Path) -> Path:
    """A copy of the picasso modules serving imports, shipped inside the model so that it
    loads where picasso is not installed. The subpackages that setup.py maps from folders
    outside picasso_stage/ (kernels, connectors, serving) are copied in from there."""
    package = directory / "picasso"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(picasso.__path__[0], package, ignore=ignore)
    for module, name in ((models, "models"), (kernels, "kernels"), (connectors, "connectors"), (serving, "serving")):
        if not (package / name).exists():
            shutil.copytree(module.__path__[0], package / name, ignore=ignore)
    return package
