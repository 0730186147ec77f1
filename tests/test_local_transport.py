"""Calls to a parameter server this process serves go to it directly (local_transport.py):
the same answers, errors and model as over gRPC, and gRPC still for a server served elsewhere."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch

from picasso.connectors.testing.loopback import free_port
from picasso.distributed import local_transport
from picasso.distributed.gba import GBAConfig
from picasso.distributed.worker_startup import JoinSettings, join_job
from picasso.distributed.param_server import JobDescription, ServerAddress, serve_shard
from picasso.distributed.ps_checkpoint import build_shard
from picasso.distributed.transport import Connection, TransportError
from picasso.distributed.worker import WorkerStats
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.trainer import Trainer

from test_trainer import CONFIG, SPEC


class _Served:
    """One endless shard served in a thread of this process, on loopback."""

    def __init__(self):
        trainer = Trainer(SPEC, CONFIG)
        self.shard, layout = build_shard(trainer, 0, 1, GBAConfig(1))
        self.address = ServerAddress("127.0.0.1", free_port(), 30.0)
        self.stop, ready = threading.Event(), threading.Event()
        description = JobDescription(SPEC, CONFIG, layout, lease_s=30.0)
        self.thread = threading.Thread(target=serve_shard, args=(self.shard, self.address, 0, 30.0, description),
                                       kwargs={"stop": self.stop, "ready": ready}, daemon=True)
        self.thread.start()
        assert ready.wait(60)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


def _train(address: ServerAddress, batches) -> type:
    # Each push answered before the next pull: with one in flight, whether a pull saw the
    # previous push would depend on timing, and the two models could differ by that alone.
    joined = join_job(address, JoinSettings(max_in_flight=0), SPEC)
    kind = type(joined.connections[0])
    stats = WorkerStats()
    for batch in batches:
        assert joined.worker.step(batch, stats)
    joined.leave()
    return kind


def test_a_worker_in_the_servers_process_trains_the_same_model_directly_as_over_grpc():
    batches = list(planted_batches(SPEC, 600, 100, stream=4))
    models = {}
    for in_process in (False, True):
        served = _Served()
        try:
            address = ServerAddress(served.address.host, served.address.port, 30.0, in_process=in_process)
            kind = _train(address, batches)
            models[in_process] = served.shard.snapshot()
        finally:
            served.close()
        assert kind is (local_transport.LocalConnection if in_process else Connection)
    assert models[True].step == models[False].step == len(batches)
    for key, value in models[False].tensors.items():
        assert torch.equal(models[True].tensors[key], value), key


def test_a_server_this_process_does_not_serve_is_reached_over_grpc():
    address = ServerAddress("127.0.0.1", free_port(), 5.0, in_process=True)
    connection = address.connect(0)
    try:
        assert isinstance(connection, Connection)
    finally:
        connection.close()


def test_a_local_call_fails_as_a_grpc_call_would():
    served = _Served()
    connection = ServerAddress(served.address.host, served.address.port, 30.0, in_process=True).connect(0)
    try:
        with pytest.raises(TransportError, match=r"failed: stash_at: TypeError") as refused:
            connection.call("stash_at", "not a step")
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION and not refused.value.unreachable
        assert connection.call_async("step").result() == 0
    finally:
        served.close()
    with pytest.raises(TransportError, match="unreachable") as gone:  # the server stopped serving
        connection.call_async("step").result()
    assert gone.value.unreachable
    connection.close()
