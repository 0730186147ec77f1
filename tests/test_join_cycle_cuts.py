"""The join is one deterministic function of the events: the same events, cut into other
cycles and polls, and polled in any order that keeps each partition's, give the same
samples, late labels, duplicates and orphans (with the same reasons).

Each schedule below reads the same partitions the way a joined stream's bounded cycles do
(JoinedStreamModel.take): a cycle reads some partitions (the others have nothing to read
then: they are idle in that cycle) a poll at a time, its CycleClock gives the watermark,
and JoinState (and the reference, DictJoin) advances on each poll. The labels come at
every delay: within W, beyond W, beyond the horizon (W + horizon, here 2W), beyond what
an orphan is still told about (2 (W + horizon)), before their impression within the
grace, explicit negatives within and beyond W, duplicates, and labels of keys never seen.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, astuple

import numpy as np
import pytest
from test_sample_join import SCHEMA, canonical, impressions, labels

from picasso.sample_join.join_rules import JoinPolicy
from picasso.pipelines.runs.joined_stream_state import CycleClock
from picasso.sample_join.join_state import JoinState
from picasso.sample_join.reference import DictJoin

WAIT_MS, GRACE_MS, LATENESS_MS = 10_000, 2_000, 500
POLICY = JoinPolicy(wait_ms=WAIT_MS, late_labels="correct", orphan_grace_ms=GRACE_MS)  # horizon: W again
IMPRESSION_PARTITIONS, LABEL_PARTITIONS = ("imp/0", "imp/1"), ("lab/0", "lab/1")
THE_END = 10**12


def partitioned_events(seed: int, n: int = 500) -> dict[str, list[tuple]]:
    """Each partition's events, (time, key, value) with value None for an impression, in
    the partition's order: by time, but up to the allowed lateness out of it. A key's
    labels are on one label partition."""
    rng = np.random.default_rng(seed)
    keep = POLICY.keep_ms
    keys = rng.permutation(20 * n)[:n] + 1
    times = rng.integers(0, 40 * keep, n)
    parts: dict[str, list[tuple]] = {p: [] for p in IMPRESSION_PARTITIONS + LABEL_PARTITIONS}
    for key, time in zip(keys.tolist(), times.tolist()):
        parts[IMPRESSION_PARTITIONS[rng.integers(2)]].append((time, key, None))
        if rng.random() < 0.05:  # sent twice
            parts[IMPRESSION_PARTITIONS[rng.integers(2)]].append((time, key, None))
    delays = {  # label delay after the impression, by kind
        "in W": lambda: rng.integers(0, WAIT_MS + 1),
        "before its impression": lambda: -rng.integers(1, GRACE_MS + 1),
        "beyond W": lambda: rng.integers(WAIT_MS + 1, keep + 1),
        "beyond the horizon": lambda: rng.integers(keep + 1, POLICY.recall_ms + 1),
        "beyond recall": lambda: rng.integers(POLICY.recall_ms + 1, 3 * POLICY.recall_ms),
    }
    kinds = list(delays)
    for key, time in zip(keys.tolist(), times.tolist()):
        if rng.random() < 0.4:
            continue
        label_time = time + int(delays[kinds[rng.integers(len(kinds))]]())
        value = int(rng.random() > 0.1)
        partition = LABEL_PARTITIONS[key % 2]
        parts[partition].append((label_time, key, value))
        if rng.random() < 0.1:  # a second label: a duplicate, or late after a negative
            parts[partition].append((label_time + int(rng.integers(0, keep)), key, 1))
    for key, time in zip(rng.integers(10**9, 2 * 10**9, 15).tolist(), rng.integers(0, 40 * keep, 15).tolist()):
        parts[LABEL_PARTITIONS[key % 2]].append((time, key, 1))  # no impression at all
    jitter = {p: rng.integers(0, LATENESS_MS + 1, len(events)) for p, events in parts.items()}
    return {p: [e for _, e in sorted(zip(jitter[p] + [e[0] for e in events], events), key=lambda x: x[0])]
            for p, events in parts.items()}


def schedule(parts: dict[str, list[tuple]], seed: int) -> list[list[tuple[str, list[tuple]]]]:
    """Cycles of polls, (partition, events), cut at random: a cycle reads a random set of
    partitions, each a random number of polls of random sizes, the polls interleaved at
    random. The first cycle reads every partition (CycleClock counts a partition from
    its first event), so the later ones may leave any partition idle."""
    rng = np.random.default_rng(seed)
    at = {p: 0 for p in parts}
    cycles = []
    while any(at[p] < len(parts[p]) for p in parts):
        left = [p for p in parts if at[p] < len(parts[p])]
        reading = left if not cycles else [p for p in left if rng.random() < 0.6] or left[:1]
        queue = []
        for p in reading:
            for _ in range(int(rng.integers(1, 4))):
                size = int(rng.integers(1, 60))
                if at[p] < len(parts[p]):
                    queue.append((p, parts[p][at[p]:at[p] + size]))
                    at[p] += size
        # Interleaved at random, each partition's polls kept in their order.
        order = sorted(range(len(queue)), key=lambda i: (rng.random(), i))
        by_partition = {p: [poll for poll in queue if poll[0] == p] for p in reading}
        cycles.append([by_partition[queue[i][0]].pop(0) for i in order])
    return cycles


def run(cycles, join) -> dict:
    """Feed the schedule as a joined stream would; what the join decided."""
    clock = CycleClock(LATENESS_MS)
    samples, orphans, delays = [], [], []
    for cycle in cycles:
        clock.begin_cycle({p for p, _ in cycle})
        for partition, events in cycle:
            times = np.array([e[0] for e in events], np.int64)
            clock.observe(partition, times)
            keys = [e[1] for e in events]
            if partition in IMPRESSION_PARTITIONS:
                out = join.advance(impressions(keys, times), None, clock.watermark())
            else:
                out = join.advance(None, labels(keys, times, np.array([e[2] for e in events], np.int8)),
                                   clock.watermark())
            samples += canonical(out.samples)
            orphans += [astuple(o) for o in out.orphans]
            delays += out.delays_ms.tolist()
    decided = {"samples": Counter(samples), "orphans": Counter(orphans), "delays": Counter(delays),
               "counts": asdict(join.counts), "pending": join.pending, "waiting": join.waiting_labels,
               "watermark": join.watermark}
    out = join.advance(None, None, THE_END)  # the rest, as a later watermark decides it
    decided["after the end"] = (Counter(canonical(out.samples)), Counter(astuple(o) for o in out.orphans),
                                asdict(join.counts))
    return decided


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_events_in_other_cycles_and_polls_are_joined_alike(seed):
    parts = partitioned_events(seed)
    first = run(schedule(parts, seed=100), JoinState(POLICY, SCHEMA, block=64))
    for cut in range(101, 105):
        cycles = schedule(parts, seed=cut)
        assert run(cycles, JoinState(POLICY, SCHEMA, block=64)) == first, f"cut {cut}"
        assert run(cycles, DictJoin(POLICY, SCHEMA)) == first, f"cut {cut}, reference"
    # Every kind of outcome was there to differ.
    counts = first["counts"]
    assert counts["positives"] and counts["negatives"] and counts["explicit_negatives"] and counts["corrections"]
    assert counts["late_labels"] and counts["duplicate_labels"] and counts["duplicate_impressions"]
    told = [o for o in first["orphans"] if o[4] is not None]
    assert told and len(told) < counts["orphan_labels"]  # forgotten impressions, and none at all
    assert any(o[1] - o[4] > 2 * WAIT_MS for o in told)  # labels later than 2W are orphans, told so


@pytest.mark.parametrize("seed", [0, 1])
def test_a_label_beyond_the_horizon_is_an_orphan_however_far_the_watermark_trails(seed):
    """In one schedule the label partitions are read first, so their labels find every
    impression still held; in the other they are read last, so the watermark has passed
    every horizon. A label beyond the horizon is an orphan either way."""
    parts = partitioned_events(seed)
    # One cycle, one poll per partition: the partitions one after another.
    labels_first = [[(p, parts[p]) for p in LABEL_PARTITIONS + IMPRESSION_PARTITIONS]]
    impressions_first = [[(p, parts[p]) for p in IMPRESSION_PARTITIONS + LABEL_PARTITIONS]]
    outcomes = [run(cycles, JoinState(POLICY, SCHEMA)) for cycles in (labels_first, impressions_first)]
    assert outcomes[0] == outcomes[1] == run(schedule(parts, seed=7), JoinState(POLICY, SCHEMA))
    beyond = [o for o in outcomes[0]["orphans"] if o[4] is not None and o[1] - o[4] > POLICY.keep_ms]
    assert beyond  # there were such labels, and each is an orphan told of its impression


class _Clock:
    """A wall clock the test moves by hand (seconds)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("idle_after_ms", [0, 60_000])
def test_a_partition_idle_past_idle_after_stops_holding_the_watermark(idle_after_ms):
    """A partition that stops receiving events would stop the join's clock for good (no
    impression would time out): after idle_after of wall-clock time with nothing to read it
    holds the watermark no longer, and holds it again once it has messages; 0 never lets go."""
    clock = _Clock()
    cycles = CycleClock(LATENESS_MS, idle_after_ms=idle_after_ms, wall_clock=clock)
    cycles.begin_cycle({"imp/0", "imp/1"})
    cycles.observe("imp/0", np.array([1_000]))
    cycles.observe("imp/1", np.array([5_000]))
    assert cycles.watermark() == 1_000 - LATENESS_MS
    clock.now = 59.0  # imp/0 has had nothing to read for 59 s: it still holds
    cycles.begin_cycle({"imp/1"})
    cycles.observe("imp/1", np.array([9_000]))
    assert cycles.watermark() == 1_000 - LATENESS_MS
    clock.now = 61.0  # past idle_after
    cycles.begin_cycle({"imp/1"})
    cycles.observe("imp/1", np.array([12_000]))
    assert cycles.watermark() == (12_000 if idle_after_ms else 1_000) - LATENESS_MS
    cycles.begin_cycle({"imp/0", "imp/1"})  # it has messages again: it holds again
    cycles.observe("imp/0", np.array([11_000]))
    assert cycles.watermark() == 11_000 - LATENESS_MS
