"""The daily pipeline: one partition of day files (a date, or a date and hour) → a new
model version.

  ReadDayFiles → DecodeRecords ─┬─ train   → PackFeatures → PicassoTrain → checkpoint
                                ├─ holdout → PackFeatures → EvaluateCheckpoint ─┐
                                └─ dead letters → DEAD_LETTER_DIR/*.jsonl        │
              checkpoint + metrics → PublishToMLflow (via the outbox) → result ◄─┘

Evaluation is on a holdout slice of the day, or on the whole of the next day when
eval_date is given (the day is then all training). Training warm-starts from the latest
checkpoint under WORKDIR/checkpoints, from the champion's checkpoint, or from scratch.

A date is done once its record (WORKDIR/runs/daily-DATE.json, see workdir.py) exists:
running it again trains nothing unless forced. The run-health gate (run_health.py) stands
before the publish: a partition that learned nothing (no sample trained, mostly dead
letters, a loss that is not finite) is refused. Its record says so (status "refused",
with the reason), which does not make it done, its checkpoint is discarded so that no
later run warm-starts from it, and no version is made. A partition too small to score
(its evaluation rows empty or of one class) is not refused: it trains and is done (status
"not_evaluated", with why), and makes no version, since a version would claim a metric it
does not have. Its checkpoint is where the next partition starts, and the next version
says which partitions it covers (the tag picasso.partitions): its own and those before it
that made none. The checkpoint itself records that list, and the records say which of
them made a version, so a partition run alone (a daily schedule) finds it too. If MLflow was unreachable, the result says
"pending" and the checkpoint waits in the publish outbox (WORKDIR/publish); any later run,
the same date's included, publishes it first.

The record is written by the pipeline's last step, which may run on another machine than
the driver (a cluster runner's worker): it is how the outcome of that step reaches
run_daily, and it holds exactly the result's fields that step knows (RECORDED), so the
result is the record plus what the driver adds (the counters, the planted ceiling).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, fields, replace

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from picasso import storage
from picasso.checkpoint import checkpoint_metrics, latest_checkpoint
from picasso.connectors.beam_files import use_beam_filesystems
from picasso.connectors.beam_urls import serve_urls_through_beam
from picasso.connectors.day_files import ReadDayFiles, list_day_files
from picasso.connectors.dead_letters.files import WriteDeadLettersToFiles
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.partitions import parse_partition
from picasso.serving.publishing.registry_tags import EVALUATION, ORIGIN, PARENT_CHECKPOINT
from picasso.pipelines.runs.lineage import partitions_origin
from picasso.serving.publishing.contract import PUBLISHED, MLflowTarget, PublishOutcome, PublishRequest
from picasso.serving.publishing.outbox import PublishOutbox
from picasso.serving.publishing.policy import PublishPolicy
from picasso.serving.publishing.transform import PublishToMLflow
from picasso.pipelines.runs.counters import picasso_counters
from picasso.pipelines.runs.generate import planted_ceiling
from picasso.pipelines.runs.run_health import EvaluationRows, HealthFacts, HealthLimits, HealthVerdict, check_health
from picasso.pipelines.runs.workdir import Workdir
from picasso.pipelines.transforms.decode import DEAD_LETTERS, HOLDOUT, TRAIN, DecodeRecords
from picasso.pipelines.transforms.pack import PackFeatures
from picasso.pipelines.transforms.row_profile import RowProfile
from picasso.pipelines.transforms.train import CheckpointRef, EvaluateCheckpoint, PicassoTrain
from picasso.pipelines.transforms.train_handlers import TrainerHandler
from picasso.spec import FeatureSpec
from picasso.trainer import EvalMetrics, TrainConfig

log = logging.getLogger(__name__)
CHECKPOINTED = "checkpointed"  # a partition trained and evaluated, whose version is still to come
REFUSED = "refused"  # the run-health gate refused the partition: not done, nothing published
NOT_EVALUATED = "not_evaluated"  # trained and done, but too small to score: no version
UNVERSIONED = (CHECKPOINTED, NOT_EVALUATED)  # done, and no version holds the partition yet
PARTITIONS = "picasso.partitions"  # the version's tag: the partitions it covers, comma-separated
PARTITIONS_COVERED = "picasso.partitions_covered"  # and how many
WARM_STARTS = ("latest", "champion", "none")


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
    holdout_fraction: float = 0.1  # ignored when eval_date is given
    eval_date: str | None = None  # evaluate on this (next) day instead of a holdout slice
    warm_start: str = "latest"  # latest | champion | none
    force: bool = False  # run a date that is done already
    policy: PublishPolicy = PublishPolicy()
    # False: train, checkpoint and evaluate, but make no version yet (status "checkpointed");
    # a range publishes every N partitions (pipelines/runs/backfill.py, publish_checkpointed).
    publish: bool = True
    health: HealthLimits = HealthLimits()
    runner: str = "FnApiRunner"
    beam_args: tuple[str, ...] = ()

    def __post_init__(self):
        if self.train.loss_batch_size is None:  # each sample weighs one over the configured chunk
            object.__setattr__(self, "train", replace(self.train, loss_batch_size=self.batch_size))
        for partition in filter(None, (self.date, self.eval_date)):
            parse_partition(partition)  # a clear error for a date that is not one
        if self.warm_start not in WARM_STARTS:
            raise ValueError(f"warm start must be one of {', '.join(WARM_STARTS)}, got {self.warm_start!r}")
        if not 0 <= self.holdout_fraction < 1:
            raise ValueError(f"holdout fraction must be in [0, 1), got {self.holdout_fraction}")
        if self.eval_date == self.date:
            raise ValueError(f"the evaluation day must differ from the training day ({self.date})")
        if self.eval_date is None and self.holdout_fraction == 0:
            raise ValueError("nothing to evaluate on: give a holdout fraction above 0 or an evaluation day")

    @property
    def evaluation(self) -> str:
        """How the version is scored, as its record, params and tags say: holdout | day=PARTITION."""
        return f"day={self.eval_date}" if self.eval_date else "holdout"

    @property
    def folders(self) -> Workdir:
        return Workdir(self.workdir)

    @property
    def record_path(self) -> str:
        return self.folders.daily_record(self.date)

    def pipeline_options(self) -> PipelineOptions:
        return PipelineOptions([f"--runner={self.runner}", *self.beam_args])


@dataclass(frozen=True)
class DailyResult:
    date: str
    # published | pending (MLflow was unreachable; the outbox holds it) | checkpointed | not_evaluated | refused
    status: str
    model_uri: str | None
    version: str | None
    run_id: str | None
    checkpoint: str
    step: int
    auc: float
    logloss: float
    calibration: float  # mean prediction / mean label on the evaluation rows
    samples: int  # rows trained on in this run
    holdout_samples: int  # rows evaluated on (the holdout slice, or the evaluation day)
    rows_in: int
    dead_letters: int
    train_loss: float
    champion: bool = False  # the version became (or already was) the champion
    promotion_reason: str = ""
    evaluation: str = "holdout"  # holdout | day=PARTITION (DailyConfig.evaluation)
    warm_start_from: str | None = None  # the checkpoint training started from
    skipped: bool = False  # the date was done already; nothing was trained
    delta_base: str | None = None  # the version this one's delta artifact applies to
    delta_bytes: int | None = None
    full_bytes: int | None = None  # of the serving weights
    error: str | None = None  # why a pending publish is pending
    auc_ceiling: float | None = None  # the planted model's own AUC, for generated data
    refused: str | None = None  # why the run-health gate refused the partition (status "refused")
    not_evaluated: str | None = None  # why it has no score: "not evaluated (2 held-out rows, one class)"
    covers: list[str] = field(default_factory=list)  # the partitions its checkpoint holds that no version had
    warnings: list[str] = field(default_factory=list)  # the gate's warnings (also the version's tag)
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def scored_on(self) -> str:
        """The partition the version was scored on, or "holdout" (a slice of its own)."""
        return self.evaluation.partition("=")[2] or self.evaluation


# What the run's record holds of its result: all but what the driver adds after the run.
RECORDED = tuple(f.name for f in fields(DailyResult)
                 if f.name not in ("date", "rows_in", "dead_letters", "skipped", "auc_ceiling", "counters"))


def _publish_request(metrics: EvalMetrics, checkpoint: CheckpointRef, config: "_RunFacts",
                     verdict: HealthVerdict) -> PublishRequest:
    calibration = metrics.mean_prediction / metrics.mean_label if metrics.mean_label else math.nan
    return PublishRequest(
        checkpoint_path=checkpoint.path,
        metrics={
            "auc": metrics.auc,
            "logloss": metrics.logloss,
            "calibration": calibration,
            "mean_prediction": metrics.mean_prediction,
            "mean_label": metrics.mean_label,
            "holdout_samples": metrics.samples,
            "samples": checkpoint.stats.samples,
            "train_loss": checkpoint.stats.mean_loss,
        },
        params={"date": config.date, "evaluation": config.evaluation, "warm_start": config.warm_start},
        run_name=f"daily-{config.date}",
        tags={"picasso.date": config.date, EVALUATION: config.evaluation,
              PARTITIONS: ",".join(config.covers), PARTITIONS_COVERED: str(len(config.covers)),
              PARENT_CHECKPOINT: config.parent_checkpoint, ORIGIN: partitions_origin(config.covers),
              "picasso.train_samples": str(checkpoint.stats.samples), "picasso.eval_samples": str(metrics.samples),
              "picasso.total_samples": str(checkpoint.stats.samples + metrics.samples), **verdict.tags()},
    )


@dataclass(frozen=True)
class _RunFacts:
    """What the pipeline's closures need (small and picklable)."""

    date: str
    evaluation: str
    warm_start: str
    warm_start_from: str | None
    health: HealthLimits
    fields: tuple[str, ...]  # the spec's features, whose absence the gate checks
    covers: tuple[str, ...]  # the partitions this one's checkpoint holds that no version had, itself last
    parent_checkpoint: str = ""  # the checkpoint of the version it descends from (_lineage)


@dataclass(frozen=True)
class _Judged:
    """A partition's publish request and the gate's verdict on it."""

    request: PublishRequest
    verdict: HealthVerdict


def _judge(metrics: EvalMetrics, checkpoint: CheckpointRef, profile: RowProfile, dead_letters: int,
           facts: _RunFacts) -> _Judged:
    """The run-health gate on what the partition trained (its own rows: the holdout slice
    too, not an evaluation day's)."""
    health = HealthFacts(
        trained=checkpoint.stats.samples, rows_read=profile.rows + dead_letters, dead_letters=dead_letters,
        losses={"auc": metrics.auc, "logloss": metrics.logloss, "train_loss": checkpoint.stats.mean_loss},
        profile=profile, evaluation=EvaluationRows(metrics.samples, metrics.positives))
    verdict = check_health(health, facts.health, facts.fields)
    return _Judged(_publish_request(metrics, checkpoint, facts, verdict), verdict)


def _outcome_fields(outcome: PublishOutcome) -> dict:
    version = outcome.version
    return {
        "status": outcome.status,
        "model_uri": version.model_uri if version else None,
        "version": version.version if version else None,
        "run_id": version.run_id if version else None,
        "champion": version.champion if version else False,
        "promotion_reason": version.promotion_reason if version else "",
        "delta_base": version.delta_base if version else None,
        "delta_bytes": version.delta_bytes if version else None,
        "full_bytes": version.full_bytes if version else None,
        "error": outcome.error,
    }


def _write_record(path: str, record: dict) -> None:
    storage.write_text(path, json.dumps(record))


def _write_result(outcome: PublishOutcome, judged: _Judged, checkpoint: CheckpointRef, facts: _RunFacts,
                  path: str, **more) -> None:
    """The record of a partition run: RECORDED's fields (the request's other metrics, e.g.
    the mean label, ride along for whoever reads the file), and `more`."""
    # Called by a Beam worker (a Map), whose process imports only the modules of its steps:
    # nothing else has set up writing the record's URL.
    serve_urls_through_beam()
    _write_record(path, {
        **more,
        **_outcome_fields(outcome),
        "checkpoint": checkpoint.path,
        "step": checkpoint.step,
        "evaluation": facts.evaluation,
        "warm_start_from": facts.warm_start_from,
        "warnings": list(judged.verdict.warnings),
        "not_evaluated": judged.verdict.not_evaluated,
        "covers": list(facts.covers),
        **judged.request.metrics,
    })


def _write_checkpointed(judged: _Judged, checkpoint: CheckpointRef, facts: _RunFacts, path: str) -> None:
    """The result of a partition that makes no version (yet): its request is kept in it,
    so that publishing it later needs nothing but this file."""
    _write_result(PublishOutcome(CHECKPOINTED, checkpoint.path), judged, checkpoint, facts, path,
                  publish_request=judged.request.to_dict())


def _write_not_evaluated(judged: _Judged, checkpoint: CheckpointRef, facts: _RunFacts, path: str) -> None:
    """The record of a partition trained but too small to score: done, with no version."""
    _write_result(PublishOutcome(NOT_EVALUATED, checkpoint.path), judged, checkpoint, facts, path)


def _write_refused(judged: _Judged, checkpoint: CheckpointRef, facts: _RunFacts, path: str) -> None:
    """The record of a refused partition, which does not make it done. Its checkpoint goes
    (unless it is the one training started from: nothing was saved over it), or the next
    run would warm-start from a model the gate refused."""
    serve_urls_through_beam()  # a Beam worker's step, as _write_result
    if checkpoint.path != facts.warm_start_from:
        storage.delete_tree(checkpoint.path)
    _write_result(PublishOutcome(REFUSED, checkpoint.path, error=judged.verdict.reason), judged, checkpoint, facts,
                  path, refused=judged.verdict.reason)


def _evaluation_rows(pipeline: beam.Pipeline, config: DailyConfig, decoded):
    """The holdout slice of the day, or the whole evaluation day."""
    if config.eval_date is None:
        return decoded[HOLDOUT]
    evaluation = (
        pipeline
        | "ReadEvalDay" >> ReadDayFiles(config.data_root, config.eval_date, chunk_rows=config.batch_size)
        | "DecodeEvalDay" >> DecodeRecords(config.spec, config.decode, holdout_fraction=1.0)
    )
    evaluation[DEAD_LETTERS] | "WriteEvalDeadLetters" >> WriteDeadLettersToFiles(
        storage.join(config.folders.dead_letters(config.eval_date), "eval-part"))
    return evaluation[HOLDOUT]


def build_daily(pipeline: beam.Pipeline, config: DailyConfig, start_from: str | None = "latest",
                warm_start_from: str | None = None) -> None:
    spec = config.spec
    decoded = (
        pipeline
        | "ReadDayFiles" >> ReadDayFiles(config.data_root, config.date, chunk_rows=config.batch_size)
        | "DecodeRecords" >> DecodeRecords(spec, config.decode, 0.0 if config.eval_date else config.holdout_fraction)
    )
    decoded[DEAD_LETTERS] | "WriteDeadLetters" >> WriteDeadLettersToFiles(
        storage.join(config.folders.dead_letters(config.date), "part"))
    lineage = _lineage(config, warm_start_from)
    checkpoint = (
        decoded[TRAIN]
        | "PackTrain" >> PackFeatures(spec)
        | "PicassoTrain" >> PicassoTrain(TrainerHandler.for_run(spec, config.train, config.folders.checkpoints,
                                                               start_from, lineage=lineage.covers,
                                                               parent_checkpoint=lineage.parent_checkpoint))
    )
    metrics = (
        _evaluation_rows(pipeline, config, decoded)
        | "PackHoldout" >> PackFeatures(spec)
        | "Evaluate" >> EvaluateCheckpoint(spec, config.train, checkpoint)
    )
    # The gate's facts: the partition's own rows (trained and held out) and its dead letters.
    profile = (
        (decoded[TRAIN], decoded[HOLDOUT])
        | "OwnRows" >> beam.Flatten()
        | "RowProfiles" >> beam.Map(lambda chunk: chunk.profile)
        | "Profile" >> beam.CombineGlobally(RowProfile.merged)
    )
    dead_letters = decoded[DEAD_LETTERS] | "CountDeadLetters" >> beam.combiners.Count.Globally()
    facts = _RunFacts(config.date, config.evaluation, config.warm_start, warm_start_from, config.health,
                      spec.feature_names, lineage.covers, lineage.parent_checkpoint)
    at_checkpoint = {"checkpoint": beam.pvalue.AsSingleton(checkpoint), "facts": facts, "path": config.record_path}
    judged = metrics | "CheckHealth" >> beam.Map(
        lambda m, ckpt, rows, dead: _judge(m, ckpt, rows, dead, facts), ckpt=beam.pvalue.AsSingleton(checkpoint),
        rows=beam.pvalue.AsSingleton(profile), dead=beam.pvalue.AsSingleton(dead_letters))
    (judged
     | "Refused" >> beam.Filter(lambda j: j.verdict.refused)
     | "WriteRefused" >> beam.Map(_write_refused, **at_checkpoint))
    (judged
     | "NotEvaluated" >> beam.Filter(lambda j: not j.verdict.refused and j.verdict.not_evaluated)
     | "WriteNotEvaluated" >> beam.Map(_write_not_evaluated, **at_checkpoint))
    healthy = judged | "Healthy" >> beam.Filter(lambda j: not j.verdict.refused and not j.verdict.not_evaluated)
    if not config.publish:
        healthy | "WriteResult" >> beam.Map(_write_checkpointed, **at_checkpoint)
        return
    outcomes = (healthy
                | "PublishRequest" >> beam.Map(lambda j: j.request)
                | "PublishToMLflow" >> PublishToMLflow(config.mlflow, config.folders.publish, config.policy))
    outcomes | "WriteResult" >> beam.Map(_write_result, judged=beam.pvalue.AsSingleton(healthy), **at_checkpoint)


@dataclass(frozen=True)
class _Lineage:
    """What a version of this partition descends from and covers."""

    covers: tuple[str, ...]  # the partitions it covers that no version had, itself last
    parent_checkpoint: str  # the checkpoint of the version it descends from; "" from scratch


def _lineage(config: DailyConfig, warm_start_from: str | None) -> _Lineage:
    """A version of this partition covers itself, after those its warm start's checkpoint
    holds that made no version (that checkpoint lists them, and their records in this
    workdir say whether a version came of them); it descends from the warm start's
    version, or, where that checkpoint made none, from the version it descends from."""
    if warm_start_from is None:
        return _Lineage((config.date,), "")
    metrics = checkpoint_metrics(warm_start_from)
    held = metrics.get("partitions", [])
    path = config.folders.daily_record(held[-1]) if held else None
    if path and storage.exists(path):
        record = json.loads(storage.read_text(path))
        if record["status"] in UNVERSIONED and record["checkpoint"] == warm_start_from:
            return _Lineage((*[p for p in held if p != config.date], config.date),
                            metrics.get("parent_checkpoint", ""))
    return _Lineage((config.date,), warm_start_from)


def _start_from(config: DailyConfig) -> tuple[str | None, str | None]:
    """(what PicassoTrain restores: "latest", a checkpoint path or None; the path it is)."""
    if config.warm_start == "none":
        return None, None
    if config.warm_start == "champion":
        # MLflow, for the registry's champion: a run that publishes nothing loads it nowhere else.
        from picasso.serving.publishing.champion import champion_checkpoint

        champion = champion_checkpoint(config.mlflow, config.policy)
        if champion is not None:
            log.info("warm start from the champion, version %s: %s", champion.version, champion.checkpoint_path)
            return champion.checkpoint_path, champion.checkpoint_path
        latest = latest_checkpoint(config.folders.checkpoints)
        log.warning("%s has no champion yet: %s", config.mlflow.model_name,
                    f"warm start from the latest checkpoint, {latest}" if latest else
                    f"and {config.folders.checkpoints} no checkpoint: training starts from scratch")
        return "latest", latest
    return "latest", latest_checkpoint(config.folders.checkpoints)


def _done_result(config: DailyConfig, record: dict) -> DailyResult:
    """The result of a date done before; a pending publish of it is retried first."""
    if record["status"] not in (PUBLISHED, *UNVERSIONED):
        outbox = PublishOutbox(config.folders.publish)
        outbox.flush(config.mlflow, config.policy)
        published = outbox.published(record["checkpoint"])
        if published is not None:
            record = {**record, "status": PUBLISHED, "error": None, "model_uri": published["model_uri"],
                      "version": published["version"], "run_id": published["run_id"],
                      "champion": published["champion"], "promotion_reason": published.get("promotion_reason", "")}
            _write_record(config.record_path, record)
    return _result(config, record, {}, skipped=True)


def _result(config: DailyConfig, record: dict, counters: dict, skipped: bool = False) -> DailyResult:
    """The record's fields (a field an older record lacks takes its default), and the driver's."""
    return DailyResult(
        date=config.date,
        **{name: record[name] for name in RECORDED if name in record},
        rows_in=counters.get("rows_in", 0),
        dead_letters=counters.get("dead_letters", 0),
        skipped=skipped,
        auc_ceiling=planted_ceiling(config.data_root, config.date),
        counters=counters,
    )


def run_daily(config: DailyConfig) -> DailyResult:
    options = config.pipeline_options()
    # The workdir and the data may be URLs: their filesystems are set up before the first read.
    use_beam_filesystems(options, data=config.data_root, workdir=config.workdir)
    record = json.loads(storage.read_text(config.record_path)) if storage.exists(config.record_path) else None
    if record is not None and record["status"] != REFUSED and not config.force:
        log.info("%s is done already (%s); --force runs it again", config.date, config.record_path)
        return _done_result(config, record)
    for date in filter(None, (config.date, config.eval_date)):  # a missing day fails before anything is written
        list_day_files(config.data_root, date)
    start_from, warm_start_from = _start_from(config)
    storage.delete(config.record_path)
    with beam.Pipeline(options=options) as pipeline:
        build_daily(pipeline, config, start_from, warm_start_from)
    counters = picasso_counters(pipeline.result) if hasattr(pipeline, "result") else {}
    # The record the pipeline's last step wrote: the one way its outcome reaches the driver.
    return _result(config, json.loads(storage.read_text(config.record_path)), counters)


def publish_checkpointed(config: DailyConfig) -> DailyResult:
    """Publish the version of a partition that was only checkpointed (config.publish was
    False), through the outbox as a daily run does; a published one is left as it is."""
    record = json.loads(storage.read_text(config.record_path))
    if record["status"] != CHECKPOINTED:
        return _result(config, record, {}, skipped=True)
    request = PublishRequest.from_dict(record.pop("publish_request"))
    record |= _outcome_fields(PublishOutbox(config.folders.publish).submit(request, config.mlflow, config.policy))
    _write_record(config.record_path, record)
    return _result(config, record, {})

