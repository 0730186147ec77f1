"""`picasso ps` and `picasso gba-worker` without --json say what they do, in plain lines on
stderr: the worker at once what it waits for, the server where it listens, who joins and
leaves, and each checkpoint. Real processes on loopback: `picasso ps`, and a worker started
as `python -m picasso.pipelines.cli.distributed`."""

from __future__ import annotations

import subprocess
import sys

from picasso.connectors.testing.loopback import free_port

from test_gba_ps import tiny_spec  # noqa: F401 - the fixture

HANG_GUARD_SECONDS = 300  # only against a hang: every wait below ends on a line or an exit


def _start(module: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _line_with(process: subprocess.Popen, text: str, seen: list[str]) -> str:
    """The first line of the process's stderr that holds `text`; what came before goes to seen."""
    for line in process.stderr:
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r}: {''.join(seen)}")


def test_a_worker_says_what_it_waits_for_and_the_server_who_comes_and_goes(tiny_spec, tmp_path):  # noqa: F811
    port = free_port()
    # The worker as shard processes and torchrun's ranks run: the module on its own.
    worker = _start("picasso.pipelines.cli.distributed", "gba-worker", "--port", str(port), "--rank", "0",
                    "--rows", "400", "--batch-size", "100", "--timeout", str(HANG_GUARD_SECONDS))
    worker_lines: list[str] = []
    # Before any server: at once, the address and how long it waits.
    waiting = _line_with(worker, "joining the parameter server", worker_lines)
    assert f"at 127.0.0.1:{port} (waiting up to {HANG_GUARD_SECONDS} s" in waiting
    server = _start("picasso.pipelines.cli", "ps", "--spec", tiny_spec, "--workdir", str(tmp_path), "--port", str(port),
                    "--workers", "1", "--hidden", "16,8", "--timeout", "60")
    server_lines: list[str] = []
    assert f"listening on 127.0.0.1:{port}" in _line_with(server, "listening on", server_lines)
    assert _line_with(server, "joined", server_lines).strip().startswith("shard 0: worker0/")
    assert "worker0/" in _line_with(server, "finished and left", server_lines)
    checkpoint = _line_with(server, "last checkpoint at step 4 (400 samples)", server_lines)
    assert str(tmp_path / "checkpoints") in checkpoint
    _, rest = server.communicate(timeout=HANG_GUARD_SECONDS)
    assert server.returncode == 0, "".join(server_lines) + rest
    _, rest = worker.communicate(timeout=HANG_GUARD_SECONDS)
    assert worker.returncode == 0, "".join(worker_lines) + rest
    said = "".join(worker_lines) + rest
    assert "joined the parameter server as worker0/" in said and "worker0: done: 4 batches, 400 samples" in said
    for line in server_lines + worker_lines:
        assert not line.startswith(("INFO", "WARNING", "20")), line  # plain lines, not log records
