"""The parameter server's transport: gRPC (picasso) against torch.distributed.rpc over TCP.

One server process serves both transports, one client process calls them in turn, on
loopback. Each call is the parameter server's own message:
- pull: a small request (rows asked for) answered by a `Pulled` of SIZE bytes of rows;
- push: a `Contribution` of SIZE bytes of row gradients answered by a `PushOutcome`.
torch's side is what `picasso ps` ran before (TensorPipe with its TCP transport, as
param_server.py configured it: its shared-memory transport busy-polls a core per process);
its messages go as torch pickles them. picasso's side is transport.py with wire.py.

Reported per size: the median milliseconds of a call on each side, and ms per MB.
`ratios`: torch's ms per MB over gRPC's, per call and size (higher: gRPC is cheaper).

    python -m benchmarks.ps_transport [--sizes 65536,1048576,8388608] [--repeat 50] [--json]

gRPC costs less per call but more per byte: grpcio copies a message into its own buffers
on the way out and into a new bytes object on the way in, where TensorPipe writes tensor
storage to the socket and reads into the tensor. The benchmark job's pulls and pushes are
about 1 MB each (a batch's distinct rows and the dense parameters).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from benchmarks.harness import median_seconds, parse_args, report
from picasso.connectors.testing.loopback import free_port

DIM = 16  # floats per row: the tables' usual width


def _rows(size: int) -> int:
    return max(1, size // (DIM * 4))


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


def serve(rpc_port: int, grpc_port: int) -> None:
    import torch.distributed.rpc as rpc

    from picasso.distributed import param_server, transport  # noqa: F401  (registers the message types)

    server = transport.serve({"pull": pull, "push": push}, "127.0.0.1", grpc_port, transport.Security(), threads=4)
    rpc.init_rpc("server", rank=0, world_size=2, rpc_backend_options=_rpc_options(rpc_port))
    while not _stopping:
        time.sleep(0.05)
    rpc.shutdown(graceful=False)
    server.stop(None)


def _rpc_options(port: int):
    import torch.distributed.rpc as rpc

    return rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=60,
                                           num_worker_threads=4, _transports=["uv"])


# -- the client ------------------------------------------------------------------------------

def _messages(size: int):
    from picasso.distributed.aggregation import Contribution, RowGradient

    k = _rows(size)
    rows = torch.arange(k, dtype=torch.int64)
    contribution = Contribution("worker0/bench", 0, 512, {}, {"table": RowGradient(
        rows, torch.randn(k, DIM), torch.zeros(k, dtype=torch.int64))}, {"src": 512}, sequence=0)
    return ("worker0/bench", {"table": rows}, False), (contribution,)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--sizes", default="65536,1048576,8388608", help="payload bytes, comma-separated"),
        p.set_defaults(repeat=50)))
    import torch.distributed.rpc as rpc

    import benchmarks.ps_transport as me  # by module name, so that torch's pickles resolve in the server
    from picasso.distributed import param_server  # noqa: F401  (registers the message types)
    from picasso.distributed.transport import Connection, Security

    rpc_port, grpc_port = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-c", f"from benchmarks.ps_transport import serve; "
                               f"serve({rpc_port}, {grpc_port})"], env={**os.environ})
    try:
        rpc.init_rpc("client", rank=1, world_size=2, rpc_backend_options=_rpc_options(rpc_port))
        connection = Connection("127.0.0.1", grpc_port, Security(), 60)
        if not connection.wait_ready(60):
            raise RuntimeError("the gRPC server did not come up")
        rows, ratios, metrics = [], {}, {}
        for size in (int(s) for s in args.sizes.split(",")):
            pull_args, push_args = _messages(size)
            mb = _rows(size) * DIM * 4 / 1e6
            timed = {
                ("pull", "torch_rpc"): lambda: rpc.rpc_sync("server", me.pull, args=pull_args),
                ("pull", "grpc"): lambda: connection.call("pull", *pull_args),
                ("push", "torch_rpc"): lambda: rpc.rpc_sync("server", me.push, args=push_args),
                ("push", "grpc"): lambda: connection.call("push", *push_args),
            }
            ms = {key: median_seconds(call, args.repeat, warmup=3) * 1e3 for key, call in timed.items()}
            for method in ("pull", "push"):
                torch_ms, grpc_ms = ms[(method, "torch_rpc")], ms[(method, "grpc")]
                rows.append([method, f"{size / 1024:,.0f} KiB", torch_ms, grpc_ms, torch_ms / mb, grpc_ms / mb])
                ratios[f"{method}_torch_over_grpc_ms_per_mb@{size}"] = torch_ms / grpc_ms
                metrics[f"{method}_torch_rpc_ms@{size}"] = torch_ms
                metrics[f"{method}_grpc_ms@{size}"] = grpc_ms
        rpc.rpc_sync("server", me.stop)
        connection.close()
        rpc.shutdown(graceful=False)
    finally:
        server.wait(timeout=30) if server.poll() is None else None
        if server.poll() is None:
            server.kill()
    report("ps_transport", ["call", "payload", "torch rpc ms", "grpc ms", "torch ms/MB", "grpc ms/MB"],
           [[r[0], r[1], f"{r[2]:.3f}", f"{r[3]:.3f}", f"{r[4]:.3f}", f"{r[5]:.3f}"] for r in rows], ratios,
           metrics, args.json, caption=f"median of {args.repeat} calls each, loopback; ratios: torch over gRPC")


if __name__ == "__main__":
    main()
