"""A checkpoint on an S3-compatible object store against the local disk.

The checkpoint is a Wide&Deep model's on the 39-field Criteo spec (model, optimizer slots,
positions, spec), trained one batch so that every slot exists. Each save is what a daily
or stream run writes (picasso.checkpoint.save_checkpoint): on the local disk, files fsynced
in a temporary folder that is renamed into place; on the store (moto's standalone server on
loopback, through Beam's S3 filesystem), every file put under a fresh prefix and the
commit marker last. Each load reads it back whole (load_checkpoint), and the newest-
checkpoint lookup lists the root (latest_checkpoint), as every warm start does.

Most of the store's time is not the bytes: Beam's S3 filesystem builds a new boto3 client
for every call (a checkpoint load makes eight).

No target: the figures say what the object store costs. `ratios` are local seconds over
object-store seconds (below 1: the store is slower).

    python -m benchmarks.checkpoint_store [--repeat 5] [--json]
"""

from __future__ import annotations

import os
import tempfile
import uuid

from apache_beam.options.pipeline_options import PipelineOptions

from benchmarks.harness import median_seconds, parse_args, report, sized
from picasso import storage
from picasso.batch import pack
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from picasso.connectors.beam_files import use_beam_filesystems
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.testing.s3_server import S3Server
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer


def _trained_state():
    spec = criteo_spec()
    trainer = Trainer(spec, TrainConfig(device="cpu", log_every=0))
    table, _ = PlantedModel(spec).sample(2048, 0)
    decoded = RecordDecoder(spec).decode_table(table, "day-0")
    trainer.train([pack(decoded.table, spec, PackingPlan.from_spec(spec), {"day-0": 2048})])
    return spec, trainer.state(), trainer.positions


def _measure(root: str, spec, state, positions, repeat: int, warmup: int) -> dict[str, float]:
    saved: list[str] = []

    def save():
        saved.append(save_checkpoint(root, state, spec, positions, {}))

    seconds = {"save": median_seconds(save, repeat, warmup)}
    seconds["load"] = median_seconds(lambda: load_checkpoint(saved[-1]), repeat, warmup)
    seconds["latest"] = median_seconds(lambda: latest_checkpoint(root), repeat, warmup)
    return seconds


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], smoke={"repeat": 1})
    spec, state, positions = _trained_state()
    warmup = sized(args, 1, 0)  # --smoke: no untimed first call; each operation runs once
    with tempfile.TemporaryDirectory() as scratch, S3Server(scratch) as server:
        os.environ.update(server.env())
        use_beam_filesystems(PipelineOptions(server.beam_args))
        local = _measure(os.path.join(scratch, "checkpoints"), spec, state, positions, args.repeat, warmup)
        bucket = server.bucket(f"bench-{uuid.uuid4().hex[:8]}")
        remote = _measure(f"{bucket}/checkpoints", spec, state, positions, args.repeat, warmup)
        mb = sum(len(storage.read_bytes(path)) for path in storage.files_under(latest_checkpoint(f"{bucket}/checkpoints"))) / 1e6
    rows = [[what, f"{local[what]:.3f}", f"{remote[what]:.3f}", f"{remote[what] / local[what]:.1f}x"]
            for what in ("save", "load", "latest")]
    report("checkpoint_store", ["operation", "local disk s", "object store s", "store / local"], rows,
           {f"local_over_s3_{what}": local[what] / remote[what] for what in local},
           {"checkpoint_mb": mb, **{f"local_{k}_s": v for k, v in local.items()},
            **{f"s3_{k}_s": v for k, v in remote.items()}},
           args.json, caption=f"{spec.name} wide_deep checkpoint, {mb:.1f} MB; median of {args.repeat}")


if __name__ == "__main__":
    main()
