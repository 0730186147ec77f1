"""Regularisation: L2 on the dense weights and on embedding rows, and dropout, from the
training flags to every place the model trains."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
import torch

from picasso.distributed.ps_checkpoint import build_shard
from picasso.models import MODELS
from picasso.models.common import MLP
from picasso.packing import PackingPlan
from picasso.distributed.gba import GBAConfig
from picasso.pipelines.cli import distributed as distributed_cli
from picasso.pipelines.cli.daily import daily_config
from picasso.pipelines.cli.main import build_parser
from picasso.pipelines.cli.stream import stream_config
from picasso.trainer import TrainConfig, Trainer

from helpers import planted_batches, refusal_in_process
from test_trainer import CONFIG, SPEC


def _trained(config: TrainConfig, steps: int = 4) -> Trainer:
    trainer = Trainer(SPEC, config)
    for batch in planted_batches(SPEC, 64 * steps, 64)[0]:
        trainer.train_step(batch)
    return trainer


def _dense_norm(trainer: Trainer) -> float:
    return float(sum(p.detach().pow(2).sum() for p in trainer.model.parameters()))


@pytest.mark.parametrize("settings, named", [
    ({"weight_decay": -1e-4}, "weight_decay"), ({"embedding_l2": float("nan")}, "embedding_l2"),
    ({"dropout": 1.0}, "dropout"), ({"dropout": True}, "dropout"), ({"weight_decay": "0.1"}, "weight_decay"),
])
def test_bad_settings_are_refused_by_name(settings, named):
    with pytest.raises(ValueError, match=named):
        TrainConfig(**settings)


def test_embedding_l2_decays_the_rows_a_step_touches_and_only_those():
    batch = planted_batches(SPEC, 64, 64)[0][0]
    plain, decayed = Trainer(SPEC, CONFIG), Trainer(SPEC, replace(CONFIG, embedding_l2=0.5))
    assert all(o.weight_decay == 0.5 for o in decayed.model.embedding.optimizers.values())
    before = {k: v.clone() for k, v in decayed.model.state_dict().items()}
    assert all(torch.equal(before[k], v) for k, v in plain.model.state_dict().items())  # same start
    plain.train_step(batch)
    decayed.train_step(batch)
    for name, table in decayed.model.embedding.tables.items():
        key = f"embedding.table_{name}"
        touched = (table != before[key]).any(dim=1)
        # The same rows move, and they move differently: the decay is in their step.
        assert torch.equal(touched, (plain.model.state_dict()[key] != before[key]).any(dim=1))
        assert touched.any() and not torch.allclose(table[touched], plain.model.state_dict()[key][touched])


def test_weight_decay_shrinks_the_dense_weights():
    plain = _trained(CONFIG)
    decayed = _trained(replace(CONFIG, weight_decay=1.0))
    assert decayed.dense_optimizer.weight_decay == 1.0
    assert _dense_norm(decayed) < _dense_norm(plain)


def test_dropout_acts_while_training_only_and_keeps_the_checkpoint_layout(tmp_path):
    batch = planted_batches(SPEC, 64, 64)[0][0]
    with_dropout = Trainer(SPEC, replace(CONFIG, dropout=0.5))
    tensors = batch.to_torch()
    with_dropout.model.train()
    with torch.no_grad():
        first, second = with_dropout.model(tensors), with_dropout.model(tensors)
    assert not torch.equal(first, second)  # each pass drops other units
    assert (with_dropout.predict(batch) == with_dropout.predict(batch)).all()  # scoring does not
    # The same state_dict keys: a run without dropout warm-starts one with it.
    plain = _trained(CONFIG)
    restored = Trainer(SPEC, replace(CONFIG, dropout=0.5))
    restored.restore(plain.save_checkpoint(tmp_path))
    assert (restored.predict(batch) == plain.predict(batch)).all()


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_mode_builds_its_model_with_the_dropout(model):
    """TrainConfig.build_model is how the Trainer, a sync rank and a GBA worker build theirs."""
    built = replace(CONFIG, model=model, dropout=0.3).build_model(SPEC, PackingPlan.from_spec(SPEC))
    mlps = [m for m in built.modules() if isinstance(m, MLP)]
    assert mlps and all(m.dropout == 0.3 for m in mlps)


def test_a_warm_start_trains_with_the_settings_it_was_given(tmp_path):
    """The checkpoint's Adam state comes back, its hyper-parameters do not: a run that
    changes --lr-dense or --weight-decay gets them."""
    earlier = _trained(CONFIG)
    later = Trainer(SPEC, replace(CONFIG, lr_dense=3e-4, weight_decay=0.02, embedding_l2=0.01))
    later.restore(earlier.save_checkpoint(tmp_path))
    assert (later.dense_optimizer.lr, later.dense_optimizer.weight_decay) == (3e-4, 0.02)
    assert all(o.weight_decay == 0.01 for o in later.model.embedding.optimizers.values())
    assert later.dense_optimizer.state and all(int(s["step"]) == 4 for s in later.dense_optimizer.state.values())


def test_the_parameter_server_takes_the_settings():
    config = replace(CONFIG, weight_decay=0.03, embedding_l2=0.07)
    shard, layout = build_shard(Trainer(SPEC, config), 0, 1, GBAConfig(1))
    assert shard.dense_optimizer.weight_decay == 0.03
    assert layout.tables and all(table.optimizer.weight_decay == 0.07 for table in layout.tables)


FLAGS = ["--weight-decay", "1e-05", "--embedding-l2", "0.0001", "--dropout", "0.2", "--lr-dense", "0.002",
         "--hidden", "64,32"]
EXPECTED = {"weight_decay": 1e-5, "embedding_l2": 1e-4, "dropout": 0.2, "lr_dense": 0.002, "hidden": (64, 32)}


def _matches(config: TrainConfig) -> bool:
    return all(getattr(config, name) == value for name, value in EXPECTED.items())


def test_daily_and_stream_take_the_flags(tmp_path):
    args = build_parser().parse_args(["daily", "--data", str(tmp_path), "--date", "2026-11-01", "--workdir",
                                      str(tmp_path / "w"), *FLAGS])
    assert _matches(daily_config(args, args.data, args.date).train)
    args = build_parser().parse_args(["stream", "--topic", "events:json", "--workdir", str(tmp_path / "s"),
                                      "--publish-every", "0", "--model", "dcn_v2", *FLAGS])
    config = stream_config(args).train
    assert _matches(config) and config.model == "dcn_v2"


def _distributed_args(argv: list[str]):
    parser = argparse.ArgumentParser(prog="picasso")
    distributed_cli.add_ps_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_the_parameter_server_command_passes_the_flags_to_every_shard(tmp_path):
    args = _distributed_args(["ps", "--spec", "criteo:4", "--workdir", str(tmp_path), "--shards", "2", "--port", "1",
                              "--workers", "2", *FLAGS])
    shard_args = _distributed_args(distributed_cli._shard_argv(args, 1))
    assert _matches(TrainConfig(**distributed_cli.model_settings(shard_args)))


@pytest.mark.parametrize("flag, value", [("--dropout", "1"), ("--dropout", "-0.1"), ("--weight-decay", "nan"),
                                         ("--embedding-l2", "-1"), ("--hidden", "64,x"), ("--hidden", "0")])
def test_bad_flags_are_refused_by_name(flag, value, tmp_path, capsys):
    status, stderr = refusal_in_process(["daily", "--data", tmp_path, "--date", "2026-11-01", "--workdir",
                                         tmp_path / "w", flag, value], capsys)
    assert status == 2 and flag in stderr and value in stderr
