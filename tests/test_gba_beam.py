"""PicassoTrain(GBAHandler(...)) on a multi-process FnApiRunner: each Beam worker process is one
GBA worker of a real `picasso ps` on loopback."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.testing.loopback import free_port
from picasso.distributed.row_cache import RowCacheConfig
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.pipelines.transforms.gba_train import PSAddress
from picasso.pipelines.transforms.train import PicassoTrain
from picasso.pipelines.transforms.train_handlers import GBAHandler
from picasso.trainer import Trainer

from test_gba_ps import _finish, _ps
from test_gba_sync import TRAIN
from test_trainer import SPEC

ROWS, BATCH, WORKERS, SHARDS = 3000, 100, 2, 2
LR_SPARSE = 0.2  # the tiny spec learns slowly at the default; every mode is given the same
STREAMS = (100, 101)
EVERY = 10  # the server's --checkpoint-every, in global steps
CONFIG = replace(TRAIN, lr_sparse=LR_SPARSE)


def _stop(server) -> None:
    """On a failed test: the server and the shard processes it started (its children)."""
    if server.poll() is None:
        subprocess.run(["pkill", "-KILL", "-P", str(server.pid)], check=False)
        server.kill()


def _planted(keyed):
    _, streams = keyed
    for stream in streams:
        yield from planted_batches(SPEC, ROWS, BATCH, stream)


def _held_out(checkpoint=None, train_on=()):
    trainer = Trainer(SPEC, CONFIG)
    if checkpoint is not None:
        trainer.restore(checkpoint)
    trainer.train(train_on)
    return trainer.evaluate(planted_batches(SPEC, 2000, 500, stream=999))


def test_each_beam_worker_process_is_a_gba_worker(tmp_path, monkeypatch):
    # The runner's worker processes unpickle this module's functions by name.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    spec_path = tmp_path / "tiny.yaml"
    SPEC.save(spec_path)
    # The job resumes a local Trainer's checkpoint (any mode resumes any other's): two global
    # batches of a source of its own.
    start = Trainer(SPEC, CONFIG)
    start.train(planted_batches(SPEC, 2 * WORKERS * BATCH, WORKERS * BATCH, stream=300))
    start.save_checkpoint(tmp_path / "checkpoints")
    port = free_port(count=SHARDS)
    # No hard staleness limit: how far one process runs ahead of the other is the
    # scheduler's choice (a loaded machine can pause one for 10 global steps), and a batch
    # dropped as too stale would make the exact accounting below depend on it. Dropping is
    # tested with controlled timing in test_gba_math.py.
    server = _ps(str(spec_path), tmp_path, port, SHARDS, WORKERS, "--mode", "gba", "--lr-sparse", str(LR_SPARSE),
                 "--checkpoint-every", str(EVERY), "--decay", "exp:limit=none")
    out = tmp_path / "stats.json"
    options = PipelineOptions(["--runner", "FnApiRunner", f"--direct_num_workers={WORKERS}",
                               "--direct_running_mode=multi_processing"])
    try:
        with beam.Pipeline(options=options) as p:
            _ = (
                p
                # One key per source, split up front: the grouped stage hands one to each worker process.
                | beam.Create([(i, stream) for i, stream in enumerate(STREAMS)])
                | beam.GroupByKey()
                | beam.FlatMap(_planted)
                # Hot rows come from each worker's cache in front of the server, at most
                # two global steps old.
                | PicassoTrain(GBAHandler(PSAddress("127.0.0.1", port, timeout_s=30,
                                                  row_cache=RowCacheConfig(capacity="20%", max_staleness=2)),
                                        SPEC))
                | beam.Map(lambda stats: out.write_text(json.dumps(
                    {"steps": stats.steps, "samples": stats.samples, "positions": stats.positions})))
            )
        code, summary, err = _finish(server)
    finally:
        _stop(server)
    assert code == 0, err
    batches = ROWS // BATCH
    # Both processes joined and pushed their whole source; nothing was refused or left over.
    assert summary["contributed"] == {f"worker{r}": batches for r in range(WORKERS)}, err
    assert summary["dropped_workers"] == [] and summary["lost_workers"] == []
    counts = summary["counts"]
    assert counts["accepted"] == WORKERS * batches and counts["dropped_stale"] == 0
    assert counts["steps"] == batches  # M = WORKERS: one step per round of local batches
    assert summary["step"] == start.step + batches and summary["samples"] == start.samples + WORKERS * ROWS
    beam_sources = {f"planted-{s}": ROWS for s in STREAMS}
    assert summary["positions"] == {**start.positions, **beam_sources}
    stats = json.loads(out.read_text())
    assert stats == {"steps": WORKERS * batches, "samples": WORKERS * ROWS, "positions": beam_sources}

    checkpoint = latest_checkpoint(tmp_path / "checkpoints")
    assert load_checkpoint(checkpoint).positions == summary["positions"]
    # Checkpoints during training too; in each, the rows its positions say were read are
    # exactly the samples in the model, however the two workers' pushes interleaved.
    saved = [load_checkpoint(path) for path in sorted((tmp_path / "checkpoints").iterdir())]
    last = start.step + batches
    assert {c.step for c in saved} == {start.step, last, *range(EVERY, last + 1, EVERY)}
    for c in saved:
        assert c.state["samples"] == sum(c.positions.values()) == c.step * WORKERS * BATCH, (c.step, c.positions)
    # As good as one process trained on as many rows in global batches (sync's arithmetic).
    untrained, gba = _held_out(), _held_out(checkpoint)
    local = _held_out(train_on=planted_batches(SPEC, WORKERS * ROWS, WORKERS * BATCH, stream=200))
    print(json.dumps({"untrained": untrained.auc, "gba": gba.auc, "local": local.auc, "gba_logloss": gba.logloss,
                      "local_logloss": local.logloss}))
    assert gba.logloss <= untrained.logloss - 0.02 and gba.auc >= 0.55, (untrained, gba)
    assert gba.auc >= local.auc - 0.03 and gba.logloss <= local.logloss + 0.01, (local, gba)


def test_a_pipeline_of_another_spec_is_refused_by_name(tmp_path, monkeypatch):
    """The model is the server's: a pipeline packing another spec fails at the worker's start,
    naming both, and the server, its worker gone without training, still ends and checkpoints."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    spec_path = tmp_path / "tiny.yaml"
    SPEC.save(spec_path)
    port = free_port()
    # The server counts the refused worker lost once it has not joined within --timeout.
    server = _ps(str(spec_path), tmp_path, port, 1, 1, "--lease", "2", "--timeout", "10")
    other = replace(SPEC, name="other")
    options = PipelineOptions(["--runner", "FnApiRunner", "--direct_num_workers=1",
                               "--direct_running_mode=multi_processing"])
    try:
        with pytest.raises(Exception, match="the parameter server trains spec 'tiny', the pipeline packs 'other'"):
            with beam.Pipeline(options=options) as p:
                _ = (p | beam.Create([(0, (STREAMS[0],))]) | beam.FlatMap(_planted)
                     | PicassoTrain(GBAHandler(PSAddress("127.0.0.1", port, timeout_s=30), other)))
        code, summary, err = _finish(server)
    finally:
        _stop(server)
    assert code == 0, err
    assert summary["lost_workers"] == ["worker0"] and summary["step"] == 0


KILL_AFTER = 12  # batches of the doomed source the first run trains before its process dies


def _planted_dying(keyed, marker: str):
    """The planted sources, except that the process reading source STREAMS[1] kills itself
    with SIGKILL halfway through its bundle (once: the marker says it has)."""
    import signal as signals

    _, streams = keyed
    for stream in streams:
        for i, batch in enumerate(planted_batches(SPEC, ROWS, BATCH, stream)):
            if stream == STREAMS[1] and i == KILL_AFTER and not os.path.exists(marker):
                Path(marker).write_text("killed")
                os.kill(os.getpid(), signals.SIGKILL)
            yield batch


def _gba_pipeline(port: int, source_fn, **kwargs) -> None:
    options = PipelineOptions(["--runner", "FnApiRunner", f"--direct_num_workers={WORKERS}",
                               "--direct_running_mode=multi_processing"])
    with beam.Pipeline(options=options) as p:
        _ = (p | beam.Create([(i, stream) for i, stream in enumerate(STREAMS)]) | beam.GroupByKey()
             | beam.FlatMap(source_fn, **kwargs)
             | PicassoTrain(GBAHandler(PSAddress("127.0.0.1", port, timeout_s=30), SPEC)))


def test_a_beam_worker_killed_mid_bundle_and_the_job_run_again_trains_every_sample_once(tmp_path, monkeypatch):
    """A Beam worker process dies (SIGKILL) halfway through its bundle, after pushing some
    of its batches; the pipeline fails, the server drops the dead worker after its lease
    and checkpoints what it trained (weights, positions, trained ranges). The job is then
    run again from the start, as an at-least-once runner would, against a server restored
    from that checkpoint: every batch trained before is acknowledged, not trained again,
    the rest is trained, and each sample of both sources is in the model exactly once."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    spec_path = tmp_path / "tiny.yaml"
    SPEC.save(spec_path)
    flags = ("--mode", "gba", "--lr-sparse", str(LR_SPARSE), "--decay", "exp:limit=none", "--lease", "2")
    port = free_port(count=SHARDS)
    server = _ps(str(spec_path), tmp_path, port, SHARDS, WORKERS, *flags)
    try:
        with pytest.raises(Exception):  # the runner reports its worker's death
            _gba_pipeline(port, _planted_dying, marker=str(tmp_path / "killed"))
        code, first, err = _finish(server)
    finally:
        _stop(server)
    assert code == 0, err
    assert (tmp_path / "killed").exists() and first["dropped_workers"] + first["lost_workers"], first
    trained_first = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert trained_first.state["samples"] < WORKERS * ROWS  # the dead one's tail was never trained

    port = free_port(count=SHARDS)
    server = _ps(str(spec_path), tmp_path, port, SHARDS, WORKERS, *flags)
    try:
        _gba_pipeline(port, _planted)  # every source from its start: at least once
        code, second, err = _finish(server)
    finally:
        _stop(server)
    assert code == 0, err
    assert second["counts"]["duplicate"] > 0  # the first run's batches came again and were acknowledged
    final = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    sources = {f"planted-{s}": ROWS for s in STREAMS}
    assert final.positions == sources
    assert final.applied == {source: [[0, ROWS]] for source in sources}
    assert final.state["samples"] == WORKERS * ROWS  # each sample once: none lost, none twice
