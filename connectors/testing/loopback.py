"""What the loopback servers share: a free port, whether a port is listening, waiting for an
HTTP endpoint, and a server process on a fixed loopback port."""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from picasso.distributed.transport import free_port  # noqa: F401 - the tests' free port


def listening(port: int, timeout: float = 2.0) -> bool:
    """Whether something accepts connections on the loopback port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=timeout).close()
        return True
    except OSError:
        return False


def wait_http(url: str, process: subprocess.Popen | None, timeout: float, what: str = "server") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{what} did not answer {url} within {timeout}s")


class LoopbackServer:
    """A server process on a fixed loopback port, its output in LOG_DIR/NAME-PORT.log."""

    name = "server"

    def __init__(self, log_dir: Path | None = None, port: int | None = None):
        self.port = port or free_port()
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix=f"{self.name}-"))
        self.process: subprocess.Popen | None = None

    def _spawn(self, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.log_dir / f"{self.name}-{self.port}.log", "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self.process

    def stop(self) -> None:
        """Kill the server outright (no clean shutdown: the clients see it vanish)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
