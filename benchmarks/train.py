"""End-to-end training throughput: raw rows in, a trained Wide&Deep out.

Side by side, on the same rows with the same hyper-parameters (batch 1024, dim from the
spec, MLP 256-128, Adam 1e-3 on dense weights, Adagrad 0.05 on embeddings):
- naive: a Dataset of row dicts, a DataLoader whose collate validates and hashes each value
  (memoised, which favours it) into per-field tensors, one nn.EmbeddingBag per field
  (deep and wide) with torch.optim.Adagrad, and the same dense part;
- picasso: RecordDecoder + pack on Arrow record batches, then Trainer.train_step
  (PackedEmbedding with the fused kernels); decoding and packing are timed with it;
- dense only: the dense part alone (MLP and first-order terms) stepped on ready-made
  inputs of the same shape: the compute no data path avoids, so the limit.

Ratios: vs_naive@F and vs_dense_only@F (samples/s over samples/s); auc_delta@F is
picasso's held-out AUC minus naive's. The hot-row cache and interleaving are not built
yet, so interleave_on_vs_off is not reported.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from benchmarks.harness import parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import builtin_spec
from picasso.connectors.decoders import RecordDecoder
from picasso.hashing import bucket_of
from picasso.metrics import auc
from picasso.models.wide_deep import WideDeepDensePart
from picasso.packing import PackingPlan
from picasso.synthetic import PlantedModel
from picasso.trainer import TrainConfig, Trainer

BATCH = 1024
HIDDEN = (256, 128)


class NaiveWideDeep(torch.nn.Module):
    """Wide&Deep as plain PyTorch writes it: two nn.EmbeddingBag per field."""

    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        self.deep = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(f.num_rows, f.embedding_dim, mode=f.pooling, sparse=True) for f in spec.sparse)
        self.wide = torch.nn.ModuleList(torch.nn.EmbeddingBag(f.num_rows, 1, mode=f.pooling, sparse=True) for f in spec.sparse)
        for bag in self.deep:
            torch.nn.init.uniform_(bag.weight, -0.05, 0.05)
        for bag in self.wide:
            torch.nn.init.zeros_(bag.weight)
        width = sum(f.embedding_dim for f in spec.sparse)
        self.dense_part = WideDeepDensePart(len(spec.dense), len(spec.sparse), width, HIDDEN)

    def forward(self, dense, fields):
        deep = [bag(ids, offsets).unsqueeze(1) for bag, (ids, offsets) in zip(self.deep, fields)]
        wide = [bag(ids, offsets).unsqueeze(1) for bag, (ids, offsets) in zip(self.wide, fields)]
        return self.dense_part(dense, deep + wide)


class RowCollate:
    """Rows (dicts) -> (label, dense, per-field (ids, offsets)), one value at a time."""

    def __init__(self, spec):
        self.spec = spec
        self.memo: dict = {}

    def __call__(self, rows):
        spec, memo = self.spec, self.memo
        labels = torch.tensor([float(r[spec.label]) for r in rows])
        dense = torch.tensor([[math.copysign(math.log1p(abs(r[f.name] or 0.0)), r[f.name] or 0.0) for f in spec.dense]
                              for r in rows])
        fields = []
        for f in spec.sparse:
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


def run_naive(spec, train_table, test_table) -> tuple[float, float]:
    torch.manual_seed(0)
    model = NaiveWideDeep(spec)
    sparse = [p for bags in (model.deep, model.wide) for p in bags.parameters()]
    sparse_optimizer = torch.optim.Adagrad(sparse, lr=0.05)
    dense_optimizer = torch.optim.Adam(model.dense_part.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(train_table.to_pylist(), batch_size=BATCH, collate_fn=RowCollate(spec))
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
        labels, dense, fields = RowCollate(spec)(test_table.to_pylist())
        scores = torch.sigmoid(model(dense, fields)).numpy()
    return train_table.num_rows / seconds, auc(labels.numpy(), scores)


def run_picasso(spec, train_table, test_table) -> tuple[float, float]:
    plan = PackingPlan.from_spec(spec)
    decoder = RecordDecoder(spec)
    trainer = Trainer(spec, TrainConfig(hidden=HIDDEN, log_every=0))
    start = time.perf_counter()
    for batch in train_table.to_batches(max_chunksize=BATCH):
        trainer.train_step(pack(decoder.decode_table(batch, "bench").table, spec, plan))
    seconds = time.perf_counter() - start
    held_out = pack(decoder.decode_table(test_table, "bench").table, spec, plan)
    return train_table.num_rows / seconds, auc(test_table.column(spec.label).to_numpy(), trainer.predict(held_out))


def run_dense_only(spec, rows: int) -> float:
    """The dense part stepped on ready-made (dense, pooled) inputs of the real shapes."""
    torch.manual_seed(0)
    plan = PackingPlan.from_spec(spec)
    width = sum(g.num_fields * g.embedding_dim for g in plan.groups)
    part = WideDeepDensePart(len(spec.dense), len(plan.groups), width, HIDDEN)
    optimizer = torch.optim.Adam(part.parameters(), lr=1e-3)
    dense = torch.randn(BATCH, len(spec.dense))
    pooled = [torch.randn(BATCH, g.num_fields, g.embedding_dim, requires_grad=True) for g in plan.groups]
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
        parser.add_argument("--rows", type=int, default=40_960, help="training rows at 39 fields (half as many at 400)")

    args = parse_args(__doc__.splitlines()[0], extra)
    ratios, metrics, table_rows = {}, {}, []
    for name, label, rows in (("criteo", "39", args.rows), ("criteo:387", "400", max(BATCH, args.rows // 2))):
        spec = builtin_spec(name)
        planted = PlantedModel(spec)
        train_table, _ = planted.sample(rows, stream=0)
        test_table, _ = planted.sample(10_000, stream=1)
        naive_rate, naive_auc = run_naive(spec, train_table, test_table)
        picasso_rate, picasso_auc = run_picasso(spec, train_table, test_table)
        dense_rate = run_dense_only(spec, rows)
        ratios[f"vs_naive@{label}"] = picasso_rate / naive_rate
        ratios[f"vs_dense_only@{label}"] = picasso_rate / dense_rate
        metrics.update({f"naive_samples_per_s@{label}": naive_rate, f"picasso_samples_per_s@{label}": picasso_rate,
                        f"dense_only_samples_per_s@{label}": dense_rate, f"naive_auc@{label}": naive_auc,
                        f"picasso_auc@{label}": picasso_auc, f"auc_delta@{label}": picasso_auc - naive_auc})
        table_rows.append([f"{len(spec.dense) + len(spec.sparse)}", naive_rate, picasso_rate, dense_rate,
                           f"{picasso_auc - naive_auc:+.4f}"])
    report("train", ["fields", "naive samples/s", "picasso samples/s", "dense-only samples/s", "auc delta"],
           table_rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
