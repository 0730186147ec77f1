"""The code a served model ships: exactly the picasso modules its pyfunc needs (nothing of
Kafka, Beam, publishing or the server), and the old module names versions logged earlier
import, kept in `picasso serve`.

That a version loads and predicts where only its own code is importable is
test_publish.py's test_the_model_loads_and_predicts_without_beam_kafka_or_an_installed_picasso.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from import_graph import scan

import picasso.serving.request_decoding
import picasso.serving.weights
from picasso.serving import old_names
from picasso.serving.code_closure import SourceModule, _imports_of, picasso_imports
from picasso.serving.model_code import SERVED_FROM, served_files, served_modules, stage_code

# What a served model must never carry: training's outside systems, publishing, the server.
NOT_SERVED = (
    "picasso.pipelines",
    "picasso.trainer",
    "picasso.distributed",
    "picasso.connectors.testing",
    "picasso.connectors.synthetic",
    "picasso.connectors.dead_letters.topic",
    "picasso.connectors.dead_letters.oversize",
    "picasso.connectors.dead_letters.policy",
    "picasso.connectors.kafka",
    "picasso.connectors.beam",
    "picasso.connectors.confluent_reader",
    "picasso.connectors.librdkafka_config",
    "picasso.connectors.local_broker",
    "picasso.connectors.day_files",
    "picasso.connectors.metric_plots",
    "picasso.connectors.retry",
    "picasso.connectors.publishing",
    "picasso.serving.publishing",
    "picasso.serving.server",
    "picasso.serving.follower",
    "picasso.serving.versions",
    "picasso.serving.model_code",
    "picasso.serving.code_closure",
    "picasso.serving.old_names",
)
NOT_IMPORTED = ("apache_beam", "kafka", "confluent_kafka", "boto3", "fastapi", "uvicorn", "prometheus_client")
# A module named in a string: importlib.import_module's, or the kernels' table of backends.
NAMED = re.compile(r"""["'](picasso(?:\.\w+)*)["']""")


def _needs() -> dict[str, set[str]]:
    """Each picasso module's own needs, read independently of model_code: the imports the
    repository's import graph finds, the modules its strings name, its package."""
    graph = scan()
    needs = {name: set(NAMED.findall(path.read_text())) & set(graph.modules) for name, path in graph.modules.items()}
    for edge in graph.imports:
        needs[edge.importer].add(edge.imported)
    for name in graph.modules:
        if "." in name:
            needs[name].add(name.rpartition(".")[0])
    return needs


def test_the_served_modules_are_exactly_what_the_pyfunc_needs():
    served, needs = set(served_modules()), _needs()
    assert SERVED_FROM == "picasso.serving.pyfunc_model" and SERVED_FROM in served
    assert served_modules() == sorted(served)
    for name in served:
        assert needs[name] <= served, f"{name} needs {sorted(needs[name] - served)}, which is not served"
    reached, waiting = set(), [SERVED_FROM]
    while waiting:
        name = waiting.pop()
        if name not in reached:
            reached.add(name)
            waiting.extend(needs[name])
    assert served == reached, f"served but not needed: {sorted(served - reached)}"
    assert {"picasso", "picasso.kernels", "picasso.kernels.cpu", "picasso.connectors.decoding.record_decoder",
            "picasso.serving.request_decoding", "picasso.serving.weights"} <= served


def test_a_served_model_carries_no_training_publishing_or_server_code():
    served = served_modules()
    assert [name for name in served if name.startswith(NOT_SERVED)] == []
    # Of the dead letters, only the record the decoder returns for a refused row.
    assert [name for name in served if name.startswith("picasso.connectors.dead_letters")] == [
        "picasso.connectors.dead_letters", "picasso.connectors.dead_letters.letters"]
    graph = scan()
    for name in served:
        outside = _outside_imports(graph.modules[name])
        assert not outside & set(NOT_IMPORTED), (name, sorted(outside & set(NOT_IMPORTED)))
        assert "mlflow" not in outside or name == SERVED_FROM, name  # only the model MLflow loads


def test_the_staged_folder_holds_the_served_files_and_no_other_python(tmp_path):
    package = stage_code(tmp_path / "code")
    assert package == tmp_path / "code" / "picasso"
    files = sorted(str(path.relative_to(tmp_path / "code")) for path in (tmp_path / "code").rglob("*")
                   if path.is_file())
    assert files == served_files()
    modules = sorted(re.sub(r"(/__init__)?\.py$", "", file).replace("/", ".") for file in files if file.endswith(".py"))
    assert modules == served_modules()
    assert "picasso/kernels/csrc/picasso_kernels.cpp" in files and "picasso/kernels/csrc/hashing.h" in files
    assert {"picasso/__init__.py", "picasso/serving/pyfunc_model.py", "picasso/kernels/__init__.py",
            "picasso/connectors/decoding/record_decoder.py"} <= set(files)
    graph = scan()
    for file in files:
        assert (tmp_path / "code" / file).read_bytes() == _installed(file, graph).read_bytes(), file


def test_old_module_names_are_the_modules_that_hold_their_names_now():
    old_names.install()
    rows = importlib.import_module("picasso.connectors.serving_rows")
    assert rows.decode_request is picasso.serving.request_decoding.decode_request
    assert rows.BadRows is picasso.serving.request_decoding.BadRows
    assert rows.on_bad_row_problem is picasso.serving.request_decoding.on_bad_row_problem
    weights = importlib.import_module("picasso.connectors.serving_weights")
    assert weights.is_training_only is picasso.serving.weights.is_training_only
    assert importlib.import_module("picasso.serving.rows").decode_request is \
        picasso.serving.request_decoding.decode_request
    from picasso.connectors.serving_rows import BadRows  # as an old version's pyfunc imports it
    assert BadRows is picasso.serving.request_decoding.BadRows
    old_names.install()  # twice is once
    assert importlib.import_module("picasso.serving.rows") is picasso.serving.request_decoding


def _outside_imports(path: Path) -> set[str]:
    """The top-level names of the packages other than picasso that a file imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - {"picasso"}


def _installed(file: str, graph) -> Path:
    """The repository file a staged file was copied from (setup.py's package_dir)."""
    parts = file.split("/")
    for end in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:end])
        if package in graph.modules and graph.modules[package].name == "__init__.py":
            return graph.modules[package].parent.joinpath(*parts[end:])
    raise AssertionError(file)


def test_a_module_edited_after_it_was_read_is_read_again(tmp_path):
    """Each publish reads the closure; a file's imports are read once per version of it,
    so an edit (a new time or size) is seen and an unchanged file is not parsed again."""
    module = SourceModule("picasso.edited", tmp_path / "edited.py")
    module.file.write_text("import picasso.spec\n")
    assert picasso_imports(module) == {"picasso.spec"}
    hits = _imports_of.cache_info().hits
    assert picasso_imports(module) == {"picasso.spec"}
    assert _imports_of.cache_info().hits == hits + 1  # unchanged: not parsed again
    module.file.write_text("from picasso import storage, spec_refs\n")
    assert picasso_imports(module) == {"picasso.storage", "picasso.spec_refs"}
