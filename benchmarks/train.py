"""End-to-end training throughput: raw rows in, a trained model out.

For Wide&Deep and DLRM, side by side on the same rows with the same hyper-parameters
(batch 1024, dims from the spec, MLPs 256-128, Adam 1e-3 on dense weights, element-wise
Adagrad 0.05 on embeddings: torch.optim.Adagrad's math, which picasso's kernels also
offer) and the same initial weights, so that the two compute the same model and
auc_delta shows what the fast path costs in quality, if anything:
- naive: a Dataset of row dicts, a DataLoader whose collate validates and hashes each value
  (memoised, which favours it) into per-field tensors, one nn.EmbeddingBag per field
  (two for Wide&Deep: deep and wide) with torch.optim.Adagrad, and the same dense part;
- picasso: RecordDecoder + pack on Arrow record batches, then Trainer.train with the
  hot-row cache (10% of each table), run twice: interleaving on (batch i+1 is decoded,
  packed, de-duplicated and its missing rows staged in a worker thread while batch i
  computes) and off (every stage in one thread). Decoding and packing are timed with it.
  vs_naive and vs_dense_only take picasso as it runs by default here: interleaving is
  on where it pays (interleave.worth_interleaving: a GPU, or CPU cores torch's threads
  leave free) and off otherwise; the same ratios with interleaving on are in the metrics
  (vs_naive_interleaved@F, vs_dense_only_interleaved@F);
- dense only: the dense part alone (MLPs, interaction, first-order terms) stepped on
  ready-made inputs of the same shape: the compute no data path avoids, so the limit.
The naive run is timed once (it is slow); picasso on, off and the dense part run in turns
--repeat times (default 3) and their medians count. Runs are long enough (200 steps at 39
fields, 80 at 400) that what only happens at the start of a job (the cache filling up,
with refreshes after 1, 2, 4, ... steps; the worker thread starting; first-touch page
faults) weighs on the rate about as little as it does in a job that trains for hours.

Ratios (Wide&Deep, the model the targets were set for): vs_naive@F and vs_dense_only@F
(samples/s over samples/s, picasso as it runs by default) and interleave_on_vs_off@F; DLRM's are the same names with
",dlrm". auc_delta@F is picasso's held-out AUC minus naive's.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

from benchmarks.harness import parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import builtin_spec
from picasso.cache import CacheConfig
from picasso.connectors.decoders import RecordDecoder
from picasso.hashing import bucket_of
from picasso.interleave import worth_interleaving
from picasso import kernels
from picasso.kernels import SparseOptimizer
from picasso.metrics import auc
from picasso.models.dlrm import DLRMDensePart
from picasso.models.wide_deep import WideDeepDensePart
from picasso.packing import PackingPlan
from picasso.synthetic import PlantedModel
from picasso.trainer import TrainConfig, Trainer

BATCH = 1024
HIDDEN = (256, 128)
MODELS = ("wide_deep", "dlrm")


def dense_part(model: str, spec, plan: PackingPlan) -> torch.nn.Module:
    """The model's dense part over `plan`'s groups (pooled inputs arrive group by group)."""
    if model == "dlrm":
        return DLRMDensePart(len(spec.dense), plan, HIDDEN)
    width = sum(g.num_fields * g.embedding_dim for g in plan.groups)
    return WideDeepDensePart(len(spec.dense), len(plan.groups), width, HIDDEN)


class NaiveModel(torch.nn.Module):
    """The model as plain PyTorch writes it: an nn.EmbeddingBag per field (and per part),
    starting from the weights of `template` (a picasso model of the same spec and seed)."""

    def __init__(self, spec, template: torch.nn.Module):
        super().__init__()
        plan = template.embedding.plan
        self.fields = [spec.sparse_field(name) for g in plan.groups for name in g.fields]
        self.group_sizes = [g.num_fields for g in plan.groups]
        parts = [template.embedding] + ([template.wide_embedding] if hasattr(template, "wide_embedding") else [])
        self.parts = torch.nn.ModuleList(torch.nn.ModuleList(_bags(spec, plan, packed)) for packed in parts)
        self.dense_part = copy.deepcopy(template.dense_part)

    def forward(self, dense, fields):
        pooled = []
        for bags in self.parts:
            per_field = [bag(ids, offsets) for bag, (ids, offsets) in zip(bags, fields)]
            starts = [sum(self.group_sizes[:i]) for i in range(len(self.group_sizes))]
            pooled += [torch.stack(per_field[a:a + n], dim=1) for a, n in zip(starts, self.group_sizes)]
        return self.dense_part(dense, pooled)


def _bags(spec, plan, packed):
    """One EmbeddingBag per field, holding that field's rows of the packed table."""
    for group in plan.groups:
        table = packed.tables[group.name]
        for name, start in zip(group.fields, group.row_offsets):
            field = spec.sparse_field(name)
            bag = torch.nn.EmbeddingBag(field.num_rows, table.shape[1], mode=field.pooling, sparse=True)
            bag.weight.data.copy_(table[start:start + field.num_rows])
            yield bag


class RowCollate:
    """Rows (dicts) -> (label, dense, per-field (ids, offsets)), one value at a time."""

    def __init__(self, spec, fields):
        self.spec = spec
        self.fields = fields
        self.memo: dict = {}

    def __call__(self, rows):
        spec, memo = self.spec, self.memo
        labels = torch.tensor([float(r[spec.label]) for r in rows])
        dense = torch.tensor([[math.copysign(math.log1p(abs(r[f.name] or 0.0)), r[f.name] or 0.0) for f in spec.dense]
                              for r in rows])
        fields = []
        for f in self.fields:
            ids, offsets = [], []
            for r in rows:
                offsets.append(len(ids))
                value = r.get(f.name)
                for raw in [] if value is None else value if isinstance(value, list) else [value]:
                    key = (f.name, raw)
                    if key not in memo:
                        memo[key] = bucket_of(raw, f.hash_buckets)
                    ids.append(memo[key])
            fields.append((torch.tensor(ids, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)))
        return labels, dense, fields


def train_config(model_name: str, interleave: bool | None = None) -> TrainConfig:
    return TrainConfig(model=model_name, hidden=HIDDEN, lr_dense=1e-3, lr_sparse=0.05,
                       sparse_optimizer="adagrad_elementwise", log_every=0, cache=CacheConfig(capacity="10%"),
                       interleave=interleave)


def run_naive(model_name, spec, train_table, test_table) -> tuple[float, float]:
    model = NaiveModel(spec, Trainer(spec, train_config(model_name)).model)  # picasso's initial weights
    sparse = [p for bags in model.parts for p in bags.parameters()]
    sparse_optimizer = torch.optim.Adagrad(sparse, lr=0.05, eps=SparseOptimizer().eps)
    dense_optimizer = torch.optim.Adam(model.dense_part.parameters(), lr=1e-3)
    collate = RowCollate(spec, model.fields)
    loader = torch.utils.data.DataLoader(train_table.to_pylist(), batch_size=BATCH, collate_fn=collate)
    start = time.perf_counter()
    for labels, dense, fields in loader:
        loss = F.binary_cross_entropy_with_logits(model(dense, fields), labels)
        sparse_optimizer.zero_grad(set_to_none=True)
        dense_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sparse_optimizer.step()
        dense_optimizer.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        labels, dense, fields = collate(test_table.to_pylist())
        scores = torch.sigmoid(model(dense, fields)).numpy()
    return train_table.num_rows / seconds, auc(labels.numpy(), scores)


def run_picasso(model_name, spec, train_table, test_table, interleave: bool) -> tuple[float, float, dict]:
    plan = PackingPlan.from_spec(spec)
    decoder = RecordDecoder(spec)
    trainer = Trainer(spec, train_config(model_name, interleave))

    def packed_batches():  # lazily: with interleaving on, this runs in the worker thread
        for batch in train_table.to_batches(max_chunksize=BATCH):
            yield pack(decoder.decode_table(batch, "bench").table, spec, plan)

    start = time.perf_counter()
    trainer.train(packed_batches())
    seconds = time.perf_counter() - start
    held_out = pack(decoder.decode_table(test_table, "bench").table, spec, plan)
    score = auc(test_table.column(spec.label).to_numpy(), trainer.predict(held_out))
    return train_table.num_rows / seconds, score, trainer.performance_metrics()


def run_dense_only(model_name, spec, rows: int) -> float:
    """The dense part stepped on ready-made (dense, pooled) inputs of the real shapes."""
    torch.manual_seed(0)
    plan = PackingPlan.from_spec(spec)
    part = dense_part(model_name, spec, plan)
    optimizer = torch.optim.Adam(part.parameters(), lr=1e-3)
    dense = torch.randn(BATCH, len(spec.dense))
    pooled = [torch.randn(BATCH, g.num_fields, g.embedding_dim, requires_grad=True) for g in plan.groups]
    if model_name == "wide_deep":
        pooled += [torch.randn(BATCH, g.num_fields, 1, requires_grad=True) for g in plan.groups]
    labels = (torch.rand(BATCH) < 0.25).float()
    steps = max(1, rows // BATCH)
    start = time.perf_counter()
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(part(dense, pooled), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # reaches the pooled inputs too, as it would the embeddings
        optimizer.step()
    return steps * BATCH / (time.perf_counter() - start)


def main() -> None:
    def extra(parser):
        parser.add_argument("--rows", type=int, default=204_800, help="training rows at 39 fields")
        parser.add_argument("--rows-400", type=int, default=81_920, help="training rows at 400 fields")
        parser.add_argument("--rows-400-dlrm", type=int, default=10_240,
                            help="training rows for DLRM at 400 fields (its 80k-pair interaction is slow)")
        parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: wide_deep, dlrm")
        parser.set_defaults(repeat=3)

    args = parse_args(__doc__.splitlines()[0], extra)
    # Build or load the C++ kernels now: a one-off per machine, not part of any run's time.
    kernels.backend_for(torch.device("cpu"))
    kernels.map_to_slots(torch.zeros(1, dtype=torch.int64), torch.full((1,), -1, dtype=torch.int32), 1)
    interleaves_by_default = worth_interleaving(torch.device("cpu"))
    ratios, metrics, table_rows = {}, {}, []
    row_counts = {("39", "wide_deep"): args.rows, ("39", "dlrm"): args.rows, ("400", "wide_deep"): args.rows_400,
                  ("400", "dlrm"): args.rows_400_dlrm}
    models = args.models.split(",")
    for name, fields in (("criteo", "39"), ("criteo:387", "400")):
        spec = builtin_spec(name)
        planted = PlantedModel(spec)
        all_rows, _ = planted.sample(max(row_counts[fields, m] for m in models), stream=0)
        test_table, _ = planted.sample(10_000, stream=1)
        for model_name in models:
            rows = row_counts[fields, model_name]
            train_table = all_rows.slice(0, rows)
            key = fields if model_name == "wide_deep" else f"{fields},{model_name}"
            naive_rate, naive_auc = run_naive(model_name, spec, train_table, test_table)
            # picasso with interleaving on and off, in turns, --repeat times each (a busy
            # moment then slows both alike); the medians count. The dense part alone too.
            on, off, dense = [], [], []
            for _ in range(args.repeat):
                on.append(run_picasso(model_name, spec, train_table, test_table, interleave=True))
                off.append(run_picasso(model_name, spec, train_table, test_table, interleave=False))
                dense.append(run_dense_only(model_name, spec, rows))
            interleaved_rate = statistics.median(rate for rate, _, _ in on)
            serial_rate = statistics.median(rate for rate, _, _ in off)
            dense_rate = statistics.median(dense)
            picasso_rate, runs = (interleaved_rate, on) if interleaves_by_default else (serial_rate, off)
            _, picasso_auc, stages = runs[0]
            ratios[f"vs_naive@{key}"] = picasso_rate / naive_rate
            ratios[f"vs_dense_only@{key}"] = picasso_rate / dense_rate
            ratios[f"interleave_on_vs_off@{key}"] = interleaved_rate / serial_rate
            metrics.update({f"naive_samples_per_s@{key}": naive_rate, f"picasso_samples_per_s@{key}": picasso_rate,
                            f"picasso_interleaved_samples_per_s@{key}": interleaved_rate,
                            f"picasso_serial_samples_per_s@{key}": serial_rate,
                            f"vs_naive_interleaved@{key}": interleaved_rate / naive_rate,
                            f"vs_dense_only_interleaved@{key}": interleaved_rate / dense_rate,
                            f"dense_only_samples_per_s@{key}": dense_rate, f"naive_auc@{key}": naive_auc,
                            f"picasso_auc@{key}": picasso_auc, f"auc_delta@{key}": picasso_auc - naive_auc,
                            **{f"{stat}@{key}": value for stat, value in stages.items()}})
            table_rows.append([fields, model_name, rows, naive_rate, interleaved_rate, serial_rate, dense_rate,
                               f"{stages['cache_hit_rate']:.3f}", f"{picasso_auc - naive_auc:+.4f}"])
    default = "on" if interleaves_by_default else "off"
    metrics["interleaving_by_default"] = float(interleaves_by_default)
    report("train", ["fields", "model", "rows", "naive samples/s", "picasso, interleaving on",
                     "picasso, interleaving off", "dense-only samples/s", "cache hit rate", "auc delta"],
           table_rows, ratios, metrics, args.json,
           caption=f"vs_naive and vs_dense_only: picasso as it runs by default here, interleaving {default}")


if __name__ == "__main__":
    main()
