"""`mlflow models serve -m models:/NAME@champion --env-manager local`: real HTTP round
trips with raw events. Every row gets one answer, as the in-process model gives it, or
the request is refused with each bad row's reason; no NaN, no dropped row."""

from __future__ import annotations

import json
import math
import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from publish_helpers import CheckpointMaker, fresh_target, request
from serving_helpers import post, probabilities

from picasso.serving.publishing.publication import publish
from picasso.connectors.testing.mlflow_server import picasso_served, served_model
from picasso.kernels.build_lock import LOCK_FILE, TORCH_LOCK_FILE

EVENTS = pd.DataFrame({
    "d1": [0.5, 3.0, None, 1.0],
    "d2": [10.0, None, 2.0, 0.0],
    "h": ["seen-or-not", None, "never-seen-id", 42],  # strings and integers hash alike
    "v": [3, 7, None, 0],
    "bag": [["a", "b"], [], None, ["c"]],
    # "vbag" is missing altogether: an empty bag for every row
})
MAX_ROWS = 50  # the served model's row limit in this test (PICASSO_SERVING_MAX_ROWS)


KERNEL_LIBRARY = "picasso_*.so"  # the C++ kernels' library (kernels/cpu.py: picasso_kernels.so)
# What loading kernels that are already built writes in their folder, in any process of the
# environment (other tests' among them), so that it says nothing of this server: who holds
# the build lock (kernels/build_lock.py), torch's lock file for the moment of a load, and
# build.ninja, which torch writes at each load before ninja finds nothing to do. A build changes the others: the
# objects, the libraries, ninja's log.
LOAD_RECORDS = {LOCK_FILE, TORCH_LOCK_FILE, "build.ninja"}


@dataclass(frozen=True)
class KernelState:
    """The served process's C++ kernels, seen from outside it (Linux's /proc/PID/maps): the
    kernel libraries it has mapped, and every file of the build folder they came from, with
    its size and mtime."""

    mapped: frozenset[str]
    folder: Path | None
    files: dict[str, tuple[int, int]]

    @classmethod
    def of_session(cls, session: int, folder: Path | None = None) -> "KernelState":
        mapped = frozenset(path for pid in _pids_in(session) for path in _mapped_paths(pid)
                           if Path(path).match(KERNEL_LIBRARY))
        if folder is None:
            folders = {Path(path).parent for path in mapped}
            assert len(folders) <= 1, f"kernels mapped from more than one folder: {sorted(mapped)}"
            folder = folders.pop() if folders else None
        files = {} if folder is None else {
            str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name not in LOAD_RECORDS}
        return cls(mapped, folder, files)


def _pids_in(session: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == session:
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return pids


def _mapped_paths(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {parts[5].rstrip("\n") for parts in (line.split(maxsplit=5) for line in f) if len(parts) == 6}
    except OSError:  # gone meanwhile
        return set()


@dataclass
class Served:
    url: str
    model_name: str
    in_process: mlflow.pyfunc.PyFuncModel
    server: subprocess.Popen
    kernels_at_start: KernelState  # once the server answered /ping, before any request
    picasso_url: str  # `picasso serve` of the same model
    picasso_server: subprocess.Popen
    picasso_kernels_at_start: KernelState  # once it answered /ping


def split(frame: pd.DataFrame, **extra) -> dict:
    return {"dataframe_split": json.loads(frame.to_json(orient="split", index=False)), **extra}


@pytest.fixture(scope="module")
def served(mlflow_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    target = fresh_target(mlflow_server)
    maker = CheckpointMaker(root / "checkpoints")
    publish(request(maker.next(), 0.70), target)
    publish(request(maker.next(), 0.50), target)  # not promoted: serving must pick version 1
    uri = f"models:/{target.model_name}@champion"
    mlflow.set_tracking_uri(mlflow_server)
    in_process = mlflow.pyfunc.load_model(uri)
    with served_model(uri, mlflow_server, root / "serve.log", {"PICASSO_SERVING_MAX_ROWS": str(MAX_ROWS)}) as (url, server):
        # The server's process group is a session of its own (served_model), which holds
        # the scoring process that mlflow starts.
        kernels_at_start = KernelState.of_session(server.pid)
        with picasso_served(uri, mlflow_server, root / "picasso-serve.log", "--max-rows", str(MAX_ROWS)) as (ours, process):
            yield Served(url, target.model_name, in_process, server, kernels_at_start, ours, process,
                         KernelState.of_session(process.pid))


def test_the_first_request_is_answered_like_the_tenth(served):
    """The kernels load when the server starts, not on the first request: the model's load
    hook (CtrModel.load_context) has loaded every C++ kernel library of its build folder into
    the scoring process before the server takes a request, and the requests leave that
    folder as they found it (no build) and load no other. Checked from outside the process
    (its memory maps and the folder's files), with nothing timed. Whichever test ran first,
    the state compared with is the one from before the server's first request."""
    start = served.kernels_at_start
    assert start.folder is not None, "no C++ kernel library was loaded before the first request"
    built = {str(path.resolve()) for path in start.folder.glob("*.so")}
    assert built and built <= start.mapped, f"kernels of {start.folder} not loaded at start: {sorted(built - start.mapped)}"
    expected = served.in_process.predict(EVENTS)
    body = json.dumps(split(EVENTS)).encode()
    for _ in range(10):
        status, answer = post(served.url, body)
        assert status == 200
        np.testing.assert_allclose(probabilities(answer, len(EVENTS)), expected, rtol=1e-6)
    after = KernelState.of_session(served.server.pid, start.folder)
    assert after.files == start.files, "the kernel build folder changed after the server's first request"
    assert after.mapped == start.mapped


# name -> (request body, expected status, what the body must say)
HOSTILE = {
    "string-for-a-number": (split(pd.DataFrame({"d1": ["old", 1.0], "h": ["a", "b"]})), 400,
                            [(0, "field 'd1': expected a number, got str 'old'")]),
    "dict-for-an-id": ({"dataframe_records": [{"h": "a"}, {"h": {"k": 1}}]}, 400,
                       [(1, "field 'h': expected integer or string ids, got dict")]),
    "bag-over-max-len": ({"dataframe_records": [{"bag": list(range(200_000))}]}, 400,
                         [(0, "field 'bag'")]),
    "too-many-rows": ({"dataframe_records": [{"d1": 1.0}] * (MAX_ROWS + 1)}, 400,
                      f"a request of {MAX_ROWS + 1} rows is over this server's limit of {MAX_ROWS}"),
    "unknown-on-bad-row": (split(EVENTS, params={"on_bad_row": "skip"}), 400, "on_bad_row must be one of"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_request_with_refused_rows_is_a_400_naming_each_row_and_reason(served, name):
    body, status, says = HOSTILE[name]
    got, answer = post(served.url, body)
    assert got == status, answer
    assert answer["error_code"] == "INVALID_PARAMETER_VALUE"
    if isinstance(says, str):
        assert says in answer["message"]
        return
    assert [row["row"] for row in answer["refused_rows"]] == [row for row, _ in says]
    for refused, (_, reason) in zip(answer["refused_rows"], says):
        assert reason in refused["reason"]
        assert f"row {refused['row']}: {refused['reason']}" in answer["message"]


@pytest.mark.parametrize("body, rows", [
    ({"dataframe_records": [{"zzz": 1}]}, 1),  # only a column the spec does not know
    ({"dataframe_records": [{}, {}]}, 2),
    ({"dataframe_records": [{"zzz": 1}, {"d1": 2.0, "h": "a"}]}, 2),
])
def test_rows_with_no_known_field_get_one_answer_each_on_defaults(served, body, rows):
    status, answer = post(served.url, body)
    assert status == 200, answer
    predictions = probabilities(answer, rows)
    defaults = served.in_process.predict(pd.DataFrame(index=range(1)))[0]
    assert math.isclose(predictions[0], defaults, rel_tol=1e-6)


def test_on_bad_row_default_scores_a_bad_row_on_its_good_fields_and_says_why(served):
    rows = [{"d1": 0.5, "h": "a", "v": 3}, {"d1": "old", "h": "a", "v": 3}, {"d1": 0.5, "h": "a", "v": 3}]
    status, answer = post(served.url, {"dataframe_records": rows, "params": {"on_bad_row": "default"}})
    assert status == 200, answer
    probabilities(answer, len(rows))
    predictions = answer["predictions"]
    assert [p["refused"] for p in predictions] == [None, "field 'd1': expected a number, got str 'old'", None]
    repaired = served.in_process.predict(pd.DataFrame([{"h": "a", "v": 3}]))[0]
    assert math.isclose(predictions[1]["probability"], repaired, rel_tol=1e-6)
    assert math.isclose(predictions[0]["probability"], predictions[2]["probability"])


def test_the_server_survives_every_case_and_still_answers_valid_requests(served):
    """A valid request after all the others (and after a body nested 5,000 deep, which
    MLflow's own parser refuses) returns the in-process model's predictions."""
    status, _ = post(served.url, b'{"dataframe_records": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert status >= 400
    for body, _, _ in HOSTILE.values():
        post(served.url, body)
    status, answer = post(served.url, split(EVENTS))
    assert status == 200
    np.testing.assert_allclose(probabilities(answer, len(EVENTS)), served.in_process.predict(EVENTS), rtol=1e-6)
    champion = mlflow.pyfunc.load_model(f"models:/{served.model_name}/1").predict(EVENTS)
    np.testing.assert_array_equal(champion, served.in_process.predict(EVENTS))
    with urllib.request.urlopen(f"{served.url}/ping", timeout=30) as response:
        assert response.status == 200
    assert served.server.poll() is None


@pytest.mark.parametrize("name", [name for name in HOSTILE if name != "too-many-rows"])
def test_picasso_serve_refuses_as_mlflow_models_serve_does(served, name):
    """The same version, the same request: the same status and the same JSON, word for word."""
    body, _, _ = HOSTILE[name]
    assert post(served.picasso_url, body) == post(served.url, body)


@pytest.mark.parametrize("body", [split(EVENTS), {"dataframe_records": EVENTS.to_dict(orient="records")},
                                  {"inputs": EVENTS.to_dict(orient="list")},
                                  split(EVENTS, params={"on_bad_row": "default"}), {"dataframe_records": [{}]}])
def test_picasso_serve_answers_as_mlflow_models_serve_does(served, body):
    assert post(served.picasso_url, body) == post(served.url, body)


def test_picasso_serve_refuses_more_than_max_rows_with_a_413_and_malformed_json_with_a_400(served):
    status, answer = post(served.picasso_url, HOSTILE["too-many-rows"][0])
    assert status == 413
    assert answer["message"] == f"a request of {MAX_ROWS + 1} rows is over this server's limit of {MAX_ROWS} (--max-rows)"
    # The code mlflow models serve gives the same refusal (a 400 there: its pyfunc's own limit).
    theirs = post(served.url, HOSTILE["too-many-rows"][0])[1]
    assert answer["error_code"] == theirs["error_code"] == "INVALID_PARAMETER_VALUE"
    assert post(served.picasso_url, b'{"dataframe_split": ') == post(served.url, b'{"dataframe_split": ')
    assert post(served.picasso_url, b'{"dataframe_split": ')[0] == 400


def test_picasso_serve_has_its_kernels_and_model_loaded_before_its_port_opens(served):
    """As for mlflow models serve above: every kernel library of the build folder is mapped
    into the process by the time it answers /ping, and answering leaves that folder as it was."""
    start = served.picasso_kernels_at_start
    assert start.folder is not None, "no C++ kernel library was loaded before the port opened"
    built = {str(path.resolve()) for path in start.folder.glob("*.so")}
    assert built and built <= start.mapped
    for _ in range(3):
        assert post(served.picasso_url, split(EVENTS))[0] == 200
    assert KernelState.of_session(served.picasso_server.pid, start.folder).files == start.files
