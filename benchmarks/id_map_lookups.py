"""Id map lookups: the C++ find on one core against a Python dict.

A map of capacity 262,144 holding 200,000 random 64-bit keys (a dynamic table three
quarters full). Each timed pass looks up 16 batches of 65,536 keys with find(update=True),
which also stamps each row found (last_seen, counts): keys Zipf(1.05)-drawn over the live
keys (ranks shuffled over them), and, for `uniform_lookups_per_s`, drawn uniformly. One
thread (torch.set_num_threads(1)). The dict maps the same keys to their rows and looks up
the same Zipf keys (`[d.get(k, -1) for k in keys]`, from a list), with no bookkeeping.
Ratio `vs_dict`: the map's lookups per second over the dict's.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.harness import median_seconds, parse_args, report
from picasso import kernels
from picasso.kernels.id_map_reference import EMPTY_KEY, slots_for

CAPACITY = 262_144
LIVE = 200_000
BATCH = 65_536
BATCHES = 16
ALPHA = 1.05


def new_map(capacity: int) -> dict[str, torch.Tensor]:
    return {"index": torch.tensor([EMPTY_KEY, -1]).repeat(slots_for(capacity), 1),
            "row_keys": torch.full((capacity,), EMPTY_KEY), "last_seen": torch.full((capacity,), -1),
            "counts": torch.zeros(capacity, dtype=torch.int64),
            "free_rows": torch.arange(capacity - 1, -1, -1, dtype=torch.int32), "free_count": torch.tensor([capacity])}


def zipf_ranks(rng: np.random.Generator, ranks: int, alpha: float, n: int) -> np.ndarray:
    """Ranks from 0, rank r with probability ∝ (r + 1)^-alpha."""
    cdf = np.cumsum(np.arange(1, ranks + 1, dtype=np.float64) ** -alpha)
    return np.minimum(np.searchsorted(cdf / cdf[-1], rng.random(n)), ranks - 1)


def measure(repeat: int = 5) -> dict:
    rng = np.random.default_rng(0)
    keys = torch.from_numpy(rng.integers(EMPTY_KEY + 1, 2**63 - 1, LIVE))
    state = new_map(CAPACITY)
    rows = kernels.id_map_admit(*state.values(), keys, torch.ones_like(keys), 0, False, 0)[0]
    tensors = [state[name] for name in ("index", "row_keys", "last_seen", "counts")]
    by_rank = keys[torch.from_numpy(rng.permutation(LIVE))]
    zipf = by_rank[torch.from_numpy(zipf_ranks(rng, LIVE, ALPHA, BATCHES * BATCH))].reshape(BATCHES, BATCH)
    uniform = keys[torch.from_numpy(rng.integers(0, LIVE, BATCHES * BATCH))].reshape(BATCHES, BATCH)

    def finds(batches):
        for batch, batch_keys in enumerate(batches):
            kernels.id_map_find(*tensors, batch_keys, batch, True)

    # Same input, same output: every key is live, so every lookup finds its row.
    assert bool((kernels.id_map_find(*tensors, zipf[0], 0, False)[0] >= 0).all())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        zipf_s = median_seconds(lambda: finds(zipf), repeat)
        uniform_s = median_seconds(lambda: finds(uniform), repeat)
    finally:
        torch.set_num_threads(threads)
    row_of = dict(zip(keys.tolist(), rows.tolist()))
    lists = [batch_keys.tolist() for batch_keys in zipf]
    dict_s = median_seconds(lambda: [[row_of.get(k, -1) for k in batch_keys] for batch_keys in lists], repeat)
    lookups = BATCHES * BATCH
    return {"lookups_per_s": lookups / zipf_s, "dict_lookups_per_s": lookups / dict_s, "vs_dict": dict_s / zipf_s,
            "uniform_lookups_per_s": lookups / uniform_s}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    result = measure(args.repeat)
    rows = [["id map find, Zipf 1.05", result["lookups_per_s"], result["lookups_per_s"] / result["dict_lookups_per_s"]],
            ["id map find, uniform", result["uniform_lookups_per_s"],
             result["uniform_lookups_per_s"] / result["dict_lookups_per_s"]],
            ["Python dict, Zipf 1.05", result["dict_lookups_per_s"], 1.0]]
    report("id_map_lookups", ["lookups (one thread)", "lookups/s", "vs dict"], rows, {"vs_dict": result["vs_dict"]},
           result, args.json, caption=f"capacity {CAPACITY:,}, {LIVE:,} live keys, batches of {BATCH:,}")


if __name__ == "__main__":
    main()
