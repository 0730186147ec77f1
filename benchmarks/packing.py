"""The embedding layer's forward + backward + optimizer step, side by side, each optimizer
against the same optimizer.

Two optimizers, with the same learning rate (0.05) and eps (1e-8) everywhere:
- row-wise Adagrad (one slot per row; TorchRec's fastest CTR setting, picasso's default);
- element-wise Adagrad (dim slots per row; torch.optim.Adagrad's arithmetic).

Three implementations of each:
- per_field: one nn.EmbeddingBag per field with sparse gradients, the way a plain PyTorch
  model is written; element-wise: torch.optim.Adagrad; row-wise: SparseRowWiseAdagrad
  (torch.optim has none; benchmarks/sparse_rowwise_adagrad.py);
- torchrec: TorchRec's FusedEmbeddingBagCollection, the optimizer fused into the backward
  (torchrec.optim.RowWiseAdagrad -> FBGEMM EXACT_ROWWISE_ADAGRAD; torch.optim.Adagrad ->
  EXACT_ADAGRAD); 'absent' when torchrec is not installed (the recipe is in the README);
- picasso: PackedEmbedding over the packing plan (one table, one fused lookup and one fused
  update per group; "adagrad" or "adagrad_elementwise") on the kernels the dispatch picks.

Settings: batch 4096, dim 16, 20k rows per field, Zipf(1.05) ids, F fields; plus one
multi-hot case (mean-pooled bags of 1..5 ids). An upstream gradient of ones stands in for
the rest of the model. Each (implementation, optimizer, F) runs in a fresh process, so that
its peak memory is its own, and first steps a one-field table of its own kind, so that
loading libraries and autograd's and OpenMP's thread set-up count as runtime, not as this
layer's memory. Time: the median step after the same warm-up for all.

Ratios: vs_torchrec_rowwise@F, vs_torchrec_elementwise@F, vs_per_field_rowwise@F and
vs_per_field_elementwise@F (step time over picasso's). Metrics: each one's ms and peak MB;
memory_vs_torchrec_<optimizer>@F (TorchRec's peak over picasso's); and
memory_vs_state_<optimizer>@F: picasso's peak less the step's inputs and outputs (which any
implementation holds), over the bytes of its tables plus optimizer state.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.harness import median_seconds, parse_args, report, torchrec_absent
from benchmarks.sparse_rowwise_adagrad import SparseRowWiseAdagrad

BATCH, DIM, ROWS, ALPHA = 4096, 16, 20_000, 1.05
LR, EPS = 0.05, 1e-8
OPTIMIZERS = ("rowwise", "elementwise")
IMPLEMENTATIONS = ("per_field", "torchrec", "picasso")


@dataclass(frozen=True)
class Case:
    fields: int
    multi_hot: bool
    optimizer: str  # one of OPTIMIZERS
    rows: int = ROWS
    batch: int = BATCH

    @property
    def label(self) -> str:
        return f"{self.fields}" + ("mh" if self.multi_hot else "")


@dataclass
class Layer:
    """One implementation built for one case: its training step, the bytes of its tables
    plus optimizer slots, and of the step's inputs and outputs (ids, offsets, the pooled
    output and its gradient, which any implementation holds)."""
    step: Callable[[], None]
    state_bytes: int
    io_bytes: int = 0


def _reset_peak_rss() -> int:
    """Start a new peak-memory count here (Linux: the process's high-water mark drops to its
    resident size); returns that size. ru_maxrss cannot be reset: a peak while importing
    libraries would hide the layer's own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) * 1024


def zipf_bags(case: Case, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(lengths (batch, fields), local ids, flat in sample-major bag order)."""
    rng = np.random.default_rng(seed)
    shape = (case.batch, case.fields)
    lengths = rng.integers(1, 6, shape) if case.multi_hot else np.ones(shape, np.int64)
    ranks = np.arange(1, case.rows + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-ALPHA)
    cdf /= cdf[-1]
    ids = np.searchsorted(cdf, rng.random(int(lengths.sum())))
    return lengths, np.minimum(ids, case.rows - 1)


def _state_bytes(case: Case) -> int:
    table = case.fields * case.rows * DIM * 4
    return table + (table if case.optimizer == "elementwise" else case.fields * case.rows * 4)


def _field_owner(lengths: np.ndarray) -> np.ndarray:
    """Each id's field, for ids in sample-major bag order."""
    batch, fields = lengths.shape
    return np.repeat(np.tile(np.arange(fields), batch), lengths.reshape(-1))


def build_per_field(case: Case) -> Layer:
    lengths, ids = zipf_bags(case, 0)
    bags = [torch.nn.EmbeddingBag(case.rows, DIM, mode="mean" if case.multi_hot else "sum", sparse=True)
            for _ in range(case.fields)]
    weights = [bag.weight for bag in bags]
    if case.optimizer == "rowwise":
        optimizer = SparseRowWiseAdagrad(weights, lr=LR, eps=EPS)
    else:
        optimizer = torch.optim.Adagrad(weights, lr=LR, eps=EPS)
    owner = _field_owner(lengths)
    inputs = []
    for f in range(case.fields):
        field_lengths = torch.from_numpy(lengths[:, f])
        inputs.append((torch.from_numpy(ids[owner == f].astype(np.int64)), torch.cumsum(field_lengths, 0) - field_lengths))

    def step():
        optimizer.zero_grad(set_to_none=True)
        total = sum(bag(field_ids, offsets).sum() for bag, (field_ids, offsets) in zip(bags, inputs))
        total.backward()
        optimizer.step()

    return Layer(step, _state_bytes(case))


def build_torchrec(case: Case) -> Layer:
    import torchrec
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor, PoolingType
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    lengths, ids = zipf_bags(case, 0)
    names = [f"f{i}" for i in range(case.fields)]
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=DIM, num_embeddings=case.rows, feature_names=[name],
                           pooling=PoolingType.MEAN if case.multi_hot else PoolingType.SUM)
        for i, name in enumerate(names)
    ]
    optimizer_type = torchrec.optim.RowWiseAdagrad if case.optimizer == "rowwise" else torch.optim.Adagrad
    collection = FusedEmbeddingBagCollection(tables=tables, optimizer_type=optimizer_type,
                                             optimizer_kwargs={"lr": LR, "eps": EPS}, device=torch.device("cpu"))
    # A KeyedJaggedTensor is key-major: all of field 0's bags, then field 1's, ...
    order = np.argsort(_field_owner(lengths), kind="stable")
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=names,
        values=torch.from_numpy(ids[order].astype(np.int64)),
        lengths=torch.from_numpy(np.ascontiguousarray(lengths.T).reshape(-1)),
    )

    def step():
        collection(features).values().sum().backward()

    return Layer(step, _state_bytes(case))


def build_picasso(case: Case) -> Layer:
    from picasso.embedding import PackedEmbedding
    from picasso.kernels import SparseOptimizer
    from picasso.packing import PackingPlan
    from picasso.spec import DenseField, FeatureSpec, SparseField

    lengths, ids = zipf_bags(case, 0)
    spec = FeatureSpec(
        label="label",
        dense=(DenseField("d"),),
        sparse=tuple(
            SparseField(f"f{i}", embedding_dim=DIM, hash_buckets=case.rows, max_len=5 if case.multi_hot else 1,
                        pooling="mean" if case.multi_hot else "sum")
            for i in range(case.fields)
        ),
    )
    plan = PackingPlan.from_spec(spec)
    (group,) = plan.groups
    name = "adagrad" if case.optimizer == "rowwise" else "adagrad_elementwise"
    embedding = PackedEmbedding(plan, optimizer=SparseOptimizer(name, lr=LR, eps=EPS))
    # Packed: the field's row offset added, bags sample-major (the PackedBatch layout).
    packed_ids = torch.from_numpy(ids + np.asarray(group.row_offsets)[_field_owner(lengths)])
    flat_lengths = lengths.reshape(-1)
    offsets = torch.from_numpy((np.cumsum(flat_lengths) - flat_lengths).astype(np.int32))
    upstream = torch.ones(case.batch, case.fields, DIM)

    def step():
        (pooled,) = embedding({group.name: packed_ids}, {group.name: offsets})
        pooled.backward(upstream)

    io_bytes = packed_ids.numel() * 8 + offsets.numel() * 4 + 2 * upstream.numel() * 4
    return Layer(step, group.table_bytes() + group.slot_bytes(embedding.optimizers[group.name].name), io_bytes)


BUILDERS = {"per_field": build_per_field, "torchrec": build_torchrec, "picasso": build_picasso}


def run(name: str, case: Case, repeat: int) -> dict:
    build = BUILDERS[name]
    warm = Case(fields=1, multi_hot=case.multi_hot, optimizer=case.optimizer, rows=8, batch=4)
    build(warm).step()
    base = _reset_peak_rss()
    layer = build(case)
    seconds = median_seconds(layer.step, repeat, warmup=3)
    return {"seconds": seconds, "peak_bytes": _peak_rss_bytes() - base, "state_bytes": layer.state_bytes,
            "io_bytes": layer.io_bytes}


def _child(name: str, case: Case, repeat: int, queue) -> None:
    torch.manual_seed(0)
    queue.put(run(name, case, repeat))


def measure(name: str, case: Case, repeat: int) -> dict:
    """Run one implementation in a fresh process, so that its peak memory is its own."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(name, case, repeat, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> None:
    def extra(parser):
        parser.add_argument("--fields", default="26,100,400,1000", help="field counts, comma-separated")
        parser.add_argument("--multi-hot-fields", type=int, default=100, help="fields of the multi-hot case (0: none)")
        parser.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="rowwise, elementwise or both")

    # --smoke: one shape, one optimizer, a few fields: each (implementation, shape) is a process of its own,
    # whose start is most of the time.
    args = parse_args(__doc__.splitlines()[0], extra,
                      smoke={"fields": "4", "multi_hot_fields": 0, "optimizers": "rowwise", "repeat": 1})
    shapes = [(int(f), False) for f in args.fields.split(",")]
    if args.multi_hot_fields:
        shapes.append((args.multi_hot_fields, True))
    absent = torchrec_absent()
    names = [n for n in IMPLEMENTATIONS if not (n == "torchrec" and absent)]
    ratios, metrics, rows = {}, {}, []
    if absent:
        metrics["torchrec"] = "absent: " + absent
    metrics["picasso_backend"] = _backend()
    for fields, multi_hot in shapes:
        for optimizer in args.optimizers.split(","):
            case = Case(fields, multi_hot, optimizer)
            key = f"{optimizer}@{case.label}"
            results = {name: measure(name, case, args.repeat) for name in names}
            ours = results["picasso"]
            for name, result in results.items():
                metrics[f"{name}_{optimizer}_ms@{case.label}"] = result["seconds"] * 1e3
                metrics[f"{name}_{optimizer}_peak_mb@{case.label}"] = result["peak_bytes"] / 2**20
                if name != "picasso":
                    ratios[f"vs_{name}_{key}"] = result["seconds"] / ours["seconds"]
            if "torchrec" in results:
                metrics[f"memory_vs_torchrec_{key}"] = results["torchrec"]["peak_bytes"] / ours["peak_bytes"]
            memory_vs_state = (ours["peak_bytes"] - ours["io_bytes"]) / ours["state_bytes"]
            metrics[f"memory_vs_state_{key}"] = memory_vs_state

            def cell(name, result=results):
                if name not in result:
                    return "absent"
                return f"{result[name]['seconds'] * 1e3:,.1f} ({result[name]['peak_bytes'] / 2**20:,.0f} MB)"

            rows.append([
                case.label, optimizer, cell("per_field"), cell("torchrec"), cell("picasso"),
                f"{ratios[f'vs_per_field_{key}']:.2f}",
                f"{ratios[f'vs_torchrec_{key}']:.2f}" if f"vs_torchrec_{key}" in ratios else "-",
                f"{ours['state_bytes'] / 2**20:,.0f}", f"{memory_vs_state:.2f}",
            ])
    report(
        "packing",
        ["F", "optimizer", "per-field ms (peak)", "torchrec ms (peak)", "picasso ms (peak)", "vs per-field",
         "vs torchrec", "state MB", "picasso mem vs state"],
        rows, ratios, metrics, args.json,
    )


def _backend() -> str:
    from picasso import kernels

    return kernels.backend_for(torch.device("cpu")).__name__.rsplit(".", 1)[-1]


if __name__ == "__main__":
    main()
