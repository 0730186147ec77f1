"""The hot-row cache and interleaving: training with them computes exactly what training
without them computes (through refreshes, checkpoints and a memory-mapped big tier); the
directory caches the hottest rows and follows drift; bad capacities are refused."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch

from picasso import kernels
from picasso.cache import CacheConfig, parse_capacity
from picasso.frequency import DecayedSketch
from picasso.hot_rows import HotRowDirectory
from picasso.interleave import SWITCH_INTERVAL_S, StepPipeline
from picasso.trainer import Trainer

from helpers import planted_batches
from test_trainer import CONFIG, SPEC, assert_state_equal

# Small enough that every batch misses and refreshes evict.
SMALL_CACHE = CacheConfig(capacity="10%", refresh_every=3)


def assert_close_to(reference: Trainer, other: Trainer, tolerance: float = 1e-6) -> None:
    expected, actual = reference.state()["model"], other.state()["model"]
    assert set(expected) == set(actual)
    for name in expected:
        assert torch.allclose(expected[name].float(), actual[name].float(), atol=tolerance, rtol=0), name
    for (name, a), b in zip(reference.model.named_parameters(), other.model.parameters()):
        assert torch.allclose(a, b, atol=tolerance, rtol=0), name
    assert (reference.step, reference.samples, reference.positions) == (other.step, other.samples, other.positions)


@pytest.fixture(scope="module")
def batches():
    return planted_batches(SPEC, rows=30 * 64, batch_size=64)[0]


@pytest.mark.parametrize("sparse_optimizer, embedding_l2", [("adagrad", 0.0), ("adam", 0.0), ("sgd", 0.0),
                                                             ("adagrad", 0.05)])
@pytest.mark.parametrize("interleave", [False, True])
def test_cached_training_equals_uncached(batches, sparse_optimizer, embedding_l2, interleave):
    """With L2 on embedding rows too: a staged row decays in the fast tier as in the table."""
    config = replace(CONFIG, sparse_optimizer=sparse_optimizer, embedding_l2=embedding_l2)
    plain = Trainer(SPEC, replace(config, interleave=False))
    plain.train(batches)
    cached = Trainer(SPEC, replace(config, cache=SMALL_CACHE, interleave=interleave))
    cached.train(batches)
    assert_close_to(plain, cached)
    stats = cached.cache.stats
    assert stats.steps == len(batches) and stats.refreshes > 3
    assert 0 < stats.hits < stats.lookups  # some rows hot, some staged
    assert stats.rows_moved > 0 and stats.bytes_moved > stats.rows_moved
    # Refreshes evicted: some rows that were hot once are not any more.
    directory = cached.cache.directories["dim8"]
    assert directory.free_slots == 0


def test_cache_and_interleaving_give_the_same_predictions(batches):
    plain = Trainer(SPEC, replace(CONFIG, interleave=False))
    plain.train(batches[:20])
    cached = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    cached.train(batches[:20])
    for batch in batches[20:]:
        assert torch.allclose(torch.from_numpy(plain.predict(batch)), torch.from_numpy(cached.predict(batch)), atol=1e-6)
    # predicting moved no weight: training goes on exactly alike
    plain.train(batches[20:])
    cached.train(batches[20:])
    assert_close_to(plain, cached)


def test_checkpoint_with_a_cache_restores_exactly(batches, tmp_path):
    plain = Trainer(SPEC, replace(CONFIG, interleave=False))
    plain.train(batches)

    first = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    first.train(batches[:13])  # stops between two refreshes
    path = first.save_checkpoint(tmp_path / "ckpt")
    hot_before = {name: d.row_of_slot.clone() for name, d in first.cache.directories.items()}

    resumed = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE, seed=5))
    resumed.restore(path)
    for name, directory in resumed.cache.directories.items():  # the hot set came back with its rows
        assert torch.equal(directory.row_of_slot, hot_before[name])
    resumed.train(batches[13:])
    assert_close_to(plain, resumed)

    # A checkpoint is the same with the cache on or off: it restores into either.
    uncached = Trainer(SPEC, replace(CONFIG, seed=9))
    uncached.restore(path)
    uncached.train(batches[13:])
    assert_close_to(plain, uncached)
    plain_path = Trainer(SPEC, CONFIG).save_checkpoint(tmp_path / "plain")
    cached_from_plain = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    cached_from_plain.train(batches[:5])  # a hot set, whose rows the restore must re-read
    cached_from_plain.restore(plain_path)
    fresh = Trainer(SPEC, CONFIG)
    assert_state_equal(fresh.model.state_dict(), cached_from_plain.state()["model"], "model")


def test_memory_mapped_big_tier_trains_exactly(batches, tmp_path):
    plain = Trainer(SPEC, replace(CONFIG, interleave=False))
    plain.train(batches)
    cached = Trainer(SPEC, replace(CONFIG, cache=replace(SMALL_CACHE, big_tier_dir=str(tmp_path / "big"))))
    cached.train(batches)
    files = list((tmp_path / "big").iterdir())
    assert len(files) == 2 * 2 * 2  # two embeddings x two groups x (table, adagrad slot)
    table = cached.model.embedding.tables["dim8"]
    assert table.untyped_storage().nbytes() == table.numel() * 4  # backed by its file, not a copy
    assert_close_to(plain, cached)


def test_performance_metrics_report_cache_and_stages(batches):
    trainer = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    trainer.train(batches[:6])
    metrics = trainer.performance_metrics()
    for stage in ("source", "prepare", "wait", "install", "compute", "commit", "refresh"):
        assert metrics[f"{stage}_s_per_step"] >= 0
    assert metrics["compute_s_per_step"] > 0 and metrics["prepare_s_per_step"] > 0
    assert 0 < metrics["cache_hit_rate"] < 1 and metrics["cache_steps"] == 6


# -- the directory and the sketch -------------------------------------------------------------


def observe(directory: HotRowDirectory, ids: list[int]) -> None:
    directory.observe(*kernels.map_to_slots(torch.tensor(ids), directory.slot_of_row, directory.capacity)[1:])
    if directory.refresh_due:
        directory.plan_refresh()


def test_directory_caches_the_hottest_rows_and_moves_their_counts():
    directory = HotRowDirectory(num_rows=1000, capacity=4, refresh_every=5, half_life=1e9)
    observe(directory, [900, 901, 902, 903])  # a cold start fills the slots with what comes first
    observe(directory, [1])
    assert set(directory.row_of_slot.tolist()) == {900, 901, 902, 903}
    for _ in range(20):
        observe(directory, [1, 1, 1, 2, 2, 3, 3, 4, 4, 900])
    directory.plan_refresh()
    assert set(directory.row_of_slot.tolist()) == {1, 2, 3, 4}
    slot = int(directory.slot_of_row[1])
    assert directory.counts[slot] >= 60  # the count moved with the row (sketch: never under)
    assert int(directory.slot_of_row[900]) == -1 and directory.threshold > 0


def test_directory_follows_a_drifting_hot_set():
    directory = HotRowDirectory(num_rows=10_000, capacity=10, refresh_every=10, half_life=50)
    for _ in range(300):
        observe(directory, list(range(10)) * 5 + list(range(100, 200)))
    assert set(directory.row_of_slot.tolist()) == set(range(10))
    for _ in range(300):  # the hot set moves to new rows
        observe(directory, list(range(5000, 5010)) * 5 + list(range(100, 200)))
    assert set(directory.row_of_slot.tolist()) == set(range(5000, 5010))


def test_directory_state_round_trips():
    directory = HotRowDirectory(num_rows=100, capacity=5, refresh_every=2)
    for i in range(7):
        observe(directory, [i, i, 50, 51])
    observe(directory, directory.row_of_slot.tolist())  # hits only: every cached count rises, no refresh
    other = HotRowDirectory(num_rows=100, capacity=5, refresh_every=2)
    other.load_state_dict(directory.state_dict())
    assert torch.equal(other.slot_of_row, directory.slot_of_row) and torch.equal(other.counts, directory.counts)
    # Hits raise the cached counts after a refresh; the admission line stays where that
    # refresh drew it, in both, so both go on to admit the same rows at the same steps.
    assert directory.free_slots == 0 and directory.threshold < float(directory.counts.min())
    assert other.threshold == directory.threshold
    for i in range(7, 20):
        observe(directory, [i, i, 50, 51])
        observe(other, [i, i, 50, 51])
        assert torch.equal(other.row_of_slot, directory.row_of_slot) and other.threshold == directory.threshold
    with pytest.raises(ValueError, match="holds 5 slots, this cache has 6"):
        HotRowDirectory(num_rows=100, capacity=6).load_state_dict(directory.state_dict())


def test_sketch_never_undercounts_and_decays():
    generator = torch.Generator().manual_seed(0)
    sketch = DecayedSketch(width=256, depth=4)
    truth = torch.zeros(5000)
    for _ in range(50):  # ten hot rows, 20 lookups each per step, in a uniform tail of 5000
        ids = torch.cat([torch.arange(10).repeat(20), torch.randint(0, 5000, (400,), generator=generator)])
        rows, counts = torch.unique(ids, return_counts=True)
        sketch.add(rows, counts)
        truth.index_add_(0, rows, counts.float())
    rows = torch.arange(5000)
    estimate = sketch.estimate(rows)
    assert (estimate >= truth - 1e-4).all()
    # The hot rows stand out: their estimates are close to the truth, above every tail row's.
    assert torch.allclose(estimate[:10], truth[:10], rtol=0.1)
    assert estimate[:10].min() > estimate[10:].max()
    sketch.decay(0.5)
    assert torch.allclose(sketch.estimate(rows), estimate * 0.5)


# -- bad configuration and failures -------------------------------------------------------------


@pytest.mark.parametrize("text, rows", [("50", 50), ("5%", 500), ("64KiB", 1024), ("1kb", 15), ("1e9", None),
                                        ("200%", 10_000), ("0", 1)])
def test_capacity_in_rows_bytes_or_share(text, rows):
    if rows is None:
        with pytest.raises(ValueError, match="give rows"):
            parse_capacity(text, 10_000, 64)
    else:
        assert parse_capacity(text, 10_000, 64) == rows


@pytest.mark.parametrize("text", ["lots", "-5", "5 rows", "", "10%%"])
def test_bad_capacity_is_refused_with_its_text(text):
    with pytest.raises(ValueError, match="cache capacity"):
        parse_capacity(text, 10_000, 64)


def test_per_group_capacity_overrides_the_default():
    trainer = Trainer(SPEC, replace(CONFIG, cache=CacheConfig(capacity="10%", group_capacity={"dim4": "7"})))
    assert trainer.cache.directories["dim4"].capacity == 7
    assert trainer.cache.directories["dim8"].capacity == 30  # 10% of 300 rows


def test_a_failing_batch_source_surfaces_and_stops_the_worker(batches):
    def source():
        yield from batches[:3]
        raise OSError("source went away")

    trainer = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    with pytest.raises(OSError, match="source went away"):
        trainer.train(source())
    assert trainer.step == 3  # what came before the failure was trained, once


def test_step_pipeline_keeps_the_order_of_parts():
    log = []

    def part(name):
        def run(item):
            log.append((name, item))
            return item
        return run

    for enabled in (False, True):
        for how in ("run", "push"):
            log.clear()
            with StepPipeline(part("prepare"), part("begin"), part("finish"), enabled=enabled) as pipeline:
                if how == "run":
                    results = list(pipeline.run(range(4)))
                else:
                    results = [r for item in range(4) for r in pipeline.push(item)] + pipeline.drain()
            assert results == [0, 1, 2, 3]
            # A step begins only after the previous one finished, and the next batch is
            # prepared only after this one began (a refresh in begin remaps the rows).
            for item in range(1, 4):
                assert log.index(("finish", item - 1)) < log.index(("begin", item))
                assert log.index(("begin", item - 1)) < log.index(("prepare", item))


def test_the_switch_interval_is_short_while_any_pipeline_interleaves():
    default = sys.getswitchinterval()
    with StepPipeline(lambda i: i, lambda i: i, lambda i: i, enabled=False):
        assert sys.getswitchinterval() == default  # nothing runs beside the steps
    first = StepPipeline(lambda i: i, lambda i: i, lambda i: i)
    second = StepPipeline(lambda i: i, lambda i: i, lambda i: i)
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    first.close()
    first.close()  # closing twice gives nothing back twice
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)  # the second still interleaves
    second.close()
    assert sys.getswitchinterval() == default


def test_a_failing_step_surfaces_at_the_next_push():
    def finish(item):
        if item == 1:
            raise RuntimeError("step 1 failed")
        return item

    with StepPipeline(lambda i: i, lambda i: i, finish) as pipeline:
        assert pipeline.push(0) == []
        assert pipeline.push(1) == [0]
        with pytest.raises(RuntimeError, match="step 1 failed"):
            pipeline.push(2)


def test_step_metrics_are_recorded_every_log_interval(batches):
    trainer = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE, log_every=5))
    trainer.train(batches[:12])
    hit_rates = trainer.step_metrics["cache_hit_rate"]
    assert [step for step, _ in hit_rates] == [5, 10]
    assert all(0 <= rate <= 1 for _, rate in hit_rates)
    # A point covers its own interval: the first is the hit rate of the first five steps.
    first_five = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE, log_every=5))
    first_five.train(batches[:5])
    assert hit_rates[0][1] == pytest.approx(first_five.cache.stats.hit_rate)
    assert hit_rates[1][1] != hit_rates[0][1]
    assert all(value > 0 for _, value in trainer.step_metrics["compute_s_per_step"])
    assert all(value > 0 for _, value in trainer.step_metrics["cache_rows_moved_per_step"])


def test_only_dirty_rows_are_written_back(batches):
    trainer = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    trainer.train(batches[:8])
    cache = trainer.cache
    assert any(dirty.any() for dirty in cache.dirty.values())
    trainer.state()  # flushes the dirty rows
    assert not any(dirty.any() for dirty in cache.dirty.values())
    moved = cache.stats.rows_moved
    trainer.state()  # nothing changed since: nothing to write
    assert cache.stats.rows_moved == moved
    trainer.predict(batches[8])  # reading dirties nothing
    assert not any(dirty.any() for dirty in cache.dirty.values())


def test_capacity_for_a_table_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match=r"\['dim9'\]: no such packed table; the tables are \['dim4', 'dim8'\]"):
        Trainer(SPEC, replace(CONFIG, cache=CacheConfig(group_capacity={"dim9": "5"})))


def test_the_model_state_dict_is_current_without_the_trainer(batches):
    plain = Trainer(SPEC, replace(CONFIG, interleave=False))
    plain.train(batches[:10])
    cached = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    cached.train(batches[:10])
    state = cached.model.state_dict()  # flushes dirty hot rows first
    for name, value in plain.model.state_dict().items():
        assert torch.allclose(value.float(), state[name].float(), atol=1e-6), name
    # and loading into the model directly refreshes the fast tier from the tables
    other = Trainer(SPEC, replace(CONFIG, cache=SMALL_CACHE))
    other.train(batches[:3])
    other.model.load_state_dict(state)
    other.dense_optimizer.load_state_dict(cached.dense_optimizer.state_dict())
    other.step = cached.step
    for batch in batches[10:12]:
        assert torch.allclose(torch.from_numpy(other.predict(batch)), torch.from_numpy(cached.predict(batch)))


def test_scoring_while_an_interleaved_step_waits_changes_no_training(batches):
    """Between two pushes of Trainer.pipeline() a step is installed (its missed rows staged
    in the fast tier) and waits to compute. Scoring another batch then stages that batch's
    rows after it, so the step reads and writes back its own rows: training with scoring
    in between is training without it."""
    config = replace(CONFIG, cache=SMALL_CACHE, interleave=True)
    plain, scored = Trainer(SPEC, config), Trainer(SPEC, config)
    for trainer, score in ((plain, False), (scored, True)):
        with trainer.pipeline() as steps:
            for i, batch in enumerate(batches):
                steps.push(batch)
                if score:  # a batch of other rows than the waiting step's
                    trainer.predict(batches[len(batches) - 1 - i])
            steps.drain()
    assert_close_to(plain, scored, tolerance=0.0)
    # Scoring counted no lookup and moved nothing of training's.
    assert scored.cache.stats.lookups == plain.cache.stats.lookups
    assert scored.cache.stats.rows_moved == plain.cache.stats.rows_moved
