"""The picasso modules that one module needs to run: it, every picasso module it imports,
theirs in turn, and every package on the way, each with its file.

The served model ships exactly these, starting from the pyfunc (model_code.py), so that it
carries what serving runs and nothing of training's outside systems (Kafka, Beam,
publishing, the `picasso serve` server). The files are read with `ast`, nothing is
imported: importing would run them (torch, MLflow) and would show only the imports that one
run happened to take, where reading sees every one, those inside functions too (a kernel
backend is loaded on first use). A module is found the way the import system would find it
(sys.meta_path over its package's __path__), so the files are the installed ones, editable
or not.

What counts as an import of a picasso module M:
- `import M`, `from M import x`, and `from P import M` where M is a module of package P,
  relative forms included; `from M import x` where x is no module is M (x is defined there);
- a string that is exactly M's name: importlib.import_module(M), or a table of modules by
  name that is imported from (the kernel backends);
- the packages above M: importing M runs their __init__.py first.
A name that names no module file (a guarded import of something absent) adds nothing.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from importlib.machinery import ModuleSpec
from pathlib import Path

PACKAGE = "picasso"


@dataclass(frozen=True)
class SourceModule:
    """One picasso module as installed: its name and file."""

    name: str
    file: Path

    @property
    def is_package(self) -> bool:
        return self.file.name == "__init__.py"

    @property
    def package(self) -> str:
        """The package its relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


def import_closure(start: str) -> dict[str, SourceModule]:
    """`start` and every picasso module it needs, by name (see the module docstring)."""
    found: dict[str, SourceModule] = {}
    waiting = [start]
    while waiting:
        name = waiting.pop()
        if name in found:
            continue
        module = source_module(name)
        if module is None:
            raise ModuleNotFoundError(f"no picasso module {name!r} to read", name=name)
        found[name] = module
        parent = name.rpartition(".")[0]
        waiting.extend([parent] if parent else [])
        waiting.extend(picasso_imports(module))
    return found


def picasso_imports(module: SourceModule) -> frozenset[str]:
    """The picasso modules that `module`'s file names, at import or inside functions."""
    stat = module.file.stat()
    return _imports_of(module.file, module.package, stat.st_mtime_ns, stat.st_size)


@cache
def _imports_of(file: Path, package: str, mtime_ns: int, size: int) -> frozenset[str]:
    """picasso_imports, read once per version of the file (its time and size are in the
    key): every publish ships the closure, and parsing ~60 files took a third of a second
    of each one."""
    tree = ast.parse(file.read_text(), str(file))
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            named.update(f"{base}.{alias.name}" if _is_module(f"{base}.{alias.name}") else base
                         for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            named.add(node.value)
    return frozenset(name for name in named if _is_module(name))


def source_module(name: str) -> SourceModule | None:
    """The installed file of picasso module `name`, None where there is none."""
    spec = _spec(name)
    if spec is None or not spec.has_location or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return SourceModule(name, Path(spec.origin))


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def _is_module(name: str) -> bool:
    return (name == PACKAGE or name.startswith(PACKAGE + ".")) and source_module(name) is not None


@cache
def _spec(name: str) -> ModuleSpec | None:
    """The import system's spec for `name`, found without importing its packages
    (importlib.util.find_spec would run their __init__.py)."""
    parent = name.rpartition(".")[0]
    if parent:
        parent_spec = _spec(parent)
        if parent_spec is None or parent_spec.submodule_search_locations is None:
            return None  # the parent is no package: nothing is below it
        path = list(parent_spec.submodule_search_locations)
    else:
        path = None
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(name, path) if find_spec else None
        if spec is not None:
            return spec
    return None
