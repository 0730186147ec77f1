"""The join policy of picasso.sample_join, one event at a time, in plain Python dicts.

This is the join as one would first write it: a dict of impressions with their features
as row dicts, heaps of their deadlines for the timeouts, and a loop over events.
It is the reference that tests hold the columnar JoinState to, call by call, and the
baseline of benchmarks.join. It follows the same order of work within a call: the
impressions, then the labels that were waiting for them, then the call's labels, then
the watermark.
"""

from __future__ import annotations

import heapq

import numpy as np
import pyarrow as pa

from picasso.join_rules import (CORRECTION_COLUMN, DELAY_COLUMN, KEY_COLUMN, Impressions, JoinCounts, JoinOutput,
                                JoinPolicy, Labels, OrphanLabel)
from picasso.sample_join import sample_schema


class _Record:
    __slots__ = ("key", "time", "row", "state", "label_time")

    def __init__(self, key: int, time: int, row: dict):
        self.key, self.time, self.row, self.state, self.label_time = key, time, row, "pending", None


class DictJoin:
    def __init__(self, policy: JoinPolicy, schema: pa.Schema):
        self.policy = policy
        self.schema = schema
        self.watermark: int | None = None
        self.records: dict[int, _Record] = {}
        self.due: list[tuple[int, int]] = []  # heap of (time + W, key): the timeouts
        self.expiry: list[tuple[int, int]] = []  # heap of (time + keep, key): when to forget
        self.orphans: dict[int, list[tuple]] = {}  # key -> [(time, value, ref, impression time)], in arrival order
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
        self._samples: list[dict] = []
        self._delays: list[int] = []
        self._orphans_out: list[OrphanLabel] = []
        self._counts = JoinCounts()
        waiting = []
        if impressions is not None:  # waiting labels of new impressions join them, or wait on
            rows = impressions.rows.to_pylist()
            for key, time, row in zip(impressions.keys.tolist(), impressions.times.tolist(), rows):
                if key in self.records:
                    self._counts.duplicate_impressions += 1
                    continue
                self._counts.impressions += 1
                self.records[key] = _Record(key, time, row)
                heapq.heappush(self.due, (time + self.policy.wait_ms, key))
                heapq.heappush(self.expiry, (time + self.policy.keep_ms, key))
                if key in self.orphans:
                    waiting += [(key, *label) for label in self.orphans.pop(key)]
        for key, time, value, ref, _ in waiting:
            self._label(key, time, value, ref)
        if labels is not None:
            refs = labels.refs or [None] * len(labels)
            for key, time, value, ref in zip(labels.keys.tolist(), labels.times.tolist(), labels.values.tolist(), refs):
                self._counts.labels += 1
                self._label(key, time, value, ref)
        if watermark is not None and (self.watermark is None or watermark > self.watermark):
            self.watermark = watermark
            self._expire()
        self.counts.add(self._counts)
        table = pa.Table.from_pylist(self._samples, schema=sample_schema(self.schema))
        return JoinOutput(table, self._orphans_out, self._counts, np.array(self._delays, dtype=np.int64))

    def _label(self, key: int, time: int, value: int, ref) -> None:
        record = self.records.get(key)
        if record is None or time - record.time > self.policy.keep_ms:  # unknown, or beyond the horizon
            impression = record.time if record else self.forgotten.get(key)
            self.orphans.setdefault(key, []).append((time, value, ref, impression))
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
        self._samples.append({**record.row, "label": float(label), CORRECTION_COLUMN: int(correction),
                              DELAY_COLUMN: delay, KEY_COLUMN: record.key})

    def _expire(self) -> None:
        watermark, policy = self.watermark, self.policy
        while self.due and self.due[0][0] < watermark:
            record = self.records[heapq.heappop(self.due)[1]]
            if record.state in ("pending", "pending-late"):
                late = record.state == "pending-late"
                label_time, record.label_time = record.label_time, None  # a timeout's negative has no label
                self._negative(record)
                record.label_time = label_time
                if late:
                    self._late(record)
        while self.expiry and self.expiry[0][0] < watermark:
            record = self.records.pop(heapq.heappop(self.expiry)[1])
            self._counts.forgotten += 1
            self.forgotten[record.key] = max(record.time, self.forgotten.get(record.key, record.time))
            heapq.heappush(self.unrecall, (record.time + policy.recall_ms + policy.orphan_grace_ms, record.key,
                                           record.time))
        limit = watermark - policy.orphan_grace_ms
        orphans = []
        for key in [k for k, queue in self.orphans.items() if queue[0][0] < limit]:
            queue = self.orphans.pop(key)
            # The first label still waiting is an orphan once its grace is over; the ones
            # after it within its grace are its duplicates; then the next one left.
            while queue and queue[0][0] < limit:
                (time, value, ref, impression), *queue = queue
                told = impression is not None and time - impression <= policy.recall_ms
                orphans.append(OrphanLabel(key, time, value, ref, impression if told else None))
                echoes = [label for label in queue if label[0] <= time + policy.orphan_grace_ms]
                self._counts.duplicate_labels += len(echoes)
                queue = [label for label in queue if label[0] > time + policy.orphan_grace_ms]
            if queue:
                self.orphans[key] = queue
        self._orphans_out += sorted(orphans, key=lambda o: (o.time_ms, o.key))
        self._counts.orphan_labels += len(orphans)
        while self.unrecall and self.unrecall[0][0] < watermark:
            _, key, time = heapq.heappop(self.unrecall)
            if self.forgotten.get(key) == time:
                del self.forgotten[key]
