"""Sync mode: torchrun ranks with gloo all-gathers, and its step is GBA's step with fresh
gradients from every rank."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.testing.loopback import free_port
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard, trainer_state
from picasso.distributed.ps_client import PSClient
from picasso.models import build_model
from picasso.pipelines.cli import distributed as distributed_cli
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.trainer import Trainer

from test_trainer import CONFIG, SPEC

ROWS, BATCH, RANKS = 600, 100, 2
TRAIN = replace(CONFIG, hidden=(16, 8), lr_dense=0.01, lr_sparse=0.05)


def _fresh_gba(steps: int) -> dict:
    """GBA with M = RANKS on one shard, in process, each round every worker pulling before
    any pushes: no gradient is stale, which is what a sync step is."""
    trainer = Trainer(SPEC, TRAIN)
    shard, layout = build_shard(trainer, 0, 1, GBAConfig(RANKS))
    call = in_process([shard])
    model = build_model(TRAIN.model, SPEC, trainer.plan, TRAIN.hidden)
    computer = GradientComputer(model)
    clients = [PSClient(layout, f"rank{r}/gba", max_in_flight=0, call=call) for r in range(RANKS)]
    streams = [list(planted_batches(SPEC, ROWS, BATCH, 100 + r)) for r in range(RANKS)]
    for step in range(steps):
        work = []
        for client, batches in zip(clients, streams):
            tensors = batches[step].to_torch()
            rows = computer.rows_needed(tensors)
            work.append((client, tensors, rows, client.pull(rows)))
        for client, tensors, rows, pulled in work:
            client.push(pulled, computer.compute(tensors, pulled.dense, rows, pulled.values))
    assert shard.control.step == steps
    return trainer_state(layout, [shard.snapshot()], trainer)


def test_sync_ranks_stay_identical_and_step_like_fresh_gba(tmp_path):
    spec_path = tmp_path / "tiny.yaml"
    SPEC.save(spec_path)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS),
               "--master-port", str(free_port()), "-m", "picasso.pipelines.cli.distributed", "sync-worker",
               "--spec", str(spec_path), "--workdir", str(tmp_path), "--hidden", "16,8", "--lr-dense", "0.01",
               "--lr-sparse", "0.05", "--rows", str(ROWS), "--batch-size", str(BATCH), "--json",
               "--precision", "fp32"]  # TRAIN's: one global batch's step to the rounding holds in fp32 only
    # A hang guard only: on a busy 2-core machine the two ranks take minutes.
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in ranks) == list(range(RANKS))
    assert len({r["state_hash"] for r in ranks}) == 1  # the replicas agree bit for bit
    steps = ROWS // BATCH
    assert all(r["steps"] == steps and r["samples"] == RANKS * ROWS for r in ranks)

    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert checkpoint.step == steps and checkpoint.state["samples"] == RANKS * ROWS
    expected = _fresh_gba(steps)
    for key, value in expected["model"].items():
        torch.testing.assert_close(checkpoint.state["model"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    Trainer(SPEC, TRAIN).restore(checkpoint.path)  # and it is a Trainer's checkpoint


def test_sync_worker_outside_torchrun_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        distributed_cli.main(["sync-worker", "--spec", "criteo", "--workdir", str(tmp_path)])
