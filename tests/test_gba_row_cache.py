"""The hot-row cache in front of the parameter server (picasso.distributed.row_cache),
against in-process shards: what it serves is never staler than its bound, with bound 0
it changes nothing, and what it saves is counted."""

from __future__ import annotations

import pytest
import torch

from picasso.connectors.testing.loopback import free_port
from picasso.connectors.testing.param_server import in_process
from picasso.distributed.gba import GBAConfig
from picasso.distributed.local_gradient import GradientComputer
from picasso.distributed.ps_checkpoint import build_shard
from picasso.distributed.ps_client import PSClient
from picasso.distributed.row_cache import CachedPSClient, RowCacheConfig
from picasso.distributed.worker import GBAWorker
from picasso.models import build_model
from picasso.packing import PackingPlan
from picasso.trainer import Trainer

from helpers import planted_batches
from test_gba_ps import _finish, _ps, _start, _worker, tiny_spec  # noqa: F401 (a fixture)
from test_trainer import CONFIG, SPEC, assert_state_equal


def _shards(shards: int, gba: GBAConfig):
    trainer = Trainer(SPEC, CONFIG)
    built = [build_shard(trainer, s, shards, gba) for s in range(shards)]
    return [shard for shard, _ in built], built[0][1]


def _train(client, batches) -> None:
    model = build_model(CONFIG.model, SPEC, PackingPlan.from_spec(SPEC), CONFIG.hidden)
    GBAWorker(client, GradientComputer(model)).train(batches)


def _counting(call, asked: list[int]):
    """The in-process call, counting the embedding rows each pull asks the shards for."""
    def counted(index, fn, args, asynchronous):
        if fn == "pull":
            asked.append(sum(rows.numel() for rows in args[1].values()))
        return call(index, fn, args, asynchronous)
    return counted


def test_with_no_staleness_allowed_training_is_unchanged_and_pulls_are_saved():
    """M = 4 local batches per global step from one worker: between steps the shards'
    rows do not move, so hot rows are served locally even at bound 0, and the result is
    bit for bit the uncached one."""
    batches, _ = planted_batches(SPEC, 1280, 64)
    states, asked = [], {False: [], True: []}
    for cached in (False, True):
        servers, layout = _shards(2, GBAConfig(4))
        client = PSClient(layout, "worker0/a", max_in_flight=0, call=_counting(in_process(servers), asked[cached]))
        if cached:
            client = CachedPSClient(client, RowCacheConfig(capacity="50%", max_staleness=0, refresh_every=1))
        _train(client, batches)
        states.append([s.snapshot().tensors for s in servers])
    for cached_shard, uncached_shard in zip(states[1], states[0]):
        assert_state_equal(cached_shard, uncached_shard)
    stats = client.stats
    row_bytes = [t.row_bytes for t in client.tables.values()]  # a row's values and its version
    assert stats.rows_served > 0
    assert min(row_bytes) * stats.rows_served <= stats.bytes_saved <= max(row_bytes) * stats.rows_served
    assert stats.rows_asked == sum(asked[False])
    assert sum(asked[True]) == stats.rows_asked - stats.rows_served  # what it served, the shards never sent


@pytest.mark.parametrize("bound", [0, 2])
def test_a_served_row_is_never_staler_than_the_bound(bound):
    """Plain async, so every push moves the model: each value the cache serves must be
    the shards' value of that row at one of the last `bound` + 1 global steps."""
    servers, layout = _shards(2, GBAConfig.plain_async())
    call = in_process(servers)
    observer = PSClient(layout, "observer/a", max_in_flight=0, call=call)
    every_row = {t.key: torch.arange(t.num_rows) for t in layout.tables}
    history = {0: observer.pull(every_row).values}  # global step -> every table's rows then
    client = CachedPSClient(PSClient(layout, "worker0/a", max_in_flight=0, call=call),
                            RowCacheConfig(capacity="50%", max_staleness=bound, refresh_every=1))
    model = build_model(CONFIG.model, SPEC, PackingPlan.from_spec(SPEC), CONFIG.hidden)
    computer = GradientComputer(model)
    served_any = False
    for batch in planted_batches(SPEC, 1280, 64)[0]:
        tensors = batch.to_torch()
        rows = computer.rows_needed(tensors)
        before = client.stats.rows_served
        pulled = client.pull(rows)
        served_any |= client.stats.rows_served > before
        step = servers[0].control.step
        for key, wanted in rows.items():
            recent = [history[s][key][wanted] for s in range(max(0, step - bound), step + 1)]
            matches = torch.zeros(wanted.numel(), dtype=torch.bool)
            for values in recent:
                matches |= (pulled.values[key] == values).all(dim=1)
            assert bool(matches.all()), f"{key}: a row older than {bound} steps was served at step {step}"
        client.push(pulled, computer.compute(tensors, pulled.dense, rows, pulled.values), batch.positions)
        history[servers[0].control.step] = observer.pull(every_row).values
    assert served_any == (bound > 0)  # at bound 0 the model moves at every push: nothing is fresh


def test_tables_over_the_same_rows_share_one_directory():
    """Wide&Deep pulls its deep and wide tables of a group for the same ids: one directory
    counts them once, sized by a row of both when the capacity is in bytes."""
    servers, layout = _shards(1, GBAConfig(1))
    client = CachedPSClient(PSClient(layout, "worker0/a", call=in_process(servers)), RowCacheConfig(capacity="4KiB"))
    for group in ("dim4", "dim8"):
        deep, wide = client.tables[f"embedding.table_{group}"], client.tables[f"wide_embedding.table_{group}"]
        assert deep.directory is wide.directory
        assert deep.directory.capacity == 4096 // (deep.row_bytes + wide.row_bytes)


def test_bad_settings_are_refused():
    servers, layout = _shards(1, GBAConfig(1))
    client = PSClient(layout, "worker0/a", call=in_process(servers))
    with pytest.raises(ValueError, match="max_staleness"):
        RowCacheConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="cache capacity"):
        CachedPSClient(client, RowCacheConfig(capacity="lots"))


def test_gba_workers_with_the_row_cache_against_a_real_server(tiny_spec, tmp_path):
    """`picasso gba-worker --row-cache`: real processes on loopback; each worker reports what
    its cache served, and the job trains every sample."""
    port = free_port(count=2)
    server = _ps(tiny_spec, tmp_path, port, 2, 2, "--mode", "gba")
    workers = [_worker(port, rank, 1000, "--row-cache", "30%", "--row-cache-staleness", "2")
               for rank in range(2)]
    results = [_finish(w) for w in workers]
    code, summary, err = _finish(server)
    assert code == 0, err
    for code, stats, err in results:
        assert code == 0, err
        assert stats["batches"] == 10 and stats["refused"] == 0
        assert 0 < stats["row_cache_rows_served"] < stats["row_cache_rows_asked"]
        assert stats["row_cache_bytes_saved"] > 0
    assert summary["samples"] == 2000


def test_a_bad_row_cache_setting_fails_before_joining():
    code, _, err = _finish(_start("gba-worker", "--port", str(free_port()), "--rank", "0", "--row-cache",
                                  "lots"))
    assert code != 0 and "cache capacity 'lots'" in err
