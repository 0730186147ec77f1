"""Impression and label events off Kafka, decoded for the join (picasso.sample_join.join_state).

An impression event is a raw record of the spec's features plus the join section's key
fields and event time (picasso.sample_join.join_spec); a label event carries the key fields, the event
time and the label, 0 or 1. Both go through the RecordDecoder of day files and streams,
which reads and checks the event fields too (EventFields), so a bad event becomes a dead
letter with its reason like any other bad record:
- a key field missing, or not a string or an integer;
- the event time missing, not whole milliseconds, or more than `max_future_ms` past the
  newest message timestamp of its poll (a producer's clock or unit gone wrong: seconds
  read as milliseconds lie decades in the past, microseconds centuries in the future);
- a label that is not exactly 0 or 1.

Key values are compared as text (the integer 7 and the string "7" are one key), so that a
key's hash never depends on how the rows of its poll happened to be typed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from picasso.connectors.decoding.columns import as_arrow_array
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.dead_letters.letters import MessageDeadLetter
from picasso.connectors.kafka_source import Messages
from picasso.connectors.decoding.message_formats import DecodedMessages, decode_messages
from picasso.sample_join.join_spec import JoinSpec
from picasso.sample_join.join_rules import Impressions, Labels, OrphanLabel, join_ids, join_keys
from picasso.spec import FeatureSpec

KEY_COLUMN = "_join_key"  # uint64: the hash of the key fields
# The key fields themselves, as one text (join_rules.join_ids): the join finds a record by
# the hash and takes it only if these are equal too, since anyone can pick a key whose
# unkeyed hash equals another's.
ID_COLUMN = "_join_id"
TIME_COLUMN = "_event_time_ms"  # int64
KEY_TEXT_COLUMN = "_join_key_text"  # the key fields as text, for a label's dead letter
POSITION_COLUMN = "_position"  # the message's offset, for a label's dead letter
JOIN_FORMATS = ("json", "arrow")  # a TSV line has no room for the key and time


@dataclass
class EventFields:
    """The join fields a RecordDecoder reads and checks (its `events`)."""

    key: tuple[str, ...]
    time: str
    max_future_ms: int
    binary_label: bool = False  # label events: the label must be 0 or 1
    for_dead_letters: bool = False  # keep each row's key text and position
    with_positions: bool = False  # keep each row's position (an impression's identity)
    # The newest message timestamp of the poll being decoded (set per poll by decode_poll:
    # a decoder serves one poll at a time); None: no bound.
    newest_ms: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.key, self.time)

    @property
    def schema(self) -> list[pa.Field]:
        fields = [pa.field(KEY_COLUMN, pa.uint64()), pa.field(ID_COLUMN, pa.string()),
                  pa.field(TIME_COLUMN, pa.int64())]
        if self.for_dead_letters:
            fields += [pa.field(KEY_TEXT_COLUMN, pa.string())]
        if self.for_dead_letters or self.with_positions:
            fields += [pa.field(POSITION_COLUMN, pa.int64())]
        return fields

    def validate(self, columns: dict, n: int, verdicts, positions: np.ndarray, label: np.ndarray) -> dict[str, pa.Array]:
        texts = [self._key_text(name, columns.get(name), n, verdicts) for name in self.key]
        out = {KEY_COLUMN: pa.array(join_keys(texts), pa.uint64()),
               ID_COLUMN: pa.array(join_ids(texts), pa.string()),
               TIME_COLUMN: pa.array(self._times(columns.get(self.time), n, verdicts), pa.int64())}
        if self.binary_label:
            fractional = (label != 0) & (label != 1) & np.isfinite(label) & (label >= 0) & (label <= 1)
            verdicts.refuse(fractional, lambda i: f"label must be 0 or 1, got {label[i]}")
        if self.for_dead_letters:
            joined = texts[0] if len(texts) == 1 else pc.binary_join_element_wise(*texts, "|")
            out[KEY_TEXT_COLUMN] = joined
        if self.for_dead_letters or self.with_positions:
            out[POSITION_COLUMN] = pa.array(np.asarray(positions, dtype=np.int64))
        return out

    def _key_text(self, name: str, values, n: int, verdicts) -> pa.Array:
        """The key field as text; rows without a usable one refused (and given "")."""
        arr = as_arrow_array(values) if values is not None else None
        if arr is not None and (pa.types.is_integer(arr.type) or pa.types.is_string(arr.type)
                                or pa.types.is_large_string(arr.type) or pa.types.is_null(arr.type)):
            if arr.null_count:
                verdicts.refuse(arr.is_null().to_numpy(zero_copy_only=False),
                                lambda _: f"missing join key field '{name}'")
            return pc.cast(arr, pa.string()).fill_null("")
        items = _items(values, n)
        texts = []
        for i, value in enumerate(items):
            if value is None:
                verdicts.refuse(np.array([i]), lambda _: f"missing join key field '{name}'")
            elif isinstance(value, bool) or not isinstance(value, (str, int)):
                verdicts.refuse(np.array([i]), lambda _, v=value: f"join key field '{name}' must be a string or an "
                                f"integer, got {type(v).__name__} {repr(v)[:40]}")
            else:
                texts.append(str(value))
                continue
            texts.append("")
        return pa.array(texts, pa.string())

    def _times(self, values, n: int, verdicts) -> np.ndarray:
        name = self.time
        arr = as_arrow_array(values) if values is not None else None
        if arr is not None and pa.types.is_integer(arr.type):
            null = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else np.zeros(n, bool)
            times = arr.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            items = _items(values, n)
            null = np.array([v is None for v in items], dtype=bool)
            times = np.zeros(n, np.int64)
            for i, value in enumerate(items):
                whole = isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer()
                if value is not None and whole and abs(value) < 2**62:
                    times[i] = int(value)
                elif value is not None:
                    verdicts.refuse(np.array([i]), lambda _, v=value: f"event time '{name}' must be whole epoch "
                                    f"milliseconds, got {type(v).__name__} {repr(v)[:40]}")
        verdicts.refuse(null, lambda _: f"missing event time '{name}'")
        verdicts.refuse(~null & (times < 0), lambda i: f"event time '{name}' is before 1970 ({times[i]} ms)")
        if self.newest_ms is not None:
            limit = self.newest_ms + self.max_future_ms
            verdicts.refuse(~null & (times > limit), lambda i: (
                f"event time '{name}' is {(times[i] - self.newest_ms) / 1000:,.0f} s after its message's timestamp "
                f"(more than {self.max_future_ms / 1000:,.0f} s: a clock or a unit is wrong)"))
        return times


class JoinDecoders:
    """The two decoders of a joined stream, and how their rows become join events."""

    def __init__(self, spec: FeatureSpec, join: JoinSpec, options: DecodeOptions = DecodeOptions(),
                 identify: bool = False):
        """identify: keep each impression's offset (its samples' identity: impressions_of
        with a source)."""
        self.spec = spec
        self.join = join
        fields = dict(key=join.key, time=join.time_field, max_future_ms=join.max_future_ms)
        self.impressions = RecordDecoder(spec, replace(options, require_label=False),
                                         events=EventFields(**fields, with_positions=identify))
        label_spec = FeatureSpec(label=join.label_of(spec.label), dense=(), sparse=(), name="labels")
        self.labels = RecordDecoder(label_spec, options,
                                    events=EventFields(**fields, binary_label=True, for_dead_letters=True))
        self.feature_names = [name for name in self.impressions.schema.names if not name.startswith("_")]

    @property
    def feature_schema(self) -> pa.Schema:
        """The canonical rows' schema: what the join holds and emits."""
        return pa.schema([self.impressions.schema.field(name) for name in self.feature_names])


def decode_poll(decoder: RecordDecoder, fmt: str, messages: Messages) -> DecodedMessages:
    """decode_messages, with the poll's newest message timestamp as the bound on event times."""
    if fmt not in JOIN_FORMATS:
        raise ValueError(f"a joined stream's topics carry {' or '.join(JOIN_FORMATS)} events, not {fmt}")
    stamps = [t for t in messages.timestamps if t is not None and t >= 0]
    decoder.events.newest_ms = max(stamps) if stamps else None
    return decode_messages(decoder, fmt, messages)


def impressions_of(table: pa.Table, feature_names: list[str], source: str | None = None) -> Impressions:
    """Impression rows as join events; given their source, each keeps its offset there (its
    samples' identity: decoded by JoinDecoders(identify=True))."""
    offsets = table.column(POSITION_COLUMN).to_numpy() if source is not None else None
    return Impressions(table.column(KEY_COLUMN).to_numpy(), table.column(TIME_COLUMN).to_numpy(),
                       table.select(feature_names), source, offsets, ids=_ids(table))


def labels_of(table: pa.Table, source: str) -> Labels:
    """Label rows as join events; each keeps [source, offset, key text] to be dead-lettered by."""
    refs = [[source, position, text] for position, text in
            zip(table.column(POSITION_COLUMN).to_pylist(), table.column(KEY_TEXT_COLUMN).to_pylist())]
    return Labels(table.column(KEY_COLUMN).to_numpy(), table.column(TIME_COLUMN).to_numpy(),
                  table.column("label").to_numpy().astype(np.int8), refs, ids=_ids(table))


def _ids(table: pa.Table) -> np.ndarray:
    return table.column(ID_COLUMN).to_numpy(zero_copy_only=False).astype(object, copy=False)


def orphan_dead_letter(orphan: OrphanLabel, join: JoinSpec, label_field: str) -> MessageDeadLetter:
    """The dead letter of a label that found no impression: its event, rebuilt from what
    the join kept (the original bytes are long gone by then), and why. It goes where every
    letter of a bad message goes (connectors/dead_letters/policy.py)."""
    source, offset, key_text = orphan.ref
    topic, partition = source.rsplit("/", 1)
    keys = dict(zip(join.key, key_text.split("|"))) if len(join.key) > 1 else {join.key[0]: key_text}
    value = json.dumps({**keys, join.time_field: orphan.time_ms, label_field: orphan.value}).encode()
    return MessageDeadLetter(topic=topic, partition=int(partition), offset=int(offset), key=None, value=value,
                             timestamp_ms=orphan.time_ms, reason=orphan_reason(orphan, join, keys))


def orphan_reason(orphan: OrphanLabel, join: JoinSpec, keys: dict[str, str]) -> str:
    """Why a label found no impression: the impression came and was forgotten at the
    horizon (the join knows its time), or none is known."""
    named = ", ".join(f"{k}={v}" for k, v in keys.items())
    policy = join.policy()
    if orphan.forgotten_impression_ms is not None:
        late_s = (orphan.time_ms - orphan.forgotten_impression_ms) / 1000
        return (f"orphan label: the impression with {named} was forgotten at the join's horizon, "
                f"{policy.keep_ms / 1000:g} s after its time (W {policy.wait_ms / 1000:g} s + horizon "
                f"{(policy.keep_ms - policy.wait_ms) / 1000:g} s); the label came {late_s:g} s after the impression")
    return (f"orphan label: no impression with {named} arrived within {join.orphan_grace_ms / 1000:g} s of the "
            f"label's time, nor in the {policy.recall_ms / 1000:g} s before it")


def _items(values, n: int) -> list:
    if values is None:
        return [None] * n
    return values.to_pylist() if isinstance(values, (pa.Array, pa.ChunkedArray)) else list(values)
