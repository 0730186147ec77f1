"""A stream's window (what its next version's metrics are computed from) lives in its
checkpoints: a stream restored between two publishes goes on with it, one restored from a
checkpoint a version holds starts a new one, and one that never publishes keeps none."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import canonical_table, small_spec

from picasso.batch import pack
from picasso.checkpoint import read_checkpoint_file
from picasso.connectors.kafka_config import KafkaConnection
from picasso.serving.publishing.contract import MLflowTarget, PublishRequest
from picasso.serving.publishing.outbox import PublishOutbox
from picasso.sample_join.join_rules import JoinCounts
from picasso.packing import PackingPlan
from picasso.pipelines.runs.stream import StreamConfig
from picasso.pipelines.runs.stream_publisher import StreamPublisher
from picasso.pipelines.runs.stream_state import StreamModel
from picasso.pipelines.runs.stream_window import SCORED_FILE, JoinWindow
from picasso.trainer import TrainConfig

SPEC = small_spec(name="window-test")
TRAIN = TrainConfig(hidden=(8,), device="cpu")


def batches(n: int):
    plan = PackingPlan.from_spec(SPEC)
    return [pack(canonical_table(SPEC, 64, seed=i), SPEC, plan) for i in range(n)]


def config(workdir, publishes: bool = True) -> StreamConfig:
    target = MLflowTarget("http://127.0.0.1:9", experiment="never-called") if publishes else None
    return StreamConfig(connection=KafkaConnection("127.0.0.1:9"), topics={"t": "json"}, workdir=str(workdir),
                        spec=SPEC, mlflow=target, train=TRAIN)


def restored(cfg: StreamConfig, publisher: StreamPublisher) -> StreamModel:
    model = StreamModel.load(SPEC, TRAIN, cfg.folders.checkpoints)
    publisher.adopt(model)
    return model


def test_a_stream_restored_between_publishes_goes_on_with_its_window(tmp_path):
    cfg = config(tmp_path)
    straight = restored(cfg, StreamPublisher(cfg, []))
    data = batches(6)
    for batch in data[:3]:
        straight.score_and_train(batch)
    checkpoint = straight.save(cfg.folders.checkpoints)
    labels, scores = np.concatenate(straight.window.labels), np.concatenate(straight.window.scores)
    for batch in data[3:]:
        straight.score_and_train(batch)

    # Killed after the checkpoint: the process that goes on from it has its window back.
    publisher = StreamPublisher(cfg, [])
    resumed = restored(cfg, publisher)
    assert resumed.checkpoint == checkpoint and publisher.unpublished  # a checkpoint no version holds yet
    assert np.array_equal(resumed.window.labels[0], labels) and np.array_equal(resumed.window.scores[0], scores)
    for batch in data[3:]:
        resumed.score_and_train(batch)
    got, want = resumed.window_metrics(), straight.window_metrics()
    assert got["window_samples"] == want["window_samples"] == 6 * 64
    assert got == pytest.approx(want, rel=1e-6)  # the same batches' scores (the trainer resumes exactly)


def test_a_checkpoint_a_version_holds_starts_a_new_window(tmp_path):
    cfg = config(tmp_path)
    model = restored(cfg, StreamPublisher(cfg, []))
    model.score_and_train(batches(1)[0])
    checkpoint = model.save(cfg.folders.checkpoints)
    # Killed after queueing this checkpoint's version (MLflow never answered): that version
    # holds the window, so the next one must not count its samples again.
    PublishOutbox(cfg.folders.publish).add(PublishRequest(checkpoint_path=checkpoint, metrics={}))
    publisher = StreamPublisher(cfg, [])
    resumed = restored(cfg, publisher)
    assert resumed.window_metrics()["window_samples"] == 0 and not publisher.unpublished


def test_a_stream_that_never_publishes_keeps_no_window(tmp_path):
    cfg = config(tmp_path, publishes=False)
    model = restored(cfg, StreamPublisher(cfg, []))
    for batch in batches(2):
        model.score_and_train(batch)
    assert model.window_metrics()["window_samples"] == 0
    assert read_checkpoint_file(model.save(cfg.folders.checkpoints), SCORED_FILE) is None
    assert not StreamPublisher(replace(config(tmp_path), publish_every_s=0.0), []).publishes  # 0: never, too


def test_a_join_window_comes_back_from_its_bytes():
    window = JoinWindow()
    window.add_cycle(1, JoinCounts(impressions=5, positives=2), [np.array([10, 20])], {"pending": 3})
    window.add_cycle(2, JoinCounts(impressions=1, negatives=4), [np.array([5])], {"pending": 0})
    back = JoinWindow.from_bytes(window.to_bytes())
    assert back.counts == JoinCounts(impressions=6, positives=2, negatives=4)
    assert back.delays().tolist() == [10, 20, 5]
    assert back.series == window.series and back.series["join.cycle.pending"] == [[1, 3], [2, 0]]
