"""The source folders' imports point one way and go round in no loop (DESIGN.md, "Layout
and import names"), imports inside functions included: tests/import_graph.py reads them.

A failure names what to fix: each upward import (the importer, its line, what it imports),
or the modules of each loop. `python tests/import_graph.py` prints the whole graph."""

from __future__ import annotations

from import_graph import ROOT, scan


def test_no_folder_imports_a_folder_above_it():
    graph = scan()
    upward = [f"  {edge.importer} imports {edge.imported}: {graph.modules[edge.importer].relative_to(ROOT)} "
              f"line {edge.line}{' (in a function)' if edge.in_function else ''}"
              for edge in graph.upward()]
    assert not upward, ("imports of a folder above the importer's (layers, bottom first: kernels, picasso_stage, "
                        "connectors, serving, pipelines); move the shared piece down, to the lower folder:\n"
                        + "\n".join(upward))


def test_no_modules_import_each_other_in_a_loop():
    loops = scan().loops()
    assert not loops, ("modules that import each other, directly or round a loop; put what they share in a "
                       "module below them (or in the module that owns it), which each imports:\n"
                       + "\n".join("  " + ", ".join(component) for component in loops))
