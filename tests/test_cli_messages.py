"""What the `picasso` command line says, and nothing else: no library noise on stderr (as
under cron, into a file), an error in one line (its traceback with --debug), a typo named as
one, no abbreviations, --version, and help for every flag that needs it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from picasso.serving.publishing.contract import MLflowTarget
from picasso.pipelines.cli import main as cli

DATE = "2026-11-01"
# Lines the libraries under picasso printed on every command, or every partition.
NOISE = ("apitools", "No shards found to finalize", "Add type hints", "ERROR:apache_beam", "Traceback")
ANSI = "\x1b["


def picasso(*args: str, stderr_file: Path, cwd: Path | None = None) -> tuple[int, str, str]:
    """Run the command line as cron would: stderr into a file, not a terminal. (status,
    stdout, what the file holds)"""
    with open(stderr_file, "w") as err:
        done = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", *args], stdout=subprocess.PIPE,
                              stderr=err, text=True, cwd=cwd, timeout=600)
    return done.returncode, done.stdout, stderr_file.read_text()


def assert_quiet(text: str) -> None:
    for line in NOISE:
        assert line not in text, text
    assert ANSI not in text, text


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A generated day and one daily run of it (MLP 32,16), as a user would: stderr of each
    in a file."""
    root = tmp_path_factory.mktemp("trained")
    data, workdir = root / "data", root / "work"
    generated = picasso("generate", "--out", str(data), "--rows", "3000", "--json", stderr_file=root / "generate.err")
    daily = picasso("daily", "--data", str(data), "--date", DATE, "--workdir", str(workdir), "--hidden", "32,16",
                    "--mlflow-uri", f"sqlite:///{root / 'mlflow.db'}", "--json", stderr_file=root / "daily.err")
    return {"root": root, "data": data, "workdir": workdir, "generate": generated, "daily": daily}


# -- no noise -------------------------------------------------------------------------------


def test_help_prints_nothing_on_stderr(tmp_path):
    code, out, err = picasso("--help", stderr_file=tmp_path / "help.err")
    assert code == 0 and "daily" in out
    assert err == ""


def test_generate_and_daily_write_no_library_noise_into_a_file(trained):
    code, out, err = trained["generate"]
    assert code == 0, err
    assert_quiet(err)
    code, out, err = trained["daily"]
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["version"] == "1"
    assert_quiet(err)


# -- one-line errors, tracebacks with --debug -------------------------------------------------


def _other_mlp(trained, *extra: str) -> tuple[int, str, str]:
    root = trained["root"]
    return picasso(*extra, "daily", "--data", str(trained["data"]), "--date", DATE, "--workdir", str(root / "work"),
                   "--mlflow-uri", f"sqlite:///{root / 'mlflow.db'}", "--force", "--hidden", "64,32",
                   stderr_file=trained["root"] / f"other-mlp{len(extra)}.err")


def test_a_checkpoint_of_another_mlp_is_one_line(trained):
    code, _, err = _other_mlp(trained)
    assert code == 2
    last = err.strip().splitlines()[-1]
    # The whole message on the one line (never wrapped), and nothing of Beam's before it.
    assert last.startswith("error: checkpoint") and "--hidden 32,16 (this run: 64,32)" in last, err
    assert "Traceback" not in err and "apache_beam" not in err and err.count("error:") == 1


def test_debug_shows_the_traceback_and_beams_log_of_it(trained):
    code, _, err = _other_mlp(trained, "--debug")
    assert code == 2
    assert "Traceback (most recent call last)" in err and "apache_beam.runners.common" in err
    assert err.strip().splitlines()[-1].startswith("error:")


def test_debug_shows_the_traceback_of_any_bad_input(tmp_path, capsys):
    argv = ["generate", "--out", str(tmp_path / "data"), "--spec", str(tmp_path / "missing.yaml")]
    assert cli.main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert cli.main(["--debug", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "SpecError" in err and "error:" in err
    assert cli.main([*argv, "--debug"]) == 2  # after the command too
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_debug_shows_where_a_distributed_commands_error_came_from(tmp_path, capsys):
    argv = ["ps", "--spec", str(tmp_path / "missing.yaml"), "--workdir", str(tmp_path), "--port", "1", "--workers", "1"]
    with pytest.raises(SystemExit, match="no such file"):
        cli.main(argv)
    assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no such file"):
        cli.main(["--debug", *argv])
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "SpecError" in err


# -- flags ----------------------------------------------------------------------------------


def _parse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, typo, meant", [
    (["daily", "--data", "d", "--date", DATE, "--workdr", "x"], "--workdr", "--workdir"),
    (["demo", "--workdr", "x"], "--workdr", "--workdir"),
    (["generate", "--outt", "x"], "--outt", "--out"),
    (["publish-pending", "--workdr", "x"], "--workdr", "--workdir"),
    (["ps", "--spec", "criteo", "--workdir", "w", "--prot", "1"], "--prot", "--port"),
    (["gba-worker", "--rank", "0", "--prot", "1"], "--prot", "--port"),
])
def test_a_typo_of_a_required_flag_is_named_as_a_typo(argv, typo, meant, capsys):
    message = _parse_error(argv, capsys)
    assert f"unrecognized arguments: {typo} " in message and f"(did you mean {meant}?)" in message
    assert "are required" not in message


def test_a_beam_option_does_not_hide_a_missing_flag(capsys):
    message = _parse_error(["daily", "--data", "d", "--date", DATE, "--direct_num_workers=2"], capsys)
    assert "the following arguments are required: --workdir" in message


def test_a_stray_flag_is_named_with_the_flag_it_is_close_to(capsys):
    assert "unrecognized arguments: --rowz 5 (did you mean --rows?)" in _parse_error(
        ["generate", "--out", "x", "--rowz", "5"], capsys)


def _commands() -> dict[str, argparse.ArgumentParser]:
    subparsers = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(subparsers.choices)


@pytest.mark.parametrize("command", sorted(_commands()))
def test_no_command_takes_an_abbreviated_flag(command, capsys):
    parser = _commands()[command]
    flags = {flag for action in parser._actions for flag in action.option_strings}
    # The longest flag whose name less its last letter is no flag itself: an abbreviation.
    flag = max((f for f in flags if f.startswith("--") and f[:-1] not in flags), key=len)
    message = _parse_error([command, flag[:-1], "1"], capsys)
    assert f"unrecognized arguments: {flag[:-1]}" in message


@pytest.mark.parametrize("argv", [["generate", "--out", "x", "--day", "2"],
                                  ["apply-delta", "--out", "x", "--vers", "3"]])
def test_the_abbreviations_seen_are_refused(argv, capsys):
    assert "unrecognized arguments" in _parse_error(argv, capsys)


def test_version_is_the_installed_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"picasso {version('picasso-stage')}"


def test_the_help_says_every_command_in_its_description(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for command in ("apply-delta", "publish-pending", "ps", "gba-worker", "sync-worker"):
        assert command in text.split("positional arguments")[0]


@pytest.mark.parametrize("command", sorted(c for c, p in _commands().items()
                                           if any("--spec" in a.option_strings for a in p._actions)))
def test_every_spec_flag_says_what_it_takes(command):
    spec = next(a for a in _commands()[command]._actions if "--spec" in a.option_strings)
    assert "built-in" in spec.help and "YAML" in spec.help


def test_daily_stream_ps_and_sync_worker_take_a_spec():
    assert {"daily", "stream", "ps", "sync-worker", "demo", "generate", "plan"} <= {
        c for c, p in _commands().items() if any("--spec" in a.option_strings for a in p._actions)}


# -- apply-delta's store --------------------------------------------------------------------


def test_apply_delta_without_a_workdir_makes_no_store_and_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert cli.main(["apply-delta", "--version", "2", "--out", "weights.pt"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "mlflow.db").exists()
    assert f"no MLflow store at {tmp_path / 'mlflow.db'}" in err and "--workdir" in err and "--mlflow-uri" in err


def test_apply_delta_of_a_version_the_store_lacks_names_the_store(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    target = MLflowTarget.for_workdir(tmp_path / "work")  # an empty store, made as a run makes it
    code = cli.main(["apply-delta", "--workdir", str(tmp_path / "work"), "--version", "7", "--out",
                     str(tmp_path / "w.pt")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert f"in the MLflow store {target.tracking_uri}" in err and "--mlflow-uri chooses the store" in err
