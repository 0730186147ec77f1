"""How checkpoint/ here was made: with picasso at commit 902ba3c, the last before feature
crosses (the spec's `crosses:` section, and packing by the model's parts). Kept for the
record; run with today's code it makes a checkpoint of today's, which proves nothing.

    git worktree add /tmp/before-crosses 902ba3c
    # `picasso` resolving to that tree's folders (setup.py's package_dir), e.g. a folder
    # /tmp/before-pkg/picasso of links to picasso_stage/*, kernels, connectors, serving
    # and pipelines, on PYTHONPATH ahead of the installed picasso:
    PYTHONPATH=/tmp/before-pkg python tests/data/checkpoint-before-crosses/make.py

A tiny Wide&Deep (a hashed, a vocabulary, a multi-hot and a dynamic field; one hidden
layer of 4) trained a few steps; rows.json holds raw rows and predictions.json the
probabilities that code gave them (test_crosses_everywhere.py loads both)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from picasso.batch import pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.packing import PackingPlan
from picasso.spec import parse_spec
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer

HERE = Path(__file__).resolve().parent
SPEC = {
    "name": "before-crosses",
    "label": "click",
    "dense": ["d"],
    "sparse": [
        {"name": "h", "embedding_dim": 4, "hash_buckets": 40},
        {"name": "v", "embedding_dim": 4, "vocab_size": 6},
        {"name": "bag", "embedding_dim": 2, "hash_buckets": 20, "max_len": 3, "pooling": "mean"},
        {"name": "item", "embedding_dim": 4, "dynamic": {"capacity": 30}},
    ],
}
CONFIG = TrainConfig(model="wide_deep", hidden=(4,), lr_dense=0.01, lr_sparse=0.1, log_every=0, device="cpu",
                     interleave=False)


def main() -> None:
    spec = parse_spec(SPEC)
    plan = PackingPlan.from_spec(spec)
    table, _ = PlantedModel(spec).sample(200, 7)
    decoded = RecordDecoder(spec).decode_table(table, "day-0").table
    trainer = Trainer(spec, CONFIG)
    for start in range(0, 160, 32):
        trainer.train_step(pack(decoded.slice(start, 32), spec, plan, {"day-0": start + 32}))
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(trainer.save_checkpoint(tmp))
        shutil.rmtree(HERE / "checkpoint", ignore_errors=True)
        shutil.copytree(saved, HERE / "checkpoint")
    held_out = table.slice(160, 40)
    probabilities = trainer.predict(pack(decoded.slice(160, 40), spec, plan))
    (HERE / "rows.json").write_text("[\n" + ",\n".join(json.dumps(row) for row in held_out.to_pylist()) + "\n]\n")
    (HERE / "predictions.json").write_text(json.dumps([float(p) for p in probabilities]) + "\n")


if __name__ == "__main__":
    main()
