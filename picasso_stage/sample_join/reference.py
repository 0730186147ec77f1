"""The join policy of picasso.sample_join.join_state, one event at a time, in plain Python dicts.

This is the join as one would first write it: a dict of impressions with their features
as row dicts, heaps of their deadlines for the timeouts, and a loop over events.
It is the reference that tests hold the columnar JoinState to, call by call, and the
reference join of benchmarks.join. It follows the same order of work within a call: the
impressions, then the labels that were waiting for them, then the call's labels, then
the watermark. Its records are keyed by the key's hash and the key itself (the events'
`ids`), as JoinState compares them; the forgotten impressions by hash, as JoinState's.

How a record holds its features, and how a call's samples become a table, are three
methods (_rows, _sample, _table), so that picasso.sample_join.dict_join can hold them in Arrow.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from picasso.sample_join.join_rules import (CORRECTION_COLUMN, DELAY_COLUMN, KEY_COLUMN, Impressions, JoinCounts, JoinOutput,
                                JoinPolicy, Labels, OrphanLabel)
from picasso.sample_join.join_state import sample_schema


class _Record:
    __slots__ = ("key", "key_id", "time", "row", "state", "label_time")

    def __init__(self, key: int, key_id, time: int, row):
        self.key, self.key_id, self.time, self.row = key, key_id, time, row
        self.state, self.label_time = "pending", None


class DictJoin:
    def __init__(self, policy: JoinPolicy, schema: pa.Schema):
        self.policy = policy
        self.schema = schema
        self.watermark: int | None = None
        self.records: dict[tuple[int, object], _Record] = {}  # (key, id) -> its impression's record
        # Heaps of (deadline, key, arrival number, record): the timeouts (time + W) and when to
        # forget (time + keep). The arrival number breaks ties before records are compared.
        self.due: list[tuple[int, int, int, _Record]] = []
        self.expiry: list[tuple[int, int, int, _Record]] = []
        self.arrivals = 0
        # (key, id) -> [(time, value, ref, impression time)], in arrival order
        self.orphans: dict[tuple[int, object], list[tuple]] = {}
        self.forgotten: dict[int, int] = {}  # key -> the newest time of a forgotten impression of it
        self.unrecall: list[tuple[int, int, int]] = []  # heap of (time + recall + grace, key, time)
        self.counts = JoinCounts()

    @property
    def pending(self) -> int:
        return sum(record.state in ("pending", "pending-late") for record in self.records.values())

    @property
    def waiting_labels(self) -> int:
        return sum(map(len, self.orphans.values()))

    def advance(self, impressions: Impressions | None, labels: Labels | None, watermark: int | None) -> JoinOutput:
        self._samples: list = []
        self._delays: list[int] = []
        self._orphans_out: list[OrphanLabel] = []
        self._counts = JoinCounts()
        waiting = []
        if impressions is not None:  # waiting labels of new impressions join them, or wait on
            for key, key_id, time, row in zip(impressions.keys.tolist(), impressions.ids.tolist(),
                                              impressions.times.tolist(), self._rows(impressions)):
                if (key, key_id) in self.records:
                    self._counts.duplicate_impressions += 1
                    continue
                self._counts.impressions += 1
                record = self.records[key, key_id] = _Record(key, key_id, time, row)
                self.arrivals += 1
                heapq.heappush(self.due, (time + self.policy.wait_ms, key, self.arrivals, record))
                heapq.heappush(self.expiry, (time + self.policy.keep_ms, key, self.arrivals, record))
                if (key, key_id) in self.orphans:
                    waiting += [(key, key_id, *label) for label in self.orphans.pop((key, key_id))]
        for key, key_id, time, value, ref, _ in waiting:
            self._label(key, key_id, time, value, ref)
        if labels is not None:
            refs = labels.refs or [None] * len(labels)
            for key, key_id, time, value, ref in zip(labels.keys.tolist(), labels.ids.tolist(),
                                                     labels.times.tolist(), labels.values.tolist(), refs):
                self._counts.labels += 1
                self._label(key, key_id, time, value, ref)
        if watermark is not None and (self.watermark is None or watermark > self.watermark):
            self.watermark = watermark
            self._expire()
        self.counts.add(self._counts)
        return JoinOutput(self._table(self._samples), self._orphans_out, self._counts,
                          np.array(self._delays, dtype=np.int64))

    # -- how records hold their features, and how samples become a table ----------------

    def _rows(self, impressions: Impressions) -> Iterable:
        """What each impression's record holds of its features: a row dict."""
        return impressions.rows.to_pylist()

    def _sample(self, record: _Record, label: int, correction: bool, delay: int):
        return {**record.row, "label": float(label), CORRECTION_COLUMN: int(correction), DELAY_COLUMN: delay,
                KEY_COLUMN: record.key}

    def _table(self, samples: list) -> pa.Table:
        return pa.Table.from_pylist(samples, schema=sample_schema(self.schema))

    # -- the policy ----------------------------------------------------------------------

    def _label(self, key: int, key_id, time: int, value: int, ref) -> None:
        record = self.records.get((key, key_id))
        if record is None or time - record.time > self.policy.keep_ms:  # unknown, or beyond the horizon
            impression = record.time if record else self.forgotten.get(key)
            self.orphans.setdefault((key, key_id), []).append((time, value, ref, impression))
            return
        delay = time - record.time
        if record.state == "pending" and value == 0 and delay > self.policy.wait_ms:
            self._counts.duplicate_labels += 1  # says what the timeout will
        elif record.state == "pending":
            record.label_time = time
            if value == 0:
                self._counts.explicit_negatives += 1
                self._negative(record)
            elif delay <= self.policy.wait_ms:
                self._delays.append(delay)
                record.state = "positive"
                self._emit(record, 1)
            else:
                self._delays.append(delay)
                record.state = "pending-late"
        elif record.state == "negative" and value == 1:
            record.label_time = time
            self._delays.append(time - record.time)
            self._late(record)
        else:
            self._counts.duplicate_labels += 1

    def _negative(self, record: _Record) -> None:
        record.state = "negative"
        self._emit(record, 0)

    def _late(self, record: _Record) -> None:
        self._counts.late_labels += 1
        record.state = "settled"
        if self.policy.late_labels == "correct":
            self._emit(record, 1, correction=True)

    def _emit(self, record: _Record, label: int, correction: bool = False) -> None:
        if correction:
            self._counts.corrections += 1
        elif label:
            self._counts.positives += 1
        else:
            self._counts.negatives += 1
        delay = record.label_time - record.time if record.label_time is not None else -1
        self._samples.append(self._sample(record, label, correction, delay))

    def _expire(self) -> None:
        watermark, policy = self.watermark, self.policy
        while self.due and self.due[0][0] < watermark:
            record = heapq.heappop(self.due)[3]
            if record.state in ("pending", "pending-late"):
                late = record.state == "pending-late"
                label_time, record.label_time = record.label_time, None  # a timeout's negative has no label
                self._negative(record)
                record.label_time = label_time
                if late:
                    self._late(record)
        while self.expiry and self.expiry[0][0] < watermark:
            record = heapq.heappop(self.expiry)[3]
            del self.records[record.key, record.key_id]
            self._counts.forgotten += 1
            self.forgotten[record.key] = max(record.time, self.forgotten.get(record.key, record.time))
            heapq.heappush(self.unrecall, (record.time + policy.recall_ms + policy.orphan_grace_ms, record.key,
                                           record.time))
        limit = watermark - policy.orphan_grace_ms
        orphans = []
        for exact in [k for k, queue in self.orphans.items() if queue[0][0] < limit]:
            queue = self.orphans.pop(exact)
            # The first label still waiting is an orphan once its grace is over; the ones
            # after it within its grace are its duplicates; then the next one left.
            while queue and queue[0][0] < limit:
                (time, value, ref, impression), *queue = queue
                told = impression is not None and time - impression <= policy.recall_ms
                orphans.append(OrphanLabel(exact[0], time, value, ref, impression if told else None))
                echoes = [label for label in queue if label[0] <= time + policy.orphan_grace_ms]
                self._counts.duplicate_labels += len(echoes)
                queue = [label for label in queue if label[0] > time + policy.orphan_grace_ms]
            if queue:
                self.orphans[exact] = queue
        self._orphans_out += sorted(orphans, key=lambda o: (o.time_ms, o.key))
        self._counts.orphan_labels += len(orphans)
        while self.unrecall and self.unrecall[0][0] < watermark:
            _, key, time = heapq.heappop(self.unrecall)
            if self.forgotten.get(key) == time:
                del self.forgotten[key]
