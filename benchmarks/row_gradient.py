"""What sync's and GBA's row-gradient rule does to AUC: global-mean (one big batch) against touched-mean.

    python -m benchmarks.row_gradient --json [--workers 4 --rows 40960 --batch-size 512 --orders 1]

The rule is how the aggregation divides a row's summed gradient (picasso/distributed/
aggregation.py): by the global batch's size B, as one Trainer step on the concatenated
batch does (global-mean, the default), or by the sizes of only the local batches that held
the row's id (touched-mean, this project's rule before sync followed one big batch): a row
one worker of W saw then steps up to W times harder. The dense weights are the same under
both, so the difference is the rare ids'.

Two data sets, each trained from a fresh model (rare ids matter most while a model is
young) by W workers in one process (benchmarks/gba_inprocess.py):
- planted: criteo:26, each worker its own planted stream, as benchmarks.gba_staleness;
  the AUC on --holdout rows of a planted stream no worker reads.
- churn: the churn stream (`churn:hashed`: its item field hashed into a fixed table, as
  sync needs; about 45 impressions an item, 2,500 items alive at a time), its batches dealt
  to the workers in stream order (worker r takes batches r, r + W, ...); the AUC on the
  --holdout rows that follow the trained ones, whose items are the ones alive then.
Per data set and rule: sync (round robin, every push fresh: M = W) and gba (M = W, the
default decay, each push landing --delay +- 2 turns after its pull, --orders seeds of the
turn order). Same start model, data and hyper-parameters in every run.

Ratios: auc_delta_global_vs_touched_<data> (sync's AUC under the default minus under
touched-mean: above 0, the default is better there) and the same for gba
(auc_delta_global_vs_touched_gba_<data>); the metrics carry every run's AUC.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from benchmarks.gba_inprocess import HOLDOUT_STREAM, Schedule, train
from benchmarks.harness import parse_args, report
from picasso.batch import PackedBatch, pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.distributed.aggregation import ROW_GRADIENTS
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted_batches import planted_batches
from picasso.spec import FeatureSpec
from picasso.spec_refs import load_spec
from picasso.connectors.synthetic.churn import ChurnModel
from picasso.trainer import TrainConfig, Trainer

STREAM_BASE = 100  # planted: worker r reads stream STREAM_BASE + r
DATA = {"planted": "criteo:26", "churn": "churn:hashed"}

SMOKE = {"workers": 2, "rows": 1024, "batch_size": 256, "holdout": 2048, "orders": 1}


@dataclass(frozen=True)
class Run:
    data: str
    mode: str  # sync | gba
    rule: str
    order: int | None
    auc: float


def _extra(parser) -> None:
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=40_960, help="samples per worker")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--delay", type=int, default=4, help="gba: turns between a pull and its push landing")
    parser.add_argument("--orders", type=int, default=1, help="gba: random turn orders per rule")
    parser.add_argument("--holdout", type=int, default=50_000)


def _packed(spec: FeatureSpec, table, source: str, batch_size: int) -> list[PackedBatch]:
    decoded = RecordDecoder(spec).decode_table(table, source).table
    plan = PackingPlan.from_spec(spec)
    return [pack(decoded.slice(at, batch_size), spec, plan, {source: at + batch_size})
            for at in range(0, decoded.num_rows, batch_size)]


def data_set(name: str, args) -> tuple[FeatureSpec, dict[int, list[PackedBatch]] | None, list[PackedBatch]]:
    """The spec, each worker's batches (None: planted_batches' own streams) and the held-out batches."""
    spec = load_spec(DATA[name])
    if name == "planted":
        return spec, None, list(planted_batches(spec, args.holdout, 4096, HOLDOUT_STREAM))
    trained = args.workers * args.rows
    table, _ = ChurnModel(spec).sample(0, trained + args.holdout)
    batches = _packed(spec, table.slice(0, trained), "churn", args.batch_size)
    dealt = {r: batches[r::args.workers] for r in range(args.workers)}
    return spec, dealt, _packed(spec, table.slice(trained), "churn-holdout", 4096)


def run(args, name: str, mode: str, rule: str, order: int | None) -> Run:
    spec, sources, holdout = data_set(name, args)
    config = TrainConfig(hidden=tuple(int(s) for s in args.hidden.split(",")), log_every=0, device="cpu")
    start = Trainer(spec, config)
    trained = train(start, mode, Schedule(args.workers, args.batch_size, args.rows, STREAM_BASE, order, args.delay),
                    rule, sources)
    evaluated = Trainer(spec, config)
    evaluated.model.load_state_dict(trained.model_state(start)["model"])
    return Run(name, mode, rule, order, evaluated.evaluate(holdout).auc)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], _extra, smoke=SMOKE)
    torch.set_num_threads(1)  # one torch thread, as each process of benchmarks.gba
    runs = []
    for name in DATA:
        for rule in ROW_GRADIENTS:
            runs.append(run(args, name, "sync", rule, None))
            runs += [run(args, name, "gba", rule, order) for order in range(args.orders)]
            print(f"{name} {rule}: " + ", ".join(f"{r.mode} {r.auc:.4f}" for r in runs if r.data == name
                                                 and r.rule == rule), flush=True)

    def mean_auc(name: str, mode: str, rule: str) -> float:
        return statistics.mean(r.auc for r in runs if (r.data, r.mode, r.rule) == (name, mode, rule))

    ratios, rows = {}, []
    for name in DATA:
        default, touched = ROW_GRADIENTS
        ratios[f"auc_delta_global_vs_touched_{name}"] = mean_auc(name, "sync", default) - mean_auc(name, "sync", touched)
        ratios[f"auc_delta_global_vs_touched_gba_{name}"] = (mean_auc(name, "gba", default)
                                                             - mean_auc(name, "gba", touched))
        rows += [[name, mode, f"{mean_auc(name, mode, default):.4f}", f"{mean_auc(name, mode, touched):.4f}",
                  f"{mean_auc(name, mode, default) - mean_auc(name, mode, touched):+.4f}"] for mode in ("sync", "gba")]
    metrics = {"runs": [asdict(r) for r in runs],
               "setup": {k: v for k, v in vars(args).items() if k not in ("json", "repeat")}}
    report("row_gradient", ["data", "mode", "global-mean auc", "touched-mean auc", "delta"], rows, ratios, metrics,
           args.json, caption=f"{args.workers} workers x {args.rows:,} samples from a fresh model; "
                              f"gba: {args.orders} order(s), pushes {args.delay} +- 2 turns late")


if __name__ == "__main__":
    main()
