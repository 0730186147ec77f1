"""The import graph of picasso's source folders, read from their files with `ast` (nothing is
imported), imports inside functions and classes included.

The folders are layered (DESIGN.md, "Layout and import names"): kernels at the bottom, then
picasso_stage/ (`picasso`), connectors/, serving/ and pipelines/ on top. A module may import
its own folder's modules and any folder below its own; an import of a folder above is
upward. A loop is a cycle of modules each importing the next.

    python tests/import_graph.py          # the counts, then every upward import and loop
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Bottom first: each folder may import those before it. The import prefix of each is
# setup.py's package_dir mapping.
LAYERS = (("kernels", "picasso.kernels"), ("picasso_stage", "picasso"), ("connectors", "picasso.connectors"),
          ("serving", "picasso.serving"), ("pipelines", "picasso.pipelines"))
RANK = {folder: rank for rank, (folder, _) in enumerate(LAYERS)}


@dataclass(frozen=True)
class Import:
    importer: str  # module name, e.g. picasso.kernels.cpu
    imported: str
    line: int
    in_function: bool  # inside a def (run when called, not at import)


@dataclass
class ImportGraph:
    modules: dict[str, Path]  # module name -> file
    imports: list[Import]

    def folder(self, module: str) -> str:
        return folder_of(self.modules[module])

    def upward(self) -> list[Import]:
        return [edge for edge in self.imports
                if RANK[self.folder(edge.imported)] > RANK[self.folder(edge.importer)]]

    def between_folders(self) -> Counter:
        return Counter((self.folder(edge.importer), self.folder(edge.imported)) for edge in self.imports
                       if self.folder(edge.importer) != self.folder(edge.imported))

    def loops(self) -> list[list[str]]:
        """The strongly connected components of more than one module (or a module that
        imports itself): each holds at least one loop."""
        edges: dict[str, set[str]] = {module: set() for module in self.modules}
        for edge in self.imports:
            edges[edge.importer].add(edge.imported)
        return [sorted(component) for component in _components(edges)
                if len(component) > 1 or next(iter(component)) in edges[next(iter(component))]]


def folder_of(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    prefix = dict(LAYERS)[folder]
    parts = [part for part in rest if part != "__init__"]
    return ".".join([prefix, *parts])


def scan(root: Path = ROOT) -> ImportGraph:
    modules = {module_name(path): path for folder, _ in LAYERS
               for path in sorted((root / folder).rglob("*.py")) if "__pycache__" not in path.parts}
    imports = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, in_function in _walk(tree):
            for target in _targets(node, package, modules):
                if target != name or isinstance(node, ast.ImportFrom):
                    imports.append(Import(name, target, node.lineno, in_function))
    return ImportGraph(modules, [edge for edge in imports if edge.imported != edge.importer])


def _walk(tree: ast.AST):
    """Every import statement, and whether it sits inside a function."""
    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
    yield from visit(tree, False)


def _targets(node, package: str, modules: dict[str, Path]) -> list[str]:
    """The picasso modules an import statement names: `from a import b` is a.b where that is
    a module, else a (the name is defined in a's __init__)."""
    if isinstance(node, ast.Import):
        return [_known(alias.name, modules) for alias in node.names if _known(alias.name, modules)]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, *([base] if base else [])])
    found = []
    for alias in node.names:
        target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else _known(base, modules)
        if target and target not in found:
            found.append(target)
    return found


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest picasso module that `name` starts with (None for other packages)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _components(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively (the graph has ~400 modules)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def main() -> int:
    graph = scan()
    upward, loops = graph.upward(), graph.loops()
    in_functions = sum(edge.in_function for edge in graph.imports)
    print(f"{len(graph.modules)} modules, {len(graph.imports)} imports between them "
          f"({in_functions} inside functions)")
    print("between folders (importer -> imported: count):")
    for (importer, imported), count in sorted(graph.between_folders().items()):
        mark = "  UPWARD" if RANK[imported] > RANK[importer] else ""
        print(f"  {importer} -> {imported}: {count}{mark}")
    print(f"upward imports: {len(upward)}")
    for edge in upward:
        where = "in a function" if edge.in_function else "at import"
        print(f"  {edge.importer} (line {edge.line}, {where}) -> {edge.imported}")
    print(f"loops: {len(loops)}")
    for component in loops:
        print("  " + ", ".join(component))
    return 0


if __name__ == "__main__":
    sys.exit(main())
