"""Dynamic tables against fixed hashed tables of equal bytes, on a stream whose items churn.

Quality. The churn data set (picasso.connectors.synthetic.churn): new item ids arrive all the time
and old ones fade, each with its own planted effect. Two settings of it, over the same
stream of --days days of 100,000 rows, with about 2,500 items alive at a time in both:
- 45 impressions (the defaults of `picasso generate --churn`): each churning item gets
  about 45 impressions over its life;
- 9 impressions (birth_interval 10, lifetime 8,000 positions: the defaults before): items
  churn five times faster, and at about 9 impressions neither table learns an item's
  effect, so sharing its row costs little.
--impressions picks one or both (the default). On each, Wide&Deep trains twice, batch
after batch in stream order, with the same seed, optimizer and learning rates:
- picasso: the `churn` spec, whose item field is a dynamic table of CHURN_CAPACITY rows
  (admission at an id's second impression, eviction of rows unseen for 8 steps);
- baseline: the same spec with the item field hashed into as many buckets as the dynamic
  table's bytes pay for: its rows and default row with their optimizer slots, in the deep
  and the wide embedding, plus its id map (index, row keys, stamps, counts, free list and
  admission sketch). A bucket costs the same rows and slots. Both are counted from the
  trained models' tensors and printed.
Both are scored test-then-train (progressive validation, as a stream is judged): each
batch is scored before the model trains on it, and the AUC is over every batch after the
first day. The two models take turns, batch by batch. `auc_delta_vs_hashed_equal_bytes`
is picasso's AUC minus the baseline's on the 45-impression stream
(`auc_delta_vs_hashed_equal_bytes_9_impressions` on the other). Beside it:
`colliding_share_alive`, the share of the ids alive at a time whose bucket holds another
id alive then (see colliding_share_alive), and `default_row_share`, the share of the
dynamic table's lookups that went to its shared default row (ids not admitted yet, or
refused a row).

Speed. `dynamic_vs_hashed_step`: the baseline's median training step time over picasso's,
in those same runs (the dynamic step maps its ids, admits and evicts).
`vs_vectorised_hash` and `vs_python_dict`: the map's lookups per second on one core
against pandas' Index.get_indexer and against a Python loop over a dict
(benchmarks.id_map_lookups).

Bounded memory. One dynamic field of --memory-capacity rows meets 10x as many distinct
ids, a batch at a time, in a fresh process. Reported: the most rows ever in use (never above the capacity),
and the growth of the process's resident memory over the model's tables, slots and map
(`rss_vs_model`, which should stay within 1.2).

--smoke: two short days, a small bounded-memory run and a small lookup map, to check the
benchmark runs; its figures mean nothing.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import resource
import statistics
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from benchmarks import id_map_lookups
from benchmarks.harness import parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import CHURN_CAPACITY, churn_spec
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels.hashing import hash_to_buckets
from picasso.metrics import auc
from picasso.packing import PackingPlan
from picasso.spec import DynamicTable, FeatureSpec, SparseField
from picasso.connectors.synthetic.churn import ITEM_FIELD, ChurnConfig, ChurnModel
from picasso.trainer import TrainConfig, Trainer

BATCH = 2048
ROWS_PER_DAY = 100_000
SMOKE_ROWS_PER_DAY = 2 * BATCH
# The churn settings, by the impressions a churning item gets over its life
# ((1 - popular_share) x birth_interval). Both keep lifetime / birth_interval, and so the
# items alive at a time (ChurnConfig.alive_items), the same: only how long each stays differs.
SETTINGS = {45: ChurnConfig(), 9: ChurnConfig(birth_interval=10, lifetime=8_000.0)}
DEFAULT_IMPRESSIONS = 45  # ChurnConfig's defaults


@dataclass(frozen=True)
class ItemBytes:
    """What a model's item field takes in memory, from its tensors."""

    rows: int  # rows of the field, the dynamic table's default row included
    row_bytes: int  # those rows and their optimizer slots, in every embedding (deep and wide)
    map_bytes: int  # the dynamic table's id map (every buffer of it training keeps); 0 when hashed

    @property
    def total(self) -> int:
        return self.row_bytes + self.map_bytes


def item_bytes(trainer: Trainer) -> ItemBytes:
    group = next(g for g in trainer.plan.groups if ITEM_FIELD in g.fields)
    position = group.fields.index(ITEM_FIELD)
    bounds = [*group.row_offsets, group.num_rows]
    rows = bounds[position + 1] - bounds[position]
    row_bytes = 0
    for embedding in trainer.model.embeddings():
        for tensor in (embedding.tables[group.name], *embedding.slots(group.name)):
            row_bytes += rows * tensor[0].numel() * tensor.element_size()  # a row's share: its slice of dim 0
    maps = getattr(trainer.model, "dynamic_rows", None)
    item_map = next((m for m in maps.maps if m.field.name == ITEM_FIELD), None) if maps is not None else None
    map_bytes = sum(b.numel() * b.element_size() for b in item_map.buffers()) if item_map is not None else 0
    return ItemBytes(rows, row_bytes, map_bytes)


def hashed_spec_of_equal_bytes(dynamic: FeatureSpec, config: TrainConfig) -> FeatureSpec:
    """The churn spec hashed into as many item buckets as the dynamic spec's item rows,
    slots and map take bytes (rounded down: the hashed table never gets more)."""
    budget = item_bytes(Trainer(dynamic, config)).total
    probe = item_bytes(Trainer(churn_spec(hashed=True), config))
    buckets = budget * probe.rows // probe.row_bytes
    return churn_spec(capacity=buckets - 1, hashed=True)  # capacity + 1 buckets


def churn_batches(spec: FeatureSpec, table: pa.Table) -> list:
    decoded = RecordDecoder(spec).decode_table(table, "churn")
    assert not decoded.dead_letters, decoded.dead_letters[:3]
    plan = PackingPlan.from_spec(spec)
    return [pack(decoded.table.slice(start, BATCH), spec, plan, {"churn": start + BATCH})
            for start in range(0, decoded.table.num_rows, BATCH)]


def test_then_train(trainers: list[Trainer], batches: list[list], warmup_rows: int) -> list[dict]:
    """Score each batch, then train on it, one trainer per packing of the same rows; the
    AUC over batches past `warmup_rows`. The models take turns batch by batch, so that
    whatever else the machine does weighs on their step times alike."""
    labels, scores, step_seconds = ([[] for _ in trainers] for _ in range(3))
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
                  "step_s": statistics.median(seconds[len(seconds) // 10:]),  # past the first steps' warm-up
                  "bytes": item_bytes(trainer)}
        if "dynamic_rows" in trainer.model._modules:
            result.update(trainer.model.dynamic_rows.metrics())
        results.append(result)
    return results


def share_sharing_a_bucket(buckets: np.ndarray) -> float:
    """Given the buckets of distinct ids, the share of them whose bucket holds another."""
    _, inverse, counts = np.unique(buckets, return_inverse=True, return_counts=True)
    return float((counts[inverse] > 1).mean())


def colliding_share_alive(item_ids: np.ndarray, buckets: int, window_rows: int, from_row: int) -> float:
    """The share of the ids alive at a time whose bucket holds another id alive then.

    Alive at a batch: seen within the `window_rows` rows that end with that batch. Sized
    as the rows over which the dynamic table keeps an id (the batch, and the
    evict_after_steps batches before it, whose rows expiry spares), these are the ids that
    compete for the hashed table's rows at once. One-off ids count too: the dynamic table
    sends them to its default row, the hashed table to a bucket another id may hold.
    Averaged over the batches scored (those starting at `from_row` or later)."""
    bucket_of_row = hash_to_buckets(pa.array(item_ids), buckets)
    shares = []
    first_scored = -(-from_row // BATCH) * BATCH  # test_then_train scores a batch that starts at from_row or later
    for batch_start in range(first_scored, item_ids.size, BATCH):
        end = min(batch_start + BATCH, item_ids.size)
        start = max(0, end - window_rows)
        _, first = np.unique(item_ids[start:end], return_index=True)
        shares.append(share_sharing_a_bucket(bucket_of_row[start:end][first]))
    return float(np.mean(shares))


def colliding_share_ever_seen(item_ids: np.ndarray, buckets: int) -> float:
    """Of every distinct id the stream ever carries, the share whose bucket holds another
    of them (most of which were never alive at the same time: see colliding_share_alive)."""
    return share_sharing_a_bucket(hash_to_buckets(pa.array(np.unique(item_ids)), buckets))


def quality_and_speed(churn: ChurnConfig, days: int, rows_per_day: int, seed: int) -> dict:
    config = TrainConfig(seed=seed, log_every=0, interleave=False)
    dynamic = churn_spec()
    hashed = hashed_spec_of_equal_bytes(dynamic, config)
    table, _ = ChurnModel(dynamic, dataclasses.replace(churn, seed=seed)).sample(0, days * rows_per_day)
    item_ids = table.column(ITEM_FIELD).to_numpy()
    ours, theirs = test_then_train([Trainer(dynamic, config), Trainer(hashed, config)],
                                   [churn_batches(dynamic, table), churn_batches(hashed, table)], rows_per_day)
    buckets = hashed.sparse_field(ITEM_FIELD).hash_buckets
    window = (dynamic.sparse_field(ITEM_FIELD).dynamic.evict_after_steps + 1) * BATCH
    return {"ours": ours, "theirs": theirs, "distinct_items": int(np.unique(item_ids).size), "buckets": buckets,
            "colliding_share_alive": colliding_share_alive(item_ids, buckets, window, rows_per_day),
            "colliding_share_ever_seen": colliding_share_ever_seen(item_ids, buckets),
            "default_row_share": ours["dynamic_item_default_lookups"] / ours["dynamic_item_lookups"]}


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


def setting_figures(impressions: int, run: dict, suffix: str) -> tuple[dict, dict]:
    """One churn setting's ratio and metrics, their names ending in `suffix`."""
    ours, theirs = run["ours"], run["theirs"]
    ratios = {f"auc_delta_vs_hashed_equal_bytes{suffix}": ours["auc"] - theirs["auc"]}
    metrics = {"impressions_per_item": impressions, "auc": ours["auc"], "hashed_auc": theirs["auc"],
               "step_s": ours["step_s"], "hashed_step_s": theirs["step_s"], "distinct_items": run["distinct_items"],
               "hashed_buckets": run["buckets"], "colliding_share_alive": run["colliding_share_alive"],
               "colliding_share_ever_seen": run["colliding_share_ever_seen"],
               "default_row_share": run["default_row_share"], "dynamic_row_bytes": ours["bytes"].row_bytes,
               "dynamic_map_bytes": ours["bytes"].map_bytes, "hashed_row_bytes": theirs["bytes"].row_bytes,
               **{k: v for k, v in ours.items() if k.startswith("dynamic_")}}
    return ratios, {f"{k}{suffix}": v for k, v in metrics.items()}


def setting_rows(runs: dict[int, dict]) -> list[list]:
    """The quality table: a row per figure, two columns (dynamic, hashed) per setting."""
    def cells(run: dict) -> list[list[str]]:
        ours, theirs = run["ours"], run["theirs"]
        mib = 2**20
        return [
            [f"{ours['auc']:.4f}", f"{theirs['auc']:.4f}"],
            [f"{ours['step_s'] * 1e3:.2f}", f"{theirs['step_s'] * 1e3:.2f}"],
            [f"{ours['bytes'].row_bytes / mib:.3f} + map {ours['bytes'].map_bytes / mib:.3f} "
             f"= {ours['bytes'].total / mib:.3f}", f"{theirs['bytes'].total / mib:.3f}"],
            [f"{CHURN_CAPACITY:,} + 1 default", f"{run['buckets']:,} buckets"],
            [f"{run['distinct_items']:,}", f"{run['distinct_items']:,}"],
            [f"{run['default_row_share']:.2%} of lookups on the default row",
             f"{run['colliding_share_alive']:.1%} alive / {run['colliding_share_ever_seen']:.1%} ever"],
            [f"{ours['dynamic_item_admitted']:,.0f} / {ours['dynamic_item_evicted_by_age']:,.0f} / "
             f"{ours['dynamic_item_evicted_when_full']:,.0f}", ""],
        ]

    labels = ["AUC, test-then-train after day 1", "training step (median ms)", "item rows + slots (+ map), MiB",
              "item rows", "distinct items in the stream", "sharing: default row / ids alive (ever) sharing a bucket",
              "admitted / evicted by age / when full"]
    columns = [cells(run) for run in runs.values()]
    return [[label, *(cell for column in columns for cell in column[i])] for i, label in enumerate(labels)]


def main() -> None:
    def extra(parser):
        parser.add_argument("--days", type=int, default=10, help=f"days of {ROWS_PER_DAY:,} churning rows")
        parser.add_argument("--impressions", type=int, nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS,
                            reverse=True), help="the churn settings to run, by impressions per item (default: both)")
        parser.add_argument("--memory-capacity", type=int, default=300_000, help="rows of the bounded-memory run")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--smoke", action="store_true",
                            help="two short days, small maps: checks the benchmark runs, its figures mean nothing")

    args = parse_args(__doc__.splitlines()[0], extra)
    days, rows_per_day = (2, SMOKE_ROWS_PER_DAY) if args.smoke else (args.days, ROWS_PER_DAY)
    memory_capacity = 2_000 if args.smoke else args.memory_capacity

    runs = {}
    for impressions in args.impressions:
        torch.manual_seed(args.seed)
        runs[impressions] = quality_and_speed(SETTINGS[impressions], days, rows_per_day, args.seed)
    lookups = id_map_lookups.measure(args.repeat, id_map_lookups.SMOKE if args.smoke else id_map_lookups.FULL)
    # In a process of its own: memory the runs above freed would otherwise be reused, and
    # the growth it measures would read low.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        memory = pool.apply(bounded_memory, (memory_capacity, 8192, args.seed))

    ratios, metrics = {}, {"capacity": CHURN_CAPACITY, "rows": days * rows_per_day}
    for impressions, run in runs.items():
        # The data set's defaults name the plain figures; the other setting's carry its name.
        suffix = "" if impressions == DEFAULT_IMPRESSIONS else f"_{impressions}_impressions"
        setting_ratios, setting_metrics = setting_figures(impressions, run, suffix)
        ratios.update(setting_ratios)
        metrics.update(setting_metrics)
    ours, theirs = runs[args.impressions[0]]["ours"], runs[args.impressions[0]]["theirs"]  # for the step times
    ratios.update({"dynamic_vs_hashed_step": theirs["step_s"] / ours["step_s"],
                   "vs_vectorised_hash": lookups["vs_vectorised_hash"], "vs_python_dict": lookups["vs_python_dict"]})
    metrics.update({**lookups, **{f"memory_{k}": v for k, v in memory.items()}})

    blank = [""] * (2 * len(runs) - 1)
    rows = setting_rows(runs) + [
        ["map lookups/s, one core: find / pandas get_indexer / Python dict",
         f"{lookups['zipf_find_lookups_per_s'] / 1e6:.1f}M / {lookups['zipf_vectorised_hash_lookups_per_s'] / 1e6:.1f}M"
         f" / {lookups['zipf_python_dict_lookups_per_s'] / 1e6:.1f}M", *blank],
        [f"{memory['distinct_ids']:,} ids into {memory['capacity']:,} rows: most rows in use",
         f"{memory['most_rows_in_use']:,}", *blank],
        ["resident memory grown / model bytes", f"{memory['rss_growth_bytes'] / 2**20:.1f} MiB / "
         f"{memory['model_bytes'] / 2**20:.1f} MiB = {memory['rss_vs_model']:.2f}", *blank],
    ]
    columns = [""] + [f"{side}, {impressions} impressions" for impressions in runs
                      for side in ("picasso (dynamic)", "hashed, equal bytes")]
    report("dynamic", columns, rows, ratios, metrics, args.json,
           caption=f"{days} days of {rows_per_day:,} rows, batches of {BATCH:,}")


if __name__ == "__main__":
    main()
