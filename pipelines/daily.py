"""The daily pipeline: one date partition of day files → a new model version.

  ReadDayFiles → DecodeRecords ─┬─ train   → PackFeatures → PicassoTrain → checkpoint
                                ├─ holdout → PackFeatures → EvaluateCheckpoint ─┐
                                └─ dead letters → DEAD_LETTER_DIR/*.jsonl        │
                        checkpoint + metrics → PublishToMLflow → result file ◄───┘

Training warm-starts from the latest checkpoint under WORKDIR/checkpoints.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from picasso.connectors.day_files import ReadDayFiles, partition_dir
from picasso.connectors.decoders import DecodeOptions
from picasso.connectors.mlflow_registry import MLflowTarget, PublishRequest, PublishToMLflow
from picasso.pipelines.counters import picasso_counters
from picasso.pipelines.decode import DEAD_LETTERS, HOLDOUT, TRAIN, DecodeRecords
from picasso.pipelines.pack import PackFeatures
from picasso.pipelines.train import CheckpointRef, EvaluateCheckpoint, PicassoTrain
from picasso.spec import FeatureSpec
from picasso.trainer import EvalMetrics, TrainConfig

PLANTED_FILE = "_planted.json"  # written by `picasso generate` next to the parts


@dataclass(frozen=True)
class DailyConfig:
    data_root: str
    date: str
    workdir: str
    spec: FeatureSpec
    mlflow: MLflowTarget
    train: TrainConfig = TrainConfig()
    decode: DecodeOptions = DecodeOptions()
    batch_size: int = 2048  # raw rows per chunk; a chunk's training rows make one step
    holdout_fraction: float = 0.1
    runner: str = "FnApiRunner"
    beam_args: tuple[str, ...] = ()

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.workdir) / "checkpoints"

    @property
    def dead_letter_dir(self) -> Path:
        return Path(self.workdir) / "dead_letters" / f"date={self.date}"

    @property
    def result_path(self) -> Path:
        return Path(self.workdir) / "runs" / f"daily-{self.date}.json"


@dataclass(frozen=True)
class DailyResult:
    date: str
    model_uri: str
    version: str
    run_id: str
    checkpoint: str
    step: int
    auc: float
    logloss: float
    calibration: float  # mean prediction / mean label on the holdout
    samples: int  # rows trained on in this run
    holdout_samples: int
    rows_in: int
    dead_letters: int
    train_loss: float
    auc_ceiling: float | None = None  # the planted model's own AUC, for generated data
    counters: dict[str, int] = field(default_factory=dict)


def _publish_request(metrics: EvalMetrics, checkpoint: CheckpointRef, date: str) -> PublishRequest:
    calibration = metrics.mean_prediction / metrics.mean_label if metrics.mean_label else math.nan
    return PublishRequest(
        checkpoint_path=checkpoint.path,
        metrics={
            "auc": metrics.auc,
            "logloss": metrics.logloss,
            "calibration": calibration,
            "holdout_samples": metrics.samples,
            "samples": checkpoint.stats.samples,
            "train_loss": checkpoint.stats.mean_loss,
        },
        params={"date": date},
        run_name=f"daily-{date}",
    )


def _write_result(version, request: PublishRequest, checkpoint: CheckpointRef, path: str) -> None:
    result = {
        "model_uri": version.model_uri,
        "version": version.version,
        "run_id": version.run_id,
        "checkpoint": checkpoint.path,
        "step": checkpoint.step,
        **request.metrics,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, path)


def build_daily(pipeline: beam.Pipeline, config: DailyConfig) -> None:
    spec = config.spec
    decoded = (
        pipeline
        | "ReadDayFiles" >> ReadDayFiles(config.data_root, config.date, chunk_rows=config.batch_size)
        | "DecodeRecords" >> DecodeRecords(spec, config.decode, config.holdout_fraction)
    )
    (
        decoded[DEAD_LETTERS]
        | "DeadLetterJson" >> beam.Map(lambda letter: letter.to_json())
        | "WriteDeadLetters" >> beam.io.WriteToText(str(config.dead_letter_dir / "part"), file_name_suffix=".jsonl")
    )
    checkpoint = (
        decoded[TRAIN]
        | "PackTrain" >> PackFeatures(spec)
        | "PicassoTrain" >> PicassoTrain(spec, config.train, config.checkpoint_dir)
    )
    metrics = (
        decoded[HOLDOUT]
        | "PackHoldout" >> PackFeatures(spec)
        | "Evaluate" >> EvaluateCheckpoint(spec, config.train, checkpoint)
    )
    date = config.date
    requests = metrics | "PublishRequest" >> beam.Map(
        lambda m, ckpt: _publish_request(m, ckpt, date), ckpt=beam.pvalue.AsSingleton(checkpoint)
    )
    versions = requests | "PublishToMLflow" >> PublishToMLflow(config.mlflow)
    result_path = str(config.result_path)
    versions | "WriteResult" >> beam.Map(
        _write_result,
        request=beam.pvalue.AsSingleton(requests),
        checkpoint=beam.pvalue.AsSingleton(checkpoint),
        path=result_path,
    )


def planted_ceiling(data_root: str, date: str) -> float | None:
    path = partition_dir(data_root, date) / PLANTED_FILE
    return json.loads(path.read_text())["auc_ceiling"] if path.exists() else None


def run_daily(config: DailyConfig) -> DailyResult:
    if config.result_path.exists():
        config.result_path.unlink()
    options = PipelineOptions([f"--runner={config.runner}", *config.beam_args])
    with beam.Pipeline(options=options) as pipeline:
        build_daily(pipeline, config)
    counters = picasso_counters(pipeline.result) if hasattr(pipeline, "result") else {}
    outcome = json.loads(config.result_path.read_text())
    return DailyResult(
        date=config.date,
        model_uri=outcome["model_uri"],
        version=outcome["version"],
        run_id=outcome["run_id"],
        checkpoint=outcome["checkpoint"],
        step=outcome["step"],
        auc=outcome["auc"],
        logloss=outcome["logloss"],
        calibration=outcome["calibration"],
        samples=outcome["samples"],
        holdout_samples=outcome["holdout_samples"],
        rows_in=counters.get("rows_in", 0),
        dead_letters=counters.get("dead_letters", 0),
        train_loss=outcome["train_loss"],
        auc_ceiling=planted_ceiling(config.data_root, config.date),
        counters=counters,
    )
