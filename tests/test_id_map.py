"""A dynamic table's id -> row map: the definition (kernels/id_map_reference.py) does what its
docstring says, and the C++ map (kernels/csrc/id_map.cpp) equals it op for op, every state
tensor included (the index's layout too)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from picasso import kernels
from picasso.kernels import id_map_reference as reference
from picasso.frequency import DecayedSketch
from picasso.kernels import load_backend

EMPTY = reference.EMPTY_KEY
cpu = load_backend("cpu")
CPP = {"find": cpu.id_map_find, "admit": cpu.id_map_admit, "expire": cpu.id_map_expire, "rebuild": cpu.id_map_rebuild,
       "initial_rows": cpu.id_map_initial_rows, "resolve": cpu.id_map_resolve,
       "reset_rows": cpu.id_map_reset_rows}
REFERENCE = {"find": reference.find, "admit": reference.admit, "expire": reference.expire, "rebuild": reference.rebuild,
             "initial_rows": reference.initial_rows, "resolve": reference.resolve,
             "reset_rows": reference.reset_rows}
STATE = ("index", "row_keys", "last_seen", "counts", "free_rows", "free_count")


def new_map(capacity: int) -> dict[str, torch.Tensor]:
    """An empty map whose free stack pops rows 0, 1, 2, ..."""
    return {"index": torch.tensor([EMPTY, -1]).repeat(reference.slots_for(capacity), 1),
            "row_keys": torch.full((capacity,), EMPTY), "last_seen": torch.full((capacity,), -1),
            "counts": torch.zeros(capacity, dtype=torch.int64),
            "free_rows": torch.arange(capacity - 1, -1, -1, dtype=torch.int32), "free_count": torch.tensor([capacity])}


def call(ops, state, op, *args):
    """An op on a map: find and rebuild take its first 4 and 2 tensors, admit and expire all."""
    tensors = [state[name] for name in STATE[:{"find": 4, "rebuild": 2}.get(op, 6)]]
    return ops[op](*tensors, *args)


def find(state, keys, batch=0, update=True):
    return call(REFERENCE, state, "find", torch.tensor(keys, dtype=torch.int64), batch, update)


def admit(state, keys, key_counts=None, batch=0, lfu=False, protect_since=0):
    counts = torch.ones(len(keys), dtype=torch.int64) if key_counts is None else torch.tensor(key_counts)
    rows, evicted_keys, evicted_rows = call(REFERENCE, state, "admit", torch.tensor(keys, dtype=torch.int64), counts,
                                            batch, lfu, protect_since)
    return rows.tolist(), evicted_keys.tolist(), evicted_rows.tolist()


def expire(state, older_than, keep=0):
    return [t.tolist() for t in call(REFERENCE, state, "expire", older_than, keep)]


# The definition, checked by hand.

def test_a_new_map_pops_rows_0_1_2_and_finds_them():
    state = new_map(4)
    assert admit(state, [10, 20, 30], [3, 1, 2], batch=7) == ([0, 1, 2], [], [])
    assert state["row_keys"].tolist() == [10, 20, 30, EMPTY]
    assert state["last_seen"].tolist() == [7, 7, 7, -1] and state["counts"].tolist() == [3, 1, 2, 0]
    assert int(state["free_count"][0]) == 1

    rows, miss_keys, miss_counts, miss_inverse = find(state, [20, 99, 10, EMPTY, 99, 20, 5], batch=8)
    assert rows.tolist() == [1, -1, 0, -1, -1, 1, -1]
    assert miss_keys.tolist() == [99, 5] and miss_counts.tolist() == [2, 1]
    assert miss_inverse.tolist() == [-1, 0, -1, -1, 0, -1, 1]  # -1 for hits and for EMPTY_KEY
    assert state["last_seen"].tolist() == [8, 8, 7, -1] and state["counts"].tolist() == [4, 3, 2, 0]


def test_find_without_update_changes_nothing():
    state = new_map(2)
    admit(state, [1, 2])
    before = {name: t.clone() for name, t in state.items()}
    assert find(state, [2, 2, 3], batch=9, update=False)[0].tolist() == [1, 1, -1]
    assert all(torch.equal(state[name], before[name]) for name in STATE)


def test_a_full_map_refuses_new_keys_without_lfu():
    state = new_map(2)
    admit(state, [1, 2])
    before = {name: t.clone() for name, t in state.items()}
    assert admit(state, [3, 4], batch=5) == ([-1, -1], [], [])
    assert all(torch.equal(state[name], before[name]) for name in STATE)


def lfu_map() -> dict[str, torch.Tensor]:
    """Rows 0..3: counts 5, 2, 2, 2 last seen at batches 0, 1, 0, 0."""
    state = new_map(4)
    admit(state, [10], [5], batch=0)
    admit(state, [11], [2], batch=1)
    admit(state, [12, 13], [2, 2], batch=0)
    return state


def test_lfu_takes_the_least_count_then_the_oldest_then_the_lowest_row():
    state = lfu_map()
    rows, evicted_keys, evicted_rows = admit(state, [20, 21, 22], [1, 1, 1], batch=3, lfu=True, protect_since=3)
    # Count 2 ties: rows 2 and 3 (last seen 0) before row 1 (last seen 1); row 2 before 3.
    assert (rows, evicted_keys, evicted_rows) == ([2, 3, 1], [12, 13, 11], [2, 3, 1])
    assert state["row_keys"].tolist() == [10, 22, 20, 21]
    assert find(state, [11, 12, 13, 20, 21, 22], batch=3, update=False)[0].tolist() == [-1, -1, -1, 2, 3, 1]


def test_protect_since_protects_the_rows_seen_since():
    state = lfu_map()
    # Rows 0, 2, 3 last seen at batch 0 are eligible; row 1 (batch 1) is protected; the third key is refused.
    rows, evicted_keys, _ = admit(state, [20, 21, 22, 23], batch=2, lfu=True, protect_since=1)
    assert rows == [2, 3, 0, -1] and evicted_keys == [12, 13, 10]
    assert admit(state, [24], batch=2, lfu=True, protect_since=0) == ([-1], [], [])


def test_free_rows_come_first_and_the_last_freed_is_reused_first():
    state = lfu_map()
    assert expire(state, older_than=1) == [[10, 12, 13], [0, 2, 3]]
    assert state["free_rows"][:3].tolist() == [0, 2, 3] and int(state["free_count"][0]) == 3
    rows, evicted_keys, _ = admit(state, [30, 31, 32, 33], batch=4, lfu=True, protect_since=5)
    assert rows == [3, 2, 0, 1] and evicted_keys == [11]


def test_expire_frees_the_oldest_first_but_keeps_enough_live():
    state = new_map(5)
    for batch, key in [(3, 100), (1, 101), (2, 102), (1, 103), (9, 104)]:
        admit(state, [key], batch=batch)
    assert expire(state, older_than=3, keep=2) == [[101, 103, 102], [1, 3, 2]]
    assert state["row_keys"].tolist() == [100, EMPTY, EMPTY, EMPTY, 104]
    assert state["last_seen"].tolist() == [3, -1, -1, -1, 9] and state["counts"].tolist() == [1, 0, 0, 0, 1]
    assert expire(state, older_than=10, keep=1) == [[100], [0]]  # two live, keep one
    assert expire(state, older_than=10, keep=5) == [[], []]
    assert find(state, [100, 101, 104], update=False)[0].tolist() == [-1, -1, 4]


def test_rebuild_from_row_keys_finds_the_same_rows():
    state = new_map(50)
    keys = list(range(1000, 1050))
    admit(state, keys)
    expire(state, older_than=1, keep=30)  # holes in the rows, and shifted probe runs
    admit(state, [7, 8, 9])
    expected = find(state, keys + [7, 8, 9], update=False)[0]
    state["index"].fill_(123)
    reference.rebuild(state["index"], state["row_keys"])
    assert torch.equal(find(state, keys + [7, 8, 9], update=False)[0], expected)
    assert int((state["index"][:, 0] != EMPTY).sum()) == 33


# The C++ map against the definition.

class Twins:
    """One map twice, run by the reference and by the C++ ops; each op's outputs and the
    two maps' state tensors must be equal, dtypes included."""

    def __init__(self, capacity: int):
        self.maps = {"reference": new_map(capacity), "cpp": new_map(capacity)}

    def __call__(self, op, *args):
        expected = call(REFERENCE, self.maps["reference"], op, *args)
        got = call(CPP, self.maps["cpp"], op, *args)
        assert_same(got, expected, f"{op} output")
        for name in STATE:
            assert_same(self.maps["cpp"][name], self.maps["reference"][name], f"{name} after {op}")
        return expected


def assert_same(got, expected, what):
    if expected is None or isinstance(expected, tuple):
        assert type(got) is type(expected), what
        for g, e in zip(got or (), expected or (), strict=True):
            assert_same(g, e, what)
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape and torch.equal(got, expected), \
        f"{what}: {got} != {expected}"


def key_pool(rng: np.random.Generator, capacity: int, large: bool) -> np.ndarray:
    """Keys from a small space (0..2 capacity) or any 64-bit one, and keys homed in the last two
    slots, whose probe runs wrap past the end of the index."""
    space = rng.integers(-(2**63) + 1, 2**63 - 1, 4 * capacity + 8) if large else np.arange(2 * capacity + 2)
    slots = reference.slots_for(capacity)
    candidates = rng.integers(-(2**63) + 1, 2**63 - 1, 64 * slots)
    homes = reference.home_slots(torch.from_numpy(candidates), slots).numpy()
    wrapping = candidates[homes >= slots - 2][: capacity + 4]
    return np.concatenate([space, wrapping]).astype(np.int64)


def random_keys(rng, pool, n) -> torch.Tensor:
    keys = rng.choice(pool, n)
    keys[rng.random(n) < 0.05] = EMPTY
    return torch.from_numpy(keys)


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 8, 40])
@pytest.mark.parametrize("large", [False, True], ids=["small_key_space", "large_key_space"])
@pytest.mark.parametrize("seed", range(6))
def test_the_cpp_map_equals_the_reference_op_for_op(capacity, large, seed):
    rng = np.random.default_rng([seed, capacity, int(large)])
    pool = key_pool(rng, capacity, large)
    twins = Twins(capacity)
    for batch in range(60):
        op = rng.choice(["find", "admit", "admit", "expire", "rebuild"], p=[0.45, 0.2, 0.15, 0.15, 0.05])
        if op == "find":
            twins("find", random_keys(rng, pool, int(rng.integers(0, 3 * capacity + 4))), batch, bool(rng.random() < 0.8))
        elif op == "admit":
            # Mostly a find's misses (how a table admits); sometimes any keys, present or repeated.
            keys = twins("find", random_keys(rng, pool, int(rng.integers(1, 2 * capacity + 3))), batch, True)[1]
            if rng.random() < 0.3:
                keys = torch.from_numpy(rng.choice(pool, int(rng.integers(0, capacity + 3))))
            key_counts = torch.from_numpy(rng.integers(1, 5, keys.numel()))
            twins("admit", keys, key_counts, batch, bool(rng.random() < 0.7), int(rng.integers(0, batch + 2)))
        elif op == "expire":
            twins("expire", int(rng.integers(0, batch + 2)), int(rng.integers(-1, capacity + 2)))
        else:
            twins("rebuild")


def test_the_cpp_map_equals_the_reference_when_full_and_probe_runs_wrap():
    """Every key homed in the index's last slot: one probe run over the whole map that wraps
    past the end, filled, churned by LFU and expiry, and emptied."""
    capacity, rng = 16, np.random.default_rng(11)
    slots = reference.slots_for(capacity)
    candidates = rng.integers(-(2**63) + 1, 2**63 - 1, 200 * slots)
    pool = candidates[reference.home_slots(torch.from_numpy(candidates), slots).numpy() == slots - 1]
    twins = Twins(capacity)
    for batch in range(30):
        keys = torch.from_numpy(rng.choice(pool, 12))
        misses = twins("find", keys, batch, True)[1]
        twins("admit", misses, torch.ones_like(misses), batch, True, batch)
        twins("expire", batch - 2, int(rng.integers(0, capacity)))
    twins("expire", 1000, 0)
    assert int(twins.maps["cpp"]["free_count"][0]) == capacity


def test_a_batch_split_across_threads_gives_the_reference_results():
    """Batches long enough for the C++ probes to run on several threads; the rows' counters
    (updated after the probes) come out exact."""
    capacity, rng = 3000, np.random.default_rng(5)
    twins = Twins(capacity)
    keys = torch.from_numpy(rng.integers(-(2**63) + 1, 2**63 - 1, capacity))
    twins("admit", keys[:2500], torch.ones(2500, dtype=torch.int64), 0, False, 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))
    try:
        for batch in range(1, 4):
            twins("find", keys[torch.from_numpy(rng.zipf(1.3, 40_000) % capacity)], batch, True)
    finally:
        torch.set_num_threads(threads)


def test_bad_inputs_are_clear_errors_from_the_cpp_ops():
    state = new_map(4)
    with pytest.raises(RuntimeError, match="find: keys must be a contiguous 1-d int64"):
        call(CPP, state, "find", torch.tensor([1, 2], dtype=torch.int32), 0, True)
    with pytest.raises(RuntimeError, match="admit: free_rows must be a contiguous int32"):
        cpu.id_map_admit(*(state[name] for name in STATE[:4]), state["free_rows"].long(), state["free_count"],
                         torch.tensor([1]), torch.tensor([1]), 0, False, 0)
    with pytest.raises(RuntimeError, match="expire: counts must be a contiguous 1-d int64"):
        cpu.id_map_expire(*(state[name] for name in STATE[:3]), state["counts"].float(), state["free_rows"],
                          state["free_count"], 0, 0)
    with pytest.raises(RuntimeError, match="index slots must be a power of two above the capacity"):
        cpu.id_map_rebuild(state["index"][:3], state["row_keys"])
    with pytest.raises(RuntimeError, match="admit: one count per key"):
        call(CPP, state, "admit", torch.tensor([1, 2]), torch.tensor([1]), 0, False, 0)
    with pytest.raises(RuntimeError, match="EMPTY_KEY .* is never admitted"):
        call(CPP, state, "admit", torch.tensor([EMPTY]), torch.tensor([1]), 0, False, 0)
    assert torch.equal(state["row_keys"], new_map(4)["row_keys"])  # refused before anything moved


@pytest.mark.parametrize("capacity", [1, 3, 8, 40])
@pytest.mark.parametrize("admit_after", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_resolve_equals_the_reference_batch_for_batch(capacity, admit_after, seed):
    """A field's whole training batch in one call (expire, find, the admission sketch and its
    halving, admit with or without LFU, first occurrences, default rows, counts) against the
    reference, with the sketch's counters and the maps' state compared after every batch."""
    rng = np.random.default_rng([seed, capacity, admit_after])
    pool = key_pool(rng, capacity, bool(seed % 2))
    sketch = DecayedSketch(capacity, seed=seed) if admit_after > 1 else None
    maps = {name: {**new_map(capacity), "counters": sketch.counters.clone() if sketch else torch.zeros(0),
                   "added": torch.zeros((), dtype=torch.int64)} for name in ("reference", "cpp")}
    multipliers = sketch.multipliers if sketch else torch.zeros(0, dtype=torch.int64)
    totals = torch.zeros(len(reference.RESOLVE_STATS), dtype=torch.int64)
    for batch in range(40):
        keys = random_keys(rng, pool, int(rng.integers(0, 3 * capacity + 4)))
        args = (batch, bool(rng.random() < 0.3), batch - int(rng.integers(0, 4)), int(rng.integers(-1, capacity + 2)),
                bool(rng.random() < 0.7), batch - 1, capacity)
        outputs = {}
        for name, ops in (("reference", REFERENCE), ("cpp", CPP)):
            state = maps[name]
            outputs[name] = tuple(ops["resolve"](*(state[n] for n in STATE), keys.clone(), *args, state["counters"],
                                                 multipliers, sketch.bits if sketch else 0, state["added"],
                                                 3 * capacity, float(admit_after)))
        assert_same(outputs["cpp"], outputs["reference"], f"resolve output, batch {batch}")
        for name in (*STATE, "counters", "added"):
            assert_same(maps["cpp"][name], maps["reference"][name], f"{name} after batch {batch}")
        rows, positions, new_keys, counted = outputs["reference"]
        assert ((rows >= 0) & (rows <= capacity)).all() and torch.equal(keys[positions], new_keys)
        # Each key a hit, a key just given its row, or on the default row.
        assert int(counted[0]) + int(torch.isin(keys, new_keys).sum()) + int(counted[-1]) == keys.numel()
        totals += counted
    hits, admitted = (int(totals[reference.RESOLVE_STATS.index(name)]) for name in ("hits", "admitted"))
    assert hits and admitted, dict(zip(reference.RESOLVE_STATS, totals.tolist()))


@pytest.mark.parametrize("width, scale", [(1, 0.01), (7, 0.05), (16, 1.0), (33, 3e-4)])
def test_initial_rows_are_the_references_bit_for_bit_and_a_function_of_the_key(width, scale):
    keys = torch.cat([torch.tensor([0, 1, -1, EMPTY + 1, 2**63 - 1]),
                      torch.from_numpy(np.random.default_rng(width).integers(EMPTY + 1, 2**63 - 1, 500))])
    values = cpu.id_map_initial_rows(keys, width, scale)
    expected = reference.initial_rows(keys, width, scale)
    assert values.dtype == torch.float32 and values.shape == (keys.numel(), width)
    assert torch.equal(values, expected)
    assert values.abs().max() <= scale and values.std() > scale / 3  # spread over [-scale, scale)
    assert torch.equal(cpu.id_map_initial_rows(keys[3:4], width, scale), values[3:4])  # the key's alone
    assert not torch.equal(values[0], values[1])
    with pytest.raises(RuntimeError, match="initial_rows: width must be >= 1"):
        cpu.id_map_initial_rows(keys, 0, scale)


@pytest.mark.parametrize("op", ["find", "admit", "expire", "rebuild", "initial_rows", "resolve", "reset_rows"])
def test_dispatch_runs_the_cpp_ops_unless_told_otherwise(monkeypatch, op):
    monkeypatch.delenv("PICASSO_KERNELS", raising=False)
    assert kernels._host_op(f"id_map_{op}") is CPP[op]
    monkeypatch.setenv("PICASSO_KERNELS", "reference")
    assert kernels._host_op(f"id_map_{op}") is REFERENCE[op]


@pytest.mark.parametrize("width, scale, slot_shapes", [(4, 0.05, [(), (4,)]), (1, 0.0, [()]), (16, 0.01, [(16,), (16,)])])
def test_reset_rows_writes_the_references_first_values_and_zeroes_the_slots(width, scale, slot_shapes):
    rows = 50
    keys, targets = torch.tensor([7, EMPTY + 1, 2**62, -3]), torch.tensor([3, 49, 0, 20])

    def tensors():
        generator = torch.Generator().manual_seed(width)
        return (torch.rand(rows, width, generator=generator),
                [torch.rand(rows, *shape, generator=generator) for shape in slot_shapes])

    (weight, slots), (expected_weight, expected_slots) = tensors(), tensors()
    cpu.id_map_reset_rows(weight, slots, targets, keys, scale)
    reference.reset_rows(expected_weight, expected_slots, targets, keys, scale)
    assert torch.equal(weight, expected_weight) and all(map(torch.equal, slots, expected_slots))
    untouched = torch.ones(rows, dtype=torch.bool)
    untouched[targets] = False
    assert torch.equal(weight[targets], reference.initial_rows(keys, width, scale) if scale else torch.zeros(4, width))
    assert all(not slot[targets].any() and slot[untouched].all() for slot in slots)  # rand: never exactly 0
    with pytest.raises(RuntimeError, match="reset_rows: target 50 outside the 50 rows"):
        cpu.id_map_reset_rows(weight, slots, torch.tensor([1, 2, 3, 50]), keys, scale)
    with pytest.raises(RuntimeError, match="reset_rows: one target per key"):
        cpu.id_map_reset_rows(weight, slots, targets[:2], keys, scale)
