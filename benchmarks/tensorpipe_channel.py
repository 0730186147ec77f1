"""Which TensorPipe channel carries torch RPC's tensors, read from TensorPipe's own log.

A TensorPipe pipe sends a message's small parts over its transport (`uv`: TCP) and each
tensor over a channel: the highest-priority one that both ends register and find viable.
Between two processes on one host that is `cma` (cross-memory attach: the receiver copies
the tensor straight out of the sender's memory with process_vm_readv, no socket at all),
unless `_channels` leaves it out. `_channels=["basic"]` writes tensors to the uv connection,
which is what "torch RPC over TCP" means.

TensorPipe's verbose log (TP_VERBOSE_LOGGING=4 or more) names the channel of every send.
It logs every message and is read once per process, so it cannot be on in a timed process:
a probe, two processes with the same options, makes one call each way and reads it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from picasso.connectors.testing.loopback import free_port

TRANSPORT = "uv"  # TCP; the shm transport busy-polls a core per process
VERBOSITY = "4"  # the lowest level that logs each channel send
_SEND = re.compile(r"\.ch_(\w+) received a send request")


def rpc_options(port: int, channels: list[str] | None):
    """The backend options of both the timed run and the probe; channels None: TensorPipe's own choice."""
    import torch.distributed.rpc as rpc

    extra = {} if channels is None else {"_channels": channels}
    return rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=60,
                                           num_worker_threads=4, _transports=[TRANSPORT], **extra)


def echo(tensor):
    return tensor


def peer(rank: int, port: int, channels: list[str] | None) -> None:
    """One end of the probe: rank 1 sends a tensor to rank 0, which sends it back."""
    import torch
    import torch.distributed.rpc as rpc

    rpc.init_rpc(f"probe{rank}", rank=rank, world_size=2, rpc_backend_options=rpc_options(port, channels))
    if rank == 1:
        rpc.rpc_sync("probe0", echo, args=(torch.ones(1024),))
    rpc.shutdown()


@dataclass
class Probe:
    """A probe under way: its two processes and their logs."""
    processes: list[subprocess.Popen]
    logs: list[Path]
    folder: tempfile.TemporaryDirectory

    def channels(self, timeout_s: float = 120) -> str:
        """The channels that carried the probe's tensors, comma-separated (one, in practice)."""
        for process in self.processes:
            process.wait(timeout=timeout_s)
        text = "".join(log.read_text(errors="replace") for log in self.logs)
        failed = [process.returncode for process in self.processes if process.returncode != 0]
        if failed:
            raise RuntimeError(f"the TensorPipe channel probe exited {failed}:\n{text[-2000:]}")
        used = sorted(set(_SEND.findall(text)))
        if not used:
            raise RuntimeError(f"the TensorPipe channel probe logged no channel send:\n{text[-2000:]}")
        return ",".join(used)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.folder.cleanup()


def start_probe(channels: list[str] | None) -> Probe:
    """Start a probe with these channels; `Probe.channels()` waits for its answer, and the
    caller closes it. It runs beside the caller's own start-up, so it must be read before
    anything is timed."""
    port = free_port()
    folder = tempfile.TemporaryDirectory(prefix="picasso-tp-probe-")
    env = {**os.environ, "TP_VERBOSE_LOGGING": VERBOSITY}
    logs, processes = [], []
    for rank in (0, 1):
        log = Path(folder.name) / f"peer{rank}.log"
        with log.open("w") as sink:  # a file, not a pipe: a full pipe would stall the peer's rpc.shutdown
            processes.append(subprocess.Popen(
                [sys.executable, "-c", f"from benchmarks.tensorpipe_channel import peer; "
                                       f"peer({rank}, {port}, {channels!r})"], env=env, stdout=sink, stderr=sink))
        logs.append(log)
    return Probe(processes, logs, folder)
