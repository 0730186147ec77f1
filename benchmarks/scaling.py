"""How cost grows with the work: step time and peak memory as the table grows, step time as
the fields grow, and both with the hot-row cache over a memory-mapped big tier.

Every case trains Wide&Deep (picasso's default model) through the real Trainer, on a spec
built here: 13 dense fields and F sparse fields of one embedding dim (--dim, default 16),
so that they pack into one table of R rows (R / F per field), trained by row-wise Adagrad
(picasso's `adagrad`: one slot per row; the wide part's dim-1 table over the same rows has
its own). Batches of 1,024 samples; each field's ids are Zipf(1.05) over its rows, ranks
scattered over the rows by a permutation (benchmarks.cache.ZipfStream), drawn afresh for
every step, so that no timed pass re-reads the rows an earlier pass brought into the CPU's
caches. Labels are random: learning is not measured here, only its cost.

Each case runs in a fresh process (so that its peak memory is its own), which first steps a
tiny model of the same shape (kernels loaded, threads and allocator warm: runtime, not
model memory) and draws its batches. Then the count starts: the process's resident set
(VmRSS) is taken as the base and its high-water mark (VmHWM) reset to it; the Trainer is
built (timed: `init_s`, the tables' uniform_ fill included), takes 10 untimed steps, then
--repeat timed passes of --steps steps each. Step time: the median pass's seconds over its
steps, with interleaving as picasso's default chooses it (`interleaved` in the metrics).

1. The table grows (--rows, default 1M, 10M, 100M at 26 fields).
   Metric `step_growth_1m_to_100m`: the step time at the largest size over the smallest
   (goal <= 1.5). Metric `memory_over_state_100m`: at the largest size, peak RSS growth
   (VmHWM at the end minus the base VmRSS, so everything the model and its training steps
   added: tables, slots, the dense part and Adam's state, the steps' tensors, allocator
   slack) over the bytes of every embedding table and optimizer slot (goal <= 1.1). The
   names carry the sizes the run had (`--smoke`: step_growth_20k_to_60k, ...).
2. The fields grow (--fields, default 26, 100, 400, 1,000), same batch, the same rows per
   field (--field-rows; by default the smallest table's, 38,461 at 1M rows and 26 fields, so
   that the first point is that table's case, run once): the table grows with the fields, as
   it does when a model gains fields, each field's ids and work per sample stay the same,
   and the step's growth is the fields' alone. Steps per pass shrink with the fields (at least 5)
   to keep a pass's work about even.
3. The hot-row cache (--cache-capacity, default 10%: picasso's default) with the big tier
   memory-mapped from files (CacheConfig.big_tier_dir, in a temporary folder under
   --big-tier-dir), at each table size of 1 (--cache-rows: which). Peak RSS there counts
   the mapped file's resident pages too (the kernel may drop those clean pages; they are
   not anonymous memory), so the sampled peak of anonymous memory (RssAnon, every 10 ms)
   and the anonymous memory left after the steps are reported beside it. Beside the
   cached cases, the disk's own rates under --big-tier-dir (benchmarks.disk_rates:
   `disk_write_mb_s`, `disk_read_mb_s` sequential, `disk_random_4k_write_mb_s` for pages
   written at random, as a step's write-back dirties them).

Ratios (higher means picasso is better): `step_flatness_A_to_B` (step at A over step at B:
1/growth), `state_over_memory_B` (1/memory_over_state), `cached_vs_uncached_step@R`
(uncached step over cached step), `cached_vs_uncached_anon_memory@R` (uncached over cached
anonymous memory after the steps: what the memory-mapped big tier saves), and
`per_field_flatness_F0_to_F1` (step per field at F0 over step per field at F1: above 1, a
field costs less as fields are added). A case whose estimated peak exceeds --memory-limit
(GiB), or 90% of MemAvailable as it would start, is skipped and named in the metrics.

Plots: benchmarks/plots/scaling_table.png (step time and memory against rows) and
scaling_fields.png (step time against fields); --smoke draws them in a temporary folder.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from rich.console import Console
from rich.progress import track

from benchmarks.cache import ZipfStream
from benchmarks.disk_rates import disk_rates
from benchmarks.harness import cpu_description, parse_args, report, sized
from picasso import kernels
from picasso.kernels import cpu as cpu_kernels
from picasso.batch import pack
from picasso.cache import CacheConfig
from picasso.embedding import PackedEmbedding
from picasso.packing import PackingPlan
from picasso.spec import DenseField, FeatureSpec, SparseField
from picasso.trainer import TrainConfig, Trainer

BATCH = 1024
ALPHA = 1.05
DENSE_FIELDS = 13
HIDDEN = (256, 128)
WARMUP_STEPS = 10
MIN_STEPS = 5
PLOTS = Path(__file__).resolve().parent / "plots"
MEMORY = ("peak_rss", "peak_anon", "final_anon", "final_file")  # MemoryWatch.stop's growths


@dataclass(frozen=True)
class Case:
    rows: int  # of the one packed table, over every field
    fields: int
    dim: int
    steps: int  # per timed pass
    repeat: int
    warmup: int  # untimed steps first
    cache: CacheConfig | None = None  # with big_tier_dir: where the temporary folder goes

    @property
    def same_as(self) -> str:
        """Cases equal in this are one case: the spec keeps rows // fields per field."""
        return repr(replace(self, rows=self.rows // self.fields * self.fields))

    @property
    def label(self) -> str:
        return f"{short(self.rows)}" + (" cached" if self.cache else "") + f", {self.fields} fields"


def short(n: int) -> str:
    """1_000_000 -> '1m', 20_000 -> '20k': the sizes in metric names."""
    for unit, size in (("m", 10**6), ("k", 10**3)):
        if n >= size and n % (size // 10) == 0:
            return f"{n / size:g}{unit}"
    return str(n)


def scaling_spec(rows: int, fields: int, dim: int) -> FeatureSpec:
    # vocab_size fields take integer ids as rows: the batches carry row indices, and no
    # hashing stands between the Zipf draw and the row it names.
    per_field = max(1, rows // fields)
    return FeatureSpec(name="scaling", label="label",
                       dense=tuple(DenseField(f"I{i + 1}") for i in range(DENSE_FIELDS)),
                       sparse=tuple(SparseField(f"C{i + 1}", embedding_dim=dim, vocab_size=per_field)
                                    for i in range(fields)))


def draw_batches(spec: FeatureSpec, count: int, seed: int) -> list:
    """`count` PackedBatches of BATCH samples, one-hot Zipf ids in every field."""
    plan = PackingPlan.from_spec(spec)
    per_field = spec.sparse[0].vocab_size
    stream = ZipfStream(per_field, per_field, ALPHA, seed)  # every field the same law over its own rows
    rng = np.random.default_rng(seed)
    one_each = pa.array(np.arange(BATCH + 1, dtype=np.int32))
    batches = []
    for _ in range(count):
        ids = stream.row_of_rank[stream.ranks(BATCH * len(spec.sparse))].reshape(BATCH, -1)
        columns = {"label": (rng.random(BATCH) < 0.25).astype(np.float32)}
        columns.update({f.name: rng.standard_normal(BATCH, dtype=np.float32) for f in spec.dense})
        columns.update({f.name: pa.ListArray.from_arrays(one_each, pa.array(ids[:, i]))
                        for i, f in enumerate(spec.sparse)})
        batches.append(pack(pa.table(columns), spec, plan))
    return batches


def train_config(cache: CacheConfig | None) -> TrainConfig:
    return TrainConfig(model="wide_deep", hidden=HIDDEN, sparse_optimizer="adagrad", log_every=0, cache=cache)


class MemoryWatch:
    """This process's memory from /proc/self/status, in bytes: `reset` makes the current
    resident set the base and the high-water mark; a thread samples anonymous memory,
    whose peak no counter of the kernel's keeps."""

    def __init__(self):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM drops to VmRSS: the warm-up's peak is not the model's
        self.base = self.read()
        self.peak_anon = self.base["RssAnon"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def read() -> dict[str, int]:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f)
        return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak_anon = max(self.peak_anon, self.read()["RssAnon"])

    def stop(self) -> dict[str, int]:
        """Growth over the base: peak RSS, peak and final anonymous memory, final file pages."""
        self._stop.set()
        self._thread.join()
        now = self.read()
        self.peak_anon = max(self.peak_anon, now["RssAnon"])
        base = self.base
        return {"peak_rss": now["VmHWM"] - base["VmRSS"], "peak_anon": self.peak_anon - base["RssAnon"],
                "final_anon": now["RssAnon"] - base["RssAnon"], "final_file": now["RssFile"] - base["RssFile"]}


def state_bytes(trainer: Trainer) -> int:
    """Bytes of every embedding table and its optimizer slots (memory-mapped or not)."""
    return sum(t.numel() * t.element_size() for e in trainer.model.modules() if isinstance(e, PackedEmbedding)
               for name, t in e.named_buffers() if name.startswith(("table_", "slot")))


def run_case(case: Case) -> dict:
    """One case, in a fresh process (see the module's docstring for what is counted)."""
    torch.manual_seed(0)
    warm = scaling_spec(case.fields * 8, case.fields, case.dim)
    Trainer(warm, train_config(None)).train(draw_batches(warm, 2, seed=1))
    spec = scaling_spec(case.rows, case.fields, case.dim)
    batches = draw_batches(spec, case.warmup + case.steps * case.repeat, seed=0)
    unique = statistics.mean(int(np.unique(ids).size) for b in batches[:20] for ids in b.to_torch().ids.values())
    gc.collect()
    big_tier = tempfile.TemporaryDirectory(prefix="picasso-scaling-", dir=case.cache.big_tier_dir) if case.cache \
        else nullcontext()
    with big_tier as folder:
        watch = MemoryWatch()
        start = time.perf_counter()
        trainer = Trainer(spec, train_config(replace(case.cache, big_tier_dir=folder) if case.cache else None))
        init_s = time.perf_counter() - start
        trainer.train(batches[:case.warmup])
        warmed = dict(trainer.stage_seconds)  # the stages' profile counts the timed steps only
        timed = batches[case.warmup:]
        passes = [timed[i * case.steps:(i + 1) * case.steps] for i in range(case.repeat)]
        seconds = statistics.median(trainer.train(p).seconds / len(p) for p in passes)
        memory = watch.stop()
        stages = {stage: (trainer.stage_seconds[stage] - warmed[stage]) / len(timed) for stage in warmed}
        fast_tier = sum(t.numel() * t.element_size() for tables in (trainer.cache.tables.values() if case.cache else ())
                        for table in tables for t in table.fast)
        return {"step_s": seconds, "init_s": init_s, "kernels": cpu_kernels.build_directory().name,
                "state": state_bytes(trainer), "fast_tier": fast_tier,
                "unique_ids_per_step": unique, "interleaved": float(trainer.interleaves), "stages_s": stages,
                # over every step, the warm-up's too: the cache starts cold
                "cache_hit_rate": trainer.cache.stats.hit_rate if case.cache else float("nan"), **memory}


def in_fresh_process(case: Case) -> dict:
    # spawn, not fork: a forked child would inherit the parent's pages and its threads' state.
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(run_case, case).result()


def estimated_peak(case: Case) -> int:
    """Bytes a case may need at its peak, before running it. Wide&Deep with row-wise
    Adagrad holds per row: the deep row and its slot, the wide row and its slot. With the
    cache, the tables are the mapped files (made on disk, picasso.big_tier: the pages the
    steps touch stay resident, up to the whole state), the fast tier holds its rows, and
    the hot-row directory keeps 4 bytes per row, and 128 per fast-tier slot in its
    count-min sketch (8 counters per slot, 4 deep)."""
    state = case.rows * (case.dim + 3) * 4
    if not case.cache:
        return state
    capacity = case.rows * 0.1  # the default share; a guess for other capacities
    return state + case.rows * 4 + int(capacity * (128 + (case.dim + 3) * 4))


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def plot(table: dict[str, list[tuple[int, dict]]], fields: list[tuple[int, dict]], folder: Path,
         caption: str) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display here
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    figure, (steps, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, points in table.items():
        rows = [r for r, _ in points]
        steps.plot(rows, [p["step_s"] * 1e3 for _, p in points], marker="o", label=name)
        memory.plot(rows, [p["peak_rss"] / 2**30 for _, p in points], marker="o", label=f"{name}: peak RSS")
        if name == "cached":
            memory.plot(rows, [p["peak_anon"] / 2**30 for _, p in points], marker="x", linestyle="--",
                        label=f"{name}: peak anonymous")
    state_points = table["uncached"] if "uncached" in table else next(iter(table.values()))
    memory.plot([r for r, _ in state_points], [p["state"] / 2**30 for _, p in state_points], color="gray",
                linestyle=":", label="tables + slots")
    steps.set(xscale="log", xlabel="rows of the table", ylabel="ms per step", title="step time", ylim=(0, None))
    memory.set(xscale="log", yscale="log", xlabel="rows of the table", ylabel="GiB over the base",
               title="peak memory growth")
    for axes in (steps, memory):
        axes.legend(fontsize=8)
        axes.grid(alpha=0.3)
    figure.suptitle(caption, fontsize=8)
    figure.tight_layout()
    paths = [folder / "scaling_table.png", folder / "scaling_fields.png"]
    figure.savefig(paths[0], dpi=110)
    plt.close(figure)

    figure, (steps, per_field) = plt.subplots(1, 2, figsize=(11, 4.2))
    counts = [f for f, _ in fields]
    steps.plot(counts, [p["step_s"] * 1e3 for _, p in fields], marker="o")
    per_field.plot(counts, [p["step_s"] * 1e6 / f for f, p in fields], marker="o")
    steps.set(xscale="log", yscale="log", xlabel="sparse fields", ylabel="ms per step", title="step time")
    per_field.set(xscale="log", xlabel="sparse fields", ylabel="µs per step per field", title="step time per field",
                  ylim=(0, None))
    for axes in (steps, per_field):
        axes.grid(alpha=0.3)
    figure.suptitle(caption, fontsize=8)
    figure.tight_layout()
    figure.savefig(paths[1], dpi=110)
    plt.close(figure)
    return paths


def main() -> None:
    def extra(parser):
        parser.add_argument("--rows", default="1000000,10000000,100000000", help="table sizes (rows), comma-separated")
        parser.add_argument("--table-fields", type=int, default=26, help="sparse fields of the table sweep")
        parser.add_argument("--fields", default="26,100,400,1000", help="field counts of the field sweep")
        parser.add_argument("--field-rows", type=int, default=None,
                            help="rows per field in the field sweep (default: the smallest table's per field)")
        parser.add_argument("--dim", type=int, default=16, help="embedding dim of every field")
        parser.add_argument("--steps", type=int, default=100, help="steps per timed pass (table sweep; and at the "
                                                                   "first field count, fewer after)")
        parser.add_argument("--cache-capacity", default="10%", help="the hot-row cache's fast tier; off: no cache runs")
        parser.add_argument("--cache-rows", default="all", help="table sizes that also run with the cache: all, "
                                                                "or sizes, comma-separated")
        parser.add_argument("--big-tier-dir", default=None, help="where the memory-mapped big tier's temporary "
                                                                  "folder goes (default: the system's temp)")
        parser.add_argument("--memory-limit", type=float, default=None,
                            help="GiB a case may need at its peak; larger cases are skipped (and always those "
                                 "over 90%% of MemAvailable when they would start)")
        parser.add_argument("--plots", default=str(PLOTS), help="folder of the PNG plots")
        parser.set_defaults(repeat=3)

    # --smoke: two small tables and two field counts, a few steps each; the cache at the
    # largest table only. Each case is a process of its own, whose start is most of the time.
    args = parse_args(__doc__.splitlines()[0], extra,
                      smoke={"rows": "20000,60000", "fields": "4,8", "table_fields": 4,
                             "dim": 8, "steps": 3, "repeat": 1, "cache_rows": "60000"})
    kernels.backend_for(torch.device("cpu"))  # build or load the C++ kernels once, before any child
    cases = plan_cases(args)
    results, done, skipped = {}, {}, []
    progress = Console(stderr=True)  # stdout's last line is the JSON
    for key, case in track(cases.items(), description="scaling cases", console=progress):
        # What is free now, not at the start: the machine may be shared.
        limit = min(args.memory_limit * 2**30 if args.memory_limit else float("inf"), 0.9 * available_bytes())
        need = estimated_peak(case)
        if need > limit:
            skipped.append(f"{case.label} (needs ~{need / 2**30:.1f} GiB, limit {limit / 2**30:.1f})")
        elif case.same_as in done:  # the field sweep's first point may be the table sweep's first
            results[key] = done[case.same_as]
        else:
            results[key] = done[case.same_as] = in_fresh_process(case)
            progress.print(f"{case.label}: {results[key]['step_s'] * 1e3:.2f} ms/step, peak RSS growth "
                           f"{results[key]['peak_rss'] / 2**20:,.0f} MiB")

    ratios, metrics = summarise(cases, results)
    if any(kind == "cached" for kind, _ in results):
        # The limit a big tier on disk can approach, on the disk it ran on.
        metrics.update(disk_rates(args.big_tier_dir, size=sized(args, 1 << 30, 16 << 20),
                                  random_pages=sized(args, 20_000, 500)))
    first = {}  # a case run once shows once in the table
    for key in results:
        first.setdefault(cases[key].same_as, key)
    metrics.update(dim=args.dim, batch=BATCH, model="wide_deep", sparse_optimizer="adagrad (row-wise)",
                   cache_capacity=args.cache_capacity, table_fields=args.table_fields)
    if skipped:
        metrics["skipped"] = "; ".join(skipped)
    caption = (f"picasso Wide&Deep, batch {BATCH}, dim {args.dim}, row-wise Adagrad, Zipf({ALPHA}) ids; "
               f"{' '.join(['python -m benchmarks.scaling', *sys.argv[1:]])}; {cpu_description()}")
    table = {kind: [(size, r) for (k, size), r in results.items() if k == kind] for kind in ("uncached", "cached")}
    fields = [(size, r) for (k, size), r in results.items() if k == "fields"]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(sized(args, args.plots, scratch))  # a smoke run's plots mean nothing: never over the real ones
        if table["uncached"] and fields:
            metrics["plots"] = ", ".join(str(p) for p in plot(table, fields, folder, caption))
    report("scaling", ["case", "rows", "ms/step", "init s", "tables+slots MiB", "peak RSS growth MiB",
                       "peak anon MiB", "anon after MiB", "peak RSS/state", "cache hits", "stages, ms/step"],
           [table_row(cases[key], r) for key, r in results.items() if key == first[cases[key].same_as]], ratios,
           metrics, args.json,
           caption=f"batch {BATCH}, dim {args.dim}, Wide&Deep, row-wise Adagrad, Zipf({ALPHA}); memory: growth "
                   f"over the process before the Trainer was built")


def plan_cases(args) -> dict[tuple[str, int], Case]:
    """(kind, size) -> Case: ("uncached", rows), ("cached", rows), ("fields", fields)."""
    sizes = [int(r) for r in args.rows.split(",")]
    cached_sizes = [] if args.cache_capacity == "off" else \
        sizes if args.cache_rows == "all" else [int(r) for r in args.cache_rows.split(",")]
    cache = CacheConfig(capacity=args.cache_capacity, big_tier_dir=args.big_tier_dir)
    warmup = sized(args, WARMUP_STEPS, 2)
    table = partial(Case, fields=args.table_fields, dim=args.dim, steps=args.steps, repeat=args.repeat, warmup=warmup)
    cases = {("uncached", rows): table(rows) for rows in sizes}
    cases.update({("cached", rows): table(rows, cache=cache) for rows in cached_sizes})
    counts = [int(f) for f in args.fields.split(",")]
    per_field = args.field_rows or sizes[0] // args.table_fields
    for f in counts:
        # Fewer steps as the fields grow: a pass's work stays about even.
        steps = max(min(MIN_STEPS, args.steps), args.steps * counts[0] // f)
        cases["fields", f] = Case(f * per_field, f, args.dim, steps, args.repeat, warmup)
    return cases


def summarise(cases: dict[tuple[str, int], Case], results: dict[tuple[str, int], dict]) -> tuple[dict, dict]:
    """The ratios (higher: picasso better) and the metrics of the module's docstring."""
    ratios, metrics = {}, {}
    for (kind, size), r in results.items():
        at = f"{size}fields" if kind == "fields" else short(size) + ("_cached" if kind == "cached" else "")
        metrics.update({f"step_ms@{at}": r["step_s"] * 1e3, f"init_s@{at}": r["init_s"],
                        f"state_mb@{at}": r["state"] / 2**20, f"unique_ids_per_step@{at}": r["unique_ids_per_step"],
                        f"interleaved@{at}": r["interleaved"], f"rows@{at}": cases[kind, size].rows,
                        # the C++ kernels' build: another build between cases (sources edited) shows here
                        f"kernels@{at}": r["kernels"]})
        metrics.update({f"{name}_mb@{at}": r[name] / 2**20 for name in MEMORY})
        metrics.update({f"{stage}_ms_per_step@{at}": s * 1e3 for stage, s in r["stages_s"].items()})
        if kind == "cached":
            metrics[f"cache_hit_rate@{at}"] = r["cache_hit_rate"]
            metrics[f"fast_tier_mb@{at}"] = r["fast_tier"] / 2**20
    uncached = [(size, r) for (kind, size), r in results.items() if kind == "uncached"]
    if len(uncached) >= 2:
        (first, small), (last, big) = uncached[0], uncached[-1]
        growth = big["step_s"] / small["step_s"]
        metrics[f"step_growth_{short(first)}_to_{short(last)}"] = growth
        ratios[f"step_flatness_{short(first)}_to_{short(last)}"] = 1 / growth
    if uncached:
        last, big = uncached[-1]
        metrics[f"memory_over_state_{short(last)}"] = big["peak_rss"] / big["state"]
        ratios[f"state_over_memory_{short(last)}"] = big["state"] / big["peak_rss"]
    for (kind, size), r in results.items():
        plain = results.get(("uncached", size))
        if kind == "cached" and plain:
            ratios[f"cached_vs_uncached_step@{short(size)}"] = plain["step_s"] / r["step_s"]
            ratios[f"cached_vs_uncached_anon_memory@{short(size)}"] = plain["final_anon"] / r["final_anon"]
    fields = [(size, r) for (kind, size), r in results.items() if kind == "fields"]
    if len(fields) >= 2:
        (f0, a), (f1, b) = fields[0], fields[-1]
        ratios[f"per_field_flatness_{f0}_to_{f1}"] = (a["step_s"] / f0) / (b["step_s"] / f1)
    return ratios, metrics


def table_row(case: Case, r: dict) -> list:
    stages = ", ".join(f"{stage} {s * 1e3:.1f}" for stage, s in r["stages_s"].items() if s >= 5e-5)
    mib = [f"{r[name] / 2**20:,.0f}" for name in ("state", "peak_rss", "peak_anon", "final_anon")]
    hits = f"{r['cache_hit_rate']:.3f}" if case.cache else ""
    return [case.label, f"{case.rows:,}", f"{r['step_s'] * 1e3:.2f}", f"{r['init_s']:.1f}", *mib,
            f"{r['peak_rss'] / r['state']:.3f}", hits, stages]


if __name__ == "__main__":
    main()
