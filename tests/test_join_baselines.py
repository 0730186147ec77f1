"""benchmarks.join's baselines join as picasso's join does: the competent dict join
(picasso.sample_join.dict_join: rows left in Arrow, one take per call) and the reference join
(picasso.sample_join.reference: rows as Python dicts)."""

from collections import Counter
from dataclasses import astuple

import pytest

from picasso.sample_join.join_rules import JoinPolicy
from picasso.sample_join.join_state import JoinState, sample_schema
from picasso.sample_join.dict_join import ArrowDictJoin
from picasso.sample_join.reference import DictJoin
from test_sample_join import SCHEMA, canonical, impressions, labels, random_calls


@pytest.mark.parametrize("join_class", [ArrowDictJoin, DictJoin])
@pytest.mark.parametrize("late", ["drop", "correct"])
@pytest.mark.parametrize("seed", [5, 6])
def test_a_baseline_emits_the_samples_of_picassos_join_call_by_call(join_class, late, seed):
    policy = JoinPolicy(wait_ms=6_000, late_labels=late, horizon_ms=4_000, orphan_grace_ms=1_500)
    core, baseline = JoinState(policy, SCHEMA, block=64), join_class(policy, SCHEMA)
    for imps, labs, watermark in random_calls(seed):
        got, want = baseline.advance(imps, labs, watermark), core.advance(imps, labs, watermark)
        assert got.samples.schema == sample_schema(SCHEMA)
        assert canonical(got.samples) == canonical(want.samples)
        keys = [Counter(out.samples.column("join_key").to_pylist()) for out in (got, want)]
        assert keys[0] == keys[1]
        assert got.counts == want.counts
        assert Counter(astuple(o) for o in got.orphans) == Counter(astuple(o) for o in want.orphans)
        assert sorted(got.delays_ms.tolist()) == sorted(want.delays_ms.tolist())
    assert baseline.counts == core.counts and baseline.counts.positives and baseline.counts.negatives


def test_the_dict_join_lets_a_table_go_once_no_record_needs_its_rows():
    for late in ("drop", "correct"):
        join = ArrowDictJoin(JoinPolicy(wait_ms=10, late_labels=late, horizon_ms=100), SCHEMA)
        join.advance(impressions([1, 2, 3], [0, 0, 0]), labels([1], [5]), watermark=5)
        assert join.arrow_bytes > 0  # 2 and 3 wait
        out = join.advance(None, None, watermark=11)  # 2 and 3 time out: negatives
        assert out.counts.negatives == 2 and len(join.records) == 3  # remembered to their horizon
        if late == "drop":
            assert join.arrow_bytes == 0  # no sample will need a row
            continue
        assert join.arrow_bytes > 0  # a late click would need its negative's row
        out = join.advance(None, labels([2, 3], [20, 21]), watermark=21)
        assert canonical(out.samples) == [(2.0, 1.0, 1, 20, (2, 2)), (3.0, 1.0, 1, 21, (3, 3))]
        assert join.arrow_bytes == 0
