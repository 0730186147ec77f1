"""The dense part's precision: bf16 runs the MLPs and interactions under autocast, with fp32
weights, gradients and optimizer state; the embeddings stay fp32. From the flags to every
place the model trains."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from picasso.serving.publishing.publication import publish
from picasso.metrics import auc
from picasso.models import MODELS, build_model
from picasso.packing import PackingPlan
from picasso.pipelines.cli.daily import daily_config
from picasso.pipelines.cli.main import build_parser
from picasso.pipelines.cli.stream import stream_config
from picasso.serving.pyfunc_model import model_config
from picasso.trainer import TrainConfig, Trainer
from picasso import precision
from picasso.precision import native_bf16

from picasso.connectors.synthetic.planted import PlantedModel

from helpers import planted_batches
from publish_helpers import fresh_target, request
from test_regularisation import _distributed_args
from test_trainer import CONFIG, SPEC
from picasso.pipelines.cli import distributed as distributed_cli
BF16 = replace(CONFIG, precision="bf16")


@pytest.mark.parametrize("precision", ["fp16", "BF16", None])
def test_an_unknown_precision_is_refused_by_name(precision):
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision=precision)
    with pytest.raises(ValueError, match="precision"):
        build_model("wide_deep", SPEC, PackingPlan.from_spec(SPEC), (8,), precision=precision)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_bf16_runs_the_dense_matmuls_in_bf16_and_keeps_every_state_fp32(model):
    trainer = Trainer(SPEC, replace(BF16, model=model))
    linears = [m for m in trainer.model.dense_part.modules() if isinstance(m, torch.nn.Linear)]
    seen = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype)) for m in linears]
    batch = planted_batches(SPEC, 64, 64)[0][0]
    trainer.train_step(batch)
    for hook in hooks:
        hook.remove()
    assert seen and set(seen) == {torch.bfloat16}
    state = trainer.state()
    floats = [v for v in state["model"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 for v in floats)
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in trainer.model.parameters())
    adam = [v for slots in trainer.dense_optimizer.state_dict()["state"].values() for v in slots.values()
            if torch.is_tensor(v) and v.is_floating_point()]
    assert adam and all(v.dtype == torch.float32 for v in adam)
    assert trainer.predict(batch).dtype == np.float32


def test_bf16_learns_what_fp32_learns_and_fp32_stays_exact():
    batches, _ = planted_batches(SPEC, rows=20_480, batch_size=256, stream=0)
    held_out, _ = planted_batches(SPEC, rows=4_000, batch_size=4_000, stream=1, source="day-1")
    labels = held_out[0].data.column("label").to_numpy()
    scores = {}
    for name, config in (("fp32", CONFIG), ("bf16", BF16), ("default", replace(CONFIG, precision=TrainConfig().precision))):
        trainer = Trainer(SPEC, config)
        trainer.train(batches)
        scores[name] = trainer.predict(held_out[0])
    # auto, the default: bf16 where this CPU has it natively, else fp32 with no autocast anywhere
    assert np.array_equal(scores["default"], scores["bf16" if native_bf16("cpu") else "fp32"])
    assert not np.array_equal(scores["bf16"], scores["fp32"])  # bf16 does round
    assert auc(labels, scores["fp32"]) > 0.62
    assert abs(auc(labels, scores["bf16"]) - auc(labels, scores["fp32"])) < 0.01
    assert np.abs(scores["bf16"] - scores["fp32"]).mean() < 0.02


@pytest.mark.parametrize("flags, expected", [("fpu avx512f avx512_bf16 sse", "bf16"), ("fpu amx_bf16 amx_tile", "bf16"),
                                             ("fpu avx2 avx512f", "fp32"), ("", "fp32")])
def test_auto_takes_bf16_only_where_the_cpu_has_it_and_says_so(monkeypatch, caplog, flags, expected):
    monkeypatch.setattr(precision, "cpu_info", lambda: {"model name": "a CPU", "flags": flags})
    config = TrainConfig(hidden=(8,), device="cpu")
    assert config.precision == expected  # decided once, so checkpoints name what trained
    assert replace(config, precision="fp32").precision == "fp32"  # asked for, always taken
    assert replace(config, precision="bf16").precision == "bf16"
    caplog.set_level(logging.INFO, logger="picasso.precision")
    precision._said.clear()
    Trainer(SPEC, replace(CONFIG, precision=config.precision))
    said = [r.getMessage() for r in caplog.records if r.name == "picasso.precision"]
    assert said and said[0].startswith(f"dense part in {expected} (")
    assert ("avx512_bf16" in said[0] or "amx_bf16" in said[0])


def test_auto_keeps_fp32_where_the_device_or_the_model_says_so(monkeypatch):
    monkeypatch.setattr(precision, "cpu_info", lambda: {"flags": "avx512_bf16"})
    assert precision.choose_precision("auto", "wide_deep", "cuda", cuda_bf16=False) == "fp32"
    assert precision.choose_precision("auto", "wide_deep", "cuda", cuda_bf16=True) == "bf16"
    assert precision.choose_precision("auto", "wide_deep", "mps") == "fp32"
    monkeypatch.setattr(precision, "FP32_MODELS", frozenset({"dlrm"}))
    assert precision.choose_precision("auto", "dlrm", "cpu") == "fp32"
    assert precision.choose_precision("bf16", "dlrm", "cpu") == "bf16"  # the flag still wins
    assert precision.choose_precision("auto", "wide_deep", "cpu") == "bf16"


def test_a_model_is_built_in_a_concrete_precision_only():
    with pytest.raises(ValueError, match="precision must be one of \\('fp32', 'bf16'\\)"):
        build_model("wide_deep", SPEC, PackingPlan.from_spec(SPEC), (8,), precision="auto")


def test_every_mode_builds_its_model_in_the_configured_precision():
    """A GBA worker and a sync rank build their model with TrainConfig.build_model."""
    assert BF16.build_model(SPEC, PackingPlan.from_spec(SPEC)).precision == "bf16"
    assert Trainer(SPEC, BF16).model.precision == "bf16"


def test_the_served_model_scores_what_evaluation_scored(mlflow_server, tmp_path):
    """A bf16 version is served in bf16: the held-out rows, sent raw as a request carries
    them, get from the published model the very scores evaluation gave them (so the AUC that
    promoted it is the served model's), bit for bit: one model, one batch, one kernel
    backend in one process. An fp32 build of the same weights scores them otherwise, as
    serving did before it read the precision."""
    trainer = Trainer(SPEC, BF16)
    trainer.train(planted_batches(SPEC, rows=2048, batch_size=256)[0])
    rows, stream = 512, 7
    (held_out,), _ = planted_batches(SPEC, rows, rows, stream=stream, source="held-out")
    evaluated = trainer.evaluate([held_out])
    scores = trainer.predict(held_out)
    version = publish(request(Path(trainer.save_checkpoint(tmp_path)), evaluated.auc), fresh_target(mlflow_server))
    mlflow.set_tracking_uri(mlflow_server)
    served = mlflow.pyfunc.load_model(version.model_uri)
    raw, _ = PlantedModel(SPEC).sample(rows, stream)  # the same rows, before decoding
    requested = pd.DataFrame(raw.drop_columns([SPEC.label]).to_pylist())
    answered = served.predict(requested)
    np.testing.assert_array_equal(answered, scores.astype(np.float64))
    assert auc(held_out.data.column("label").to_numpy(), answered) == evaluated.auc
    served.unwrap_python_model().model.precision = "fp32"
    in_fp32 = served.predict(requested)
    assert np.abs(in_fp32 - answered).max() > 1e-4


def test_a_version_records_its_precision_and_an_older_one_serves_in_fp32():
    """A checkpoint from before TrainConfig had a precision trained in fp32; one whose
    config names no known precision is refused by name before a version is logged."""
    assert model_config({**vars(BF16), "hidden": (8,)})["precision"] == "bf16"
    assert model_config({"model": "wide_deep", "hidden": [8]}) == {"model": "wide_deep", "hidden": [8],
                                                                     "precision": "fp32"}
    with pytest.raises(ValueError, match="precision must be one of .*'fp16'"):
        model_config({"model": "wide_deep", "hidden": [8], "precision": "fp16"})


def test_the_precision_flag_reaches_daily_stream_and_every_shard(tmp_path):
    args = build_parser().parse_args(["daily", "--data", str(tmp_path), "--date", "2026-11-01", "--workdir",
                                      str(tmp_path / "w"), "--precision", "bf16"])
    assert daily_config(args, args.data, args.date).train.precision == "bf16"
    args = build_parser().parse_args(["stream", "--topic", "events:json", "--workdir", str(tmp_path / "s"),
                                      "--publish-every", "0", "--precision", "bf16"])
    assert stream_config(args).train.precision == "bf16"
    args = _distributed_args(["ps", "--spec", "criteo:4", "--workdir", str(tmp_path), "--shards", "2", "--port", "1",
                              "--workers", "2", "--precision", "bf16"])
    shard_args = _distributed_args(distributed_cli._shard_argv(args, 1))
    assert TrainConfig(**distributed_cli.model_settings(shard_args)).precision == "bf16"
    args = build_parser().parse_args(["daily", "--data", str(tmp_path), "--date", "2026-11-01", "--workdir",
                                      str(tmp_path / "w")])
    assert args.precision == "auto"  # the default, decided on the machine that trains
    assert daily_config(args, args.data, args.date).train.precision == ("bf16" if native_bf16("cpu") else "fp32")


def test_a_bad_precision_flag_is_refused_by_name(tmp_path):
    result = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", "daily", "--data", str(tmp_path),
                             "--date", "2026-11-01", "--workdir", str(tmp_path / "w"), "--precision", "fp16"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "--precision" in result.stderr and "fp16" in result.stderr
