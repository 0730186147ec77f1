"""What staleness costs GBA's AUC, without the scheduler's noise: sync, GBA and plain async in one process.

    python -m benchmarks.gba_staleness --json [--workers 4 --rows 81920 --warm-rows 245760
                                               --delay 4 --orders 4 --lr-dense 1e-3 --lr-sparse 0.05]

benchmarks.gba runs the real thing (processes, RPC, a straggler), but there the order in
which pushes land is the scheduler's, and it alone moves one GBA run's AUC by up to 0.002
from a fresh model. This one takes
the order into its own hands (benchmarks/gba_inprocess.py): W workers take turns in one
process, and each push lands --delay +- 2 turns after its pull.
- sync:  M = W, round robin, every push at once: a sync step.
- gba:   M = W, the default decay, pushes delayed and the turns shuffled: one run per
         --orders seed.
- async: M = 1, no decay, the same delayed, shuffled pushes.
--delay 4 gives the staleness the real runs measure (gba 0.7 global steps, async 2.8 of its
smaller steps). Every mode starts from the same model (with --warm-rows, one trained in sync
on that many samples per worker of streams of its own, its optimizer state included: a
continuous-training job switching modes; with 0, a fresh one) and trains on the same
W x --rows planted samples with the same hyper-parameters. The AUC is on 50,000 held-out
planted rows, as in benchmarks.gba.

Ratios (GBA's, means over the orders): auc_delta_vs_sync and auc_delta_vs_async; the
metrics carry every run. Measured figures: README.md, "Distributed training" (What to expect).
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.gba_inprocess import HOLDOUT_STREAM, JITTER, WARM_STREAM_BASE, Schedule, train, warm_up
from benchmarks.harness import parse_args, report
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

STREAM_BASE = 100  # worker r reads planted stream STREAM_BASE + r, as benchmarks.gba's first repeat


@dataclass(frozen=True)
class Run:
    mode: str
    order: int | None  # the seed of the turn order and delays (None: round robin, no delay)
    auc: float
    staleness: float  # mean global steps between a push's pull and its landing
    steps: int  # global steps this run took


SMOKE = {"workers": 2, "rows": 1024, "warm_rows": 1024, "batch_size": 256, "orders": 1, "holdout": 2048}  # --smoke


def _extra(parser) -> None:
    parser.add_argument("--spec", default="criteo:26")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=81_920, help="samples per worker")
    parser.add_argument("--warm-rows", type=int, default=245_760,
                        help="train every mode's start model in sync first, on this many samples per worker "
                        "(0: start from a fresh model)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--lr-dense", type=float, default=TrainConfig.lr_dense)
    parser.add_argument("--lr-sparse", type=float, default=TrainConfig.lr_sparse)
    parser.add_argument("--delay", type=int, default=4, help=f"turns between a pull and its push landing (>= {JITTER})")
    parser.add_argument("--orders", type=int, default=4, help="random turn orders per delayed mode")
    parser.add_argument("--holdout", type=int, default=50_000)


def _start(args, base: str | None) -> Trainer:
    trainer = Trainer(load_spec(args.spec), TrainConfig(hidden=tuple(int(s) for s in args.hidden.split(",")),
                                                        lr_dense=args.lr_dense, lr_sparse=args.lr_sparse,
                                                        log_every=0, device="cpu"))
    if base is not None:
        trainer.restore(base)
    return trainer


def run(args, mode: str, order: int | None, holdout: list, base: str | None) -> Run:
    start = _start(args, base)
    trained = train(start, mode, Schedule(args.workers, args.batch_size, args.rows, STREAM_BASE, order, args.delay))
    evaluated = _start(args, None)
    evaluated.model.load_state_dict(trained.model_state(start)["model"])
    return Run(mode, order, evaluated.evaluate(holdout).auc, trained.staleness, trained.shard.control.step - start.step)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _extra, smoke=SMOKE)
    if args.delay < JITTER:
        raise SystemExit(f"error: --delay must be >= {JITTER}")
    torch.set_num_threads(1)  # one torch thread, as each process of benchmarks.gba
    holdout = list(planted_batches(load_spec(args.spec), args.holdout, 4096, HOLDOUT_STREAM))
    with tempfile.TemporaryDirectory(prefix="gba-staleness-") as tmp:
        base = warm_up(_start(args, None), args.workers, args.batch_size, args.warm_rows, WARM_STREAM_BASE,
                       Path(tmp)) if args.warm_rows else None
        runs = [run(args, "sync", None, holdout, base)]
        for order in range(args.orders):
            runs += [run(args, mode, order, holdout, base) for mode in ("gba", "async")]
            print(f"order {order}: " + ", ".join(f"{r.mode} {r.auc:.4f}" for r in runs[-2:]), flush=True)
    by_mode = {mode: [r for r in runs if r.mode == mode] for mode in ("sync", "gba", "async")}
    mean_auc = {mode: statistics.mean(r.auc for r in done) for mode, done in by_mode.items()}
    ratios = {"auc_delta_vs_sync": mean_auc["gba"] - mean_auc["sync"],
              "auc_delta_vs_async": mean_auc["gba"] - mean_auc["async"]}
    rows = [[mode, len(done), f"{mean_auc[mode]:.4f}",
             f"{statistics.stdev(r.auc for r in done):.4f}" if len(done) > 1 else "",
             f"{min(r.auc for r in done):.4f}-{max(r.auc for r in done):.4f}",
             f"{statistics.mean(r.staleness for r in done):.2f}", done[0].steps]
            for mode, done in by_mode.items()]
    metrics = {"mean_auc": mean_auc, "runs": [asdict(r) for r in runs],
               "setup": {k: v for k, v in vars(args).items() if k not in ("json", "repeat")}}
    start = f"{args.warm_rows:,} sync samples per worker" if args.warm_rows else "a fresh model"
    report("gba_staleness", ["mode", "runs", "mean auc", "stdev", "range", "staleness", "global steps"], rows,
           ratios, metrics, args.json,
           caption=f"from {start}; pushes land {args.delay} +- {JITTER} turns after their pull")


if __name__ == "__main__":
    main()
