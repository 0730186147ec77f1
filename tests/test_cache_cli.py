"""The cache's command-line options: a bad capacity fails at start; a run with the cache
logs its hit rate, rows moved and stage times with the checkpoint and the MLflow run."""

from __future__ import annotations

import json

import mlflow

from test_cli import run_cli


def test_bad_cache_capacity_fails_at_start_naming_it(tmp_path):
    done = run_cli("demo", "--workdir", str(tmp_path / "work"), "--rows", "2000", "--cache-capacity", "lots", "--json")
    assert done.returncode == 2
    assert "cache capacity 'lots'" in done.stderr
    assert "error" in json.loads(done.stdout.strip().splitlines()[-1])
    assert not (tmp_path / "work" / "data").exists()  # refused before any work


def test_cache_options_parse_per_table_sizes():
    from argparse import Namespace

    from picasso.pipelines.cli.cache_args import cache_config

    options = Namespace(cache_capacity="5%,dim64=64MiB, dim8=1000", cache_refresh_every=10, cache_half_life=50.0,
                        big_tier_dir=None)
    config = cache_config(options)
    assert config.capacity == "5%" and config.group_capacity == {"dim64": "64MiB", "dim8": "1000"}
    assert cache_config(Namespace(**{**vars(options), "cache_capacity": "off"})) is None


def test_interleave_option_and_its_auto_rule(monkeypatch):
    import argparse

    import torch

    from picasso import interleave
    from picasso.pipelines.cli.cache_args import add_cache_args, interleave_setting

    parser = argparse.ArgumentParser()
    add_cache_args(parser)
    assert [interleave_setting(parser.parse_args(flags)) for flags in ([], ["--interleave", "on"], ["--no-interleave"])] \
        == [None, True, False]
    # auto: on with a GPU; on a CPU only when torch's threads leave a core free.
    cores = len(__import__("os").sched_getaffinity(0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores)
    assert interleave.worth_interleaving(torch.device("cuda")) is True
    assert interleave.worth_interleaving(torch.device("cpu")) is False
    monkeypatch.setattr(torch, "get_num_threads", lambda: cores - 1)
    assert interleave.worth_interleaving(torch.device("cpu")) is (cores > 1)


def test_run_with_a_memory_mapped_cache_logs_its_metrics(tmp_path):
    big_tier = tmp_path / "big-tier"
    done = run_cli("demo", "--workdir", str(tmp_path / "work"), "--rows", "30000", "--hidden", "32,16",
                   "--batch-size", "1024", "--cache-capacity", "5%,dim16=2000", "--cache-refresh-every", "5",
                   "--big-tier-dir", str(big_tier), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["auc"] > 0.6
    assert any(big_tier.iterdir())  # the tables lived in files there

    (metrics_file,) = (tmp_path / "work").rglob("step-*/metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert 0 < metrics["cache_hit_rate"] < 1 and metrics["cache_rows_moved"] > 0
    assert metrics["compute_s_per_step"] > 0
    assert metrics["step_metrics"]["cache_hit_rate"]  # one point per log interval

    # A client of its own: mlflow.set_tracking_uri would leak into later tests' subprocesses.
    client = mlflow.MlflowClient(tracking_uri=result["tracking_uri"])
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.metrics["train.cache_hit_rate"] == metrics["cache_hit_rate"]
    assert "train.compute_s_per_step" in run.data.metrics
