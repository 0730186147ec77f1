"""The module names that versions logged earlier import, kept importable in `picasso serve`.

A version's pyfunc file imports picasso modules by the names they had when it was logged.
Loaded where picasso is not imported yet, it brings its own copy of that code and finds
them there. In `picasso serve` picasso is already imported, so its imports resolve against
the installed picasso, where some of those names are gone. install() makes each old name
the module that now holds what it held, before a version is loaded (versions.py).
"""

from __future__ import annotations

import importlib
import sys

# Old module name -> the module that holds its names now.
OLD_NAMES = {
    # Versions whose pyfunc lived in connectors/ imported serving's rows and weights
    # through these.
    "picasso.connectors.serving_rows": "picasso.serving.request_decoding",
    "picasso.connectors.serving_weights": "picasso.serving.weights",
    "picasso.serving.rows": "picasso.serving.request_decoding",
}


def install() -> None:
    """Each old name, imported, gives its new module (the same module object, so that
    what an old version imports is what serving runs), as `from PACKAGE import NAME` too."""
    for old, new in OLD_NAMES.items():
        module = sys.modules.setdefault(old, importlib.import_module(new))
        package, _, name = old.rpartition(".")
        setattr(importlib.import_module(package), name, module)
