"""The parameter server's transport: gRPC (picasso) against torch.distributed.rpc over TCP.

One server process serves both transports (and the floor below); one client process calls
them on loopback, one call to each in turn per repetition (a burst of load on a shared
machine falls on all three alike). Each call is the parameter server's own message:
- pull: a small request (rows asked for) answered by a `Pulled` of SIZE bytes of rows;
- push: a `Contribution` of SIZE bytes of row gradients answered by a `PushOutcome`.
torch's side is TensorPipe as `picasso ps` configured it before (its uv transport: TCP),
its messages as torch pickles them, with the tensors on TensorPipe's `basic` channel, which
writes them to that TCP connection (`--tensorpipe-channels`). Left to itself, TensorPipe
picks `cma` between two processes on one host: it copies tensors straight out of the other
process's memory and never touches a socket, which is not "over TCP". Which channel ran is
read from TensorPipe's log by a probe with the same options (benchmarks/tensorpipe_channel.py),
and the timed client counts the bytes its torch calls moved through system calls
(/proc/self/io): about 1 per payload byte over a socket, about 0 through cma. picasso's side
is transport.py with wire.py.

The floor beside them: the bytes of the same calls' tensors over a plain TCP socket between
the same two processes (a 16-byte header, then `sendall` from and `recv_into` buffers made
in advance), with no message around them.

Reported per size: the median milliseconds of a call on each side, and ms per MB of rows
(SIZE; the int64 row ids and versions the messages also carry add 1/8 to a pull's bytes
and 2/8 to a push's, which is why the syscall count reads about 1.12 and 1.25).
`ratios`: torch's ms per MB over gRPC's, per call and size (higher: gRPC is cheaper); their
names carry the TensorPipe channel that ran.

    python -m benchmarks.ps_transport [--sizes 65536,1048576,8388608] [--repeat 50] [--json]
        [--tensorpipe-channels basic|cma|mpt_uv|auto] [--smoke]

gRPC costs more per byte: grpcio copies a message into its own buffers on the way out and
into a new bytes object on the way in, where TensorPipe's basic channel writes tensor
storage to the socket and reads into the tensor. The benchmark job's pulls and pushes are
about 1 MB each (a batch's distinct rows and the dense parameters).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch

from benchmarks.harness import parse_args, report
from benchmarks.tensorpipe_channel import TRANSPORT, rpc_options, start_probe
from picasso.connectors.testing.loopback import free_port

DIM = 16  # floats per row: the tables' usual width
WARMUP = 3


def _rows(size: int) -> int:
    return max(1, size // (DIM * 4))


def _payload_bytes(size: int) -> int:
    return _rows(size) * DIM * 4


# -- the server's methods (both transports call these) -------------------------------------------

def pull(worker: str, rows: dict, dense: bool):
    from picasso.distributed.shard import Pulled

    wanted = rows["table"]
    return Pulled(0, {}, {"table": torch.ones(wanted.numel(), DIM)}, {"table": torch.zeros(wanted.numel(),
                                                                                         dtype=torch.int64)})


def push(contribution):
    from picasso.distributed.gba import PushOutcome

    return PushOutcome(True, "", 0, 1.0, contribution.token, False)


def stop():
    _stopping.append(True)


_stopping: list[bool] = []


def serve(rpc_port: int, grpc_port: int, socket_port: int, channels: list[str] | None) -> None:
    import torch.distributed.rpc as rpc

    from picasso.distributed import param_server, transport  # noqa: F401  (registers the message types)

    listener = socket.create_server(("127.0.0.1", socket_port))
    threading.Thread(target=_serve_socket, args=(listener,), daemon=True).start()
    server = transport.serve({"pull": pull, "push": push}, "127.0.0.1", grpc_port, transport.Security(), threads=4)
    rpc.init_rpc("server", rank=0, world_size=2, rpc_backend_options=rpc_options(rpc_port, channels))
    while not _stopping:
        time.sleep(0.05)
    rpc.shutdown(graceful=False)
    server.stop(None)


# -- the floor: the same bytes over a plain socket ---------------------------------------------------

_HEADER = struct.Struct("!QQ")  # bytes the client sends after the header, bytes the server answers


def _floor_bytes(method: str, size: int) -> tuple[int, int]:
    """The bytes of a call's tensors, (up, down): a pull asks for k int64 rows and gets k rows
    of floats with their int64 versions; a push sends k rows, their gradients and their
    versions, and gets an acknowledgement (a byte)."""
    k = _rows(size)
    return (k * 8, k * (DIM * 4 + 8)) if method == "pull" else (k * (8 + DIM * 4 + 8), 1)


def _receive_into(connection: socket.socket, view: memoryview) -> None:
    while view:
        got = connection.recv_into(view, len(view), socket.MSG_WAITALL)
        if not got:
            raise ConnectionError("the socket floor's peer closed the connection")
        view = view[got:]


class _Buffer:
    """A buffer made once and grown when a call needs more."""

    def __init__(self):
        self.data = bytearray()

    def view(self, size: int) -> memoryview:
        if len(self.data) < size:
            self.data = bytearray(size)
        return memoryview(self.data)[:size]


def _serve_socket(listener: socket.socket) -> None:
    """Take a call's bytes and answer with its answer's, until the client leaves."""
    connection, _ = listener.accept()
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header, buffer = bytearray(_HEADER.size), _Buffer()
    try:
        while True:
            _receive_into(connection, memoryview(header))
            up, down = _HEADER.unpack(header)
            _receive_into(connection, buffer.view(up))
            connection.sendall(buffer.view(down))
    except ConnectionError:
        connection.close()


class SocketFloor:
    """The client's end of the floor: `sendall` from and `recv_into` buffers made in advance."""

    def __init__(self, port: int):
        self.connection = socket.create_connection(("127.0.0.1", port))
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sent, self.received = _Buffer(), _Buffer()

    def call(self, up: int, down: int) -> None:
        self.connection.sendall(_HEADER.pack(up, down))
        self.connection.sendall(self.sent.view(up))
        _receive_into(self.connection, self.received.view(down))

    def close(self) -> None:
        self.connection.close()


# -- the client ------------------------------------------------------------------------------

def _messages(size: int):
    from picasso.distributed.aggregation import Contribution, RowGradient

    k = _rows(size)
    rows = torch.arange(k, dtype=torch.int64)
    contribution = Contribution("worker0/bench", 0, 512, {}, {"table": RowGradient(
        rows, torch.randn(k, DIM), torch.zeros(k, dtype=torch.int64))}, {"src": 512}, sequence=0)
    return ("worker0/bench", {"table": rows}, False), (contribution,)


def _syscall_bytes() -> tuple[int, int]:
    """Bytes this process has read and written through system calls (sockets included)."""
    with open("/proc/self/io") as counters:
        fields = dict(line.split(": ") for line in counters.read().splitlines() if line)
    return int(fields["rchar"]), int(fields["wchar"])


def _time_in_turn(calls: dict[str, Callable[[], object]], repeat: int, direction: int) -> tuple[dict, dict]:
    """Each call's median ms, the calls taken in turn (a burst of load on a shared machine
    falls on all of them alike), and the bytes each moved through system calls per call, in
    `direction` (0: read, 1: written), counted outside the timed span."""
    for call in calls.values():
        for _ in range(WARMUP):
            call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    moved = dict.fromkeys(calls, 0)
    for _ in range(repeat):
        for name, call in calls.items():
            before = _syscall_bytes()[direction]
            started = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - started)
            moved[name] += _syscall_bytes()[direction] - before
    return ({name: statistics.median(s) * 1e3 for name, s in seconds.items()},
            {name: total / repeat for name, total in moved.items()})


CPU_CHANNELS = ("basic", "cma", "mpt_uv")  # the CPU channels torch registers with TensorPipe


def _channels_flag(value: str) -> list[str] | None:
    if value == "auto":
        return None
    channels = value.split(",")
    unknown = [name for name in channels if name not in CPU_CHANNELS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown TensorPipe channel {', '.join(map(repr, unknown))}: "
                                         f"choose from {', '.join(CPU_CHANNELS)}, or auto")
    return channels


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--sizes", default="65536,1048576,8388608", help="payload bytes, comma-separated"),
        p.add_argument("--tensorpipe-channels", default="basic", type=_channels_flag,
                       help="TensorPipe channels torch may use, comma-separated; auto: TensorPipe's own choice"),
        p.set_defaults(repeat=50)), smoke={"sizes": "65536,1048576", "repeat": 5})
    channels = args.tensorpipe_channels
    os.environ.pop("TP_VERBOSE_LOGGING", None)  # it logs every message: never in the timed processes
    import torch.distributed.rpc as rpc

    import benchmarks.ps_transport as me  # by module name, so that torch's pickles resolve in the server
    from picasso.distributed import param_server  # noqa: F401  (registers the message types)
    from picasso.distributed.transport import Connection, Security

    probe = start_probe(channels)  # beside the start-up below, read before anything is timed
    rpc_port, grpc_port, socket_port = free_port(), free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-c", f"from benchmarks.ps_transport import serve; "
                               f"serve({rpc_port}, {grpc_port}, {socket_port}, {channels!r})"], env={**os.environ})
    try:
        rpc.init_rpc("client", rank=1, world_size=2, rpc_backend_options=rpc_options(rpc_port, channels))
        connection = Connection("127.0.0.1", grpc_port, Security(), 60)
        if not connection.wait_ready(60):
            raise RuntimeError("the gRPC server did not come up")
        floor = SocketFloor(socket_port)
        channel = probe.channels()
        torch_name = f"torch_rpc_{channel.replace(',', '+')}"
        rows, ratios = [], {}
        metrics = {"torch_rpc_transport": TRANSPORT, "torch_rpc_channel": channel,
                   "torch_rpc_channels_allowed": ",".join(channels or ["auto"])}
        for size in (int(s) for s in args.sizes.split(",")):
            pull_args, push_args = _messages(size)
            mb = _payload_bytes(size) / 1e6
            for method, calls in (
                    ("pull", {"torch": lambda: rpc.rpc_sync("server", me.pull, args=pull_args),
                              "grpc": lambda: connection.call("pull", *pull_args),
                              "floor": lambda: floor.call(*_floor_bytes("pull", size))}),
                    ("push", {"torch": lambda: rpc.rpc_sync("server", me.push, args=push_args),
                              "grpc": lambda: connection.call("push", *push_args),
                              "floor": lambda: floor.call(*_floor_bytes("push", size))})):
                # The payload's direction: a pull reads it, a push writes it.
                ms, moved = _time_in_turn(calls, args.repeat, 0 if method == "pull" else 1)
                torch_bytes = moved["torch"] / _payload_bytes(size)
                rows.append([method, f"{size / 1024:,.0f} KiB", ms["torch"], ms["grpc"], ms["floor"],
                             ms["torch"] / mb, ms["grpc"] / mb, ms["floor"] / mb, torch_bytes])
                ratios[f"{method}_{torch_name}_over_grpc_ms_per_mb@{size}"] = ms["torch"] / ms["grpc"]
                metrics[f"{method}_{torch_name}_ms@{size}"] = ms["torch"]
                metrics[f"{method}_grpc_ms@{size}"] = ms["grpc"]
                metrics[f"{method}_socket_floor_ms@{size}"] = ms["floor"]
                metrics[f"{method}_{torch_name}_syscall_bytes_per_payload_byte@{size}"] = torch_bytes
        rpc.rpc_sync("server", me.stop)
        floor.close()
        connection.close()
        rpc.shutdown(graceful=False)
    finally:
        probe.close()
        server.wait(timeout=30) if server.poll() is None else None
        if server.poll() is None:
            server.kill()
    torch_label = f"torch rpc ({TRANSPORT}, {channel})"
    report("ps_transport", ["call", "payload", f"{torch_label} ms", "grpc ms", "socket floor ms",
                            f"{torch_label} ms/MB", "grpc ms/MB", "socket floor ms/MB",
                            "torch syscall bytes / payload"],
           [[r[0], r[1], *(f"{v:.3f}" for v in r[2:8]), f"{r[8]:.2f}"] for r in rows], ratios, metrics, args.json,
           caption=f"median of {args.repeat} calls each, the three in turn, loopback; torch's TensorPipe channel "
                   f"({channel}) read from its log by a probe; syscall bytes / payload: about 1 through a socket, "
                   f"about 0 through cma; ratios: torch over gRPC")


if __name__ == "__main__":
    main()
