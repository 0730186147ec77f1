"""Impressions joined with delayed labels: the one policy, as one deterministic function
(its rules and contract types: join_rules.py).

Serving logs an impression (the features it used) when it shows an item; the click comes
later, on another stream. JoinState.advance(impressions, labels, watermark) turns such
events into labelled samples, by this policy (JoinPolicy):

- An impression waits W (`wait_ms`) in event time for its label. A label event with value
  1 and a time at most W after the impression's makes it a positive, emitted at once; a
  label with value 0 (an explicit negative) and a time at most W after it makes it a
  negative at once. When the watermark passes the impression's time + W with no label,
  it is a negative (with no label delay, whether a later label had come already or not).
- The first label of an impression decides it. Later labels for it within its horizon,
  and impressions whose key was seen before, are duplicates: counted, and nothing else.
- A label that comes after its impression was emitted as a negative, or that is more than
  W after it, is late. `drop` counts it. `correct` emits the impression once more as a
  positive with `join_correction` = 1, so that the loss can weight it (see
  picasso.sample_join.delayed_feedback). An emitted impression is remembered, to recognise its late
  and duplicate labels, until the watermark passes its time + W + `horizon_ms`; then it is
  forgotten. A label more than W + `horizon_ms` after its impression is beyond the
  horizon: it never joins, whether or not the record is forgotten yet (join_rules).
- A label whose impression is not (or no longer) known, or is beyond the horizon, waits
  `orphan_grace_ms` past its own time for the impression to arrive; after that it is an
  orphan, and leaves as a dead letter (JoinOutput.orphans), told the time of its
  impression when that came and was forgotten (picasso.forgotten_keys keeps the keys).
  The labels of a key that wait after it, within its grace, are its duplicates
  (join_rules.settle_waiting).

The watermark is the hosts' business (join_rules.event_watermark: the bounded-cycle
stream's CycleClock; Beam's own on a streaming runner): it only moves forward here.
Everything a call emits depends on the state and its arguments only, never on a clock or
on I/O, so two hosts fed the same events and watermarks emit the same samples; and every
verdict is one of event times, so the same events cut into other calls give them too
(join_rules' docstring says when). The state is updated in place: at a million pending
impressions a copy per call would cost more than the join.

Keys are 64-bit hashes of the join-key fields (join_keys), and the state is numpy
arrays: a key, a time, a state and an id per record, the feature rows one after another
(picasso.sample_join.held_features), and one dict from key to slot. The hash finds an event's record
and the id (join_ids: the key itself, as text) confirms it, in one vectorised comparison:
the hash is unkeyed, and a key chosen to share another user's hash must not take that
user's impression. A record whose hash another key holds already (a collision, chosen or
by chance) is indexed by (hash, id) in a second dict; events without ids (None) are
compared by hash alone. A pending impression costs its canonical feature row, a few dozen
bytes of arrays, its id and its dict entry; benchmarks.join measures the whole against
the raw event.

Over 400 lines, as one class: JoinState's arrays, slots and dict change together on every
call, and its steps (take, decide, expire, forget, compact) are only correct together. The
rules it applies are join_rules.py's.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import asdict

import numpy as np
import pyarrow as pa

from picasso.sample_join.held_features import MERGE_ROWS, HeldFeatures
from picasso.forgotten_keys import NOT_FOUND, ForgottenKeys
from picasso.key_index import KeyIndex
from picasso.sample_join.join_rules import (CORRECTION_COLUMN, DELAY_COLUMN, FORGOTTEN, KEY_COLUMN, NEGATIVE, PENDING, PENDING_LATE,
                                POSITIVE, SETTLED, Impressions, JoinCounts, JoinOutput, JoinPolicy, Labels, OrphanLabel,
                                decide_labels, forgettable, orphaned, recalled, settle_waiting, timed_out, unrecalled)

BLOCK = 4096  # slots per block: expiry scans only blocks whose oldest pending record is due
_NEVER = np.iinfo(np.int64).max


class JoinState:
    """The pending impressions, the emitted ones still remembered, and the labels still
    waiting for their impression. See the module's docstring for the policy."""

    FILES = ("join-records.arrow", "join-features.arrow", "join-state.json")  # what to_files writes

    def __init__(self, policy: JoinPolicy, schema: pa.Schema, block: int = BLOCK):
        self.policy = policy
        self.schema = schema  # the feature rows' (canonical) schema
        self._block = block
        self.watermark: int | None = None
        self.counts = JoinCounts()
        # Slot i of the arrays is the record of one impression, in arrival order; its
        # feature row is in self.rows while a sample may still need it.
        self._size = 0
        self.keys = np.zeros(0, np.uint64)
        self.times = np.zeros(0, np.int64)
        self.states = np.zeros(0, np.int8)
        self.label_times = np.zeros(0, np.int64)  # of the first label; -1 none
        self.ids = np.full(0, None, object)  # the key itself (join_ids), or None
        self.rows = HeldFeatures(schema, merge_rows=min(MERGE_ROWS, 8 * block))  # small blocks, small tables
        self._index = KeyIndex.new()  # key -> slot of the first record of that hash
        # key -> {id: slot} of the other records of that hash: keys that share the hash of
        # the record in _index (a collision); there is one only while _index holds the key.
        self._colliding: dict[int, dict[object, int]] = {}
        self._block_due = np.zeros(0, np.int64)  # per block: the earliest time of a waiting record
        self._block_keep = np.zeros(0, np.int64)  # per block: the earliest time of a live record
        self._live = 0
        # Labels waiting for their impression, by (key, id), in arrival order: (time, value, ref,
        # the time of an impression of the key when the label began to wait, held or forgotten, or None).
        self._orphans: dict[tuple[int, object], list[tuple[int, int, object, int | None]]] = {}
        self._forgotten = ForgottenKeys()  # the keys and times of forgotten impressions, for a while

    # -- what is held ------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Impressions still waiting for their label."""
        states = self.states[:self._size]
        return int(np.count_nonzero(states <= PENDING_LATE))

    @property
    def remembered(self) -> int:
        """Impressions held: pending, or emitted and within their horizon."""
        return self._live

    @property
    def waiting_labels(self) -> int:
        return sum(map(len, self._orphans.values()))

    def nbytes(self) -> int:
        """Bytes the records hold: features, arrays, the ids (their str objects), the key
        index and the forgotten keys."""
        arrays = sum(a.nbytes for a in (self.keys, self.times, self.states, self.label_times, self.ids))
        ids = self.ids[:self._size]
        texts = sum(map(sys.getsizeof, ids[np.not_equal(ids, None)].tolist()))
        return self.rows.nbytes + arrays + texts + self._index.nbytes + self._forgotten.nbytes

    # -- the join ----------------------------------------------------------------------

    def advance(self, impressions: Impressions | None, labels: Labels | None, watermark: int | None) -> JoinOutput:
        """Take in the new events, then the watermark; return what they decide.

        Impressions are taken before labels, so a label that arrives in the same call as
        its impression joins it. A watermark behind the state's is ignored (watermarks only
        move forward)."""
        out = _Emitted(self.schema)
        if impressions is not None and len(impressions):
            waiting = self._take_impressions(impressions, out.counts)
            if waiting is not None:  # labels that were waiting for these impressions
                self._take_labels(waiting, out, from_waiting=True)
        if labels is not None and len(labels):
            out.counts.labels += len(labels)
            self._take_labels(labels, out)
        if watermark is not None and (self.watermark is None or watermark > self.watermark):
            self.watermark = int(watermark)
            self._expire(out)
        self.counts.add(out.counts)
        return out.result()

    def _take_impressions(self, impressions: Impressions, counts: JoinCounts) -> Labels | None:
        keys, ids = impressions.keys, impressions.ids
        first = _first_of_each(keys, ids)
        known = self._lookup(keys[first], ids[first])
        new = first[known < 0]
        counts.duplicate_impressions += len(keys) - len(new)
        counts.impressions += len(new)
        if not len(new):
            return None
        rows = impressions.rows if len(new) == len(keys) else impressions.rows.take(pa.array(new))
        self._append(keys[new], impressions.times[new], rows, ids[new])
        if not self._orphans:
            return None
        waiting = [(key, label) for key in zip(keys[new].tolist(), ids[new].tolist()) if key in self._orphans
                   for label in self._orphans.pop(key)]
        if not waiting:
            return None
        # Joined anew, or back to waiting (beyond the horizon of the impression that came).
        return Labels(keys=[k for (k, _), _ in waiting], times=[w[0] for _, w in waiting],
                      values=[w[1] for _, w in waiting], refs=[w[2] for _, w in waiting],
                      ids=[i for (_, i), _ in waiting])

    def _take_labels(self, labels: Labels, out: "_Emitted", from_waiting: bool = False) -> None:
        slots = self._lookup(labels.keys, labels.ids)
        unknown = np.flatnonzero(slots < 0)
        if len(unknown):
            self._wait_for_impressions(labels, unknown)
        known = np.flatnonzero(slots >= 0)
        if not len(known):
            return
        # The k-th label of each impression in this call, round k: within a round no two
        # labels share a record, so each round is one vectorised step of the state machine.
        order = known[np.argsort(slots[known], kind="stable")]
        sorted_slots = slots[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_slots)) + 1]
        rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        for k in range(int(rank.max()) + 1):
            chosen = np.sort(order[rank == k])  # arrival order within the round
            self._label_step(labels, chosen, slots[chosen], out)

    def _label_step(self, labels: Labels, chosen: np.ndarray, slots: np.ndarray, out: "_Emitted") -> None:
        """Labels `chosen` of `labels`, each of another record (`slots`)."""
        times, values = labels.times[chosen], labels.values[chosen]
        delays = times - self.times[slots]
        decision = decide_labels(self.states[slots], delays, values, self.policy)
        if decision.beyond_horizon.any():  # as if their impressions were forgotten already
            self._wait_for_impressions(labels, chosen[decision.beyond_horizon])
        out.counts.duplicate_labels += int(np.count_nonzero(decision.duplicate))
        out.delays.append(delays[decision.positive | decision.beyond | decision.late])
        takes = ~(decision.duplicate | decision.beyond_horizon)
        self.label_times[slots[takes]] = times[takes]
        self.states[slots[decision.positive]] = POSITIVE
        self.states[slots[decision.beyond]] = PENDING_LATE
        out.emit(self, slots[decision.positive], label=1)
        self._release(slots[decision.positive])
        self._emit_negatives(slots[decision.explicit_negative], out)
        out.counts.explicit_negatives += int(np.count_nonzero(decision.explicit_negative))
        self._late(slots[decision.late], out)
        # Decided records still count in their blocks' earliest due time until the next
        # scan of the block: a scan too many, never one too few.

    def _emit_negatives(self, slots: np.ndarray, out: "_Emitted", by_watermark: bool = False) -> None:
        self.states[slots] = NEGATIVE
        out.emit(self, slots, label=0, by_watermark=by_watermark)
        if self.policy.late_labels == "drop":  # no correction will need the features
            self._release(slots)

    def _late(self, slots: np.ndarray, out: "_Emitted") -> None:
        """Labels with value 1 for impressions emitted as negatives."""
        out.counts.late_labels += len(slots)
        self.states[slots] = SETTLED
        if self.policy.late_labels == "correct":
            out.emit(self, slots, label=1, correction=True)
        self._release(slots)

    def _wait_for_impressions(self, labels: Labels, unknown: np.ndarray) -> None:
        """Labels whose impression is not known, or beyond the horizon. Each notes the time of
        the key's impression it can still be told about now: by the time it is an orphan the
        forgotten keys may have let it go."""
        known = self._impression_times(labels.keys[unknown], labels.ids[unknown])
        for i, impression_ms in zip(unknown.tolist(), known.tolist()):
            self._orphans.setdefault((int(labels.keys[i]), labels.ids[i]), []).append(
                (int(labels.times[i]), int(labels.values[i]), labels.refs[i] if labels.refs else None,
                 None if impression_ms == NOT_FOUND else impression_ms))

    def _expire(self, out: "_Emitted") -> None:
        watermark, policy = self.watermark, self.policy
        due_slots = []
        for block in np.flatnonzero(self._block_due < watermark - policy.wait_ms + 1).tolist():
            lo, hi = block * self._block, min((block + 1) * self._block, self._size)
            states, times = self.states[lo:hi], self.times[lo:hi]
            waiting = states <= PENDING_LATE
            due = waiting & timed_out(times, watermark, policy)
            due_slots.append(lo + np.flatnonzero(due))
            still = waiting & ~due
            self._block_due[block] = times[still].min() if still.any() else _NEVER
        # Emitted together, in arrival order: the order of the samples must not depend on
        # how the records fall into blocks (a state restored from a checkpoint has other
        # blocks than one that never stopped).
        slots = np.concatenate(due_slots) if due_slots else np.zeros(0, np.int64)
        late = slots[self.states[slots] == PENDING_LATE]
        self._emit_negatives(slots, out, by_watermark=True)
        self._late(late, out)
        self._forget(out.counts)
        self._dead_letter_orphans(out)
        # After the orphans: one this watermark dead-letters may still need its impression's time.
        self._forgotten.forget_before(self._recall_since())
        self._compact()

    def _recall_since(self) -> int:
        """The oldest forgotten impression's time an orphan may still be told about
        (join_rules.unrecalled)."""
        if self.watermark is None:  # nothing was forgotten yet
            return -_NEVER
        return self.watermark - self.policy.recall_ms - self.policy.orphan_grace_ms

    def _forget(self, counts: JoinCounts) -> None:
        watermark, keep = self.watermark, self.policy.keep_ms
        for block in np.flatnonzero(self._block_keep < watermark - keep + 1).tolist():
            lo, hi = block * self._block, min((block + 1) * self._block, self._size)
            states, times = self.states[lo:hi], self.times[lo:hi]
            live = (states != FORGOTTEN)
            gone = live & (states > PENDING_LATE) & forgettable(times, watermark, self.policy)
            if gone.any():
                slots = lo + np.flatnonzero(gone)
                self._unindex(slots)
                self._forgotten.add(self.keys[slots], self.times[slots])
                self._release(slots)
                self.states[slots] = FORGOTTEN
                self._live -= len(slots)
                counts.forgotten += len(slots)
            still = live & ~gone
            self._block_keep[block] = times[still].min() if still.any() else _NEVER

    def _dead_letter_orphans(self, out: "_Emitted") -> None:
        if not self._orphans:
            return
        keys = list(self._orphans)
        heads = np.array([self._orphans[key][0][0] for key in keys], dtype=np.int64)
        orphans = []
        for key in (keys[i] for i in np.flatnonzero(orphaned(heads, self.watermark, self.policy)).tolist()):
            queue = self._orphans.pop(key)  # key: (hash, id)
            gone, echoes = settle_waiting(np.array([label[0] for label in queue], np.int64), self.watermark,
                                          self.policy)
            for time, value, ref, impression_ms in (queue[i] for i in np.flatnonzero(gone).tolist()):
                told = impression_ms is not None and bool(recalled(np.array([time - impression_ms]), self.policy)[0])
                orphans.append(OrphanLabel(key[0], time, value, ref, impression_ms if told else None))
            out.counts.duplicate_labels += int(np.count_nonzero(echoes))
            left = [label for label, stays in zip(queue, ~(gone | echoes)) if stays]
            if left:
                self._orphans[key] = left
        out.orphans += sorted(orphans, key=lambda o: (o.time_ms, o.key))
        out.counts.orphan_labels += len(orphans)

    def _impression_times(self, keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The time of each key's impression, held, or forgotten and not yet unrecalled;
        NOT_FOUND for neither. A held one is the newer: a key forgotten and impressed again.
        (The forgotten keys are hashes only: an orphan's reason may name a forgotten
        impression of another key of its hash.)"""
        slots = self._lookup(keys, ids)
        held = slots >= 0
        times = self._forgotten.impression_times(keys)
        if self.watermark is not None:  # the runs drop their keys late: judge each time here
            times[(times != NOT_FOUND) & unrecalled(times, self.watermark, self.policy)] = NOT_FOUND
        times[held] = self.times[slots[held]]
        return times

    # -- storage of the records ---------------------------------------------------------

    def _lookup(self, keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The slot of each (key, id)'s record, -1 for none: the hash finds a record, and
        the ids, compared in one pass, confirm it."""
        slots = self._index.get(keys)
        found = np.flatnonzero(slots >= 0)
        other = found[self.ids[slots[found]] != ids[found]]
        if len(other):  # another key of the same hash: a colliding record of this one, or none
            slots[other] = [self._colliding.get(key, {}).get(key_id, -1)
                            for key, key_id in zip(keys[other].tolist(), ids[other].tolist())]
        return slots

    def _index_slots(self, keys: np.ndarray, ids: np.ndarray, start: int) -> None:
        """Index new records at slots start, start + 1, ...: the first of a hash in _index,
        any later one (another id) in _colliding."""
        held = self._index.add(keys, np.arange(start, start + len(keys)))
        for at in np.flatnonzero(held).tolist():  # a hash held already: another id's, or one of these
            self._colliding.setdefault(int(keys[at]), {})[ids[at]] = start + at

    def _unindex(self, slots: np.ndarray) -> None:
        """Forget these records' index entries. Where one of a hash in _index goes while
        others of it collide, the first of those takes its place."""
        keys = self.keys[slots]
        colliding = (np.fromiter((key in self._colliding for key in keys.tolist()), bool, len(keys))
                     if self._colliding else np.zeros(len(keys), bool))
        self._index.remove(keys[~colliding])
        for key, key_id, slot in zip(keys[colliding].tolist(), self.ids[slots[colliding]].tolist(),
                                     slots[colliding].tolist()):
            others = self._colliding.get(key)  # gone when an earlier of these took the last of its hash
            one = np.array([key], np.uint64)
            if others is None:
                self._index.remove(one)
                continue
            if self._index.get(one)[0] == slot:  # the first of its hash: another of it takes its place
                key_id = next(iter(others))
                self._index.assign(one, np.array([others[key_id]]))
            del others[key_id]
            if not others:
                del self._colliding[key]

    def _append(self, keys: np.ndarray, times: np.ndarray, rows: pa.Table | None, ids: np.ndarray) -> None:
        start, n = self._size, len(keys)
        end = start + n
        if end > len(self.keys):
            capacity = max(end, 2 * len(self.keys), self._block)
            self.keys = _grown(self.keys, capacity, 0)
            self.times = _grown(self.times, capacity, 0)
            self.states = _grown(self.states, capacity, FORGOTTEN)
            self.label_times = _grown(self.label_times, capacity, -1)
            self.ids = _grown(self.ids, capacity, None)
        self.keys[start:end] = keys
        self.times[start:end] = times
        self.states[start:end] = PENDING
        self.label_times[start:end] = -1
        self.ids[start:end] = ids
        if rows is not None:
            self.rows.add(np.arange(start, end), rows)
        self._size = end
        self._index_slots(keys, ids, start)
        self._live += n
        blocks = -(-end // self._block)
        if blocks > len(self._block_due):
            grow = blocks - len(self._block_due)
            self._block_due = np.r_[self._block_due, np.full(grow, _NEVER)]
            self._block_keep = np.r_[self._block_keep, np.full(grow, _NEVER)]
        block_of = np.arange(start, end) // self._block
        np.minimum.at(self._block_due, block_of, times)
        np.minimum.at(self._block_keep, block_of, times)

    def _release(self, slots: np.ndarray) -> None:
        """These records' feature rows are needed no more (emitted for good)."""
        self.rows.release(slots)

    def _compact(self) -> None:
        """Drop forgotten slots once they are half the arrays."""
        if self._size > 4 * self._block and self._live < self._size // 2:
            self._renumber()

    def _renumber(self) -> None:
        """Drop forgotten slots from the arrays, and renumber the index."""
        alive = np.flatnonzero(self.states[:self._size] != FORGOTTEN)
        n = len(alive)
        fills = {"keys": 0, "times": 0, "states": FORGOTTEN, "label_times": -1, "ids": None}
        for name, fill in fills.items():
            array = getattr(self, name)
            array[:n] = array[alive]
            array[n:self._size] = fill
        remap = np.full(self._size, -1, np.int64)
        remap[alive] = np.arange(n)
        self.rows.renumber(remap, len(self.keys))
        self._size = n
        first = {key: int(self._index.get(np.array([key], np.uint64))[0]) for key in self._colliding}
        self._index = KeyIndex.new()
        self._index.add(self.keys[:n], np.arange(n))  # of a colliding hash: its earliest record
        for key, others in self._colliding.items():
            self._index.assign(np.array([key], np.uint64), np.array([remap[first[key]]]))
            self._colliding[key] = {key_id: int(remap[slot]) for key_id, slot in others.items()}
        self._reblock()

    def _reblock(self) -> None:
        """The per-block earliest due and keep times, from the arrays."""
        blocks = -(-self._size // self._block)
        self._block_due = np.full(blocks, _NEVER)
        self._block_keep = np.full(blocks, _NEVER)
        block_of = np.arange(self._size) // self._block
        states, times = self.states[:self._size], self.times[:self._size]
        waiting = states <= PENDING_LATE
        np.minimum.at(self._block_due, block_of[waiting], times[waiting])
        live = states != FORGOTTEN
        np.minimum.at(self._block_keep, block_of[live], times[live])

    # -- checkpoints -------------------------------------------------------------------

    def to_files(self) -> dict[str, bytes]:
        """The state as files for a checkpoint: the records and their feature rows (Arrow
        IPC files), and the rest (JSON, with the labels still waiting)."""
        slots = np.flatnonzero(self.states[:self._size] != FORGOTTEN)
        with_rows = self.rows.row_of[slots] >= 0
        features = self.rows.take(slots[with_rows])
        # The forgotten keys still recalled follow the records, as FORGOTTEN ones without a row.
        gone_keys, gone_times = self._forgotten.entries(since=self._recall_since())
        n = len(gone_keys)
        records = pa.table({"key": np.r_[self.keys[slots], gone_keys], "time": np.r_[self.times[slots], gone_times],
                            "state": np.r_[self.states[slots], np.full(n, FORGOTTEN, np.int8)],
                            "label_time": np.r_[self.label_times[slots], np.full(n, -1, np.int64)],
                            "has_row": np.r_[with_rows, np.zeros(n, bool)],
                            "id": pa.array([*self.ids[slots].tolist(), *[None] * n], pa.string())})
        rest = {
            "policy": asdict(self.policy),
            "watermark": self.watermark,
            "counts": asdict(self.counts),
            "waiting_labels": [[str(key), *label, key_id] for (key, key_id), queue in self._orphans.items()
                               for label in queue],
        }
        return {"join-records.arrow": _ipc(records), "join-features.arrow": _ipc(features.combine_chunks()),
                "join-state.json": json.dumps(rest, sort_keys=True).encode()}

    @classmethod
    def from_files(cls, files: dict[str, bytes], schema: pa.Schema, policy: JoinPolicy,
                   block: int = BLOCK) -> "JoinState":
        """A state from to_files' output, under `policy` (which may differ from the saved
        one: a new wait applies to the impressions still pending)."""
        state = cls(policy, schema, block)
        rest = json.loads(files["join-state.json"])
        records = _read_ipc(files["join-records.arrow"])
        features = _read_ipc(files["join-features.arrow"]).select(schema.names).cast(schema)
        states = records.column("state").to_numpy()
        gone = states == FORGOTTEN
        keys, times = records.column("key").to_numpy(), records.column("time").to_numpy()
        state._forgotten.add(keys[gone], times[gone])
        held = ~gone
        has_row = records.column("has_row").to_numpy(zero_copy_only=False)[held]
        # A checkpoint from before the join compared ids has none: its keys are hashes alone.
        ids = (records.column("id").to_numpy(zero_copy_only=False).astype(object) if "id" in records.column_names
               else np.full(records.num_rows, None, object))
        state._append(keys[held], times[held], None, ids[held])
        n = int(np.count_nonzero(held))
        state.states[:n] = states[held]
        state.label_times[:n] = records.column("label_time").to_numpy()[held]
        state.rows.add(np.flatnonzero(has_row), features)
        state._reblock()
        state.watermark = rest["watermark"]
        state.counts = JoinCounts(**rest["counts"])
        for key, time, value, ref, *later in rest["waiting_labels"]:
            # A checkpoint from before forgotten impressions were recalled has no impression
            # times, and one from before ids were compared no ids.
            impression_ms, key_id = (*later, None, None)[:2]
            state._orphans.setdefault((int(key), key_id), []).append((time, value, ref, impression_ms))
        return state


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


class _Emitted:
    """What one advance() emits, gathered in order."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.parts: list[pa.Table] = []
        self.counts = JoinCounts()
        self.delays: list[np.ndarray] = []
        self.orphans: list[OrphanLabel] = []

    def emit(self, state: JoinState, slots: np.ndarray, label: int, correction: bool = False,
             by_watermark: bool = False) -> None:
        """Emit the records of slots, in slot (arrival) order. A negative the watermark
        decided (`by_watermark`) carries no label delay, even where a label beyond W came
        before the timeout: after it, the same label would find the negative emitted."""
        if not len(slots):
            return
        slots = np.sort(slots)
        if correction:
            self.counts.corrections += len(slots)
        elif label:
            self.counts.positives += len(slots)
        else:
            self.counts.negatives += len(slots)
        n = len(slots)
        delay = np.where((state.label_times[slots] >= 0) & (not by_watermark),
                         state.label_times[slots] - state.times[slots], -1)
        self.parts.append(as_samples(state.rows.take(slots), np.full(n, label), np.full(n, int(correction)), delay,
                                     state.keys[slots]))

    def result(self) -> JoinOutput:
        if self.parts:
            samples = pa.concat_tables(self.parts) if len(self.parts) > 1 else self.parts[0]
        else:
            samples = sample_schema(self.schema).empty_table()
        delays = np.concatenate(self.delays) if self.delays else np.zeros(0, np.int64)
        return JoinOutput(samples=samples, orphans=self.orphans, counts=self.counts, delays_ms=delays)


def as_samples(rows: pa.Table, labels, corrections, delays, keys) -> pa.Table:
    """Feature rows as samples (sample_schema): each row's label set, then its
    CORRECTION_COLUMN, DELAY_COLUMN and KEY_COLUMN (one value per row in each argument)."""
    rows = rows.set_column(rows.schema.get_field_index("label"), "label", pa.array(np.asarray(labels, np.float32)))
    return (rows.append_column(CORRECTION_COLUMN, pa.array(np.asarray(corrections, np.int8)))
            .append_column(DELAY_COLUMN, pa.array(np.asarray(delays, np.int64)))
            .append_column(KEY_COLUMN, pa.array(np.asarray(keys, np.uint64))))


def sample_schema(feature_schema: pa.Schema) -> pa.Schema:
    """The schema of the samples a join emits: the canonical features and their label,
    then CORRECTION_COLUMN, DELAY_COLUMN and KEY_COLUMN."""
    return (feature_schema.append(pa.field(CORRECTION_COLUMN, pa.int8())).append(pa.field(DELAY_COLUMN, pa.int64()))
            .append(pa.field(KEY_COLUMN, pa.uint64())))


def _first_of_each(keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The first event of each distinct (key, id), in arrival order."""
    unique_keys, first = np.unique(keys, return_index=True)
    if len(first) < len(keys):
        # Events of one hash are one key if their ids are equal; any other id is another key.
        other = np.flatnonzero(ids != ids[first[np.searchsorted(unique_keys, keys)]])
        if len(other):
            firsts: dict[tuple[int, object], int] = {}
            for key, key_id, i in zip(keys[other].tolist(), ids[other].tolist(), other.tolist()):
                firsts.setdefault((key, key_id), i)
            first = np.r_[first, np.fromiter(firsts.values(), np.int64, len(firsts))]
    first.sort()  # arrival order
    return first


def _grown(array: np.ndarray, capacity: int, fill) -> np.ndarray:
    grown = np.full(capacity, fill, dtype=array.dtype)
    grown[:len(array)] = array
    return grown


