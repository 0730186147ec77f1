"""Switching modes: sync -> gba -> sync through checkpoints, with nothing changed but the
mode (real torchrun ranks, real shard and worker processes on loopback).

The bound: after each segment, the held-out log loss is at most BOUND above the one
before it (a switch does not undo what was learned), and the last is below the
untrained model's by at least LEARNED (the segments do train).

Positions: every segment reads the same sources (one per rank) on from where the latest
checkpoint's training ends, and checkpoints are also taken every EVERY global steps. In
every checkpoint, periodic or final, of any mode, the samples trained equal the rows the
positions say were read: nothing skipped, nothing read twice.
"""

from __future__ import annotations

import json
import subprocess
import sys

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.testing.loopback import free_port
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.trainer import Trainer

from test_gba_ps import _finish, _ps, _worker
from test_gba_sync import TRAIN
from test_trainer import SPEC

ROWS, BATCH, WORKERS = 1000, 100, 2
BOUND, LEARNED = 0.01, 0.02
EVERY = 4  # --checkpoint-every, in global steps
STREAM_BASE = 100  # each rank's source: planted-(100 + rank), in every segment


def _held_out_loss(checkpoint) -> float:
    trainer = Trainer(SPEC, TRAIN)
    if checkpoint is not None:
        trainer.restore(checkpoint)
    return trainer.evaluate(planted_batches(SPEC, 2000, 500, stream=999)).logloss


def _sync(spec_path, workdir) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS),
               "--master-port", str(free_port()), "-m", "picasso.pipelines.cli.distributed", "sync-worker",
               "--spec", str(spec_path), "--workdir", str(workdir), "--hidden", "16,8", "--lr-dense", "0.01",
               "--lr-sparse", "0.05", "--rows", str(ROWS), "--batch-size", str(BATCH), "--checkpoint-every", str(EVERY)]
    done = subprocess.run(command + ["--stream-base", str(STREAM_BASE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _gba(spec_path, workdir) -> dict:
    port = free_port(count=2)
    server = _ps(str(spec_path), workdir, port, 2, WORKERS, "--mode", "gba", "--checkpoint-every", str(EVERY))
    workers = [_worker(port, rank, ROWS, "--stream-base", str(STREAM_BASE)) for rank in range(WORKERS)]
    for code, stats, err in [_finish(w) for w in workers]:
        assert code == 0, err
        assert stats["batches"] == ROWS // BATCH and stats["refused"] == 0
    code, summary, err = _finish(server)
    assert code == 0, err
    return summary


def test_sync_then_gba_then_sync(tmp_path):
    spec_path = tmp_path / "tiny.yaml"
    SPEC.save(spec_path)
    root = tmp_path / "checkpoints"
    losses = [_held_out_loss(None)]

    _sync(spec_path, tmp_path)
    losses.append(_held_out_loss(latest_checkpoint(root)))
    _assert_read_up_to(root, ROWS)
    steps = ROWS // BATCH

    summary = _gba(spec_path, tmp_path)
    counts = summary["counts"]
    assert counts["accepted"] == WORKERS * steps and counts["steps"] == steps  # M = WORKERS: the sync global batch
    assert summary["step"] == 2 * steps and summary["samples"] == 2 * WORKERS * ROWS
    losses.append(_held_out_loss(latest_checkpoint(root)))
    _assert_read_up_to(root, 2 * ROWS)

    _sync(spec_path, tmp_path)
    _assert_read_up_to(root, 3 * ROWS)
    checkpoint = latest_checkpoint(root)
    losses.append(_held_out_loss(checkpoint))
    assert Trainer(SPEC, TRAIN).warm_start(root) == checkpoint

    print(json.dumps({"held_out_logloss": losses}))
    for before, after in zip(losses, losses[1:]):
        assert after <= before + BOUND, losses
    assert losses[-1] <= losses[0] - LEARNED, losses

    saved = [load_checkpoint(path) for path in sorted(root.iterdir())]
    periodic = sorted({c.step for c in saved} - {steps, 2 * steps, 3 * steps})
    # sync at 4 and 8, gba at 12 and 16 (its step 20 is also its last), sync at 24 and 28
    assert periodic == [s for s in range(EVERY, 3 * steps, EVERY) if s % steps], periodic
    for c in saved:
        assert c.state["samples"] == sum(c.positions.values()) == c.step * WORKERS * BATCH, (c.path, c.positions)


def _assert_read_up_to(root, rows: int) -> None:
    """The latest checkpoint has read every rank's source up to `rows`."""
    positions = load_checkpoint(latest_checkpoint(root)).positions
    assert positions == {f"planted-{STREAM_BASE + r}": rows for r in range(WORKERS)}, positions
