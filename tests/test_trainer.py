"""Trainer and checkpoints: restored training continues exactly; checkpoints are atomic;
AUC is exact; training on planted data learns."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

import picasso.checkpoint as checkpoint_module
from picasso.checkpoint import (MARKER, clean_temporaries, latest_checkpoint, load_checkpoint, prune_checkpoints,
                                save_checkpoint)
from picasso.metrics import auc, logloss
from picasso.spec import parse_spec
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

from helpers import brute_force_auc, planted_batches

SPEC = parse_spec(
    {
        "name": "tiny",
        "label": "click",
        "dense": [{"name": "d1", "transform": "log1p"}, {"name": "d2", "transform": "log1p"}],
        "sparse": [
            {"name": "a", "embedding_dim": 8, "hash_buckets": 200},
            {"name": "b", "embedding_dim": 8, "hash_buckets": 100},
            {"name": "c", "embedding_dim": 4, "vocab_size": 50},
            {"name": "d", "embedding_dim": 4, "hash_buckets": 300, "max_len": 3, "pooling": "mean"},
        ],
    }
)
# Bit-exact equivalence is a CPU property (GPU scatter-adds may reorder); pin the CPU
# where the trainer lets one choose a device.
_ON_CPU = {"device": "cpu"} if "device" in {f.name for f in fields(TrainConfig)} else {}
# fp32, not auto: the unit tests hold paths to each other exactly, on every machine alike.
CONFIG = TrainConfig(hidden=(32, 16), lr_dense=1e-2, lr_sparse=0.1, log_every=0, precision="fp32", **_ON_CPU)


def assert_state_equal(a, b, where: str = "state") -> None:
    """Recursive, bit-exact comparison of state dicts (tensors with torch.equal)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.is_sparse:
            a, b = a.to_dense(), b.to_dense()
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            assert_state_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_state_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)), f"{where}: {a!r} != {b!r}"


def assert_trainers_equal(a: Trainer, b: Trainer) -> None:
    params_a, params_b = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    assert set(params_a) == set(params_b)
    for name in params_a:
        assert torch.equal(params_a[name], params_b[name]), f"parameter {name} differs"
    assert_state_equal(a.model.state_dict(), b.model.state_dict(), "model")
    assert_state_equal(a.dense_optimizer.state_dict(), b.dense_optimizer.state_dict(), "dense_optimizer")
    assert (a.step, a.samples, a.positions) == (b.step, b.samples, b.positions)


# -- checkpoint equivalence ------------------------------------------------------------------


@pytest.mark.parametrize("sparse_optimizer", ["adagrad", "adam", "sgd"])
@pytest.mark.parametrize("steps", [1, 4])
def test_train_n_save_restore_train_n_equals_train_2n(steps, sparse_optimizer, tmp_path):
    batches, _ = planted_batches(SPEC, rows=2 * steps * 128, batch_size=128)
    assert len(batches) == 2 * steps
    config = replace(CONFIG, sparse_optimizer=sparse_optimizer)

    straight = Trainer(SPEC, config)
    initial = {k: v.detach().clone() for k, v in straight.model.state_dict().items()}
    straight.train(batches)

    first = Trainer(SPEC, config)
    first.train(batches[:steps])
    path = first.save_checkpoint(tmp_path / "ckpt", metrics={"auc": 0.5})
    del first

    torch.manual_seed(999)  # the global RNG moved on meanwhile
    resumed = Trainer(SPEC, replace(config, seed=7))  # new trainer, different initial weights
    resumed.restore(path)
    assert resumed.step == steps and resumed.samples == steps * 128
    assert resumed.positions == {"day-0": steps * 128}
    assert resumed.restored_from == path
    resumed.train(batches[steps:])

    assert_trainers_equal(straight, resumed)
    assert straight.positions == {"day-0": 2 * steps * 128}
    # and training did move every table (equality above is not of untouched weights)
    state = straight.model.state_dict()
    tables = [name for name in state if ".table_" in name]
    assert tables
    for name in tables:
        assert not torch.equal(state[name], initial[name]), name
    # The tables' optimizer slots (adagrad: one sum per row; adam: two moments) moved with
    # them and are part of the model's state; the MLP's Adam moments are the dense optimizer's.
    slots = [name for name in state if ".slot" in name]
    assert len(slots) == {"adagrad": 1, "adam": 2, "sgd": 0}[sparse_optimizer] * len(tables)
    for name in slots:
        assert state[name].abs().sum() > 0, name
    assert int(state["embedding.steps"]) == 2 * steps
    dense_state = straight.dense_optimizer.state_dict()["state"]
    assert dense_state and all("exp_avg" in s and "exp_avg_sq" in s for s in dense_state.values())


def test_restore_then_predict_matches(tmp_path):
    batches, _ = planted_batches(SPEC, rows=512, batch_size=128)
    trainer = Trainer(SPEC, CONFIG)
    trainer.train(batches[:3])
    path = trainer.save_checkpoint(tmp_path)
    other = Trainer(SPEC, replace(CONFIG, seed=3))
    assert not np.array_equal(other.predict(batches[3]), trainer.predict(batches[3]))
    other.restore(path)
    np.testing.assert_array_equal(other.predict(batches[3]), trainer.predict(batches[3]))


def test_warm_start(tmp_path):
    batches, _ = planted_batches(SPEC, rows=384, batch_size=128)
    root = tmp_path / "ckpts"
    fresh = Trainer(SPEC, CONFIG)
    assert fresh.warm_start(root) is None and fresh.step == 0
    trainer = Trainer(SPEC, CONFIG)
    trainer.train(batches[:1])
    trainer.save_checkpoint(root)
    trainer.train(batches[1:])
    last = trainer.save_checkpoint(root)
    resumed = Trainer(SPEC, CONFIG)
    assert resumed.warm_start(root) == last
    assert_trainers_equal(trainer, resumed)


# -- checkpoint files -----------------------------------------------------------------------


def test_checkpoint_directory_is_complete_and_atomic(tmp_path):
    batches, _ = planted_batches(SPEC, rows=256, batch_size=128)
    root = tmp_path / "ckpts"
    trainer = Trainer(SPEC, CONFIG)
    trainer.train(batches[:1])
    first = Path(trainer.save_checkpoint(root, metrics={"auc": 0.61}))
    trainer.train(batches[1:])
    second = Path(trainer.save_checkpoint(root, metrics={"auc": 0.62}))

    assert first.parent == root and second.parent == root
    assert first.name < second.name
    assert sorted(p.name for p in root.iterdir()) == sorted([first.name, second.name])  # no .tmp-* left
    assert latest_checkpoint(root) == str(second)
    assert {p.name for p in second.iterdir()} == {"state.pt", "positions.json", "spec.yaml", "metrics.json", MARKER}

    checkpoint = load_checkpoint(second)
    assert checkpoint.step == 2 and checkpoint.checkpoint_id == second.name
    assert checkpoint.positions == {"day-0": 256}
    assert json.loads((second / "positions.json").read_text()) == {"day-0": 256}
    assert checkpoint.spec == SPEC
    assert load_spec(second / "spec.yaml") == SPEC
    assert checkpoint.metrics == {"auc": 0.62}
    assert_state_equal(checkpoint.state["model"], trainer.model.state_dict(), "model")

    # Saving at the same step again (only the positions moved: every record of a chunk
    # refused) is a new checkpoint, the latest, and leaves no temporaries.
    trainer.positions = {"day-0": 300}
    third = Path(trainer.save_checkpoint(root))
    assert third not in (first, second) and latest_checkpoint(root) == str(third)
    assert load_checkpoint(third).positions == {"day-0": 300} and load_checkpoint(third).step == 2
    assert sorted(p.name for p in root.iterdir()) == sorted([first.name, second.name, third.name])


def test_latest_checkpoint_ignores_temporaries_and_files(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    trainer = Trainer(SPEC, CONFIG)
    trainer.step = 5
    saved = trainer.save_checkpoint(tmp_path)
    (tmp_path / ".tmp-step-000000000009-deadbeef").mkdir()  # a crashed save
    (tmp_path / "step-000000000010").write_text("not a directory")
    assert latest_checkpoint(tmp_path) == saved
    trainer.step = 12
    later = trainer.save_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path) == later


def test_prune_keeps_the_newest_and_clean_removes_only_temporaries(tmp_path):
    trainer = Trainer(SPEC, CONFIG)
    saved = []
    for step in (1, 2, 2, 3):
        trainer.step = step
        saved.append(trainer.save_checkpoint(tmp_path))
    (tmp_path / ".tmp-step-000000000004-000005-cafe").mkdir()  # a killed save
    prune_checkpoints(tmp_path, keep=2)
    clean_temporaries(tmp_path)
    assert sorted(str(p) for p in tmp_path.iterdir()) == saved[2:]
    assert latest_checkpoint(tmp_path) == saved[3]


def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    trainer = Trainer(SPEC, CONFIG)
    trainer.step = 1
    good = trainer.save_checkpoint(tmp_path)

    real_write = checkpoint_module._write

    def crash_on_metrics(path, data):
        if path.name == "metrics.json":
            raise OSError("disk full")
        real_write(path, data)

    monkeypatch.setattr(checkpoint_module, "_write", crash_on_metrics)
    trainer.step = 2
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [Path(good).name]
    assert latest_checkpoint(tmp_path) == good


@pytest.mark.parametrize("change, named", [({"hidden": (16,)}, "--hidden 32,16 (this run: 16)"),
                                           ({"model": "dlrm"}, "--model wide_deep (this run: dlrm)")])
def test_restore_onto_another_architecture_is_refused_by_flag(change, named, tmp_path):
    trainer = Trainer(SPEC, CONFIG)
    path = trainer.save_checkpoint(tmp_path)
    with pytest.raises(ValueError, match=re.escape(named)):
        Trainer(SPEC, replace(CONFIG, **change)).restore(path)
    # What may change between runs does not stop a restore.
    Trainer(SPEC, replace(CONFIG, lr_dense=0.5, weight_decay=0.1, dropout=0.2, embedding_l2=0.01)).restore(path)


def test_restore_with_a_different_spec_raises(tmp_path):
    trainer = Trainer(SPEC, CONFIG)
    path = trainer.save_checkpoint(tmp_path)
    raw = SPEC.to_dict()
    raw["sparse"][0]["hash_buckets"] = 201
    other = parse_spec(raw)
    with pytest.raises(ValueError, match="spec"):
        Trainer(other, CONFIG).restore(path)
    raw = SPEC.to_dict()
    raw["name"] = "tiny-v2"
    with pytest.raises(ValueError, match="spec"):
        Trainer(parse_spec(raw), CONFIG).restore(path)


def test_checkpoint_never_runs_code(tmp_path):
    """state.pt is read with weights_only=True: a pickled object is refused, not built."""
    trainer = Trainer(SPEC, CONFIG)
    path = Path(trainer.save_checkpoint(tmp_path))
    state = trainer.state()
    state["payload"] = _Exploit()
    torch.save(state, path / "state.pt")
    _Exploit.ran = False
    with pytest.raises(Exception):
        load_checkpoint(path)
    assert _Exploit.ran is False


class _Exploit:
    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran():
    _Exploit.ran = True
    return None


def test_save_checkpoint_function_with_plain_state(tmp_path):
    spec = load_spec("criteo")
    path = save_checkpoint(tmp_path, {"step": 3, "w": torch.arange(4)}, spec, {"f": 9}, {"m": 1})
    checkpoint = load_checkpoint(path)
    assert Path(path).name == "step-000000000003-000001"
    assert checkpoint.spec == spec and checkpoint.positions == {"f": 9} and checkpoint.metrics == {"m": 1}
    assert torch.equal(checkpoint.state["w"], torch.arange(4))


# -- metrics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_auc_matches_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    labels = rng.integers(0, 2, n)
    labels[0], labels[1] = 0, 1  # both classes present
    scores = np.round(rng.random(n), int(rng.integers(0, 3)))  # 1 to 100 distinct values: many ties
    assert auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores), abs=1e-12)


def test_auc_edge_cases():
    assert auc([0, 1], [0.1, 0.9]) == 1.0
    assert auc([1, 0], [0.1, 0.9]) == 0.0
    assert auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5
    assert auc([0, 0, 1], [0.2, 0.7, 0.7]) == pytest.approx(0.75)
    assert math.isnan(auc([1, 1], [0.1, 0.2]))
    assert math.isnan(auc([0, 0], [0.1, 0.2]))
    assert math.isnan(auc([0, 1, 0], [0.1, math.nan, 0.3]))  # a NaN score ranks nothing
    assert math.isnan(auc([0, 1], [math.nan, math.nan]))  # not the 0.5 of a tie
    # only the order matters
    labels = [0, 1, 1, 0, 1]
    scores = np.array([0.1, 0.4, 0.35, 0.8, 0.7])
    assert auc(labels, scores) == auc(labels, np.exp(scores * 10))
    assert auc(labels, scores) == pytest.approx(brute_force_auc(labels, scores))
    # float labels as they come out of a batch
    assert auc(np.array([0.0, 1.0, 1.0], np.float32), [0.3, 0.2, 0.9]) == pytest.approx(0.5)


def test_logloss():
    labels = np.array([1, 0, 1, 0])
    p = np.array([0.9, 0.2, 0.6, 0.4])
    expected = -np.mean(np.log([0.9, 0.8, 0.6, 0.6]))
    assert logloss(labels, p) == pytest.approx(expected)
    assert math.isfinite(logloss([1, 0], [0.0, 1.0]))  # clipped, not infinite


# -- learning -----------------------------------------------------------------------------------


def test_training_on_planted_data_learns():
    batches, _ = planted_batches(SPEC, rows=20_480, batch_size=256, stream=0)
    held_out, probabilities = planted_batches(SPEC, rows=4_000, batch_size=1_000, stream=1, source="day-1")
    trainer = Trainer(SPEC, CONFIG)
    before = trainer.evaluate(held_out)
    stats = trainer.train(batches)
    after = trainer.evaluate(held_out)

    assert stats.steps == len(batches) == trainer.step
    assert stats.samples == 20_480 == trainer.samples
    assert stats.positions == trainer.positions == {"day-0": 20_480}
    assert math.isfinite(stats.mean_loss)
    assert after.samples == 4_000
    labels = np.concatenate([b.data.column("label").to_numpy() for b in held_out])
    ceiling = auc(labels, probabilities)  # the true click probabilities
    assert ceiling > 0.68
    assert after.auc > 0.62, (before, after, ceiling)
    assert after.auc > before.auc + 0.08
    assert after.logloss < before.logloss
    assert abs(after.mean_prediction - after.mean_label) < 0.05


# -- training mode: a step never depends on what the caller did before -------------------------


def _tables_and_slots(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every embedding buffer of the model (tables and their optimizer slots), copied."""
    return {name: value.clone() for name, value in trainer.model.state_dict().items()
            if name.split(".")[0] in trainer.model.lookups}


@pytest.mark.parametrize("before_each_step", ["predict", "evaluate", "eval_mode", "no_grad"])
def test_a_step_after_scoring_steps_the_same_rows_as_a_step_alone(before_each_step):
    """A stream scores each batch before it trains on it: predict once left the model in eval
    mode, and the next step's lookup took the path that steps no row, so only the dense part
    learned. Whatever the caller did before, a step is the same step."""
    batches = planted_batches(SPEC, rows=6 * 128, batch_size=128)[0]
    alone, after_scoring = Trainer(SPEC, CONFIG), Trainer(SPEC, CONFIG)
    initial = _tables_and_slots(alone)
    for batch in batches:
        alone.train_step(batch)
        if before_each_step == "predict":
            after_scoring.predict(batch)
        elif before_each_step == "evaluate":
            after_scoring.evaluate([batch])
        elif before_each_step == "eval_mode":
            after_scoring.model.eval()
        if before_each_step == "no_grad":
            with torch.no_grad():
                after_scoring.train_step(batch)
        else:
            after_scoring.train_step(batch)
    assert_trainers_equal(alone, after_scoring)
    stepped = _tables_and_slots(after_scoring)
    assert all(not torch.equal(initial[name], stepped[name]) for name in initial), \
        [name for name in initial if torch.equal(initial[name], stepped[name])]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_predict_and_evaluate_leave_the_mode_they_found(mode):
    trainer = Trainer(SPEC, CONFIG)
    batch = planted_batches(SPEC, rows=64, batch_size=64)[0][0]
    trainer.model.train(mode == "train")
    trainer.predict(batch)
    trainer.evaluate([batch])
    assert all(module.training == (mode == "train") for module in trainer.model.modules())


@pytest.mark.parametrize("setting", ["plain", "cache", "dropout", "dynamic"])
def test_a_scored_step_gives_the_scores_predict_gives_before_it(setting):
    """A stream's test-then-train scores come from the step's own forward pass where those
    are predict's (plain, with a hot-row cache); with dropout or a dynamic table, predict
    scores first. Either way: predict's scores of the batch before the step, the same step."""
    from picasso.cache import CacheConfig

    spec = SPEC
    config = replace(CONFIG, dropout=0.3) if setting == "dropout" else replace(
        CONFIG, cache=CacheConfig(capacity="20%")) if setting == "cache" else CONFIG
    if setting == "dynamic":
        raw = SPEC.to_dict()
        raw["sparse"].append({"name": "e", "embedding_dim": 4,
                              "dynamic": {"capacity": 60, "admit_after": 1, "evict_after_steps": 2}})
        spec = parse_spec(raw)
    batches, _ = planted_batches(spec, rows=4 * 128, batch_size=128)
    plain = Trainer(spec, config)  # one after the other: each seeds torch's generator (dropout's)
    expected = [(plain.predict(batch), plain.train_step(batch)) for batch in batches]
    scored = Trainer(spec, config)
    for batch, (scores, loss) in zip(batches, expected):
        got_loss, got_scores = scored.train_step_scored(batch)
        assert np.array_equal(got_scores, scores) and got_loss == loss
    assert_state_equal(scored.state()["model"], plain.state()["model"])
