"""The churn data set (picasso.connectors.synthetic.churn, `picasso generate --churn`): item ids that
arrive all the time and fade, in an id space no table can hold, carrying most of the
signal."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import yaml
from test_cli import run_cli

from picasso.builtin_specs import CHURN_CAPACITY, builtin_spec, churn_spec
from picasso.connectors.day_files import list_day_files, read_chunks
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.metrics import auc
from picasso.pipelines.cli import main as cli
from picasso.pipelines.runs.generate import dates_from, first_position, generate_days
from picasso.spec import FeatureSpec, SparseField, SpecError
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.connectors.synthetic.churn import ChurnConfig, ChurnModel

ROWS = 100_000  # a day, as ChurnConfig's defaults assume
DAYS = 10
DATES = dates_from("2026-11-01", DAYS)
SPEC = churn_spec()
CONFIG = ChurnConfig()


@pytest.fixture(scope="module")
def model() -> ChurnModel:
    return ChurnModel(SPEC, CONFIG)


@pytest.fixture(scope="module")
def days(model):
    """The ten days' rows, day by day (1,000,000 rows: a few seconds)."""
    return [model.draw(first_position(date, ROWS), ROWS) for date in DATES]


def test_same_seed_same_rows_and_a_row_is_its_position(model):
    start = first_position(DATES[0], ROWS)
    table, p = model.sample(start, 5_000)
    again, p_again = ChurnModel(SPEC, CONFIG).sample(start, 5_000)
    assert table.equals(again) and np.array_equal(p, p_again)
    # A row depends on its position alone, not on the range it is drawn in.
    head, _ = model.sample(start, 2_000)
    tail, p_tail = model.sample(start + 2_000, 3_000)
    assert pa.concat_tables([head, tail]).equals(table) and np.array_equal(p_tail, p[2_000:])
    other, _ = ChurnModel(SPEC, ChurnConfig(seed=1)).sample(start, 5_000)
    assert not other.column("item").equals(table.column("item"))
    assert table.schema.names == ["label", "user_activity", "page_depth", "segment", "context", "item"]


def test_the_stream_continues_across_dates_new_items_arrive_and_old_ones_fade(model, days):
    assert first_position(DATES[1], ROWS) == first_position(DATES[0], ROWS) + ROWS
    first, second = days[0], days[1]
    day2_start = first_position(DATES[1], ROWS)
    seen_day1 = set(first.table.column("item").to_numpy())
    ids, index = second.table.column("item").to_numpy(), second.item_index
    born_day2 = (index >= 0) & (model.born_at(index) >= day2_start)
    new = ~np.isin(ids, list(seen_day1))
    # Day 2 is full of items born that day, which day 1 never saw...
    assert born_day2.sum() > 0.05 * ROWS and new[born_day2].all()
    assert len(np.unique(ids[born_day2])) > 1_000
    # ... while the items of day 1's first hours are all but gone by day 2's end.
    early = np.unique(first.item_index[:ROWS // 4])
    early = early[early >= 0]  # the popular items never fade
    late = index[-ROWS // 4:]
    assert np.isin(late, early).mean() < 0.03
    assert np.isin(first.item_index[ROWS // 4: ROWS // 2], early).mean() > 0.2


def test_the_stream_is_steady_from_position_0(model, days):
    start = model.draw(0, ROWS)
    churning = start.item_index[start.item_index >= 0]
    assert np.unique(churning, return_counts=True)[1].max() < 0.002 * ROWS  # no item takes the early rows
    distinct = [len(np.unique(d.table.column("item").to_numpy())) for d in (start, days[0])]
    assert distinct[0] == pytest.approx(distinct[1], rel=0.05)


def test_distinct_items_far_outnumber_the_alive_ones(model, days):
    ids = np.concatenate([d.table.column("item").to_numpy() for d in days])
    distinct = len(np.unique(ids))
    alive = CONFIG.alive_items()
    assert 2_000 <= alive <= 5_000  # a few thousand at a time
    assert distinct >= 5 * alive
    # The churn spec's table holds the alive items, not all of them.
    assert alive < CHURN_CAPACITY < distinct / 2
    # alive_items's span does take 95% of the churning impressions.
    positions = first_position(DATES[0], ROWS) + np.arange(DAYS * ROWS)
    index = np.concatenate([d.item_index for d in days])
    churning = index >= 0
    age = positions[churning] - model.born_at(index[churning])
    span = (CONFIG.alive_items() - CONFIG.popular_items) * CONFIG.birth_interval
    share = (age < span).mean()
    assert 0.93 < share < 0.97


def test_ids_are_non_negative_int64_far_beyond_any_table(days):
    items = pa.concat_arrays([d.table.column("item").combine_chunks() for d in days])
    assert items.type == pa.int64()
    ids = items.to_numpy()
    assert ids.min() >= 0 and ids.max() > 2**40
    index = np.concatenate([d.item_index for d in days])
    # The scramble is a bijection: as many ids as items.
    assert len(np.unique(ids)) == len(np.unique(index))


def test_the_ceiling_is_high_and_mostly_the_item_effect(days):
    labels = np.concatenate([d.table.column("label").to_numpy() for d in days])
    p = np.concatenate([d.probabilities for d in days])
    item = np.concatenate([d.item_logit for d in days])
    assert 0.2 < labels.mean() < 0.3
    ceiling = auc(labels, p)
    without_item = auc(labels, 1 / (1 + np.exp(-(np.log(p / (1 - p)) - item))))
    assert ceiling > 0.75
    assert 0.5 < without_item < ceiling - 0.12
    assert item.var() > 3 * (np.log(p / (1 - p)) - item).var()


def test_item_effects_are_a_function_of_the_id(model, days):
    ids = days[0].table.column("item").to_numpy()
    assert np.array_equal(model.item_effect(ids), days[0].item_logit)
    assert model.item_effect(ids).std() == pytest.approx(CONFIG.sigma, rel=0.1)


def test_parts_continue_the_stream_and_record_the_planted_model(tmp_path, model):
    result = generate_days(SPEC, tmp_path, DATES[:2], rows=3_000, rows_per_file=1_000, churn=CONFIG)
    assert [d.files for d in result] == [3, 3]
    for date in DATES[:2]:
        parts = sorted(list_day_files(tmp_path, date))
        table = pa.concat_tables(chunk.records for path in parts for chunk in read_chunks(path, 10_000))
        assert table.equals(model.sample(first_position(date, 3_000), 3_000)[0])
    planted = json.loads((tmp_path / f"date={DATES[1]}" / "_planted.json").read_text())
    assert planted["spec"] == "churn" and planted["churn"]["lifetime"] == CONFIG.lifetime
    assert planted["auc_ceiling"] == result[1].auc_ceiling > 0.7


def test_the_planted_model_writes_dynamic_fields_too():
    table, _ = PlantedModel(SPEC).sample(500, 0)
    assert pa.types.is_string(table.column("item").type)  # a dynamic field takes strings
    decoded = RecordDecoder(SPEC).decode_table(table, "planted")
    assert decoded.table.num_rows == 500 and not decoded.dead_letters


def test_cli_writes_partitions_the_decoders_read(tmp_path):
    out = tmp_path / "churn"
    done = run_cli("generate", "--churn", "--out", str(out), "--start-date", "2026-11-01", "--days", "2",
                   "--rows", "4000", "--rows-per-file", "2000", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert [d["date"] for d in summary["days"]] == ["2026-11-01", "2026-11-02"]
    assert all(d["auc_ceiling"] > 0.7 and d["files"] == 2 for d in summary["days"])
    assert json.loads((out / "date=2026-11-02" / "_planted.json").read_text())["spec"] == "churn"
    for spec in (SPEC, builtin_spec("churn:hashed")):  # the dynamic table, and the fixed baseline
        decoder = RecordDecoder(spec)
        for path in list_day_files(out, "2026-11-02"):
            for chunk in read_chunks(path, 10_000):
                decoded = decoder.decode_table(chunk.records, path)
                assert decoded.table.num_rows == 2_000 and not decoded.dead_letters


def test_the_hashed_baseline_has_the_same_rows():
    hashed = churn_spec(hashed=True)
    assert hashed.sparse_field("item").num_rows == SPEC.sparse_field("item").num_rows == CHURN_CAPACITY + 1
    assert hashed.sparse_field("item").hashed and SPEC.dynamic_fields == [SPEC.sparse_field("item")]
    assert [f.name for f in hashed.sparse] == SPEC.sparse_names


def _vocab_item_spec(tmp_path) -> str:
    path = tmp_path / "vocab.yaml"
    path.write_text(yaml.safe_dump({"label": "label", "sparse": [
        {"name": "item", "embedding_dim": 8, "vocab_size": 1000}]}))
    return str(path)


@pytest.mark.parametrize("flags, message", [
    (["--spec", "criteo"], "has no sparse field 'item'"),
    (["--spec", "VOCAB"], "field 'item' must be one-hot, with hash_buckets or dynamic"),
    (["--events"], "--churn writes labelled rows"),
])
def test_cli_refuses_what_the_churn_model_cannot_write(tmp_path, capsys, flags, message):
    flags = [_vocab_item_spec(tmp_path) if flag == "VOCAB" else flag for flag in flags]
    code = cli.main(["generate", "--churn", "--out", str(tmp_path / "out"), "--rows", "100", "--json", *flags])
    assert code == 2
    assert message in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert not (tmp_path / "out").exists()


def test_the_model_refuses_bags_and_bad_knobs():
    bags = FeatureSpec(label="label", dense=(), sparse=(
        *SPEC.sparse, SparseField("recent", embedding_dim=8, hash_buckets=10, max_len=3)))
    with pytest.raises(SpecError, match="recent are multi-hot"):
        ChurnModel(bags)
    with pytest.raises(ValueError, match="lifetime"):
        ChurnConfig(lifetime=0)
