"""End-to-end training throughput: raw rows in, a trained model out, against what a user
would run instead.

For Wide&Deep and DLRM at 39 and 400 fields, side by side on the same rows, model, initial
weights, optimizers and learning rates (batch 1024, MLPs 256-128, Adam 1e-3 on the dense
weights, element-wise Adagrad 0.05 on the embeddings: the optimizer TorchRec runs fastest
on this CPU, see benchmarks.packing), each contender starting from raw Arrow record
batches, decoding included:
- naive: row dicts collated one value at a time, one nn.EmbeddingBag per field and part;
- plain: a competent PyTorch loop, columnar collation from Arrow, one nn.EmbeddingBag per
  field and part with offsets;
- torchrec: TorchRec's FusedEmbeddingBagCollection fed KeyedJaggedTensors built from the
  Arrow batches ('absent' when torchrec is not installed; the recipe is in the README);
  (the three rivals: benchmarks/train_rivals.py)
- picasso: RecordDecoder + pack in one pass (PackingDecoder; with crosses, one after the
  other), then Trainer.train with its defaults (no hot-row cache: on a CPU its fast tier
  would be the same memory; interleaving where it pays, interleave.worth_interleaving), and
  the same with interleaving the other way (on where the default is off,
  `picasso_interleaved`; off where it is on, as under `OMP_NUM_THREADS=1 taskset -c 0,1`:
  `picasso_not_interleaved`). `--cache CAPACITY`
  gives every picasso run the hot-row cache (`--cache-capacity`'s values: rows, bytes or a
  share of each table, e.g. 10%), to measure interleaving where a step also stages rows
  and refreshes the cache (picasso_cache_hit_rate@F in the metrics);
- dense only: the dense part alone stepped on ready-made inputs of the same shapes, the
  compute no data path avoids: the limit;
- picasso with crosses (Wide&Deep): the same run on the spec with `--crosses N` feature
  crosses of pairs of its sparse fields (C1 x C2, C3 x C4, ...; the spec's `crosses:`,
  feeding the wide part, 100,000 hash buckets each), decoded, packed and trained with the
  rest: crosses_step@F, its samples/s over picasso's without them (1/1.15 = 0.87: a step
  at most 15% longer).

The comparison runs in one precision (--precision, default fp32, so that the figures compare
across machines; picasso's own default, auto, takes bf16 where the CPU has it): the rivals'
dense part then runs under the same autocast as picasso's. picasso also runs in the
other precision, for bf16_vs_fp32@F.

Every contender gets the same warm-up (its first 5 batches, untimed) and the same
repetitions (--repeat, default 3, in turns, so that a busy moment slows all alike); the
median samples/s counts. Each is checked to reach picasso's held-out AUC within 0.002
(auc_ok@F: 1 when all do), so that nobody wins by learning less.

Ratios (samples/s over samples/s; Wide&Deep as F, DLRM as "F,dlrm"): vs_torchrec_e2e@F,
vs_plain@F, vs_naive@F, vs_dense_only@F, interleave_on_vs_off@F, bf16_vs_fp32@F. Metrics:
each contender's samples/s and AUC, auc_delta_bf16@F (picasso bf16's AUC minus fp32's).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import torch
import torch.nn.functional as F

from benchmarks.harness import parse_args, report, sized, torchrec_absent
from benchmarks.train_rivals import NaiveRival, PlainRival, TorchRecRival
from picasso import kernels
from picasso.builtin_specs import builtin_spec
from picasso.cache import CacheConfig, parse_capacity
from picasso.connectors.decoding.packed_decode import PackingDecoder
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.interleave import worth_interleaving
from picasso.metrics import auc
from picasso.models.common import dense_autocast
from picasso.models.dlrm import DLRMDensePart
from picasso.models.wide_deep import WideDeepDensePart
from picasso.packing import PackingPlan
from picasso.precision import DENSE_PRECISIONS
from picasso.spec import FeatureSpec, parse_spec
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer

BATCH = 1024
HIDDEN = (256, 128)
MODELS = ("wide_deep", "dlrm")
WARMUP_BATCHES = 5
AUC_TOLERANCE = 0.002
RIVALS = {"naive": NaiveRival, "plain": PlainRival, "torchrec": TorchRecRival}


@dataclass
class Data:
    spec: object
    train: list[pa.RecordBatch]  # raw, BATCH rows each
    test: pa.Table

    @property
    def labels(self):
        return self.test.column(self.spec.label).to_numpy()


@dataclass
class Outcome:
    samples_per_s: float
    auc: float
    cache_hit_rate: float | None = None  # picasso's, with --cache


def train_config(model_name: str, precision: str, interleave: bool | None = None,
                 cache: CacheConfig | None = None) -> TrainConfig:
    return TrainConfig(model=model_name, hidden=HIDDEN, lr_dense=1e-3, lr_sparse=0.05,
                       sparse_optimizer="adagrad_elementwise", log_every=0, interleave=interleave, precision=precision,
                       cache=cache)


def timed(train: Callable[[list[pa.RecordBatch]], int], batches: list[pa.RecordBatch]) -> float:
    """Samples/s of train() past the warm-up batches, which every contender gets alike."""
    train(batches[:WARMUP_BATCHES])
    start = time.perf_counter()
    samples = train(batches[WARMUP_BATCHES:])
    return samples / (time.perf_counter() - start)


def run_rival(name: str, model_name: str, data: Data, precision: str) -> Outcome:
    template = Trainer(data.spec, train_config(model_name, precision)).model  # picasso's initial weights
    rival = RIVALS[name](data.spec, template, precision)
    rate = timed(rival.train, data.train)
    return Outcome(rate, auc(data.labels, rival.predict(data.test)))


def run_picasso(model_name: str, data: Data, precision: str, interleave: bool | None,
                cache: CacheConfig | None) -> Outcome:
    spec = data.spec
    plan = PackingPlan.from_spec(spec)
    # Decoded and packed in one pass (one kernel call a batch) where the batch allows: a spec
    # with crosses takes the reference path, decode_table then pack (connectors.decoding.packed_decode).
    decoder = PackingDecoder(RecordDecoder(spec), plan)
    trainer = Trainer(spec, train_config(model_name, precision, interleave, cache))

    def train(batches) -> int:
        # Lazily: with interleaving on, decoding and packing run in the worker thread.
        packed = (decoder.decode_and_pack(batch, "bench").packed for batch in batches)
        return trainer.train(packed).samples

    rate = timed(train, data.train)
    held_out = decoder.decode_and_pack(data.test, "bench").packed
    hit_rate = trainer.cache.stats.hit_rate if trainer.cache is not None else None
    return Outcome(rate, auc(data.labels, trainer.predict(held_out)), hit_rate)


def dense_part(model_name: str, spec, plan: PackingPlan) -> torch.nn.Module:
    """The model's dense part over `plan`'s groups (pooled inputs arrive group by group)."""
    if model_name == "dlrm":
        return DLRMDensePart(len(spec.dense), plan, HIDDEN)
    width = sum(g.num_fields * g.embedding_dim for g in plan.groups)
    return WideDeepDensePart(len(spec.dense), len(plan.groups), width, HIDDEN)


def run_dense_only(model_name: str, data: Data, precision: str) -> float:
    """The dense part stepped on ready-made (dense, pooled) inputs of the real shapes."""
    torch.manual_seed(0)
    spec = data.spec
    plan = PackingPlan.from_spec(spec)
    part = dense_part(model_name, spec, plan)
    optimizer = torch.optim.Adam(part.parameters(), lr=1e-3)
    dense = torch.randn(BATCH, len(spec.dense))
    pooled = [torch.randn(BATCH, g.num_fields, g.embedding_dim, requires_grad=True) for g in plan.groups]
    if model_name == "wide_deep":
        pooled += [torch.randn(BATCH, g.num_fields, 1, requires_grad=True) for g in plan.groups]

    def train(batches) -> int:
        for _ in batches:
            # Fresh labels each step: on one fixed batch the part would learn it by heart,
            # its loss would fall to ~1e-5 and its gradients to denormals, which slow the
            # backward matmuls 4x and flatter every ratio to this.
            labels = (torch.rand(BATCH) < 0.25).float()
            with dense_autocast(precision, dense.device):
                logits = part(dense, pooled).float()
            loss = F.binary_cross_entropy_with_logits(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # reaches the pooled inputs too, as it would the embeddings
            optimizer.step()
        return len(batches) * BATCH

    return timed(train, data.train)


CROSS_BUCKETS = 100_000


def with_crosses(spec: FeatureSpec, count: int) -> FeatureSpec:
    """The spec with `count` crosses of pairs of its sparse fields, in order."""
    names = spec.sparse_names
    if 2 * count > len(names):
        raise SystemExit(f"--crosses {count}: the spec has {len(names)} sparse fields, enough for {len(names) // 2}")
    crosses = [{"name": f"{a}_x_{b}", "fields": [a, b], "hash_buckets": CROSS_BUCKETS}
               for a, b in zip(names[0 : 2 * count : 2], names[1 : 2 * count : 2])]
    return parse_spec({**spec.to_dict(), "crosses": crosses})


def contenders(model_name: str, data: Data, precision: str, other: str, rivals: list[str],
               cache: CacheConfig | None, crosses: int) -> dict[str, Callable]:
    """name -> a function that trains once from scratch and returns an Outcome."""
    runs = {name: (lambda name=name: run_rival(name, model_name, data, precision)) for name in rivals}
    runs["picasso"] = lambda: run_picasso(model_name, data, precision, None, cache)
    if crosses and model_name == "wide_deep":  # crosses feed the wide part, which DLRM has none of
        crossed = Data(with_crosses(data.spec, crosses), data.train, data.test)
        runs["picasso_crosses"] = lambda: run_picasso(model_name, crossed, precision, None, cache)
    # The other side of interleaving from picasso's default (auto), for interleave_on_vs_off.
    if worth_interleaving(torch.device("cpu")):
        runs["picasso_not_interleaved"] = lambda: run_picasso(model_name, data, precision, False, cache)
    else:
        runs["picasso_interleaved"] = lambda: run_picasso(model_name, data, precision, True, cache)
    runs[f"picasso_{other}"] = lambda: run_picasso(model_name, data, other, None, cache)
    runs["dense_only"] = lambda: Outcome(run_dense_only(model_name, data, precision), float("nan"))
    return runs


def main() -> None:
    def extra(parser):
        parser.add_argument("--rows", type=int, default=204_800, help="training rows at 39 fields")
        parser.add_argument("--rows-400", type=int, default=81_920, help="training rows at 400 fields")
        parser.add_argument("--rows-400-dlrm", type=int, default=15_360,
                            help="training rows for DLRM at 400 fields (its 80k-pair interaction is slow)")
        parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: wide_deep, dlrm")
        parser.add_argument("--fields", default="39,400", help="39, 400 or both")
        parser.add_argument("--precision", choices=DENSE_PRECISIONS, default="fp32",
                            help="the dense part's precision for every contender (picasso also runs the other)")
        parser.add_argument("--rivals", default=",".join(RIVALS),
                            help="comma-separated: naive, plain, torchrec; \"\": none")
        parser.add_argument("--cache", default="off", metavar="CAPACITY",
                            help="the hot-row cache for every picasso run: rows, bytes or a share of each table "
                                 "(10%%); off (the default): none")
        parser.add_argument("--crosses", type=int, default=3, metavar="N",
                            help="also train picasso (Wide&Deep) with N crosses of pairs of fields; 0: not")
        parser.set_defaults(repeat=3)

    # --smoke: Wide&Deep at 39 fields, two timed batches after the warm-up ones.
    args = parse_args(__doc__.splitlines()[0], extra,
                      smoke={"rows": (WARMUP_BATCHES + 2) * BATCH, "models": "wide_deep", "fields": "39", "repeat": 1})
    precision = args.precision
    other = "bf16" if precision == "fp32" else "fp32"
    # Build or load the C++ kernels now: a one-off per machine, not part of any run's time.
    kernels.backend_for(torch.device("cpu"))
    absent = torchrec_absent()
    asked = [name for name in args.rivals.split(",") if name]  # "": picasso and the dense part alone
    unknown = sorted(set(asked) - set(RIVALS))
    if unknown:
        raise SystemExit(f"--rivals: unknown {', '.join(unknown)} (choose from {', '.join(RIVALS)}, or none: \"\")")
    rivals = [name for name in asked if not (name == "torchrec" and absent)]
    cache = None if args.cache == "off" else CacheConfig(capacity=args.cache)
    if cache is not None:
        try:  # a bad capacity fails here, not after the data is drawn
            parse_capacity(cache.capacity, 1, 1)
        except ValueError as err:
            raise SystemExit(f"--cache: {err}") from None
    ratios, metrics, table_rows = {}, {"precision": precision, "cache": args.cache}, []
    if absent:
        metrics["torchrec"] = "absent: " + absent
    metrics["interleaving_by_default"] = float(worth_interleaving(torch.device("cpu")))
    row_counts = {("39", "wide_deep"): args.rows, ("39", "dlrm"): args.rows, ("400", "wide_deep"): args.rows_400,
                  ("400", "dlrm"): args.rows_400_dlrm}
    models = args.models.split(",")
    specs = {"39": "criteo", "400": "criteo:387"}
    for fields in args.fields.split(","):
        spec = builtin_spec(specs[fields])
        planted = PlantedModel(spec)
        all_rows, _ = planted.sample(max(row_counts[fields, m] for m in models), stream=0)
        test, _ = planted.sample(sized(args, 10_000, 2_000), stream=1)
        for model_name in models:
            rows = row_counts[fields, model_name]
            data = Data(spec, all_rows.slice(0, rows).to_batches(max_chunksize=BATCH), test)
            key = fields if model_name == "wide_deep" else f"{fields},{model_name}"
            runs = contenders(model_name, data, precision, other, rivals, cache, args.crosses)
            outcomes: dict[str, list[Outcome]] = {name: [] for name in runs}
            for _ in range(args.repeat):
                for name, run in runs.items():
                    outcomes[name].append(run())
            rate = {name: statistics.median(o.samples_per_s for o in runs_) for name, runs_ in outcomes.items()}
            scores = {name: runs_[0].auc for name, runs_ in outcomes.items() if name != "dense_only"}
            ours = rate["picasso"]
            for name in rivals:
                label = "torchrec_e2e" if name == "torchrec" else name
                ratios[f"vs_{label}@{key}"] = ours / rate[name]
            ratios[f"vs_dense_only@{key}"] = ours / rate["dense_only"]
            if "picasso_crosses" in rate:
                ratios[f"crosses_step@{key}"] = rate["picasso_crosses"] / ours
            interleaved = {True: rate.get("picasso_interleaved", ours), False: rate.get("picasso_not_interleaved", ours)}
            ratios[f"interleave_on_vs_off@{key}"] = interleaved[True] / interleaved[False]
            run_in = {precision: "picasso", other: f"picasso_{other}"}  # picasso's run in each precision
            ratios[f"bf16_vs_fp32@{key}"] = rate[run_in["bf16"]] / rate[run_in["fp32"]]
            metrics[f"auc_delta_bf16@{key}"] = scores[run_in["bf16"]] - scores[run_in["fp32"]]
            compared = [name for name in scores if name in rivals or name.endswith("interleaved")]
            auc_ok = all(abs(scores[name] - scores["picasso"]) <= AUC_TOLERANCE for name in compared)
            metrics[f"auc_ok@{key}"] = float(auc_ok)
            for name in runs:
                metrics[f"{name}_samples_per_s@{key}"] = rate[name]
                if name in scores:
                    metrics[f"{name}_auc@{key}"] = scores[name]
            if cache is not None:
                metrics[f"picasso_cache_hit_rate@{key}"] = outcomes["picasso"][0].cache_hit_rate
            table_rows.append([fields, model_name, rows,
                               *(f"{rate[name]:,.0f} ({scores[name]:.4f})" if name in rate else "absent"
                                 for name in ("naive", "plain", "torchrec", "picasso", f"picasso_{other}",
                                              "picasso_crosses")),
                               f"{rate['dense_only']:,.0f}", "yes" if auc_ok else "NO"])
    report("train", ["fields", "model", "rows", "naive", "plain PyTorch", "torchrec", f"picasso {precision}",
                     f"picasso {other}", f"picasso, {args.crosses} crosses", "dense only",
                     f"AUC within {AUC_TOLERANCE}"],
           table_rows, ratios, metrics, args.json,
           caption=f"samples/s (held-out AUC); the comparison in {precision}; picasso's hot-row cache: {args.cache}")


if __name__ == "__main__":
    main()
