"""Where a stream with no checkpoint of its own begins: the model it starts from
(--warm-start) and the offset it reads each partition from first (--start-at).

A backfill and the stream after it are one model's life: the stream takes the backfill's
champion and reads from the first message after the newest event that model holds, so no
event is trained twice and none is skipped between the two.

The start is made once. The first thing a stream so started does is write a checkpoint of
its own (begin_stream): the warm-start model's weights and optimizer state, each
partition's start offset as its position, and in its ledger what it started from and
where. From then on the stream goes on from its own checkpoints, as any restarted stream
does, and --warm-start and --start-at are not looked at again: a stream killed a second
after its start and resubmitted reads from the same offsets, whatever arrived since.

Warm-start sources: `champion` and `latest` (the model's champion and its newest version,
in the stream's registry), `models:/NAME/N` or `models:/NAME@ALIAS`, or a path (a
checkpoint, or a folder of them: its newest). A version is restored from the checkpoint it
was published from (its tag), with the optimizer state: that checkpoint must be where the
tag says. A model of another spec or other model settings is refused, naming what differs.

Start positions: `earliest`, `latest` (the end now: only what arrives from here on),
`committed` (the consumer group's, earliest where it has none), a TIMESTAMP (ISO 8601,
UTC unless it says otherwise, or epoch milliseconds: the first message stamped at or
after it, connectors.kafka_times) and `after-model` (the first message stamped after the
warm-start model's newest event). A stream's version records its newest event as a tag
(the newest message timestamp it trained); a daily version holds whole partitions, and
its newest event is taken as the end of its last partition (the next midnight, or the
next hour for an hourly one, UTC): every event of the partition is in the model, though
its newest row may be older, and a topic's messages of that day are the day's own.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass

from kafka import TopicPartition

from picasso import storage
from picasso.checkpoint import checkpoint_metrics, latest_checkpoint
from picasso.connectors.kafka_config import KafkaConnection, source_name
from picasso.connectors.kafka_readers import open_reader
from picasso.connectors.kafka_times import offsets_at_time
from picasso.connectors.partitions import partition_end_ms
from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.policy import CHAMPION, PublishPolicy
from picasso.pipelines.runs.stream_state import StreamLedger
from picasso.trainer import Trainer

log = logging.getLogger(__name__)

WARM_STARTS = ("champion", "latest")  # or models:/NAME/N, models:/NAME@ALIAS, a path
START_ATS = ("earliest", "latest", "committed", "after-model")  # or a TIMESTAMP
AFTER_MODEL = "after-model"
# The tag of the partition a daily version trained last (pipelines.runs.daily).
DAILY_DATE = "picasso.date"


def parse_timestamp_ms(text: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it names its zone), in ms."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--start-at {text!r}: expected one of {', '.join(START_ATS)}, an ISO 8601 time "
                         "(2026-11-04T00:00:00Z) or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class StreamStart:
    """--warm-start and --start-at: how a stream with no checkpoint of its own begins."""

    warm_start: str | None = None  # None: a model from scratch
    start_at: str = "earliest"

    def __post_init__(self):
        if self.start_at not in START_ATS:
            parse_timestamp_ms(self.start_at)  # a bad one fails at the command line
        if self.start_at == AFTER_MODEL and self.warm_start is None:
            raise ValueError("--start-at after-model needs --warm-start: the model whose newest event it starts after")

    @property
    def registry(self) -> bool:
        """Whether the warm start is looked up in the registry (not a path)."""
        return self.warm_start is not None and (self.warm_start in WARM_STARTS or self.warm_start.startswith("models:/"))


@dataclass(frozen=True)
class StartModel:
    """The model a stream starts from, found."""

    checkpoint: str
    source: str  # as given: champion, models:/m/3, a path
    version: str | None = None  # the registered version it is, when it is one
    model_uri: str | None = None
    newest_event_ms: int | None = None
    newest_event_from: str = ""  # where that time was read: a tag, a ledger, a partition's end


def find_start_model(source: str, target, policy: PublishPolicy = PublishPolicy()) -> StartModel:
    """The checkpoint a warm start restores; raises with the reason where there is none."""
    if StreamStart(source).registry:
        if target is None:
            raise ValueError(f"--warm-start {source}: a registered model needs --mlflow-uri")
        from picasso.serving.publishing.mlflow_env import http_settings  # MLflow: see _version

        with http_settings(policy):
            version = _version(source, target)
        return _from_version(source, version)
    return _from_path(source)


def _version(source: str, target):
    # MLflow, for a start from the registry alone: a stream that starts otherwise and does
    # not publish never loads it.
    from mlflow.exceptions import MlflowException

    from picasso.serving.publishing.registry import NO_SUCH_VERSION, client_for, latest_version, version_by_alias

    client = client_for(target)
    name, found = target.model_name, None
    if source == "champion":
        found = version_by_alias(client, name, CHAMPION, NO_SUCH_VERSION)
    elif source == "latest":
        found = latest_version(client, name)
    else:
        name, sep, which = source.removeprefix("models:/").rpartition("/")
        if sep and which.isdigit():
            try:
                found = client.get_model_version(name, which)
            except MlflowException as err:
                if err.error_code not in NO_SUCH_VERSION:
                    raise
        else:
            name, sep, alias = source.removeprefix("models:/").partition("@")
            if not sep:
                raise ValueError(f"--warm-start {source}: expected models:/NAME/VERSION or models:/NAME@ALIAS")
            found = version_by_alias(client, name, alias, NO_SUCH_VERSION)
    if found is None:
        raise ValueError(f"--warm-start {source}: {name} has no such version in {target.tracking_uri}")
    return found


def _from_version(source: str, version) -> StartModel:
    path = version.tags.get(tags.CHECKPOINT_PATH)
    uri = f"models:/{version.name}/{version.version}"
    if not path or not storage.exists(storage.join(path, "state.pt")):
        raise FileNotFoundError(
            f"--warm-start {source}: {uri} was published from checkpoint {path!r}, which is not here; a registered "
            "version carries the serving weights only, not the optimizer state a stream trains on with: give "
            "the checkpoint's path instead (--warm-start PATH), where it is reachable")
    if version.tags.get(tags.NEWEST_EVENT_MS):
        newest, how = int(version.tags[tags.NEWEST_EVENT_MS]), f"{uri}'s tag {tags.NEWEST_EVENT_MS}"
    elif version.tags.get(DAILY_DATE):
        date = version.tags[DAILY_DATE]
        newest, how = partition_end_ms(date), f"the end of {uri}'s partition {date} (UTC)"
    else:
        newest, how = _checkpoint_newest(path)
    return StartModel(path, source, str(version.version), uri, newest, how)


def _from_path(source: str) -> StartModel:
    path = source if storage.exists(storage.join(source, "state.pt")) else latest_checkpoint(source)
    if path is None:
        raise FileNotFoundError(f"--warm-start {source}: no checkpoint there (expected {', '.join(WARM_STARTS)}, "
                                "models:/NAME/N, models:/NAME@ALIAS, a checkpoint or a folder of checkpoints)")
    newest, how = _checkpoint_newest(path)
    return StartModel(path, source, newest_event_ms=newest, newest_event_from=how)


def _checkpoint_newest(path: str) -> tuple[int | None, str]:
    """The newest event a checkpoint holds, from what its metrics say: an endless job's
    time, a stream's ledger, or a daily run's last partition."""
    metrics = checkpoint_metrics(path)
    if metrics.get("newest_event_ms") is not None:
        return int(metrics["newest_event_ms"]), f"checkpoint {path}'s newest_event_ms"
    newest = StreamLedger.from_dict(metrics.get("ledger", {})).newest_timestamp_ms
    if newest is not None:
        return newest, f"checkpoint {path}'s ledger"
    if metrics.get("partitions"):
        date = metrics["partitions"][-1]
        return partition_end_ms(date), f"the end of checkpoint {path}'s partition {date} (UTC)"
    return None, ""


def start_positions(connection: KafkaConnection, topics, start_at: str, model: StartModel | None,
                    group_id: str) -> dict[str, int]:
    """Each partition's first offset to read, by source name (topic/partition)."""
    reader = open_reader(connection)
    try:
        partitions = reader.partitions(topics)
        beginnings = reader.beginning_offsets(partitions)
        ends = reader.latest_offsets(partitions)
        if start_at == "earliest":
            found = beginnings
        elif start_at == "latest":
            found = ends
        elif start_at == "committed":
            found = _committed(connection, group_id, partitions, beginnings)
        else:
            found = offsets_at_time(reader, partitions, _start_time(start_at, model), beginnings, ends)
    finally:
        reader.close()
    for tp in partitions:
        if found[tp] >= ends[tp] and ends[tp] > beginnings[tp] and start_at != "latest":
            log.warning("%s: no message at or after the start (--start-at %s) yet: the stream waits at its end, "
                        "offset %d", source_name(tp.topic, tp.partition), start_at, ends[tp])
    return {source_name(tp.topic, tp.partition): int(found[tp]) for tp in partitions}


def _start_time(start_at: str, model: StartModel | None) -> int:
    if start_at != AFTER_MODEL:
        return parse_timestamp_ms(start_at)
    if model is None or model.newest_event_ms is None:
        raise ValueError(f"--start-at after-model: the warm-start model ({model.source if model else 'none'}) "
                         "says nothing of its newest event; give --start-at TIMESTAMP")
    return model.newest_event_ms + 1


def _committed(connection: KafkaConnection, group_id: str, partitions: list[TopicPartition],
               beginnings: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    consumer = connection.consumer(group_id=group_id)
    try:
        committed = {tp: consumer.committed(tp) for tp in partitions}
    finally:
        consumer.close()
    return {tp: beginnings[tp] if committed[tp] is None else max(committed[tp], beginnings[tp]) for tp in partitions}


def start_record(start: StreamStart, model: StartModel | None, positions: dict[str, int]) -> dict:
    """What the ledger keeps of the start: where it read from first and what model it took."""
    return {"start_at": start.start_at, "positions": dict(sorted(positions.items())),
            "warm_start": asdict(model) if model else None}


def begin_stream(config) -> str | None:
    """The stream's first checkpoint, made from config.start (a StreamConfig's): the
    warm-start model at the start positions, with the start in its ledger; None where the
    stream has a checkpoint of its own already (it goes on from there) or no start to make."""
    root = config.folders.checkpoints
    if config.start is None or latest_checkpoint(root) is not None:
        return None
    start: StreamStart = config.start
    model = find_start_model(start.warm_start, config.warm_start_target or config.mlflow,
                             config.publish_policy or PublishPolicy()) if start.warm_start else None
    trainer = Trainer(config.spec, config.train)
    if model is not None:
        trainer.restore(model.checkpoint)  # refuses another spec or model, naming what differs
    # No topics (an endless job's server on its own, whose job reads them): from the earliest
    # offsets, which the job's reads start at for a source with no position.
    positions = start_positions(config.connection, config.topics, start.start_at, model, config.group_id) \
        if config.topics or start.start_at != "earliest" else {}
    trainer.positions = positions  # a daily model's file positions are not the stream's
    # The first version descends from the warm-start model, and holds what came after the start.
    ledger = StreamLedger(start=start_record(start, model, positions))
    lineage = {"checkpoint": model.checkpoint if model else "", "positions": positions}
    path = trainer.save_checkpoint(root, metrics={"ledger": ledger.to_dict(), "samples": trainer.samples,
                                                  "lineage": lineage})
    log.info("stream started%s at %s: %s", f" from {model.model_uri or model.checkpoint}" if model else "",
             start.start_at, ", ".join(f"{source} @ {offset}" for source, offset in sorted(positions.items())))
    return path
