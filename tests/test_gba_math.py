"""GBA's math without a network: staleness decay, global-batch aggregation, token control,
and the benchmark's injected straggler."""

from __future__ import annotations

import math

import pytest
import torch

from picasso.distributed.aggregation import Contribution, RowGradient, Weighted, aggregate
from picasso.distributed.gba import GBAConfig, TokenControl, worker_id
from picasso.distributed import worker as worker_module
from picasso.distributed.staleness import NO_DECAY, StalenessDecay, parse_decay
from picasso.distributed.worker import Straggler


# -- the decay function -------------------------------------------------------------------

def test_default_decay_is_flat_then_exponential_then_dropped():
    decay = StalenessDecay(tau_max=2, half_life=1.0, limit=5)
    assert [decay.weight(t) for t in range(4)] == [1.0, 1.0, 1.0, 0.5]
    assert decay.weight(5) == pytest.approx(0.125)
    assert decay.weight(6) == 0.0 and decay.dropped(6) and not decay.dropped(5)
    slow = StalenessDecay(tau_max=0, half_life=2.0, limit=None)
    assert slow.weight(2) == pytest.approx(0.5) and slow.weight(1000) > 0


def test_no_decay_counts_everything():
    assert all(NO_DECAY.weight(t) == 1.0 for t in (0, 1, 10, 10**6))


@pytest.mark.parametrize("kwargs, message", [
    ({"tau_max": -1}, "tau_max"),
    ({"half_life": 0.0}, "half_life"),
    ({"half_life": math.nan}, "half_life"),
    ({"tau_max": 4, "limit": 3}, "limit"),
])
def test_bad_decay_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StalenessDecay(**kwargs)


def test_negative_staleness_is_an_error():
    with pytest.raises(ValueError, match="future"):
        StalenessDecay().weight(-1)


def test_parse_decay_round_trips_and_names_mistakes():
    for decay in (StalenessDecay(), StalenessDecay(3, 2.5, None), NO_DECAY):
        assert parse_decay(decay.describe()) == decay
    assert parse_decay("exp:limit=4") == StalenessDecay(limit=4)
    for text, message in [("linear", "kind"), ("exp:tau=3", "tau=3"), ("exp:limit=x", "limit takes a number"),
                          ("exp:tau_max=5,limit=2", "limit")]:
        with pytest.raises(ValueError, match=message):
            parse_decay(text)


# -- aggregation ----------------------------------------------------------------------------

def _local_gradients(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def _fresh(contribution: Contribution) -> Weighted:
    return Weighted(contribution, 1.0, {t: torch.ones(g.rows.shape[0]) for t, g in contribution.sparse.items()})


def test_fresh_dense_aggregate_is_the_global_batch_gradient():
    """With weight 1, M local gradients aggregate to the gradient of the global batch's mean
    loss: synchronous all-reduce's gradient, including with unequal local batches."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x, y = torch.randn(23, 5), torch.randint(0, 2, (23,)).float()
    parts = [(0, 8), (8, 16), (16, 23)]  # the last local batch is short
    batch = [_fresh(Contribution(f"w{i}", 0, b - a, _local_gradients(model, x[a:b], y[a:b])))
             for i, (a, b) in enumerate(parts)]
    global_gradient = aggregate(batch)
    expected = _local_gradients(model, x, y)
    assert global_gradient.samples == 23 and global_gradient.workers == ("w0", "w1", "w2")
    for name, grad in expected.items():
        torch.testing.assert_close(global_gradient.dense[name], grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("rule", ["global-mean", "touched-mean"])
def test_rows_sum_their_weighted_gradients_over_the_rule_s_samples(rule):
    """global-mean: a row's sum over the global batch's samples; touched-mean: over the
    samples of the contributions that touched it (both with per-row staleness weights)."""
    dim = 3
    rng = torch.Generator().manual_seed(1)
    contributions = []
    for i, (rows, samples) in enumerate([([1, 4, 7], 10), ([4, 9], 30), ([7, 4, 2], 20)]):
        grads = torch.randn(len(rows), dim, generator=rng)
        sparse = {"t": RowGradient(torch.tensor(rows), grads, torch.zeros(len(rows), dtype=torch.int64))}
        contributions.append(Contribution(f"w{i}", 0, samples, {}, sparse))
    weights = [torch.tensor([1.0, 0.5, 1.0]), torch.tensor([1.0, 0.25]), torch.tensor([0.0, 1.0, 1.0])]
    batch = [Weighted(c, 1.0, {"t": w}) for c, w in zip(contributions, weights)]
    rows, grads = aggregate(batch, rule).sparse["t"]
    # the same rule, one row at a time in plain Python
    expected = {}
    for c, w in zip(contributions, weights):
        for j, row in enumerate(c.sparse["t"].rows.tolist()):
            total, samples = expected.get(row, (torch.zeros(dim), 0))
            expected[row] = (total + c.samples * w[j] * c.sparse["t"].grads[j], samples + c.samples)
    assert rows.tolist() == sorted(expected)
    for row, grad in zip(rows.tolist(), grads):
        total, samples = expected[row]
        torch.testing.assert_close(grad, total / (samples if rule == "touched-mean" else 60))


def test_contribution_contracts():
    with pytest.raises(ValueError, match="samples > 0"):
        Contribution("w", 0, 0)
    with pytest.raises(ValueError, match="shapes disagree"):
        RowGradient(torch.tensor([1, 2]), torch.zeros(3, 4), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="empty"):
        aggregate([])


# -- token control ------------------------------------------------------------------------

def _push(control: TokenControl, worker: str, token: int, value: float = 1.0, samples: int = 1, rows=(),
          row_staleness=()):
    sparse, staleness = {}, {}
    if rows:
        sparse["t"] = RowGradient(torch.tensor(rows), torch.full((len(rows), 2), value),
                                  torch.zeros(len(rows), dtype=torch.int64))
        staleness["t"] = torch.tensor(row_staleness or [0] * len(rows))
    return control.push(Contribution(worker, token, samples, {"w": torch.tensor([value])}, sparse), staleness)


def test_steps_once_every_m_accepted_pushes():
    control = TokenControl(GBAConfig(global_batches=3))
    for w in ("a", "b"):
        control.pull(w)
    outcomes = [_push(control, w, 0, value=v) for w, v in [("a", 1.0), ("b", 2.0), ("a", 6.0)]]
    assert [o.stepped for o, _ in outcomes] == [False, False, True]
    assert control.step == 1 and control.buffered == 0
    gradient = outcomes[-1][1]
    torch.testing.assert_close(gradient.dense["w"], torch.tensor([3.0]))  # (1 + 2 + 6) / 3
    assert gradient.workers == ("a", "b", "a")


def test_stale_gradients_decay_and_past_the_limit_do_not_count():
    control = TokenControl(GBAConfig(2, StalenessDecay(tau_max=0, half_life=1.0, limit=1)))
    control.pull("a"), control.pull("b")
    _push(control, "a", 0), _push(control, "b", 0)  # step 0 -> 1
    outcome, _ = _push(control, "a", 0, value=4.0)  # staleness 1: weight 0.5
    assert outcome.accepted and outcome.staleness == 1 and outcome.weight == 0.5
    _push(control, "b", 1, value=2.0)  # step 1 -> 2: (0.5 * 4 + 2) / 2
    assert control.step == 2
    outcome, gradient = _push(control, "a", 0)  # staleness 2 > limit 1
    assert not outcome.accepted and "limit" in outcome.reason and gradient is None
    assert control.buffered == 0 and control.counts["dropped_stale"] == 1


def test_rows_are_weighted_by_their_own_staleness():
    control = TokenControl(GBAConfig(1, StalenessDecay(tau_max=0, half_life=1.0, limit=4)))
    control.pull("a")
    _, gradient = _push(control, "a", 0, value=8.0, rows=[3, 5], row_staleness=[0, 2])
    rows, grads = gradient.sparse["t"]
    assert rows.tolist() == [3, 5]
    torch.testing.assert_close(grads[:, 0], torch.tensor([8.0, 2.0]))  # weights 1 and 0.25


def test_a_failed_worker_leaves_the_global_batch_and_can_rejoin():
    control = TokenControl(GBAConfig(2))
    dead, alive = worker_id("rank1", "first"), worker_id("rank0", "x")
    control.pull(dead), control.pull(alive)
    _push(control, dead, 0, value=100.0)
    assert control.drop_worker(dead) == 1 and control.buffered == 0
    outcome, _ = _push(control, dead, 0)  # sent before it died, delivered after
    assert not outcome.accepted and "dropped" in outcome.reason
    with pytest.raises(ValueError, match="dropped"):
        control.pull(dead)
    reborn = worker_id("rank1", "second")
    control.pull(reborn)
    _push(control, alive, 0, value=1.0)
    _, gradient = _push(control, reborn, 0, value=3.0)
    torch.testing.assert_close(gradient.dense["w"], torch.tensor([2.0]))  # the dead worker's 100 is gone


def test_silent_workers_are_dropped_after_their_lease():
    now = [0.0]
    control = TokenControl(GBAConfig(4), clock=lambda: now[0])
    control.pull("quiet"), control.pull("busy")
    _push(control, "quiet", 0)
    now[0] = 5.0
    _push(control, "busy", 0)
    now[0] = 12.0
    assert control.drop_silent(lease_s=10.0) == ["quiet"]
    assert control.buffered == 1 and control.workers == ["busy"]


def test_bad_pushes():
    control = TokenControl(GBAConfig(2))
    outcome, _ = _push(control, "stranger", 0)
    assert not outcome.accepted and "never pulled" in outcome.reason
    control.pull("a")
    with pytest.raises(ValueError, match="outside"):
        _push(control, "a", 5)
    with pytest.raises(ValueError, match="row staleness"):
        control.push(Contribution("a", 0, 1, {}, {"t": RowGradient(torch.tensor([1]), torch.zeros(1, 2),
                                                                    torch.zeros(1, dtype=torch.int64))}), {})
    with pytest.raises(ValueError, match="global_batches"):
        GBAConfig(0)
    with pytest.raises(ValueError, match="without '/'"):
        worker_id("a/b", "x")


def test_plain_async_steps_on_every_push_however_stale():
    control = TokenControl(GBAConfig.plain_async())
    control.pull("a")
    for expected_step in range(1, 30):
        outcome, gradient = _push(control, "a", 0)
        assert outcome.accepted and outcome.weight == 1.0 and outcome.step == expected_step and gradient is not None


def test_a_finished_worker_is_retired_not_dropped():
    now = [0.0]
    control = TokenControl(GBAConfig(2), clock=lambda: now[0])
    control.pull("done")
    _push(control, "done", 0)
    control.retire("done")
    now[0] = 100.0
    assert control.drop_silent(lease_s=1.0) == [] and control.dropped == set()
    assert control.buffered == 1  # what it pushed still counts


def test_positions_advance_only_over_an_unbroken_run_of_a_workers_pushes():
    """Pushes 1 and 2 of a worker land before its push 0 (RPC threads took them out of
    order): the model has them, but the positions wait for push 0, so a checkpoint taken
    meanwhile makes a resumed job read 1 and 2 again rather than skip 0."""
    control = TokenControl(GBAConfig.plain_async(), positions={"s": 0})
    control.pull("w/a")
    control.pull("v/a")

    def push(worker, sequence, position):
        return control.push(Contribution(worker, control.step, 1, {"w": torch.tensor([1.0])},
                                         positions={f"s-{worker[0]}": position}, sequence=sequence), {})

    push("w/a", 1, 20)
    push("w/a", 2, 30)
    push("v/a", 0, 7)  # another worker's run is its own
    assert control.step == 3 and control.positions == {"s": 0, "s-v": 7}
    push("w/a", 0, 10)
    assert control.positions == {"s": 0, "s-v": 7, "s-w": 30}
    # Pushes without numbers are taken as they come.
    control.push(Contribution("w/a", control.step, 1, {"w": torch.tensor([1.0])}, positions={"s": 5}), {})
    assert control.positions["s"] == 5


def test_a_straggler_sleeps_out_its_own_work_only(monkeypatch):
    """factor 4: after 2 s of its own work (in two parts) it sleeps 6 s; time spent outside
    `working` (waiting on the network) is not stretched. A fake clock: no timing here."""
    clock = iter([0.0, 1.5, 10.0, 10.5])  # two working spans: 1.5 s and 0.5 s, 8.5 s between
    slept = []
    monkeypatch.setattr(worker_module.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(worker_module.time, "sleep", slept.append)
    straggler = Straggler(4.0)
    with straggler.working():
        pass
    with straggler.working():
        pass
    assert straggler.end_step() == 6.0 and slept == [6.0]
    assert Straggler(1.0).end_step() == 0.0 and slept == [6.0]  # no straggler: no sleep
    with pytest.raises(ValueError, match="factor must be >= 1"):
        Straggler(0.5)
