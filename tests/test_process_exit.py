"""A command's process leaves with its status once every exit handler has run, and skips
only the interpreter's teardown (pipelines/cli/process_exit.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import atexit, sys, tempfile
    from pathlib import Path
    from picasso.pipelines.cli.process_exit import run_command

    marker, outcome = Path(sys.argv[1]), sys.argv[2]
    kept = []

    def main(argv):
        import torch  # a module loaded after the handler, as every command loads them
        atexit.register(lambda: marker.write_text("handlers ran"))
        kept.append(tempfile.TemporaryDirectory())  # its clean-up is an exit handler too
        (marker.parent / "tmpdir").write_text(kept[0].name)
        sys.stdout.write("unflushed output")  # no newline: still in the buffer
        if outcome == "return":
            return 3
        if outcome == "exit":
            sys.exit(2)
        if outcome == "message":
            sys.exit("a message for the user")
        raise RuntimeError("an error main does not catch")

    run_command(main)
""")


def _run(tmp_path, outcome):
    return subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "marker"), outcome], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("outcome, status, stderr", [("return", 3, ""), ("exit", 2, ""),
                                                     ("message", 1, "a message for the user"),
                                                     ("raise", 1, "RuntimeError: an error main does not catch")])
def test_the_status_is_kept_and_every_exit_handler_runs(tmp_path, outcome, status, stderr):
    done = _run(tmp_path, outcome)
    assert done.returncode == status, done.stderr
    assert stderr in done.stderr
    assert done.stdout == "unflushed output"
    assert (tmp_path / "marker").read_text() == "handlers ran"
    assert not __import__("os").path.exists((tmp_path / "tmpdir").read_text())  # cleaned up at exit


def test_the_console_script_exits_with_the_commands_status(tmp_path):
    done = subprocess.run([sys.executable, "-c", "from picasso.pipelines.cli.main import console_main; "
                           "console_main()", "daily", "--data", str(tmp_path), "--date", "2026-11-01", "--workdir",
                           str(tmp_path / "w"), "--dropout", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--dropout" in done.stderr


def test_a_library_caller_exits_as_python_always_does(tmp_path):
    """Importing picasso.pipelines arms nothing: a script's own exit status and teardown stand."""
    script = "import picasso.pipelines, sys; sys.stdout.write('plain'); sys.exit(5)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout) == (5, "plain")
