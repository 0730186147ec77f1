"""The sample join compares join keys exactly: the hash finds a record, the key itself
(join_ids) confirms it. The hash is unkeyed, so a key can be chosen to share another
user's hash, and must still not land on that user's impression."""

from collections import Counter
from dataclasses import astuple

import numpy as np
import pyarrow as pa
import pytest

from picasso.kernels.hashing import key_of
from picasso.sample_join.join_rules import Impressions, JoinPolicy, Labels, join_ids, join_keys
from picasso.sample_join.join_state import JoinState
from picasso.sample_join.dict_join import ArrowDictJoin
from picasso.sample_join.reference import DictJoin
from test_join_labels import every_bundle_counted  # noqa: F401 - autouse: Beam's counts of every bundle
from test_sample_join import SCHEMA, canonical, random_calls

VICTIM, CRAFTED = "aaaaaaaabbbbbbbb", "WnSYpkMCpr|VGy6A"  # chosen to share one word-wise splitmix64 hash
POLICY = JoinPolicy(wait_ms=1_000, late_labels="correct", horizon_ms=1_000, orphan_grace_ms=500)
JOINS = [JoinState, DictJoin, ArrowDictJoin]


def events(request_ids: list[str], times: list[int], x: list[float] | None = None) -> Impressions:
    """Impressions keyed as a host keys them (join_keys, join_ids); each row's x tells it apart."""
    column = pa.array(request_ids)
    n = len(request_ids)
    x = [float(i) for i in range(n)] if x is None else x
    rows = pa.table({"label": pa.array(np.zeros(n, np.float32)), "x": pa.array(np.asarray(x, np.float32)),
                     "ids": pa.array([[i] for i in range(n)], pa.list_(pa.int64()))}, schema=SCHEMA)
    return Impressions(join_keys([column]), times, rows, ids=join_ids([column]))


def clicks(request_ids: list[str], times: list[int]) -> Labels:
    column = pa.array(request_ids)
    return Labels(join_keys([column]), times, np.ones(len(request_ids), np.int8), refs=list(request_ids),
                  ids=join_ids([column]))


def test_the_two_keys_collide():
    # Without this the tests below would prove nothing.
    assert key_of(VICTIM) == key_of(CRAFTED)
    assert len(set(join_keys([pa.array([VICTIM, CRAFTED])]).tolist())) == 1
    assert join_ids([pa.array([VICTIM, CRAFTED])]).tolist() == [VICTIM, CRAFTED]


@pytest.mark.parametrize("join_class", JOINS)
def test_a_label_of_a_colliding_key_does_not_land_on_another_users_impression(join_class):
    join = join_class(POLICY, SCHEMA)
    join.advance(events([VICTIM], [0], x=[7.0]), None, watermark=0)
    out = join.advance(None, clicks([CRAFTED], [100]), watermark=100)
    assert out.samples.num_rows == 0 and join.pending == 1 and join.waiting_labels == 1
    out = join.advance(None, clicks([VICTIM], [200]), watermark=200)  # the victim's own click joins
    assert [(row["x"], row["label"]) for row in out.samples.to_pylist()] == [(7.0, 1.0)]
    out = join.advance(None, None, watermark=700)  # the crafted click's grace is over: an orphan
    assert [(o.ref, o.forgotten_impression_ms) for o in out.orphans] == [(CRAFTED, None)]
    assert join.counts.positives == 1 and join.counts.duplicate_labels == 0


@pytest.mark.parametrize("join_class", JOINS)
def test_colliding_keys_are_two_impressions_each_joined_by_its_own_label(join_class):
    join = join_class(POLICY, SCHEMA)
    out = join.advance(events([VICTIM, CRAFTED], [0, 10], x=[1.0, 2.0]), clicks([CRAFTED], [50]), watermark=50)
    assert out.counts.duplicate_impressions == 0 and out.counts.impressions == 2
    assert [(row["x"], row["label"]) for row in out.samples.to_pylist()] == [(2.0, 1.0)]
    out = join.advance(None, None, watermark=1_005)  # the victim times out: a negative
    assert [(row["x"], row["label"]) for row in out.samples.to_pylist()] == [(1.0, 0.0)]
    # The same pair again is two duplicates; a late click of each goes to its own impression.
    out = join.advance(events([CRAFTED, VICTIM], [20, 30]), clicks([VICTIM, CRAFTED], [1_010, 1_020]),
                       watermark=1_020)
    assert out.counts.duplicate_impressions == 2 and out.counts.late_labels == 1
    assert out.counts.duplicate_labels == 1  # the crafted key's impression was decided by its first click
    assert [(row["x"], row["label"], row["join_correction"]) for row in out.samples.to_pylist()] == [(1.0, 1.0, 1)]


def test_a_record_forgotten_while_a_colliding_one_is_held_leaves_that_one_found():
    join = JoinState(POLICY, SCHEMA, block=1)
    join.advance(events([VICTIM, CRAFTED], [0, 3_000], x=[1.0, 2.0]), None, watermark=0)
    out = join.advance(None, None, watermark=2_500)  # the victim timed out and is forgotten (keep 2,000)
    assert out.counts.forgotten == 1 and join.remembered == 1
    out = join.advance(None, clicks([CRAFTED, VICTIM], [3_100, 3_100]), watermark=2_600)
    assert [(row["x"], row["label"]) for row in out.samples.to_pylist()] == [(2.0, 1.0)]
    assert join.waiting_labels == 1  # the victim's click: its impression is gone


@pytest.mark.parametrize("saved", [False, True])
def test_colliding_records_survive_compaction_and_checkpoints(saved):
    join = JoinState(POLICY, SCHEMA, block=1)
    fillers = [f"filler-{i}" for i in range(6)]
    join.advance(events(fillers + [VICTIM, CRAFTED], [0] * 6 + [8_000, 9_000], x=list(range(8))), None,
                 watermark=0)
    # The fillers time out and are forgotten; 2 records left of 8 slots: the arrays are compacted.
    out = join.advance(None, None, watermark=5_000)
    assert out.counts.forgotten == 6 and join.remembered == 2
    assert join.ids[:2].tolist() == [VICTIM, CRAFTED]  # renumbered to the first two slots
    if saved:
        join = JoinState.from_files(join.to_files(), SCHEMA, POLICY, block=1)
    out = join.advance(None, clicks([VICTIM, CRAFTED], [8_500, 9_500]), watermark=5_001)
    assert sorted((row["x"], row["label"]) for row in out.samples.to_pylist()) == [(6.0, 1.0), (7.0, 1.0)]


def cut_hashes(calls, buckets: int = 61):
    """The same calls with each key's hash cut to `buckets` values, so that keys collide all the
    time, and the key itself as the id."""
    def ids(keys):
        return [str(k) for k in keys.tolist()]
    out = []
    for imps, labs, watermark in calls:
        if imps is not None:
            imps = Impressions(imps.keys % np.uint64(buckets), imps.times, imps.rows, ids=ids(imps.keys))
        if labs is not None:
            labs = Labels(labs.keys % np.uint64(buckets), labs.times, labs.values, labs.refs, ids=ids(labs.keys))
        out.append((imps, labs, watermark))
    return out


@pytest.mark.parametrize("late", ["drop", "correct"])
def test_with_hashes_that_collide_all_the_time_the_join_decides_as_with_distinct_ones(late):
    policy = JoinPolicy(wait_ms=6_000, late_labels=late, horizon_ms=4_000, orphan_grace_ms=1_500)
    calls = random_calls(3)
    distinct, colliding = JoinState(policy, SCHEMA, block=64), JoinState(policy, SCHEMA, block=64)
    for (imps, labs, watermark), cut in zip(calls, cut_hashes(calls)):
        want, got = distinct.advance(imps, labs, watermark), colliding.advance(*cut)
        assert canonical(got.samples) == canonical(want.samples)
        assert got.counts == want.counts
        # Forgotten impressions are remembered by hash: an orphan's reason may differ, nothing else.
        assert sorted(o.ref for o in got.orphans) == sorted(o.ref for o in want.orphans)
    assert colliding.counts.duplicate_impressions and colliding.counts.positives and colliding.counts.orphan_labels


@pytest.mark.parametrize("join_class", [DictJoin, ArrowDictJoin])
def test_the_dict_joins_compare_keys_as_the_core_does(join_class):
    policy = JoinPolicy(wait_ms=6_000, late_labels="correct", horizon_ms=4_000, orphan_grace_ms=1_500)
    core, other = JoinState(policy, SCHEMA, block=64), join_class(policy, SCHEMA)
    for call in cut_hashes(random_calls(4)):
        got, want = other.advance(*call), core.advance(*call)
        assert canonical(got.samples) == canonical(want.samples)
        assert got.counts == want.counts
        assert Counter(astuple(o) for o in got.orphans) == Counter(astuple(o) for o in want.orphans)


def test_join_ids_are_the_keys_as_text_and_tell_tuples_apart():
    assert join_ids([pa.array(["r1", "r2"])]).tolist() == ["r1", "r2"]
    assert join_ids([pa.array([7, 8])]).tolist() == ["7", "8"]
    assert join_ids([np.array([7], np.int64)]).tolist() == ["7"]
    assert join_ids([pa.chunked_array([["a"], ["b"]])]).tolist() == ["a", "b"]
    pairs = join_ids([pa.array(["a", "ab", "é"]), pa.array(["bc", "c", ":"])]).tolist()
    assert pairs == ["1:a:2:bc", "2:ab:1:c", "1:é:1::"]


def test_bad_join_key_columns_and_ids_are_refused_by_name():
    with pytest.raises(ValueError, match="join key column 1 must hold strings or integers, got double"):
        join_ids([pa.array(["a"]), pa.array([1.5])])
    with pytest.raises(ValueError, match="join key column 0 has 1 missing values"):
        join_ids([pa.array(["a", None])])
    with pytest.raises(ValueError, match="at least one column"):
        join_ids([])
    with pytest.raises(ValueError, match="1 ids for 2 impressions"):
        Impressions(np.array([1, 2], np.uint64), np.array([0, 1]), events(["a", "b"], [0, 1]).rows, ids=["a"])
    with pytest.raises(ValueError, match="3 ids for 1 labels"):
        Labels(np.array([1], np.uint64), np.array([0]), np.array([1], np.int8), ids=["a", "b", "c"])


def test_the_beam_host_keys_its_state_by_the_key_itself_as_the_core_compares_it():
    from test_join_labels import SCHEMA as BEAM_SCHEMA, THE_END, Step, run_both

    def beam_events(request_ids, times):
        n = len(request_ids)
        rows = pa.table({"label": pa.array(np.zeros(n, np.float32)), "x": pa.array(np.arange(n, dtype=np.float32)),
                         "n": pa.array(range(n), pa.int64()), "ids": pa.array([[i] for i in range(n)],
                                                                              pa.list_(pa.int64()))},
                        schema=BEAM_SCHEMA)
        column = pa.array(request_ids)
        return Impressions(join_keys([column]), times, rows, ids=join_ids([column]))

    steps = [Step(beam_events([VICTIM], [0]), watermark=0), Step(labels=clicks([CRAFTED], [100]), watermark=100),
             Step(labels=clicks([VICTIM], [200]), watermark=200), Step(watermark=700),
             Step(beam_events([CRAFTED], [800]), clicks([CRAFTED], [2_500]), watermark=800),
             Step(watermark=THE_END)]
    counts = run_both(POLICY, steps)  # the host emits what the core emits
    # The victim's click joins the victim; the crafted click at 100 finds no impression of its
    # key within its grace (an orphan at 700), and the one at 2,500 is late for its own.
    assert (counts.positives, counts.negatives, counts.orphan_labels, counts.corrections) == (1, 1, 1, 1)
