"""The embedding layer's forward + backward + optimizer step, side by side.

- per_field: one nn.EmbeddingBag per field (sparse gradients) and torch.optim.Adagrad, the
  way a plain PyTorch model is written;
- torchrec: TorchRec's FusedEmbeddingBagCollection with Adagrad fused into the backward
  ('absent' when torchrec is not installed; the recipe is in shared/FACTS.md);
- picasso: PackedEmbedding over the packing plan (one table, one fused lookup and one
  fused row-wise Adagrad update per group) on the kernels the dispatch picks.

Settings: batch 4096, dim 16, 20k rows per field, Zipf(1.05) ids, F fields; plus one
multi-hot case (mean-pooled bags of 1..5 ids). Each (implementation, F) runs in a fresh
process so that its peak memory is its own; time is the median step after warm-up. An upstream gradient of ones stands in for the rest of the model.

Memory: picasso's peak resident memory, less the step's inputs and outputs (ids,
offsets, pooled output and its gradient, which any implementation holds), over the bytes
of its tables plus optimizer state: `memory_vs_state@F` (the issue's bound is 1.2).
"""

from __future__ import annotations

import multiprocessing as mp
import resource

import numpy as np
import torch

from benchmarks.harness import median_seconds, parse_args, report

BATCH, DIM, ROWS, ALPHA = 4096, 16, 20_000, 1.05


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def zipf_bags(fields: int, multi_hot: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths (BATCH, fields), local ids per field, flat in sample-major bag order)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, (BATCH, fields)) if multi_hot else np.ones((BATCH, fields), np.int64)
    ranks = np.arange(1, ROWS + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-ALPHA)
    cdf /= cdf[-1]
    ids = np.searchsorted(cdf, rng.random(int(lengths.sum())))
    return lengths, np.minimum(ids, ROWS - 1)


def run_per_field(fields: int, multi_hot: bool, repeat: int) -> dict:
    lengths, ids = zipf_bags(fields, multi_hot, 0)
    base = _peak_rss_bytes()
    bags = [torch.nn.EmbeddingBag(ROWS, DIM, mode="mean" if multi_hot else "sum", sparse=True) for _ in range(fields)]
    optimizer = torch.optim.Adagrad([p for bag in bags for p in bag.parameters()], lr=0.05)
    # Per field: its ids (sample-major inside the field) and its bag offsets.
    owner_field = np.tile(np.arange(fields), BATCH)
    flat_field = np.repeat(owner_field, lengths.reshape(-1))
    inputs = []
    for f in range(fields):
        field_ids = torch.from_numpy(ids[flat_field == f].astype(np.int64))
        field_lengths = torch.from_numpy(lengths[:, f])
        inputs.append((field_ids, torch.cumsum(field_lengths, 0) - field_lengths))

    def step():
        optimizer.zero_grad(set_to_none=True)
        total = sum(bag(field_ids, offsets).sum() for bag, (field_ids, offsets) in zip(bags, inputs))
        total.backward()
        optimizer.step()

    seconds = median_seconds(step, repeat, warmup=3)
    return {"seconds": seconds, "peak_bytes": _peak_rss_bytes() - base}


def run_torchrec(fields: int, multi_hot: bool, repeat: int) -> dict:
    try:
        from torchrec import EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    except Exception as err:  # noqa: BLE001 - any import failure means absent
        return {"absent": f"{type(err).__name__}: {err}"}
    lengths, ids = zipf_bags(fields, multi_hot, 0)
    base = _peak_rss_bytes()
    names = [f"f{i}" for i in range(fields)]
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=ROWS, feature_names=[name],
                           pooling=PoolingType.MEAN if multi_hot else PoolingType.SUM)
        for i, name in enumerate(names)
    ]
    collection = FusedEmbeddingBagCollection(tables=tables, optimizer_type=torch.optim.Adagrad,
                                             optimizer_kwargs={"lr": 0.05}, device=torch.device("cpu"))
    # KeyedJaggedTensor is key-major: all of field 0's bags, then field 1's, ...
    owner_field = np.repeat(np.tile(np.arange(fields), BATCH), lengths.reshape(-1))
    order = np.argsort(owner_field, kind="stable")
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=names,
        values=torch.from_numpy(ids[order].astype(np.int64)),
        lengths=torch.from_numpy(np.ascontiguousarray(lengths.T).reshape(-1)),
    )

    def step():
        pooled = collection(features)
        pooled.values().sum().backward()

    seconds = median_seconds(step, repeat, warmup=3)
    return {"seconds": seconds, "peak_bytes": _peak_rss_bytes() - base}


def run_picasso(fields: int, multi_hot: bool, repeat: int) -> dict:
    from picasso import kernels
    from picasso.embedding import PackedEmbedding
    from picasso.packing import PackingPlan
    from picasso.spec import DenseField, FeatureSpec, SparseField

    lengths, ids = zipf_bags(fields, multi_hot, 0)
    spec = FeatureSpec(
        label="label",
        dense=(DenseField("d"),),
        sparse=tuple(
            SparseField(f"f{i}", embedding_dim=DIM, hash_buckets=ROWS, max_len=5 if multi_hot else 1,
                        pooling="mean" if multi_hot else "sum")
            for i in range(fields)
        ),
    )
    plan = PackingPlan.from_spec(spec)
    (group,) = plan.groups
    # Packed: the field's row offset added, bags sample-major (the PackedBatch layout).
    owner_field = np.repeat(np.tile(np.arange(fields), BATCH), lengths.reshape(-1))
    packed_ids = torch.from_numpy(ids + np.asarray(group.row_offsets)[owner_field])
    flat_lengths = lengths.reshape(-1)
    offsets = torch.from_numpy((np.cumsum(flat_lengths) - flat_lengths).astype(np.int32))
    # One step of a one-field table first: loading the kernels and the first backward pass
    # (autograd's and OpenMP's thread set-up, ~35 MB once per process) are runtime, not
    # memory of this layer.
    _warm_up(PackedEmbedding, PackingPlan, FeatureSpec, DenseField, SparseField)
    base = _peak_rss_bytes()
    embedding = PackedEmbedding(plan)
    state_bytes = group.table_bytes() + group.slot_bytes()
    upstream = torch.ones(BATCH, fields, DIM)

    def step():
        (pooled,) = embedding({group.name: packed_ids}, {group.name: offsets})
        pooled.backward(upstream)

    seconds = median_seconds(step, repeat, warmup=3)
    activations = packed_ids.numel() * 8 + offsets.numel() * 4 + 2 * upstream.numel() * 4
    peak = _peak_rss_bytes() - base
    return {"seconds": seconds, "peak_bytes": peak, "state_bytes": state_bytes,
            "memory_vs_state": (peak - activations) / state_bytes,
            "backend": kernels.backend_for(torch.device("cpu")).__name__.rsplit(".", 1)[-1]}


def _warm_up(PackedEmbedding, PackingPlan, FeatureSpec, DenseField, SparseField) -> None:
    tiny = FeatureSpec(label="label", dense=(DenseField("d"),), sparse=(SparseField("f", embedding_dim=DIM, hash_buckets=8),))
    plan = PackingPlan.from_spec(tiny)
    (group,) = plan.groups
    ids, offsets = torch.zeros(4, dtype=torch.int64), torch.arange(4, dtype=torch.int32)
    (pooled,) = PackedEmbedding(plan)({group.name: ids}, {group.name: offsets})
    pooled.backward(torch.ones_like(pooled))


RUNNERS = {"per_field": run_per_field, "torchrec": run_torchrec, "picasso": run_picasso}


def _child(name: str, fields: int, multi_hot: bool, repeat: int, queue) -> None:
    torch.manual_seed(0)
    queue.put(RUNNERS[name](fields, multi_hot, repeat))


def measure(name: str, fields: int, multi_hot: bool, repeat: int) -> dict:
    """Run one implementation in a fresh process, so that its peak memory is its own."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(name, fields, multi_hot, repeat, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> None:
    def extra(parser):
        parser.add_argument("--fields", default="26,100,400,1000", help="field counts, comma-separated")
        parser.add_argument("--multi-hot-fields", type=int, default=100, help="fields of the multi-hot case (0: none)")

    args = parse_args(__doc__.splitlines()[0], extra)
    cases = [(int(f), False) for f in args.fields.split(",")]
    if args.multi_hot_fields:
        cases.append((args.multi_hot_fields, True))
    ratios, metrics, rows = {}, {}, []
    for fields, multi_hot in cases:
        label = f"{fields}" + ("mh" if multi_hot else "")
        results = {name: measure(name, fields, multi_hot, args.repeat) for name in RUNNERS}
        ours = results["picasso"]
        ratios[f"vs_per_field@{label}"] = results["per_field"]["seconds"] / ours["seconds"]
        for name, result in results.items():
            if "seconds" in result:
                metrics[f"{name}_ms@{label}"] = result["seconds"] * 1e3
                metrics[f"{name}_peak_mb@{label}"] = result["peak_bytes"] / 2**20
        if "seconds" in results["torchrec"]:
            ratios[f"vs_torchrec@{label}"] = results["torchrec"]["seconds"] / ours["seconds"]
        metrics[f"memory_vs_state@{label}"] = ours["memory_vs_state"]
        metrics["picasso_backend"] = ours["backend"]
        rows.append([
            label,
            results["per_field"]["seconds"] * 1e3,
            results["torchrec"]["seconds"] * 1e3 if "seconds" in results["torchrec"] else "absent",
            ours["seconds"] * 1e3,
            f"{ratios[f'vs_per_field@{label}']:.2f}",
            f"{ratios[f'vs_torchrec@{label}']:.2f}" if f"vs_torchrec@{label}" in ratios else "-",
            f"{ours['peak_bytes'] / 2**20:,.0f} / {ours['state_bytes'] / 2**20:,.0f}",
            f"{ours['memory_vs_state']:.2f}",
        ])
        if "absent" in results["torchrec"]:
            metrics["torchrec"] = "absent: " + results["torchrec"]["absent"]
    report(
        "packing",
        ["F", "per-field ms", "torchrec ms", "picasso ms", "vs per-field", "vs torchrec", "picasso peak/state MB",
         "mem vs state"],
        rows, ratios, metrics, args.json,
    )


if __name__ == "__main__":
    main()
