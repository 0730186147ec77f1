"""HTTP calls to a model server (`mlflow models serve` or `picasso serve`), as a client
written for MLflow's scoring protocol makes them; a `picasso serve` process to signal; and
the server's end of a connection, seen from outside it."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from picasso.connectors.testing.loopback import free_port, wait_http

VERSION_HEADER = "X-Picasso-Model-Version"
HANG_GUARD_S = 240  # for a hung process only: nothing is timed


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict
    version: str | None  # the picasso serve header naming the version that answered


def call(url: str, path: str, body: dict | bytes | None = None, timeout: float = 120) -> Answer:
    """GET (body None) or POST a JSON body; an HTTP error is an Answer too."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, _json(response.read()), response.headers.get(VERSION_HEADER))
    except urllib.error.HTTPError as err:
        return Answer(err.code, _json(err.read()), err.headers.get(VERSION_HEADER))


def wait_for(condition, what: str):
    """condition()'s first true value, tried every 0.1 s; the hang guard is for a hung process only."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not (found := condition()):
        assert time.monotonic() < deadline, f"hang guard: {what}"
        time.sleep(0.1)
    return found


def post(url: str, body: dict | bytes) -> tuple[int, dict]:
    answer = call(url, "/invocations", body)
    return answer.status, answer.body


def _json(text: bytes) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        return {"text": text.decode(errors="replace")}


def probabilities(answer: dict, rows: int) -> np.ndarray:
    """The predictions of a 200 answer: one per row, each a probability (no NaN)."""
    predictions = answer["predictions"]
    values = np.array([p["probability"] if isinstance(p, dict) else p for p in predictions], dtype=np.float64)
    assert len(values) == rows and np.all((values > 0) & (values < 1)), predictions
    return values


# -- a `picasso serve` process of the test's own, to signal ---------------------------------


class ServeProcess:
    """`picasso serve` in a session of its own, its temporary folder (TMPDIR) and its log
    the test's, so that a test can signal it and see what it left behind. Killed on the way
    out if the test has not stopped it."""

    def __init__(self, model_uri: str, tracking_uri: str | None, root: Path, *args: str, port: int | None = None):
        self.root, self.tmp = root, root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"serve-{self.port}-{time.monotonic_ns()}.log"
        command = [sys.executable, "-m", "picasso.pipelines.cli", "serve", "--model", model_uri, "--host", "127.0.0.1",
                   "--port", str(self.port), *(["--mlflow-uri", tracking_uri] if tracking_uri else []), *args]
        env = {**os.environ, "TMPDIR": str(self.tmp), "MLFLOW_DISABLE_TELEMETRY": "true",
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def wait_serving(self, timeout: float = HANG_GUARD_S) -> "ServeProcess":
        wait_http(f"{self.url}/ping", self.process, timeout, what="picasso serve")
        return self

    def wait_for_line(self, text: str, timeout: float = HANG_GUARD_S) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.process.poll() is None, f"picasso serve exited with {self.process.returncode}: {self.output()}"
            assert time.monotonic() < deadline, f"hang guard: {text!r} not in {self.output()}"
            time.sleep(0.1)

    def signal(self, sig: int) -> int:
        """Send sig; the exit status once the process is gone."""
        self.process.send_signal(sig)
        return self.process.wait(timeout=HANG_GUARD_S)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def caches(self) -> list[Path]:
        """The temporary caches of `picasso serve` processes in this TMPDIR."""
        return sorted(self.tmp.glob("picasso-serve-*"))

    def __enter__(self) -> "ServeProcess":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def metric(url: str, name: str) -> float:
    """A sample of the server's /metrics; 0 when it has none (a counter never incremented)."""
    text = call(url, "/metrics").body.get("text", "")
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else 0.0


# -- a server's own end of a connection (Linux: pidfd_getfd) ---------------------------------

_SYS_PIDFD_OPEN, _SYS_PIDFD_GETFD = 434, 438  # the same number on x86-64 and arm64


def server_side_nodelay(pid: int, client: socket.socket) -> int:
    """TCP_NODELAY as set on the socket process `pid` accepted for this client's connection,
    read from a copy of that very socket (pidfd_getfd: Linux 5.6; the server is this
    process's child, which ptrace's rules let it reach)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
    assert pidfd >= 0, f"pidfd_open: {os.strerror(ctypes.get_errno())}"
    try:
        for entry in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{entry}").startswith("socket:"):
                    continue
            except OSError:  # closed meanwhile
                continue
            copy = libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(entry), 0)
            if copy < 0:
                continue
            with socket.socket(fileno=copy) as theirs:
                try:
                    ends = (theirs.getsockname(), theirs.getpeername())
                except OSError:  # a listening socket, or not an inet one
                    continue
                if ends == (client.getpeername(), client.getsockname()):
                    return theirs.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        os.close(pidfd)
    raise AssertionError(f"process {pid} holds no socket connected to {client.getsockname()}")
