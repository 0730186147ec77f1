"""Calls to a parameter server this process serves, made directly instead of over gRPC.

The endless job on one machine serves its parameter server in a thread of its own process,
and the FnApiRunner runs the job's worker in that process too. Over gRPC each pull and push
would be encoded, copied through the channel twice and decoded again, on the same CPUs the
step needs: about as much as the step's own optimizer work (measured by
`python -m benchmarks.freshness --endless`). A `LocalConnection` calls the shard's methods
as the gRPC handlers would, with the same answers and errors (TransportError), so the client
(ps_client.PSClient) is the same either way.

Only a client that asks for it goes this way (ServerAddress.in_process), and only to a port
this process serves (`register`): a worker in another process (a runner with several worker
processes) finds nothing registered and connects over gRPC as before. Calls made here skip
the token check: the token keeps the network out, and a caller in this process started the
server itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent import futures

import grpc

from picasso.distributed.transport import TransportError

_served: dict[int, dict[str, Callable]] = {}  # port -> the methods served there by this process
_served_lock = threading.Lock()


def register(port: int, methods: dict[str, Callable]) -> None:
    """From now on, `connect(port)` reaches these methods directly (serve_shard, as it serves)."""
    with _served_lock:
        _served[port] = methods


def unregister(port: int, methods: dict[str, Callable]) -> None:
    """The server stopped: calls made through its local connections fail as unreachable."""
    with _served_lock:
        if _served.get(port) is methods:
            del _served[port]


def connect(host: str, port: int, name: str) -> "LocalConnection | None":
    """A connection to the server this process serves on `port`; None when it serves none."""
    with _served_lock:
        if port not in _served:
            return None
    return LocalConnection(host, port, name)


class LocalCall:
    """A call in flight, as transport.Call is."""

    def __init__(self, future: futures.Future):
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self):
        return self._future.result()


class LocalConnection:
    """transport.Connection's interface, to a server in this process.

    Asynchronous calls run one after another on a thread of the connection's own, in the
    order made: a push still returns at once and is applied while the worker prepares its
    next batch, as over gRPC, and a worker's pushes reach the shard in order."""

    def __init__(self, host: str, port: int, name: str):
        self.address, self.name, self.port = f"{host}:{port}", name, port
        self._calls = futures.ThreadPoolExecutor(1, thread_name_prefix=f"{name.rsplit(' ', 1)[-1]}-local")

    def call(self, name: str, *args, timeout_s: float | None = None):
        return self._run(name, args)

    def call_async(self, name: str, *args, wait_for_ready: bool = False) -> LocalCall:
        return LocalCall(self._calls.submit(self._run, name, args))

    def wait_ready(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self._calls.shutdown(wait=True)

    def _run(self, name: str, args: tuple):
        with _served_lock:
            methods = _served.get(self.port)
        if methods is None:
            raise TransportError(f"{self.name} at {self.address} is unreachable (it stopped serving) (call {name})",
                                 grpc.StatusCode.UNAVAILABLE)
        try:
            return methods[name](*args)
        except Exception as err:  # as the gRPC handler tells its caller
            raise TransportError(f"{self.name} at {self.address} failed: {name}: {type(err).__name__}: {err} "
                                 f"(call {name})", grpc.StatusCode.FAILED_PRECONDITION) from err
