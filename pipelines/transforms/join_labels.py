"""JoinLabels: impressions joined with their delayed labels in Beam's keyed state.

The join's policy is picasso.sample_join.join_state's (see its docstring); this is its host for
streaming runners. The bounded-cycle stream holds every pending impression in one
JoinState; a streaming runner instead shards the join by key, so each key's impression,
its verdict and the labels waiting for it live in that key's state, and event-time timers
stand for the watermark passing the impression's timeout, its forget time and a waiting
label's grace. The verdicts come from join_rules.decide_labels and the times from its
predicates (timed_out, forgettable, settle_waiting, recalled, unrecalled), so both hosts
emit the same samples and orphans for the same events and watermarks. A forgotten impression
leaves its time in the key's state, until no orphan label can be told about it any more.

    joined = {IMPRESSIONS: impression_chunks, LABELS: label_chunks} | JoinLabels(policy, schema)
    joined[SAMPLES]  # pa.Table chunks in sample_schema(schema)
    joined[ORPHANS]  # join_rules.OrphanLabel: labels that found no impression in time

With `identify=True` (an endless job's join, whose parameter server trains each sample at
most once) every event keeps where it came from. A sample table then also holds each
row's identity (the impression's source and offset; a correction's under the source's
"#corrections" namespace: picasso.sample_identity), and names in its metadata
(batch.SETTLES_KEY) the positions that will train nothing more: a forgotten impression's
correction and the labels its record took, a duplicate impression, the duplicates of an
orphan label. (An orphan's own position is settled once its dead letter is written, by
whoever writes it.) A bundle that settles positions and emits no sample emits an empty
table that names them; the names follow the bundle's samples, so a settled position never
reaches the server before the sample it settles.

One difference is by design. The core decides a call's timeouts after all of the call's
events, so a label in the same call as an impression that arrives already past its
timeout still joins it; here the watermark has passed that impression's timeout when it
arrives, its timer fires at once, and the label is late. Streams whose impressions come
before their timeouts get the same samples from both hosts.

The state is keyed by the join key's hash and the key itself (the events' `ids`,
join_rules.join_ids), so that a key chosen to share another's hash has state of its own,
as the core compares them; events without ids are keyed by their hash alone. (A key's
forgotten impression is its own here, where the core remembers forgotten impressions by
hash: with colliding keys an orphan's reason may differ between the hosts.)

Everything a worker needs travels in the transform (the policy and the schema) or in the
keyed state, so any streaming runner can run, restart and rebalance it.
"""

from __future__ import annotations

import json
from dataclasses import astuple, dataclass, fields, replace

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import typehints
from apache_beam.coders import BytesCoder, FastPrimitivesCoder, ListCoder, StrUtf8Coder, TupleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from picasso.batch import SETTLES_KEY
from picasso.sample_join.join_rules import (CORRECTION_COLUMN, DELAY_COLUMN, KEY_COLUMN, NEGATIVE, PENDING, PENDING_LATE,
                                POSITIVE, SETTLED, Impressions, JoinCounts, JoinPolicy, Labels, OrphanLabel,
                                decide_labels, forgettable, recalled, settle_waiting, timed_out, unrecalled)
from picasso.sample_identity import correction_source, identity_of, settled_source
from picasso.sample_join.join_state import sample_schema

IMPRESSIONS, LABELS = "impressions", "labels"  # the input's keys
SAMPLES, ORPHANS = "samples", "orphans"  # the output's keys

# One event of one key, from the chunks to the keyed join: ((key, id), (kind, time_ms, value,
# payload, source, offset)). The key is the uint64 join key seen as int64, so that Beam's
# VarIntCoder (deterministic, as keys must be) takes it; the id is the key itself (or None).
# The payload is the encoded feature row of an impression, or the encoded ref of a label;
# source and offset say where the event came from ("" and -1: not known).
_IMPRESSION, _LABEL = 0, 1
_KeyedEvent = typehints.KV[typehints.Tuple[int, typehints.Optional[str]],
                           typehints.Tuple[int, int, int, bytes, str, int]]
# One sample of the join, before it is batched: (feature row, label, correction, delay_ms,
# key, its impression's source, offset).
_Sample = typehints.Tuple[bytes, int, int, int, int, str, int]
# A position that will train nothing more (identify=True): (source namespace, position).
_Settle = typehints.Tuple[str, int]
_Joined = typehints.Union[_Sample, _Settle]
# A sample table's identity columns (identify=True), ahead of PackSamples.
IDENTITY_SOURCE, IDENTITY_POSITION = "sample_identity_source", "sample_identity_position"

# Feature rows and refs are encoded as Beam encodes plain Python values: a row of
# Criteo's 39 fields takes about 310 bytes (one-row Arrow IPC takes about 3,800), and its
# values come back exactly (a float32 widened to a Python float narrows back losslessly).
_VALUES = FastPrimitivesCoder()
_UINT64 = 1 << 64


def _beam_time(ms: int) -> Timestamp:
    return Timestamp(micros=ms * 1000)


def _ms(time: Timestamp) -> int:
    return time.micros // 1000


def _first_ms_past(time_ms: int, after_ms: int) -> int:
    """The first whole-ms watermark at which a predicate `time + after < watermark` of
    sample_join holds.

    Measured under TestStream on the DirectRunner: an event-time timer set at T fires as
    soon as the watermark reaches T (a watermark of T - 1 ms does not fire it; T does).
    The core's predicates are strict, so the timer goes one ms past time + after, and
    fires at exactly the watermark at which the core decides. Whole ms suffice: the
    events' times are, TestStream takes no other watermark, and Java runners keep ms."""
    return time_ms + after_ms + 1


@dataclass
class _Record:
    """One key's impression, as its keyed state holds it."""

    time_ms: int
    state: int  # sample_join's PENDING, PENDING_LATE, POSITIVE, NEGATIVE or SETTLED
    label_time_ms: int  # of its first label; -1: none yet (the core's convention)
    row: bytes  # the encoded feature row; b"" once no emission can need it
    source: str = ""  # where the impression came from ("": not known)
    offset: int = -1
    labels: list = None  # [source, offset] of each label it took: settled when it is forgotten

    def __post_init__(self):
        self.labels = list(self.labels or [])


@dataclass
class _WaitingLabel:
    """A label whose impression is not known (yet), or is beyond its horizon; a key keeps
    every one, in arrival order, as the core does."""

    time_ms: int
    value: int
    ref: bytes  # encoded
    impression_ms: int | None  # of the key's impression when it began to wait, held or forgotten
    source: str = ""  # where the label came from ("": not known)
    offset: int = -1


def _release(record: _Record) -> None:
    """The record's features will be emitted no more (as the core releases them): its
    state keeps only the bookkeeping until it is forgotten."""
    record.row = b""


_RECORD_CODER = TupleCoder([VarIntCoder(), VarIntCoder(), VarIntCoder(), BytesCoder(), StrUtf8Coder(), VarIntCoder(),
                            FastPrimitivesCoder()])
_WAITING_CODER = ListCoder(TupleCoder([VarIntCoder(), VarIntCoder(), BytesCoder(), FastPrimitivesCoder(),
                                       StrUtf8Coder(), VarIntCoder()]))


def _impression_events(chunk: Impressions, names: list[str]):
    keys = zip(chunk.keys.view(np.int64).tolist(), chunk.ids.tolist())
    columns = [chunk.rows.column(name).to_pylist() for name in names]  # in the order _SampleTables reads them
    source = chunk.source or ""
    offsets = chunk.offsets.tolist() if chunk.offsets is not None else [-1] * len(chunk)
    for key, time_ms, row, offset in zip(keys, chunk.times.tolist(), zip(*columns), offsets):
        yield beam.window.TimestampedValue((key, (_IMPRESSION, time_ms, 0, _VALUES.encode(row), source, offset)),
                                           _beam_time(time_ms))


def _label_events(chunk: Labels):
    refs = chunk.refs or [None] * len(chunk)
    for key, time_ms, value, ref in zip(zip(chunk.keys.view(np.int64).tolist(), chunk.ids.tolist()),
                                        chunk.times.tolist(), chunk.values.tolist(), refs):
        # A label's ref (connectors.join_events.labels_of) starts with its source and offset.
        source, offset = (ref[0], int(ref[1])) if isinstance(ref, (list, tuple)) and len(ref) >= 2 else ("", -1)
        yield beam.window.TimestampedValue((key, (_LABEL, time_ms, value, _VALUES.encode(ref), source, offset)),
                                           _beam_time(time_ms))


class _Counts:
    """The core's JoinCounts as Beam counters: picasso/join_<field>."""

    def __init__(self):
        self._counters = {f.name: Metrics.counter("picasso", f"join_{f.name}") for f in fields(JoinCounts)}

    def inc(self, name: str) -> None:
        self._counters[name].inc()


class _KeyJoin:
    """One key's join over its state and timers, for one callback: the core's steps for a
    single record. What it emits gathers in `out`."""

    def __init__(self, policy: JoinPolicy, counts: _Counts, key: tuple[int, str | None], record_state, waiting_state,
                 forgotten_state, timeout, forget, orphan, identify: bool = False):
        self.policy, self.counts, self.key, self.identify = policy, counts, key[0], identify  # the hash, as int64
        self.record_state, self.waiting_state, self.forgotten_state = record_state, waiting_state, forgotten_state
        # The forget timer also drops a forgotten impression's time, once no record holds the key.
        self.timeout, self.forget, self.orphan = timeout, forget, orphan
        self.out: list = []

    def record(self) -> _Record | None:
        held = self.record_state.read()
        return None if held is None else _Record(*held)

    def write(self, record: _Record) -> None:
        self.record_state.write(astuple(record))

    def waiting(self) -> list[_WaitingLabel]:
        return [_WaitingLabel(*label) for label in self.waiting_state.read() or []]

    def wait(self, labels: list[_WaitingLabel]) -> None:
        """The key's waiting labels are these now: the orphan timer watches the first."""
        if labels:
            self.waiting_state.write([astuple(label) for label in labels])
            self.orphan.set(_beam_time(_first_ms_past(labels[0].time_ms, self.policy.orphan_grace_ms)))
        else:
            self.waiting_state.clear()
            self.orphan.clear()

    # -- events ------------------------------------------------------------------------

    def take_impression(self, time_ms: int, row: bytes, source: str = "", offset: int = -1) -> None:
        if self.record_state.read() is not None:  # the first impression of a key wins
            self.counts.inc("duplicate_impressions")
            self._settle(source, offset)
            self._settle(correction_source(source), offset)
            return
        self.counts.inc("impressions")
        record = _Record(time_ms, PENDING, -1, row, source, offset)
        self.timeout.set(_beam_time(_first_ms_past(time_ms, self.policy.wait_ms)))
        waiting = self.waiting()
        if waiting:  # labels came first: they join now, in order, but those beyond the horizon
            self.wait([replace(label, impression_ms=time_ms) for label in waiting
                       if not self._decide(record, label.time_ms, label.value, label.source, label.offset)])
        self.write(record)

    def take_label(self, time_ms: int, value: int, ref: bytes, source: str = "", offset: int = -1) -> None:
        self.counts.inc("labels")
        record = self.record()
        if record is not None and self._decide(record, time_ms, value, source, offset):
            self.write(record)
            return
        impression_ms = record.time_ms if record is not None else self.forgotten_state.read()
        self.wait(self.waiting() + [_WaitingLabel(time_ms, value, ref, impression_ms, source, offset)])

    def _decide(self, record: _Record, time_ms: int, value: int, source: str = "", offset: int = -1) -> bool:
        """The label's verdict on the record; False, and nothing done, for a label beyond
        the horizon (it waits, as if the record were forgotten). A label the record takes
        is settled with it (identify)."""
        decision = decide_labels(np.array([record.state], np.int8), np.array([time_ms - record.time_ms], np.int64),
                                 np.array([value], np.int8), self.policy)
        if decision.beyond_horizon[0]:
            return False
        if self.identify and source:
            record.labels.append([source, offset])
        if decision.duplicate[0]:
            self.counts.inc("duplicate_labels")
            return True
        record.label_time_ms = time_ms
        if decision.positive[0]:
            record.state = POSITIVE
            self._emit(record, label=1)
            _release(record)
            self._decided(record)
        elif decision.explicit_negative[0]:
            self.counts.inc("explicit_negatives")
            self._negative(record)
            self._decided(record)
        elif decision.beyond[0]:
            record.state = PENDING_LATE  # a negative at its timeout, and late at once
        else:
            self._late(record)
        return True

    # -- the watermark (timers) ---------------------------------------------------------

    def time_out(self, at_ms: int) -> None:
        record = self.record()
        if record is None or record.state > PENDING_LATE:
            return
        if not timed_out(np.array([record.time_ms]), at_ms, self.policy)[0]:
            self.timeout.set(_beam_time(at_ms + 1))  # never, while the predicates are strict
            return
        clicked_beyond = record.state == PENDING_LATE
        self._negative(record, by_watermark=True)
        if clicked_beyond:
            self._late(record)
        self._decided(record)
        self.write(record)

    def forget_impression(self, at_ms: int) -> None:
        record = self.record()
        if record is None:
            self._drop_forgotten(at_ms)
            return
        if record.state <= PENDING_LATE:
            return
        if not forgettable(np.array([record.time_ms]), at_ms, self.policy)[0]:
            self.forget.set(_beam_time(at_ms + 1))
            return
        self.record_state.clear()
        self.counts.inc("forgotten")
        # Nothing more comes of it: its correction's identity closes, corrected or not, and
        # the labels it took are needed no more (sample_identity).
        self._settle(correction_source(record.source), record.offset)
        for source, offset in record.labels:
            self._settle(settled_source(source), offset)
        forgotten = self.forgotten_state.read()  # the newest, as the core's ForgottenKeys answers
        self.forgotten_state.write(record.time_ms if forgotten is None else max(forgotten, record.time_ms))
        self._drop_forgotten(at_ms)

    def _drop_forgotten(self, at_ms: int) -> None:
        """Drop the forgotten impression's time once unrecalled; until then keep the forget
        timer on it. (A label that waits has noted the time already.)"""
        forgotten = self.forgotten_state.read()
        if forgotten is None:
            return
        if unrecalled(np.array([forgotten]), at_ms, self.policy)[0]:
            self.forgotten_state.clear()
        else:
            self.forget.set(_beam_time(_first_ms_past(forgotten, self.policy.recall_ms + self.policy.orphan_grace_ms)))

    def dead_letter_labels(self, at_ms: int) -> None:
        waiting = self.waiting()
        if not waiting:
            return
        gone, echoes = settle_waiting(np.array([label.time_ms for label in waiting], np.int64), at_ms, self.policy)
        for label in (waiting[i] for i in np.flatnonzero(gone).tolist()):
            self.counts.inc("orphan_labels")
            told = label.impression_ms is not None and recalled(
                np.array([label.time_ms - label.impression_ms]), self.policy)[0]
            self.out.append(beam.pvalue.TaggedOutput(ORPHANS, OrphanLabel(
                self.key % _UINT64, label.time_ms, label.value, _VALUES.decode(label.ref),
                label.impression_ms if told else None)))
        for label in (waiting[i] for i in np.flatnonzero(echoes).tolist()):
            self.counts.inc("duplicate_labels")
            self._settle(settled_source(label.source), label.offset)
        self.wait([label for label, stays in zip(waiting, ~(gone | echoes)) if stays])

    # -- the steps the core takes -------------------------------------------------------

    def _decided(self, record: _Record) -> None:
        """The record waits no more: only its horizon is left to watch."""
        self.timeout.clear()
        self.forget.set(_beam_time(_first_ms_past(record.time_ms, self.policy.keep_ms)))

    def _negative(self, record: _Record, by_watermark: bool = False) -> None:
        record.state = NEGATIVE
        self._emit(record, label=0, by_watermark=by_watermark)
        if self.policy.late_labels == "drop":  # no correction will need the features
            _release(record)

    def _late(self, record: _Record) -> None:
        """A label with value 1 for an impression emitted as a negative."""
        self.counts.inc("late_labels")
        record.state = SETTLED
        if self.policy.late_labels == "correct":
            self._emit(record, label=1, correction=True)
        _release(record)

    def _emit(self, record: _Record, label: int, correction: bool = False, by_watermark: bool = False) -> None:
        """A sample of the record; one the watermark decided (`by_watermark`) has no label
        delay, as in the core."""
        self.counts.inc("corrections" if correction else "positives" if label else "negatives")
        delay = record.label_time_ms - record.time_ms if record.label_time_ms >= 0 and not by_watermark else -1
        self.out.append((record.row, label, int(correction), delay, self.key, record.source, record.offset))

    def _settle(self, source: str, offset: int) -> None:
        """A position that will train nothing more (identify): out after the samples."""
        # An event of no known source ("", so a namespace "#...") has no position to settle.
        if self.identify and offset >= 0 and source and not source.startswith("#"):
            self.out.append((source, offset))


class _JoinDoFn(beam.DoFn):
    """The join, keyed: each key's record (or waiting label, or a forgotten impression's
    time) in its state, and a timer for each time the watermark decides something about it."""

    RECORD = ReadModifyWriteStateSpec("impression", _RECORD_CODER)
    WAITING = ReadModifyWriteStateSpec("waiting_label", _WAITING_CODER)
    FORGOTTEN = ReadModifyWriteStateSpec("forgotten_impression_ms", VarIntCoder())
    TIMEOUT = TimerSpec("timeout", TimeDomain.WATERMARK)
    FORGET = TimerSpec("forget", TimeDomain.WATERMARK)
    ORPHAN = TimerSpec("orphan", TimeDomain.WATERMARK)

    def __init__(self, policy: JoinPolicy, identify: bool = False):
        self.policy, self.identify = policy, identify

    def setup(self):
        self.counts = _Counts()

    def _key_join(self, key, record, waiting, forgotten, timeout, forget, orphan) -> _KeyJoin:
        return _KeyJoin(self.policy, self.counts, key, record, waiting, forgotten, timeout, forget, orphan,
                        self.identify)

    def process(self, element, record=beam.DoFn.StateParam(RECORD), waiting=beam.DoFn.StateParam(WAITING),
                forgotten=beam.DoFn.StateParam(FORGOTTEN), timeout=beam.DoFn.TimerParam(TIMEOUT),
                forget=beam.DoFn.TimerParam(FORGET), orphan=beam.DoFn.TimerParam(ORPHAN)):
        key, (kind, time_ms, value, payload, source, offset) = element
        join = self._key_join(key, record, waiting, forgotten, timeout, forget, orphan)
        if kind == _IMPRESSION:
            join.take_impression(time_ms, payload, source, offset)
        else:
            join.take_label(time_ms, value, payload, source, offset)
        return join.out

    @on_timer(TIMEOUT)
    def on_timeout(self, key=beam.DoFn.KeyParam, fired=beam.DoFn.TimestampParam, record=beam.DoFn.StateParam(RECORD),
                   waiting=beam.DoFn.StateParam(WAITING), forgotten=beam.DoFn.StateParam(FORGOTTEN),
                   timeout=beam.DoFn.TimerParam(TIMEOUT), forget=beam.DoFn.TimerParam(FORGET),
                   orphan=beam.DoFn.TimerParam(ORPHAN)):
        join = self._key_join(key, record, waiting, forgotten, timeout, forget, orphan)
        join.time_out(_ms(fired))
        return join.out

    @on_timer(FORGET)
    def on_forget(self, key=beam.DoFn.KeyParam, fired=beam.DoFn.TimestampParam, record=beam.DoFn.StateParam(RECORD),
                  waiting=beam.DoFn.StateParam(WAITING), forgotten=beam.DoFn.StateParam(FORGOTTEN),
                  timeout=beam.DoFn.TimerParam(TIMEOUT), forget=beam.DoFn.TimerParam(FORGET),
                  orphan=beam.DoFn.TimerParam(ORPHAN)):
        join = self._key_join(key, record, waiting, forgotten, timeout, forget, orphan)
        join.forget_impression(_ms(fired))
        return join.out

    @on_timer(ORPHAN)
    def on_orphan(self, key=beam.DoFn.KeyParam, fired=beam.DoFn.TimestampParam, record=beam.DoFn.StateParam(RECORD),
                  waiting=beam.DoFn.StateParam(WAITING), forgotten=beam.DoFn.StateParam(FORGOTTEN),
                  timeout=beam.DoFn.TimerParam(TIMEOUT), forget=beam.DoFn.TimerParam(FORGET),
                  orphan=beam.DoFn.TimerParam(ORPHAN)):
        join = self._key_join(key, record, waiting, forgotten, timeout, forget, orphan)
        join.dead_letter_labels(_ms(fired))
        return join.out


class _SampleTables(beam.DoFn):
    """Samples in, one pa.Table per window per bundle out (or per `rows_per_table`).

    A table is timestamped with its newest sample, so that it is late only if every one
    of its samples is. With `identify`, the settled positions that came in (_Settle) go in
    the metadata of the bundle's last table of their window, after its samples."""

    def __init__(self, feature_schema: pa.Schema, rows_per_table: int, identify: bool = False):
        self.feature_schema = feature_schema
        self.rows_per_table = rows_per_table
        self.identify = identify

    def start_bundle(self):
        self.pending: dict = {}  # window -> (samples, settled positions, newest timestamp)

    def process(self, joined, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        samples, settles, newest = self.pending.get(window, ([], [], timestamp))
        (settles if len(joined) == 2 else samples).append(joined)
        self.pending[window] = (samples, settles, max(newest, timestamp))
        if len(samples) >= self.rows_per_table:
            self.pending[window] = ([], settles, max(newest, timestamp))
            yield beam.window.TimestampedValue(self._table(samples, []), max(newest, timestamp))

    def finish_bundle(self):
        for window, (samples, settles, newest) in self.pending.items():
            if samples or settles:
                yield WindowedValue(self._table(samples, settles), newest, (window,))
        self.pending = {}

    def _table(self, samples: list, settles: list) -> pa.Table:
        schema = sample_schema(self.feature_schema)
        if self.identify:
            schema = schema.append(pa.field(IDENTITY_SOURCE, pa.string())).append(pa.field(IDENTITY_POSITION,
                                                                                            pa.int64()))
        if settles:
            schema = schema.with_metadata({SETTLES_KEY: json.dumps(identity_of(settles), sort_keys=True).encode()})
        if not samples:
            return schema.empty_table()
        payloads, labels, corrections, delays, keys, sources, offsets = zip(*samples)
        columns = list(zip(*(_VALUES.decode(payload) for payload in payloads)))
        columns[self.feature_schema.get_field_index("label")] = np.asarray(labels, np.float32)
        features = [pa.array(column, type=f.type) for column, f in zip(columns, self.feature_schema)]
        join_columns = {CORRECTION_COLUMN: pa.array(np.asarray(corrections, np.int8)),
                        DELAY_COLUMN: pa.array(np.asarray(delays, np.int64)),
                        KEY_COLUMN: pa.array(np.asarray(keys, np.int64).view(np.uint64)),
                        # A correction is trained under a namespace of its own: its impression's
                        # offset is in the ledger already (sample_identity).
                        IDENTITY_SOURCE: pa.array([correction_source(source) if corrected else source
                                                   for source, corrected in zip(sources, corrections)], pa.string()),
                        IDENTITY_POSITION: pa.array(np.asarray(offsets, np.int64))}
        return pa.Table.from_arrays(features + [join_columns[name] for name in schema.names[len(features):]],
                                    schema=schema)


class JoinLabels(beam.PTransform):
    """{IMPRESSIONS: Impressions chunks, LABELS: Labels chunks} in; {SAMPLES: pa.Table
    chunks in sample_schema(schema), ORPHANS: OrphanLabel} out.

    `schema` is the impressions' feature rows' (canonical) schema. Samples carry event
    timestamps: a sample decided by a label has the label's time (the impression's, if the
    label came first), one decided by the watermark the time at which the watermark
    decided it. identify: each sample table holds its rows' identities and the positions
    settled (the module's docstring)."""

    def __init__(self, policy: JoinPolicy, schema: pa.Schema, rows_per_table: int = 8192, identify: bool = False):
        super().__init__()
        self.policy, self.schema, self.rows_per_table = policy, schema, rows_per_table
        self.identify = identify

    def expand(self, events):
        impressions = events[IMPRESSIONS] | "ImpressionEvents" >> beam.FlatMap(
            _impression_events, self.schema.names).with_output_types(_KeyedEvent)
        labels = events[LABELS] | "LabelEvents" >> beam.FlatMap(_label_events).with_output_types(_KeyedEvent)
        joined = ((impressions, labels) | "AllEvents" >> beam.Flatten().with_output_types(_KeyedEvent)
                  | "Join" >> beam.ParDo(_JoinDoFn(self.policy, self.identify))
                  .with_output_types(_Joined if self.identify else _Sample).with_outputs(ORPHANS, main=SAMPLES))
        samples = joined[SAMPLES] | "Tables" >> beam.ParDo(
            _SampleTables(self.schema, self.rows_per_table, self.identify)).with_output_types(pa.Table)
        return {SAMPLES: samples, ORPHANS: joined[ORPHANS]}
