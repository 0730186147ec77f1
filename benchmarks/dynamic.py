"""Dynamic tables against fixed hashed tables at equal memory, on a stream whose items churn.

Quality. The churn data set (picasso.synthetic_churn, the defaults of `picasso generate
--churn`): new item ids arrive all the time and old ones fade, each with its own planted
effect. Wide&Deep trains on it twice, batch after batch in stream order, with the same
seed, optimizer and learning rates:
- picasso: the `churn` spec, whose item field is a dynamic table of CHURN_CAPACITY rows
  (admission at an id's second impression, eviction of rows unseen for 8 steps);
- baseline: the same spec with the item field as hash_buckets = capacity + 1, the same
  rows (and so the same bytes of rows and slots) as the dynamic table with its default row.
Both are scored test-then-train (progressive validation, as a stream is judged): each
batch is scored before the model trains on it, and the AUC is over every batch after the
first day. The two models take turns, batch by batch. `auc_delta_vs_hashed` is picasso's AUC minus the baseline's; the share of the
stream's distinct item ids that share their bucket with another is reported beside it.

Speed. `dynamic_vs_hashed_step`: the baseline's median training step time over picasso's,
in those same runs (the dynamic step maps its ids, admits and evicts). `vs_dict`: the
map's lookups per second on one core against a Python dict doing the same job
(benchmarks.id_map_lookups).

Bounded memory. One dynamic field of --memory-capacity rows meets 10x as many distinct
ids, a batch at a time, in a fresh process. Reported: the most rows ever in use (never above the capacity),
and the growth of the process's resident memory over the model's tables, slots and map
(`rss_vs_model`, which should stay within 1.2).
"""

from __future__ import annotations

import multiprocessing
import resource
import statistics
import time

import numpy as np
import pyarrow as pa
import torch

from benchmarks.harness import parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import CHURN_CAPACITY, churn_spec
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.metrics import auc
from picasso.packing import PackingPlan
from picasso.spec import DynamicTable, FeatureSpec, SparseField
from picasso.synthetic_churn import ChurnConfig, ChurnModel
from picasso.trainer import TrainConfig, Trainer

BATCH = 2048
ROWS_PER_DAY = 100_000


def churn_batches(spec: FeatureSpec, table: pa.Table) -> list:
    decoded = RecordDecoder(spec).decode_table(table, "churn")
    assert not decoded.dead_letters, decoded.dead_letters[:3]
    plan = PackingPlan.from_spec(spec)
    return [pack(decoded.table.slice(start, BATCH), spec, plan, {"churn": start + BATCH})
            for start in range(0, decoded.table.num_rows, BATCH)]


def test_then_train(specs: list[FeatureSpec], batches: list[list], warmup_rows: int, seed: int) -> list[dict]:
    """Score each batch, then train on it, one model per spec over its own packing of the
    same rows; the AUC over batches past `warmup_rows`. The models take turns batch by
    batch, so that whatever else the machine does weighs on their step times alike."""
    trainers = [Trainer(spec, TrainConfig(seed=seed, log_every=0, interleave=False)) for spec in specs]
    labels, scores, step_seconds = ([[] for _ in specs] for _ in range(3))
    seen = 0
    for same_rows in zip(*batches):
        for trainer, batch, label, score, seconds in zip(trainers, same_rows, labels, scores, step_seconds):
            if seen >= warmup_rows:
                score.append(trainer.predict(batch))
                label.append(batch.data.column("label").to_numpy())
            start = time.perf_counter()
            trainer.train_step(batch)
            seconds.append(time.perf_counter() - start)
        seen += same_rows[0].num_samples
    results = []
    for trainer, label, score, seconds in zip(trainers, labels, scores, step_seconds):
        result = {"auc": auc(np.concatenate(label), np.concatenate(score)),
                  "step_s": statistics.median(seconds[len(seconds) // 10:])}  # past the first steps' warm-up
        if "dynamic_rows" in trainer.model._modules:
            result.update(trainer.model.dynamic_rows.metrics())
        results.append(result)
    return results


def colliding_share(item_ids: np.ndarray, buckets: int) -> float:
    """Of the distinct ids, the share whose bucket holds another of them."""
    from picasso.hashing import hash_to_buckets

    distinct = np.unique(item_ids)
    rows = hash_to_buckets(pa.array(distinct), buckets)
    _, inverse, counts = np.unique(rows, return_inverse=True, return_counts=True)
    return float((counts[inverse] > 1).mean())


def quality_and_speed(days: int, seed: int) -> dict:
    dynamic, hashed = churn_spec(), churn_spec(hashed=True)
    table, _ = ChurnModel(dynamic, ChurnConfig(seed=seed)).sample(0, days * ROWS_PER_DAY)
    item_ids = table.column("item").to_numpy()
    ours, theirs = test_then_train([dynamic, hashed], [churn_batches(dynamic, table), churn_batches(hashed, table)],
                                   ROWS_PER_DAY, seed)
    return {"ours": ours, "theirs": theirs, "distinct_items": int(np.unique(item_ids).size),
            "colliding_share": colliding_share(item_ids, CHURN_CAPACITY + 1)}


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def bounded_memory(capacity: int, batch: int, seed: int) -> dict:
    """One dynamic field meets 10x its capacity in distinct ids: the rows in use, and the
    resident memory grown over the bytes of the model's tables, slots and map."""
    def spec_of(rows: int) -> FeatureSpec:
        return FeatureSpec(name="memory", label="label", dense=(), sparse=(
            SparseField("item", embedding_dim=16, dynamic=DynamicTable(capacity=rows)),))

    spec, rng, distinct = spec_of(capacity), np.random.default_rng(seed), 10 * capacity
    steps = 2 * distinct // batch  # each id about twice, from a window that moves on
    tables = [pa.table({"label": (rng.random(batch) < 0.3).astype(np.float32),
                        "item": pa.array(((step * batch // 2 + rng.integers(0, 4 * batch, batch)) % distinct + 1)
                                         [:, None].tolist(), pa.list_(pa.int64()))}) for step in range(steps)]
    batches = [pack(table, spec, PackingPlan.from_spec(spec)) for table in tables]
    config = TrainConfig(hidden=(16,), log_every=0, interleave=False, seed=seed)
    # What any run holds besides its tables (the kernels loaded, a step's code run once)
    # is resident before the count starts.
    small = spec_of(8)
    Trainer(small, config).train_step(pack(tables[0], small, PackingPlan.from_spec(small)))
    before = _resident_bytes()
    trainer = Trainer(spec, config)
    field = trainer.model.dynamic_rows.maps[0]
    most_rows, peak = 0, before
    for packed in batches:
        trainer.train_step(packed)
        most_rows = max(most_rows, field.live_rows)
        peak = max(peak, _resident_bytes())
    model_bytes = sum(t.numel() * t.element_size() for t in trainer.model.buffers())
    model_bytes += sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    return {"capacity": capacity, "distinct_ids": distinct, "most_rows_in_use": most_rows,
            "model_bytes": model_bytes, "rss_growth_bytes": peak - before, "rss_vs_model": (peak - before) / model_bytes}


def main() -> None:
    def extra(parser):
        parser.add_argument("--days", type=int, default=10, help=f"days of {ROWS_PER_DAY:,} churning rows")
        parser.add_argument("--memory-capacity", type=int, default=300_000, help="rows of the bounded-memory run")
        parser.add_argument("--seed", type=int, default=0)

    args = parse_args(__doc__.splitlines()[0], extra)
    from benchmarks.id_map_lookups import measure

    torch.manual_seed(args.seed)
    run = quality_and_speed(args.days, args.seed)
    ours, theirs = run["ours"], run["theirs"]
    lookups = measure(args.repeat)
    # In a process of its own: memory the runs above freed would otherwise be reused, and
    # the growth it measures would read low.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        memory = pool.apply(bounded_memory, (args.memory_capacity, 8192, args.seed))
    ratios = {"auc_delta_vs_hashed": ours["auc"] - theirs["auc"],
              "dynamic_vs_hashed_step": theirs["step_s"] / ours["step_s"],
              "vs_dict": lookups["vs_dict"]}
    metrics = {"auc": ours["auc"], "hashed_auc": theirs["auc"], "step_s": ours["step_s"],
               "hashed_step_s": theirs["step_s"], "distinct_items": run["distinct_items"],
               "colliding_share": run["colliding_share"], "capacity": CHURN_CAPACITY,
               **{k: v for k, v in ours.items() if k.startswith("dynamic_")},
               **lookups, **{f"memory_{k}": v for k, v in memory.items()}}
    rows = [
        ["AUC, test-then-train after day 1", f"{ours['auc']:.4f}", f"{theirs['auc']:.4f}"],
        ["training step (median ms)", f"{ours['step_s'] * 1e3:.2f}", f"{theirs['step_s'] * 1e3:.2f}"],
        ["distinct items / rows", f"{run['distinct_items']:,} / {CHURN_CAPACITY:,} + 1",
         f"{run['distinct_items']:,} / {CHURN_CAPACITY + 1:,} buckets"],
        ["distinct items sharing a row", "0 (admitted ids)", f"{run['colliding_share']:.1%}"],
        ["admitted / evicted by age / when full",
         f"{ours['dynamic_item_admitted']:,.0f} / {ours['dynamic_item_evicted_by_age']:,.0f} / "
         f"{ours['dynamic_item_evicted_when_full']:,.0f}", ""],
        ["map lookups/s, one core (dict)", f"{lookups['lookups_per_s'] / 1e6:.1f}M",
         f"dict {lookups['dict_lookups_per_s'] / 1e6:.1f}M"],
        [f"{memory['distinct_ids']:,} ids into {memory['capacity']:,} rows: most rows in use",
         f"{memory['most_rows_in_use']:,}", ""],
        ["resident memory grown / model bytes", f"{memory['rss_growth_bytes'] / 2**20:.1f} MiB / "
         f"{memory['model_bytes'] / 2**20:.1f} MiB = {memory['rss_vs_model']:.2f}", ""],
    ]
    report("dynamic", ["", "picasso (dynamic)", "hashed, same rows"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
