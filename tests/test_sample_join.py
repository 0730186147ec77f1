"""The join core (picasso.sample_join.join_state) against its one-event-at-a-time reference, and its
policy on small cases worked by hand."""

import numpy as np
import pyarrow as pa
import pytest

from picasso.sample_join.join_rules import (CORRECTION_COLUMN, DELAY_COLUMN, Impressions, JoinPolicy, Labels, event_watermark,
                                join_keys)
from picasso.sample_join.join_state import JoinState
from picasso.sample_join.reference import DictJoin

SCHEMA = pa.schema([pa.field("label", pa.float32()), pa.field("x", pa.float32()),
                    pa.field("ids", pa.list_(pa.int64()))])


def impressions(keys, times) -> Impressions:
    keys = np.asarray(keys, dtype=np.uint64)
    n = len(keys)
    rows = pa.table({"label": pa.array(np.zeros(n, np.float32)), "x": pa.array(keys.astype(np.float32)),
                     "ids": pa.array([[int(k) % 7, int(k) % 5] for k in keys.tolist()], pa.list_(pa.int64()))},
                    schema=SCHEMA)
    return Impressions(keys, np.asarray(times, dtype=np.int64), rows)


def labels(keys, times, values=None) -> Labels:
    values = np.ones(len(keys), np.int8) if values is None else values
    return Labels(np.asarray(keys, np.uint64), np.asarray(times, np.int64), values,
                  refs=[f"label-{k}-{t}" for k, t in zip(keys, times)])


def canonical(table: pa.Table) -> list[tuple]:
    rows = table.to_pylist()
    return sorted((r["x"], r["label"], r[CORRECTION_COLUMN], r[DELAY_COLUMN], tuple(r["ids"])) for r in rows)


def random_calls(seed: int, n: int = 3000):
    """Calls of (impressions, labels, watermark) from a stream with every kind of event:
    out-of-order times, duplicate impressions and labels, labels beyond W, explicit
    negatives, labels before their impression and labels with none."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.integers(0, 200_000, n))
    keys = rng.permutation(10 * n)[:n].astype(np.uint64) + 1
    times = times + rng.integers(-500, 500, n)  # a little out of order
    imp = [(int(k), int(t)) for k, t in zip(keys, times)]
    imp += [imp[i] for i in rng.integers(0, n, n // 20)]  # duplicates
    clicked = rng.random(n) < 0.3
    delays = rng.exponential(5_000, n).astype(np.int64) - 300
    lab = [(int(k), int(t + d), int(rng.random() > 0.05)) for k, t, d, c in zip(keys, times, delays, clicked) if c]
    lab += [lab[i] for i in rng.integers(0, len(lab), len(lab) // 10)]  # duplicate labels
    lab += [(int(k), int(t), 1) for k, t in zip(rng.integers(10**9, 2 * 10**9, 60), rng.integers(0, 200_000, 60))]
    events = [(t, 0, k, t, 0) for k, t in imp] + [(t, 1, k, t, v) for k, t, v in lab]
    events.sort(key=lambda e: e[0] + rng.integers(-2_000, 2_000))
    calls, i = [], 0
    while i < len(events):
        chunk = events[i:i + int(rng.integers(1, 200))]
        i += len(chunk)
        newest = max(e[0] for e in events[:i])
        watermark = newest - int(rng.integers(0, 3_000)) if rng.random() < 0.8 else None
        imps = [(e[2], e[3]) for e in chunk if e[1] == 0]
        labs = [(e[2], e[3], e[4]) for e in chunk if e[1] == 1]
        calls.append((
            impressions([k for k, _ in imps], [t for _, t in imps]) if imps else None,
            labels([k for k, _, _ in labs], [t for _, t, _ in labs], np.array([v for *_, v in labs], np.int8))
            if labs else None,
            watermark,
        ))
    calls.append((None, None, 10**9))  # the end: every impression decided, every orphan out
    return calls


@pytest.mark.parametrize("late", ["drop", "correct"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_core_equals_the_reference_call_by_call(late, seed):
    policy = JoinPolicy(wait_ms=6_000, late_labels=late, horizon_ms=4_000, orphan_grace_ms=1_500)
    core, reference = JoinState(policy, SCHEMA, block=64), DictJoin(policy, SCHEMA)
    for imps, labs, watermark in random_calls(seed):
        got, want = core.advance(imps, labs, watermark), reference.advance(imps, labs, watermark)
        assert canonical(got.samples) == canonical(want.samples)
        assert got.counts == want.counts
        assert sorted(got.delays_ms.tolist()) == sorted(want.delays_ms.tolist())
        assert [(o.key, o.time_ms, o.ref) for o in got.orphans] == [(o.key, o.time_ms, o.ref) for o in want.orphans]
    counts = core.counts
    assert counts.positives and counts.negatives and counts.late_labels and counts.orphan_labels
    assert counts.duplicate_impressions and counts.duplicate_labels and counts.explicit_negatives
    assert counts.positives + counts.negatives == counts.impressions  # each impression once
    assert counts.corrections == (counts.late_labels if late == "correct" else 0)
    assert core.pending == 0 and core.remembered == 0 and core.waiting_labels == 0


def test_a_checkpointed_state_goes_on_as_if_never_saved():
    policy = JoinPolicy(wait_ms=6_000, late_labels="correct", horizon_ms=4_000, orphan_grace_ms=1_500)
    calls = random_calls(7)
    straight, saved = JoinState(policy, SCHEMA, block=64), JoinState(policy, SCHEMA, block=64)
    for i, (imps, labs, watermark) in enumerate(calls):
        if i % 25 == 10:
            saved = JoinState.from_files(saved.to_files(), SCHEMA, policy, block=64)
        got, want = saved.advance(imps, labs, watermark), straight.advance(imps, labs, watermark)
        assert got.samples.equals(want.samples)
        assert got.counts == want.counts and got.orphans == want.orphans
    assert saved.counts == straight.counts


def test_the_policy_by_hand():
    policy = JoinPolicy(wait_ms=10, late_labels="correct", horizon_ms=20, orphan_grace_ms=5)
    state = JoinState(policy, SCHEMA)
    # 1 is clicked in time; 2's click is 29 ms late; 3 comes twice; 9's label has no impression yet.
    out = state.advance(impressions([1, 2, 3, 3], [0, 1, 2, 2]), labels([1, 9], [5, 6]), watermark=3)
    assert canonical(out.samples) == [(1.0, 1.0, 0, 5, (1, 1))]
    assert out.counts.duplicate_impressions == 1 and state.pending == 2 and state.waiting_labels == 1
    # The watermark passes 2's time + W: a negative (with no label: it timed out), then at
    # once its correction.
    out = state.advance(None, labels([2], [30]), watermark=12)
    assert canonical(out.samples) == [(2.0, 0.0, 0, -1, (2, 2)), (2.0, 1.0, 1, 29, (2, 2))]
    assert [o.ref for o in out.orphans] == ["label-9-6"]  # waited past 6 + 5 for its impression
    out = state.advance(None, None, watermark=13)  # 3 times out: a negative with no label
    assert canonical(out.samples) == [(3.0, 0.0, 0, -1, (3, 3))]
    out = state.advance(None, labels([3, 1], [14, 15]), watermark=14)  # late for 3, duplicate for 1
    assert canonical(out.samples) == [(3.0, 1.0, 1, 12, (3, 3))]
    assert out.counts.late_labels == 1 and out.counts.duplicate_labels == 1
    state.advance(None, None, watermark=10**6)
    assert state.remembered == 0 and state.counts.forgotten == 3


def test_an_orphan_is_told_whether_its_impression_came_and_was_forgotten():
    policy = JoinPolicy(wait_ms=10, late_labels="correct", horizon_ms=10, orphan_grace_ms=5)  # keep 20, recall 40
    state = JoinState(policy, SCHEMA)
    state.advance(impressions([1, 2, 3], [0, 0, 0]), None, watermark=11)  # three negatives
    # 1's click is 25 ms late: beyond the horizon, though 1 is still held (the watermark
    # trails at 11); 7's click has no impression at all.
    out = state.advance(None, labels([1, 7], [25, 25]), watermark=12)
    assert out.samples.num_rows == 0 and state.waiting_labels == 2 and state.remembered == 3
    out = state.advance(None, None, watermark=31)  # 1, 2 and 3 forgotten; both labels' grace over
    assert [(o.key, o.forgotten_impression_ms) for o in out.orphans] == [(1, 0), (7, None)]
    # 2's click comes after 2 was forgotten: told so; 3's, past twice the horizon: not told.
    out = state.advance(None, labels([2, 3], [30, 41]), watermark=47)
    assert [(o.key, o.forgotten_impression_ms) for o in out.orphans] == [(2, 0), (3, None)]
    assert state.counts.orphan_labels == 4 and state.counts.late_labels == 0


def test_every_label_of_a_key_waits_and_those_within_the_first_ones_grace_are_its_duplicates():
    policy = JoinPolicy(wait_ms=10, late_labels="correct", horizon_ms=10, orphan_grace_ms=5)
    state = JoinState(policy, SCHEMA)
    # 5's labels all come before 5: at 2, at 3 (a duplicate of it) and at 40 (beyond the
    # horizon of an impression at 4, and so no duplicate of the one that joins).
    state.advance(None, labels([5, 5, 5], [2, 3, 40]), watermark=None)
    assert state.waiting_labels == 3
    out = state.advance(impressions([5], [4]), None, watermark=4)
    assert canonical(out.samples) == [(5.0, 1.0, 0, -2, (5, 0))] and out.counts.duplicate_labels == 1
    out = state.advance(None, None, watermark=46)
    assert [(o.key, o.time_ms, o.forgotten_impression_ms) for o in out.orphans] == [(5, 40, 4)]
    # A key never impressed: its first label is the orphan, the next within its grace a duplicate.
    out = state.advance(None, labels([8, 8, 8], [50, 53, 60]), watermark=47)
    out = state.advance(None, None, watermark=70)
    assert [o.time_ms for o in out.orphans] == [50, 60] and out.counts.duplicate_labels == 1


def test_an_explicit_negative_beyond_w_decides_nothing():
    state = JoinState(JoinPolicy(wait_ms=10, late_labels="correct"), SCHEMA)
    out = state.advance(impressions([1], [0]), labels([1, 1], [12, 15], np.array([0, 1], np.int8)), watermark=5)
    assert out.samples.num_rows == 0 and out.counts.duplicate_labels == 1 and out.counts.explicit_negatives == 0
    out = state.advance(None, None, watermark=11)  # the timeout's negative, then the click at 15 is late
    assert canonical(out.samples) == [(1.0, 0.0, 0, -1, (1, 1)), (1.0, 1.0, 1, 15, (1, 1))]


def test_drop_counts_late_labels_and_emits_nothing_for_them():
    state = JoinState(JoinPolicy(wait_ms=10, late_labels="drop"), SCHEMA)
    state.advance(impressions([1], [0]), None, watermark=11)
    out = state.advance(None, labels([1, 1], [15, 16]), watermark=12)
    assert out.samples.num_rows == 0 and out.counts.late_labels == 1 and out.counts.duplicate_labels == 1


def test_an_explicit_negative_decides_at_once():
    state = JoinState(JoinPolicy(wait_ms=10), SCHEMA)
    out = state.advance(impressions([1], [0]), labels([1], [2], np.array([0], np.int8)), watermark=None)
    assert canonical(out.samples) == [(1.0, 0.0, 0, 2, (1, 1))] and out.counts.explicit_negatives == 1


def test_a_label_before_its_impression_joins_it():
    state = JoinState(JoinPolicy(wait_ms=10, orphan_grace_ms=100), SCHEMA)
    state.advance(None, labels([4], [3]), watermark=2)
    out = state.advance(impressions([4], [1]), None, watermark=5)
    assert canonical(out.samples) == [(4.0, 1.0, 0, 2, (4, 4))] and state.waiting_labels == 0


def test_the_watermark_never_goes_back():
    state = JoinState(JoinPolicy(wait_ms=10), SCHEMA)
    state.advance(impressions([1], [0]), None, watermark=5)
    state.advance(None, None, watermark=3)
    assert state.watermark == 5


def test_bad_policies_are_refused_with_every_reason():
    with pytest.raises(ValueError) as err:
        JoinPolicy(wait_ms=-1, late_labels="keep", orphan_grace_ms=-3)
    assert "label wait" in str(err.value) and "late labels" in str(err.value) and "orphan grace" in str(err.value)


def test_join_keys_depend_on_every_field_and_their_order():
    a = join_keys([pa.array(["r1", "r1", "r2"]), pa.array([7, 8, 7])])
    assert len(set(a.tolist())) == 3
    b = join_keys([pa.array([7, 8, 7]), pa.array(["r1", "r1", "r2"])])
    assert not set(a.tolist()) & set(b.tolist())
    assert join_keys([pa.array(["r1"])])[0] == join_keys([pa.array(["r1", "x"])])[0]  # a pure function of the row


def test_event_watermark_is_the_oldest_partition_less_the_lateness():
    assert event_watermark({"a/0": 100, "b/0": 40}, 10) == 30
    assert event_watermark({}, 10) is None
