"""JoinLabels: impressions joined with their delayed labels in Beam's keyed state.

The join's policy is picasso.sample_join's (see its docstring); this is its host for
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

One difference is by design. The core decides a call's timeouts after all of the call's
events, so a label in the same call as an impression that arrives already past its
timeout still joins it; here the watermark has passed that impression's timeout when it
arrives, its timer fires at once, and the label is late. Streams whose impressions come
before their timeouts get the same samples from both hosts.

Everything a worker needs travels in the transform (the policy and the schema) or in the
keyed state, so any streaming runner can run, restart and rebalance it.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields, replace

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import typehints
from apache_beam.coders import BytesCoder, FastPrimitivesCoder, ListCoder, TupleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from picasso.join_rules import (CORRECTION_COLUMN, DELAY_COLUMN, KEY_COLUMN, NEGATIVE, PENDING, PENDING_LATE,
                                POSITIVE, SETTLED, Impressions, JoinCounts, JoinPolicy, Labels, OrphanLabel,
                                decide_labels, forgettable, recalled, settle_waiting, timed_out, unrecalled)
from picasso.sample_join import sample_schema

IMPRESSIONS, LABELS = "impressions", "labels"  # the input's keys
SAMPLES, ORPHANS = "samples", "orphans"  # the output's keys

# One event of one key, from the chunks to the keyed join: (key, (kind, time_ms, value,
# payload)). The key is the uint64 join key seen as int64, so that Beam's VarIntCoder
# (deterministic, as keys must be) takes it. The payload is the encoded feature row of an
# impression, or the encoded ref of a label.
_IMPRESSION, _LABEL = 0, 1
_KeyedEvent = typehints.KV[int, typehints.Tuple[int, int, int, bytes]]
# One sample of the join, before it is batched: (feature row, label, correction, delay_ms, key).
_Sample = typehints.Tuple[bytes, int, int, int, int]

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


@dataclass
class _WaitingLabel:
    """A label whose impression is not known (yet), or is beyond its horizon; a key keeps
    every one, in arrival order, as the core does."""

    time_ms: int
    value: int
    ref: bytes  # encoded
    impression_ms: int | None  # of the key's impression when it began to wait, held or forgotten


def _release(record: _Record) -> None:
    """The record's features will be emitted no more (as the core releases them): its
    state keeps only the bookkeeping until it is forgotten."""
    record.row = b""


_RECORD_CODER = TupleCoder([VarIntCoder(), VarIntCoder(), VarIntCoder(), BytesCoder()])
_WAITING_CODER = ListCoder(TupleCoder([VarIntCoder(), VarIntCoder(), BytesCoder(), FastPrimitivesCoder()]))


def _impression_events(chunk: Impressions, names: list[str]):
    keys = chunk.keys.view(np.int64).tolist()
    columns = [chunk.rows.column(name).to_pylist() for name in names]  # in the order _SampleTables reads them
    for key, time_ms, row in zip(keys, chunk.times.tolist(), zip(*columns)):
        yield beam.window.TimestampedValue((key, (_IMPRESSION, time_ms, 0, _VALUES.encode(row))), _beam_time(time_ms))


def _label_events(chunk: Labels):
    refs = chunk.refs or [None] * len(chunk)
    for key, time_ms, value, ref in zip(chunk.keys.view(np.int64).tolist(), chunk.times.tolist(),
                                        chunk.values.tolist(), refs):
        yield beam.window.TimestampedValue((key, (_LABEL, time_ms, value, _VALUES.encode(ref))), _beam_time(time_ms))


class _Counts:
    """The core's JoinCounts as Beam counters: picasso/join_<field>."""

    def __init__(self):
        self._counters = {f.name: Metrics.counter("picasso", f"join_{f.name}") for f in fields(JoinCounts)}

    def inc(self, name: str) -> None:
        self._counters[name].inc()


class _KeyJoin:
    """One key's join over its state and timers, for one callback: the core's steps for a
    single record. What it emits gathers in `out`."""

    def __init__(self, policy: JoinPolicy, counts: _Counts, key: int, record_state, waiting_state, forgotten_state,
                 timeout, forget, orphan):
        self.policy, self.counts, self.key = policy, counts, key
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

    def take_impression(self, time_ms: int, row: bytes) -> None:
        if self.record_state.read() is not None:  # the first impression of a key wins
            self.counts.inc("duplicate_impressions")
            return
        self.counts.inc("impressions")
        record = _Record(time_ms, PENDING, -1, row)
        self.timeout.set(_beam_time(_first_ms_past(time_ms, self.policy.wait_ms)))
        waiting = self.waiting()
        if waiting:  # labels came first: they join now, in order, but those beyond the horizon
            self.wait([replace(label, impression_ms=time_ms) for label in waiting
                       if not self._decide(record, label.time_ms, label.value)])
        self.write(record)

    def take_label(self, time_ms: int, value: int, ref: bytes) -> None:
        self.counts.inc("labels")
        record = self.record()
        if record is not None and self._decide(record, time_ms, value):
            self.write(record)
            return
        impression_ms = record.time_ms if record is not None else self.forgotten_state.read()
        self.wait(self.waiting() + [_WaitingLabel(time_ms, value, ref, impression_ms)])

    def _decide(self, record: _Record, time_ms: int, value: int) -> bool:
        """The label's verdict on the record; False, and nothing done, for a label beyond
        the horizon (it waits, as if the record were forgotten)."""
        decision = decide_labels(np.array([record.state], np.int8), np.array([time_ms - record.time_ms], np.int64),
                                 np.array([value], np.int8), self.policy)
        if decision.beyond_horizon[0]:
            return False
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
        for _ in range(int(np.count_nonzero(echoes))):
            self.counts.inc("duplicate_labels")
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
        self.out.append((record.row, label, int(correction), delay, self.key))


class _JoinDoFn(beam.DoFn):
    """The join, keyed: each key's record (or waiting label, or a forgotten impression's
    time) in its state, and a timer for each time the watermark decides something about it."""

    RECORD = ReadModifyWriteStateSpec("impression", _RECORD_CODER)
    WAITING = ReadModifyWriteStateSpec("waiting_label", _WAITING_CODER)
    FORGOTTEN = ReadModifyWriteStateSpec("forgotten_impression_ms", VarIntCoder())
    TIMEOUT = TimerSpec("timeout", TimeDomain.WATERMARK)
    FORGET = TimerSpec("forget", TimeDomain.WATERMARK)
    ORPHAN = TimerSpec("orphan", TimeDomain.WATERMARK)

    def __init__(self, policy: JoinPolicy):
        self.policy = policy

    def setup(self):
        self.counts = _Counts()

    def _key_join(self, key, record, waiting, forgotten, timeout, forget, orphan) -> _KeyJoin:
        return _KeyJoin(self.policy, self.counts, key, record, waiting, forgotten, timeout, forget, orphan)

    def process(self, element, record=beam.DoFn.StateParam(RECORD), waiting=beam.DoFn.StateParam(WAITING),
                forgotten=beam.DoFn.StateParam(FORGOTTEN), timeout=beam.DoFn.TimerParam(TIMEOUT),
                forget=beam.DoFn.TimerParam(FORGET), orphan=beam.DoFn.TimerParam(ORPHAN)):
        key, (kind, time_ms, value, payload) = element
        join = self._key_join(key, record, waiting, forgotten, timeout, forget, orphan)
        if kind == _IMPRESSION:
            join.take_impression(time_ms, payload)
        else:
            join.take_label(time_ms, value, payload)
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
    of its samples is."""

    def __init__(self, feature_schema: pa.Schema, rows_per_table: int):
        self.feature_schema = feature_schema
        self.rows_per_table = rows_per_table

    def start_bundle(self):
        self.pending: dict = {}  # window -> (samples, newest timestamp)

    def process(self, sample, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        samples, newest = self.pending.get(window, ([], timestamp))
        samples.append(sample)
        self.pending[window] = (samples, max(newest, timestamp))
        if len(samples) >= self.rows_per_table:
            del self.pending[window]
            yield beam.window.TimestampedValue(self._table(samples), max(newest, timestamp))

    def finish_bundle(self):
        for window, (samples, newest) in self.pending.items():
            yield WindowedValue(self._table(samples), newest, (window,))
        self.pending = {}

    def _table(self, samples: list) -> pa.Table:
        payloads, labels, corrections, delays, keys = zip(*samples)
        columns = list(zip(*(_VALUES.decode(payload) for payload in payloads)))
        columns[self.feature_schema.get_field_index("label")] = np.asarray(labels, np.float32)
        features = [pa.array(column, type=f.type) for column, f in zip(columns, self.feature_schema)]
        join_columns = {CORRECTION_COLUMN: pa.array(np.asarray(corrections, np.int8)),
                        DELAY_COLUMN: pa.array(np.asarray(delays, np.int64)),
                        KEY_COLUMN: pa.array(np.asarray(keys, np.int64).view(np.uint64))}
        schema = sample_schema(self.feature_schema)
        return pa.Table.from_arrays(features + [join_columns[name] for name in schema.names[len(features):]],
                                    schema=schema)


class JoinLabels(beam.PTransform):
    """{IMPRESSIONS: Impressions chunks, LABELS: Labels chunks} in; {SAMPLES: pa.Table
    chunks in sample_schema(schema), ORPHANS: OrphanLabel} out.

    `schema` is the impressions' feature rows' (canonical) schema. Samples carry event
    timestamps: a sample decided by a label has the label's time (the impression's, if the
    label came first), one decided by the watermark the time at which the watermark
    decided it."""

    def __init__(self, policy: JoinPolicy, schema: pa.Schema, rows_per_table: int = 8192):
        super().__init__()
        self.policy, self.schema, self.rows_per_table = policy, schema, rows_per_table

    def expand(self, events):
        impressions = events[IMPRESSIONS] | "ImpressionEvents" >> beam.FlatMap(
            _impression_events, self.schema.names).with_output_types(_KeyedEvent)
        labels = events[LABELS] | "LabelEvents" >> beam.FlatMap(_label_events).with_output_types(_KeyedEvent)
        joined = ((impressions, labels) | "AllEvents" >> beam.Flatten().with_output_types(_KeyedEvent)
                  | "Join" >> beam.ParDo(_JoinDoFn(self.policy)).with_output_types(_Sample)
                  .with_outputs(ORPHANS, main=SAMPLES))
        samples = joined[SAMPLES] | "Tables" >> beam.ParDo(
            _SampleTables(self.schema, self.rows_per_table)).with_output_types(pa.Table)
        return {SAMPLES: samples, ORPHANS: joined[ORPHANS]}
