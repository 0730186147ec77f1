"""Every benchmark still runs: `python -m benchmarks.NAME --smoke --json` for each one, and
what benchmarks/harness.py does with --smoke.

The benchmarks are read from the folder, so a new one is tested without a change here. The
modules that are shared code, not benchmarks, are named in HELPERS, and each is checked to
have no `__main__` block, so that a benchmark cannot hide among them. A smoke run's figures
mean nothing: only that the report holds ratios and metrics is checked, never a value or
a time.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
HELPERS = {"__init__", "harness", "disk_rates", "endless_job", "gba_inprocess", "kafka_bench", "movielens_crosses", "movielens_stream",
           "sparse_rowwise_adagrad", "tensorpipe_channel", "train_rivals"}
# Generous: a smoke run takes seconds on an idle machine, but starts brokers, servers and
# worker processes, and the suite shares two cores with other work.
TIMEOUT_S = 900
# Smoke runs at once: most of a run's wall time is starting Python, brokers and servers and
# waiting on them (its CPU time is about a fifth of it), so two overlap well on two cores.
AT_ONCE = 2


def benchmark_names() -> list[str]:
    return sorted(path.stem for path in BENCHMARKS.glob("*.py") if path.stem not in HELPERS)


def test_helpers_are_shared_code_not_benchmarks():
    for name in sorted(HELPERS):
        source = (BENCHMARKS / f"{name}.py").read_text()  # a renamed or removed helper fails here
        assert "__main__" not in source, f"benchmarks/{name}.py runs as a benchmark: take it out of HELPERS"


def test_every_benchmark_runs_as_a_module():
    for name in benchmark_names():
        assert 'if __name__ == "__main__":' in (BENCHMARKS / f"{name}.py").read_text(), \
            f"benchmarks/{name}.py is not a benchmark: add it to HELPERS"


def _smoke(name: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--smoke", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def smoke_runs(request):
    """The smoke runs of the selected tests, AT_ONCE at a time, started when the first is
    asked for; each test waits for its own."""
    selected = [item.callspec.params["name"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_smoke_run_reports_ratios_and_metrics"]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        yield {name: pool.submit(_smoke, name) for name in selected}


@pytest.mark.parametrize("name", benchmark_names())
def test_smoke_run_reports_ratios_and_metrics(name, smoke_runs: dict[str, Future]):
    done = smoke_runs[name].result()
    assert done.returncode == 0, f"benchmarks.{name} --smoke failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"benchmarks.{name} printed nothing"
    result = json.loads(lines[-1])
    for part in ("ratios", "metrics"):
        assert isinstance(result.get(part), dict) and result[part], f"benchmarks.{name}: no {part} in {lines[-1][:500]}"


# -- harness.parse_args and --smoke --------------------------------------------------------


@pytest.fixture
def harness():
    # By its path: the benchmarks folder is run from the repository root, not installed.
    spec = importlib.util.spec_from_file_location("bench_harness", BENCHMARKS / "harness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(parser):
    parser.add_argument("--rows", type=int, default=1_000)


def test_smoke_sizes_replace_the_defaults(harness, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench", "--smoke"])
    args = harness.parse_args("bench", _rows, smoke={"rows": 10, "repeat": 1})
    assert (args.smoke, args.rows, args.repeat) == (True, 10, 1)
    assert harness.sized(args, 1_000, 10) == 10


def test_without_smoke_the_defaults_stay(harness, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench"])
    args = harness.parse_args("bench", _rows, smoke={"rows": 10, "repeat": 1})
    assert (args.smoke, args.rows, args.repeat) == (False, 1_000, 5)
    assert harness.sized(args, 1_000, 10) == 1_000


def test_a_value_on_the_command_line_wins_over_smoke(harness, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench", "--smoke", "--rows", "77"])
    args = harness.parse_args("bench", _rows, smoke={"rows": 10, "repeat": 1})
    assert (args.rows, args.repeat) == (77, 1)


def test_a_benchmark_may_declare_smoke_itself(harness, monkeypatch):
    def extra(parser):
        _rows(parser)
        parser.add_argument("--smoke", action="store_true", help="its own words")

    monkeypatch.setattr(sys, "argv", ["bench", "--smoke"])
    args = harness.parse_args("bench", extra, smoke={"rows": 10})
    assert (args.smoke, args.rows) == (True, 10)


def test_a_smoke_size_for_no_argument_is_named(harness, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench", "--smoke"])
    with pytest.raises(ValueError, match="rowz"):
        harness.parse_args("bench", _rows, smoke={"rowz": 10})


def test_scaling_names_its_goal_figures_after_its_sizes(smoke_runs: dict[str, Future]):
    """benchmarks.scaling (issue 39) reports step_growth_A_to_B and memory_over_state_B for
    the smallest and largest tables it ran (--smoke: 20k and 60k rows), and draws its plots;
    only the names are checked, never a value."""
    done = smoke_runs["scaling"].result() if "scaling" in smoke_runs else _smoke("scaling")
    assert done.returncode == 0, done.stderr[-5000:]
    metrics = json.loads(done.stdout.strip().splitlines()[-1])["metrics"]
    assert {"step_growth_20k_to_60k", "memory_over_state_60k", "plots"} <= set(metrics)


def test_cli_names_the_issue_figures(smoke_runs: dict[str, Future]):
    """benchmarks.cli (the commands as a user runs them) reports the issue's ratios, fixed
    costs and start-up times by their names; its smoke run is the one above, so this costs
    nothing more. Only the names are checked, never a value."""
    done = smoke_runs["cli"].result() if "cli" in smoke_runs else _smoke("cli")
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"daily_vs_trainer", "stream_vs_daily", "stream_arrow_vs_daily", "endless_vs_daily"} <= set(result["ratios"])
    assert {"daily_fixed_cost_s", "cycle_fixed_cost_s", "endless_fixed_cost_s", "version_s",
            "daily_one_row_s"} <= set(result["metrics"])
