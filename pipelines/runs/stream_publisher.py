"""A stream's versions: when one is due, publishing it through the outbox, and the log of
every version the stream made (WORKDIR/runs/stream-versions.jsonl).

A registry outage never stops training: a publish MLflow does not take waits in the
outbox and goes out, in order, with the next one.

Each version passes the run-health gate (run_health.py) first, on the window since the
last version: its samples and progressive metrics, and the rows read and dead letters of
the cycles this process ran in it. A refused window makes no version: the stream says why
and trains on, and the next due publish judges the window grown since. So does a window
that cannot be scored (its batches all of one class): it is not refused, but a version
of it would claim an AUC it does not have.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from picasso import storage
from picasso.serving.publishing import registry_tags
from picasso.serving.publishing.contract import PUBLISHED, PublishRequest
from picasso.serving.publishing.outbox import PublishOutbox
from picasso.serving.publishing.policy import PublishPolicy
from picasso.pipelines.runs.run_health import EvaluationRows, HealthFacts, HealthVerdict, check_health

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionInfo:
    """What a stream's model says of the version made of its checkpoint."""

    mode: str  # the run's `mode` parameter: stream, endless
    run_name: str
    facts: dict  # for the stream's version log: the newest event trained, the cycle, ...
    tags: dict[str, str] = field(default_factory=dict)  # extra version tags (the positions covered)


def _freshness_tag(facts: dict) -> dict[str, str]:
    """The newest event time the version trained on, as a version tag: what a server that
    follows the champion (picasso serve) measures its freshness from."""
    newest = facts.get("newest_event_ms")
    return {} if newest is None else {registry_tags.NEWEST_EVENT_MS: str(int(newest))}


def _kept_facts(request) -> dict:
    """The version log's facts that a queued request keeps (publish_version puts them
    there): the newest event trained, the step and the samples."""
    facts = {key: int(request.metrics[key]) for key in ("step", "samples") if key in request.metrics}
    newest = request.tags.get(registry_tags.NEWEST_EVENT_MS)
    return facts if newest is None else {"newest_event_ms": int(newest), **facts}


class StreamPublisher:
    """Publishes a stream's model (a StreamModel: pipelines/runs/stream_state.py) every
    config.publish_every_s seconds of cycles, and records each version once, in
    `versions` and in the stream's version log."""

    def __init__(self, config, versions: list[str]):
        self.config = config  # a StreamConfig
        self.versions = versions  # each version this process makes is appended (the stream's summary)
        self.unpublished = False  # a cycle trained since the last version
        self.recorded_versions: set[str] | None = None  # in stream-versions.jsonl (see _flush)
        self.last_publish = time.monotonic()
        self.last_window: dict[str, float] | None = None  # the metrics of the window the newest version took
        self.read = HealthFacts(0, 0, 0)  # what this process's cycles read since the last version
        self.withheld: str | None = None  # why the last due version was not made: refused, or not evaluated

    def cycle_trained(self, read: HealthFacts | None = None) -> None:
        """A cycle's checkpoint exists that no version holds yet; `read`: what the cycle read."""
        self.unpublished = True
        if read is not None:
            self.read = self.read.merge(read)

    def judge(self, model) -> HealthVerdict:
        """The run-health gate on the window a version of the model would hold. Its samples
        are the window's own, kept in the checkpoint: a restarted stream's first version
        holds what it trained before the restart too."""
        window = model.window_metrics()
        facts = HealthFacts(trained=window["window_samples"], rows_read=self.read.rows_read,
                            dead_letters=self.read.dead_letters,
                            losses={"auc": window["auc"], "logloss": window["logloss"]}, profile=self.read.profile,
                            evaluation=EvaluationRows(window["window_samples"], window["window_positives"], "scored"))
        return check_health(facts, self.config.health, self.config.spec.feature_names)

    @property
    def publishes(self) -> bool:
        return self.config.mlflow is not None and self.config.publish_every_s > 0

    def adopt(self, model) -> None:
        """A model just loaded from its checkpoint, with the window that checkpoint kept
        (stream_window.py). If the checkpoint was queued as a version already (a process
        died after that publish, before its next checkpoint), the version holds the window
        and the next one starts afresh. If not, the checkpoint is one no version holds
        yet, and the next publish makes one even if nothing more is trained; but not the
        checkpoint a stream's start made, which holds only the model it started from. A
        stream that never publishes keeps no window at all."""
        if not self.publishes:
            model.drop_window()
        elif model.checkpoint is not None and not model.only_started:
            if PublishOutbox(self.config.folders.publish).holds(str(model.checkpoint)):
                model.reset_window()
                model.versioned()
            else:
                self.unpublished = True

    def maybe_publish(self, model, force: bool = False) -> None:
        due = time.monotonic() - self.last_publish >= self.config.publish_every_s
        if not self.publishes or not (due or force):
            return
        try:
            if not self.unpublished:
                self.flush_pending()
                return
            verdict = self.judge(model)
            if verdict.refused or verdict.not_evaluated:
                self.withheld = verdict.reason or verdict.not_evaluated
                self.last_publish = time.monotonic()  # judged again at the next due publish, not every cycle
                log.warning("no version made: %s (the stream trains on; the next due version is judged again)",
                            self.withheld)
                return
            self.publish_version(model, verdict)
            self.unpublished, self.withheld, self.read = False, None, HealthFacts(0, 0, 0)
            self.last_publish = time.monotonic()
        except Exception as err:  # noqa: BLE001 - a registry outage must not stop training
            log.warning("publish failed (retried after the next cycle): %s", err)

    def publish_version(self, model, verdict: HealthVerdict = HealthVerdict()) -> str | None:
        """Publish the last checkpoint through the outbox, with the progressive-validation
        metrics of the window since the last publish (each batch scored before it was
        trained on). Raises when MLflow did not take it: it then waits in the outbox and
        goes out, in order, with the next publish."""
        config = self.config
        if config.mlflow is None or model.checkpoint is None:
            return None
        window = model.window_metrics()  # the same window as in model.checkpoint: nothing trained since
        self.last_window = window
        mean_label = window["mean_label"]
        calibration = window["mean_prediction"] / mean_label if mean_label else float("nan")
        extra_metrics, series, plots = model.publish_extras()
        version = model.version_info()
        request = PublishRequest(
            checkpoint_path=str(model.checkpoint),
            metrics={**window, "calibration": calibration, "samples": model.trainer.samples,
                     "step": model.trainer.step, **extra_metrics},
            step_metrics=series, plots=plots,
            params={"mode": version.mode, "topics": ",".join(config.topics), "evaluation": "progressive",
                    **(config.joined.params() if config.joined else {})},
            run_name=version.run_name,
            tags={"picasso.evaluation": "progressive", "picasso.window_samples": str(window["window_samples"]),
                  "picasso.total_samples": str(model.trainer.samples), **version.tags, **verdict.tags(),
                  **_freshness_tag(version.facts)},
        )
        outbox = PublishOutbox(config.folders.publish)
        outbox.add(request)
        model.reset_window()  # now that a version holds it, as adopt would find after a restart
        model.versioned()
        outcomes = self._flush(outbox, newest={request.checkpoint_path: {**version.facts,
                                                                          "samples": model.trainer.samples}})
        mine = next(o for o in outcomes if o.checkpoint_path == request.checkpoint_path)
        if mine.status != PUBLISHED:
            raise RuntimeError(f"publish pending in {config.folders.publish}: {mine.error}")
        return mine.version.version

    def _flush(self, outbox, newest: dict[str, dict] | None = None) -> list:
        """Flush the outbox, recording each version in stream-versions.jsonl as it is made
        (once, however often a kill makes the outbox report it), with the freshness facts
        (`newest`, by checkpoint) of the one this process just checkpointed, and those its
        request kept for a version an earlier process queued (killed before recording it)."""
        config = self.config
        newest = {**{r.checkpoint_path: _kept_facts(r) for r in outbox.pending_requests()}, **(newest or {})}
        if self.recorded_versions is None:  # read once per process; kept up to date below
            path = config.folders.stream_versions
            lines = storage.read_text(path).splitlines() if storage.exists(path) else []
            self.recorded_versions = {json.loads(line)["version"] for line in lines if line}
        recorded = self.recorded_versions

        def record(outcome) -> None:
            if outcome.version.version in recorded:
                return
            entry = {"version": outcome.version.version, "model_uri": outcome.version.model_uri,
                     "published_ms": int(time.time() * 1000), "checkpoint": outcome.checkpoint_path,
                     "champion": outcome.version.champion, **newest.get(outcome.checkpoint_path, {})}
            storage.append_line(config.folders.stream_versions, json.dumps(entry))  # kept before the outbox forgets it
            recorded.add(outcome.version.version)
            self.versions.append(outcome.version.version)

        return outbox.flush(config.mlflow, config.publish_policy or PublishPolicy(), on_published=record)

    def flush_pending(self) -> None:
        """Publish what earlier runs left in the outbox (a restarted stream that has
        nothing new to train would otherwise leave it there for ever)."""
        outbox = PublishOutbox(self.config.folders.publish)
        if outbox.pending():
            self._flush(outbox)
