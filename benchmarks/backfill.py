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
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.harness import parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import criteo_spec
from picasso.checkpoint import latest_checkpoint
from picasso.connectors.day_files import list_day_files
from picasso.connectors.decoders import RecordDecoder
from picasso.metrics import auc
from picasso.packing import PackingPlan
from picasso.pipelines.generate import dates_from, generate_days
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
    spec = criteo_spec()
    trainer = Trainer(spec, TrainConfig())  # the flags' defaults, as the runs used
    trainer.restore(latest_checkpoint(workdir / "checkpoints"))
    decoder, plan = RecordDecoder(spec), PackingPlan.from_spec(spec)
    labels, scores = [], []
    for path in list_day_files(data, date):
        table = decoder.decode_table(pq.read_table(path), path).table
        labels.append(table.column("label").to_numpy())
        scores.append(trainer.predict(pack(table, spec, plan)))
    return auc(np.concatenate(labels), np.concatenate(scores))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--days", type=int, default=30),
        p.add_argument("--rows", type=int, default=2_000, help="rows per day")))
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

    single = statistics.median(seconds for _, seconds in separate)
    metrics = {
        "days": len(days), "rows_per_day": args.rows,
        "separate_total_s": separate_total, "range_total_s": range_total,
        "range_first_partition_s": first_done, "range_s_per_partition_after_first": after_first,
        "single_daily_run_s": single, "rerun_total_s": rerun_total, "rerun_trained": rerun["trained"],
        "versions_in_date_order": in_order, "held_out_date": held_out,
        "auc_separate": separate_auc, "auc_range": range_auc, "auc_delta_vs_separate": range_auc - separate_auc,
        "range_partition_auc": [p["auc"] for p in partitions],
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
    report("backfill", ["", "range (one process)", "separate processes"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
