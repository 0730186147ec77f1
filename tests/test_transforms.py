"""PicassoTrain and PackFeatures as Beam transforms, on FnApiRunner and DirectRunner."""

from __future__ import annotations

import apache_beam as beam
import pytest
import torch
from apache_beam.options.pipeline_options import PipelineOptions

from picasso.batch import pack
from picasso.checkpoint import latest_checkpoint, load_checkpoint
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.packing import PackingPlan
from picasso.pipelines.transforms.decode import DecodedChunk
from picasso.pipelines.transforms.pack import PackFeatures
from picasso.pipelines.transforms.train import PicassoTrain
from picasso.pipelines.transforms.train_handlers import TrainerHandler
from picasso.spec import parse_spec
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer

SPEC = parse_spec({
    "name": "small",
    "label": "click",
    "dense": ["d1", "d2"],
    "sparse": [
        {"name": "user", "hash_buckets": 500, "embedding_dim": 8},
        {"name": "item", "vocab_size": 300, "embedding_dim": 8},
        {"name": "history", "hash_buckets": 400, "embedding_dim": 4, "max_len": 3, "pooling": "mean"},
    ],
})
CONFIG = TrainConfig(hidden=(16,), log_every=0)


def decoded_chunks(count: int = 6, rows: int = 256) -> list[DecodedChunk]:
    planted = PlantedModel(SPEC)
    decoder = RecordDecoder(SPEC)
    chunks = []
    for i in range(count):
        table, _ = planted.sample(rows, stream=i)
        chunks.append(DecodedChunk(decoder.decode_table(table, f"file-{i}").table, {f"file-{i}": rows}))
    return chunks


@pytest.mark.parametrize("runner", ["FnApiRunner", "DirectRunner"])
def test_picasso_train_checkpoints_what_a_plain_trainer_learns(tmp_path, runner):
    chunks = decoded_chunks()
    # An empty chunk (every record refused) still moves its source's position.
    empty = DecodedChunk(chunks[0].table.slice(0, 0), {"file-empty": 99})
    with beam.Pipeline(options=PipelineOptions([f"--runner={runner}"])) as pipeline:
        (
            pipeline
            | beam.Create(chunks + [empty], reshuffle=False)
            | PackFeatures(SPEC)
            | PicassoTrain(TrainerHandler.for_run(SPEC, CONFIG, tmp_path / "checkpoints"))
        )
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert checkpoint.step == len(chunks)
    assert checkpoint.state["samples"] == 256 * len(chunks)
    assert checkpoint.positions == {**{f"file-{i}": 256 for i in range(len(chunks))}, "file-empty": 99}

    plan = PackingPlan.from_spec(SPEC)
    reference = Trainer(SPEC, CONFIG)
    reference.train(pack(chunk.table, SPEC, plan, chunk.positions) for chunk in chunks)
    for name, value in reference.model.state_dict().items():
        assert torch.equal(checkpoint.state["model"][name], value), name


def test_picasso_train_warm_starts_from_the_latest_checkpoint(tmp_path):
    chunks = decoded_chunks(count=4)
    for part in (chunks[:2], chunks[2:]):
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
            (
                pipeline
                | beam.Create(part, reshuffle=False)
                | PackFeatures(SPEC)
                | PicassoTrain(TrainerHandler.for_run(SPEC, CONFIG, tmp_path / "checkpoints"))
            )
    checkpoint = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert checkpoint.step == 4
    assert set(checkpoint.positions) == {f"file-{i}" for i in range(4)}
    assert len(list((tmp_path / "checkpoints").glob("step-*"))) == 2
