"""Id map lookups: the C++ find on one core against a vectorised hash lookup and a Python dict.

A map of capacity 262,144 holding 200,000 random 64-bit keys (a dynamic table three
quarters full). Each timed pass looks up 16 batches of 65,536 keys: Zipf(1.05)-drawn over
the live keys (ranks shuffled over them) and, in a second column, drawn uniformly. Every
contender gets the same keys, the same repetitions, one thread, and takes its turn in
every round (rounds interleave the contenders, so the machine's load weighs on them alike):
- id map find: kernels.id_map_find(update=False), the row of each key;
- id map find + stamp: find(update=True), as a training step runs it, which also stamps
  each row found (last_seen, counts) for eviction;
- vectorised hash (the baseline): pandas.Index.get_indexer over the keys in row order,
  the row of each key as one vectorised call per batch;
- Python dict: `[d.get(k, -1) for k in keys]`, a Python loop over a list of ints.
Ratios, Zipf keys: `vs_vectorised_hash` and `vs_python_dict`, the find's lookups per
second over the baseline's. --smoke: a small map, to check the benchmark runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from benchmarks.harness import parse_args, report
from picasso import kernels
from picasso.kernels.id_map_reference import EMPTY_KEY, slots_for

ALPHA = 1.05


@dataclass(frozen=True)
class LookupSize:
    capacity: int
    live: int  # keys in the map
    batch: int  # keys per find
    batches: int  # finds per timed pass

    @property
    def lookups(self) -> int:
        return self.batch * self.batches


FULL = LookupSize(capacity=262_144, live=200_000, batch=65_536, batches=16)
SMOKE = LookupSize(capacity=4_096, live=3_000, batch=1_024, batches=4)


def new_map(capacity: int) -> dict[str, torch.Tensor]:
    return {"index": torch.tensor([EMPTY_KEY, -1]).repeat(slots_for(capacity), 1),
            "row_keys": torch.full((capacity,), EMPTY_KEY), "last_seen": torch.full((capacity,), -1),
            "counts": torch.zeros(capacity, dtype=torch.int64),
            "free_rows": torch.arange(capacity - 1, -1, -1, dtype=torch.int32), "free_count": torch.tensor([capacity])}


def zipf_ranks(rng: np.random.Generator, ranks: int, alpha: float, n: int) -> np.ndarray:
    """Ranks from 0, rank r with probability ∝ (r + 1)^-alpha."""
    cdf = np.cumsum(np.arange(1, ranks + 1, dtype=np.float64) ** -alpha)
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(n)), ranks - 1)


def interleaved_medians(contenders: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Each contender's median seconds over `repeat` rounds, after one untimed round; in
    every round each runs once, in turn."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(repeat + 1):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            if round_:  # the first round warms caches and builds pandas' lazy hash table
                times[name].append(time.perf_counter() - start)
    return {name: float(np.median(seconds)) for name, seconds in times.items()}


def one_thread(fn: Callable[[], object]) -> Callable[[], object]:
    """fn run with torch on one thread (the C++ kernel's OpenMP follows it)."""
    def run():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(threads)
    return run


def finds(tensors: list[torch.Tensor], batches: list[torch.Tensor], update: bool) -> None:
    for number, batch in enumerate(batches):
        kernels.id_map_find(*tensors, batch, number, update)


def measure(repeat: int = 5, size: LookupSize = FULL) -> dict:
    rng = np.random.default_rng(0)
    keys = torch.from_numpy(rng.integers(EMPTY_KEY + 1, 2**63 - 1, size.live))
    state = new_map(size.capacity)
    rows = kernels.id_map_admit(*state.values(), keys, torch.ones_like(keys), 0, False, 0)[0]
    tensors = [state[name] for name in ("index", "row_keys", "last_seen", "counts")]
    by_rank = keys[torch.from_numpy(rng.permutation(size.live))]
    drawn = {"zipf": by_rank[torch.from_numpy(zipf_ranks(rng, size.live, ALPHA, size.lookups))],
             "uniform": keys[torch.from_numpy(rng.integers(0, size.live, size.lookups))]}

    # The baseline, as a user holding keys and their rows in arrays would write it. What it
    # does: the row of every key, -1 for a key it lacks, in one vectorised call per batch
    # (the same output as find, checked below). What it does not do: stamp rows for
    # eviction (find + stamp does; its row shows what that costs), nor admit or evict keys.
    # No contender inserts here: the map is filled, and pandas' index built (on its first
    # lookup, in the untimed round), outside the timing. A pandas index is immutable, so a
    # table whose keys changed would rebuild it, which this benchmark does not charge.
    index = pd.Index(state["row_keys"][:size.live].numpy())  # the keys in row order: a key's position is its row
    # The Python loop gets its keys as Python ints, converted outside the timing.
    row_of = dict(zip(keys.tolist(), rows.tolist()))

    medians = {}
    for name, flat in drawn.items():
        batches = list(flat.reshape(size.batches, size.batch))
        arrays = [batch.numpy() for batch in batches]
        lists = [batch.tolist() for batch in batches]
        expected = kernels.id_map_find(*tensors, batches[0], 0, False)[0]
        assert bool((expected >= 0).all()), "every key drawn is live"
        assert np.array_equal(index.get_indexer(arrays[0]), expected.numpy()), "pandas finds the same rows"
        assert [row_of.get(k, -1) for k in lists[0]] == expected.tolist(), "the dict finds the same rows"

        contenders = {"find": one_thread(lambda batches=batches: finds(tensors, batches, False)),
                      "stamped": one_thread(lambda batches=batches: finds(tensors, batches, True)),
                      "vectorised_hash": lambda arrays=arrays: [index.get_indexer(a) for a in arrays],
                      "python_dict": lambda lists=lists: [[row_of.get(k, -1) for k in batch] for batch in lists]}
        for contender, seconds in interleaved_medians(contenders, repeat).items():
            medians[f"{name}_{contender}"] = seconds

    result = {f"{key}_lookups_per_s": size.lookups / seconds for key, seconds in medians.items()}
    result["vs_vectorised_hash"] = medians["zipf_vectorised_hash"] / medians["zipf_find"]
    result["vs_python_dict"] = medians["zipf_python_dict"] / medians["zipf_find"]
    result["stamped_vs_vectorised_hash"] = medians["zipf_vectorised_hash"] / medians["zipf_stamped"]
    return result


CONTENDERS = [("find", "id map find (C++)"), ("stamped", "id map find + stamp (C++, as training runs it)"),
              ("vectorised_hash", "pandas Index.get_indexer (vectorised hash)"),
              ("python_dict", "Python dict, a Python loop")]


def table_rows(result: dict) -> list[list]:
    """One row per contender: its lookups per second, and the baseline's time over its own."""
    rows = []
    for key, label in CONTENDERS:
        zipf, uniform = result[f"zipf_{key}_lookups_per_s"], result[f"uniform_{key}_lookups_per_s"]
        rows.append([label, f"{zipf / 1e6:.1f}M", f"{uniform / 1e6:.1f}M",
                     f"{zipf / result['zipf_vectorised_hash_lookups_per_s']:.2f}",
                     f"{zipf / result['zipf_python_dict_lookups_per_s']:.2f}"])
    return rows


def main() -> None:
    def extra(parser):
        parser.add_argument("--smoke", action="store_true", help="a small map, to check the benchmark runs")

    args = parse_args(__doc__.splitlines()[0], extra)
    size = SMOKE if args.smoke else FULL
    result = measure(args.repeat, size)
    ratios = {"vs_vectorised_hash": result["vs_vectorised_hash"], "vs_python_dict": result["vs_python_dict"]}
    report("id_map_lookups", ["lookups, one thread", "Zipf 1.05 lookups/s", "uniform lookups/s",
                              "vs vectorised hash (Zipf)", "vs Python dict (Zipf)"], table_rows(result), ratios,
           {**result, "capacity": size.capacity, "live_keys": size.live, "batch": size.batch}, args.json,
           caption=f"capacity {size.capacity:,}, {size.live:,} live keys, {size.batches} batches of {size.batch:,}")


if __name__ == "__main__":
    main()
