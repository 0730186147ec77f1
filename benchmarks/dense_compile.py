"""Dense part: torch.compile against eager, one training step of each model's dense_part.

A step is forward + backward + Adam step of `model.dense_part` on ready-made inputs: the
dense values and pooled embeddings of one batch of planted Criteo-shaped rows, looked up
once before timing (the embedding lookup and its fused update are not timed; they stay
eager either way). The pooled embeddings require grad, as in training, so the backward
also computes the gradient the embedding tables would receive.
- eager: the dense part as it is;
- compiled: a copy with the same weights, compiled in place with Module.compile() (which
  keeps state_dict keys), warmed up (compiled) before timing.
Both run in one process, timed in alternation; the ratio is eager time / compiled time,
so higher means compile is better. A model whose compile fails (or captures no graph) is
reported with its error instead of a ratio. "compile s" is the first steps' wall time:
the first model's includes importing the compiler stack, and inductor's on-disk cache
(TORCHINDUCTOR_CACHE_DIR) makes a rerun much faster.
"""

from __future__ import annotations

import copy
import statistics
import time
import traceback

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from benchmarks.harness import median_seconds, parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import builtin_spec
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.models import build_model
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig

MODELS = ("wide_deep", "deepfm", "dlrm", "dcn_v2")


def ready_inputs(spec, plan, model, batch_size: int):
    """(dense, pooled, label) of one planted batch, pooled by the model's own lookups."""
    table, _ = PlantedModel(spec).sample(batch_size, stream=0)
    batch = pack(RecordDecoder(spec).decode_table(table, "bench").table, spec, plan).to_torch()
    model.eval()  # a lookup only: no table update
    with torch.no_grad():
        pooled = model.lookup(batch)
    return batch.dense.clone(), [p.clone() for p in pooled], batch.label.clone()


class Step:
    """One training step of a dense part on fixed inputs."""

    def __init__(self, part, dense, pooled, label):
        self.part, self.dense, self.label = part, dense, label
        self.pooled = [p.detach().clone().requires_grad_(True) for p in pooled]
        self.optimizer = torch.optim.Adam(part.parameters(), lr=1e-3)

    def loss(self) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(self.part(self.dense, self.pooled), self.label)

    def __call__(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.pooled:
            p.grad = None
        self.loss().backward()
        self.optimizer.step()


def measure(name: str, batch_size: int, hidden: tuple[int, ...], steps: int, repeat: int) -> dict:
    spec = builtin_spec("criteo")
    plan = PackingPlan.from_spec(spec)
    torch.manual_seed(0)
    model = build_model(name, spec, plan, hidden)
    dense, pooled, label = ready_inputs(spec, plan, model, batch_size)
    eager = Step(copy.deepcopy(model.dense_part).train(), dense, pooled, label)
    result = {"model": name, "params": sum(p.numel() for p in model.dense_part.parameters())}
    try:
        compiled_part = copy.deepcopy(model.dense_part).train()
        compiled_part.compile()
        compiled = Step(compiled_part, dense, pooled, label)
        counters.clear()
        start = time.perf_counter()
        # The first call compiles forward and backward. Same weights, same inputs: the
        # compiled loss must match before anything is timed.
        torch.testing.assert_close(compiled.loss(), eager.loss(), rtol=1e-4, atol=1e-5)
        for _ in range(3):  # and later steps must not compile again
            compiled()
        result["compile_seconds"] = time.perf_counter() - start
        # Dynamo skips some frames silently (Module.compile() on a torch.nn container
        # compiles nothing): count what it captured rather than trust that it did.
        result["graphs"] = counters["stats"]["unique_graphs"]
        result["graph_breaks"] = sum(counters["graph_break"].values())
        if result["graphs"] == 0:
            raise RuntimeError("torch.compile captured no graph; the dense part ran eager")
    except Exception as err:  # noqa: BLE001 - any compile failure is a result to report
        result["compile_error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
        result["compile_traceback"] = traceback.format_exc(limit=3)
        compiled = None
    eager()  # warm up the eager path too (allocator, Adam's state)

    def block(step):
        return lambda: [step() for _ in range(steps)]

    eager_times, compiled_times = [], []
    for _ in range(repeat):  # alternate, so that a busy moment of the machine hits both sides
        eager_times.append(median_seconds(block(eager), repeat=1, warmup=0) / steps)
        if compiled is not None:
            compiled_times.append(median_seconds(block(compiled), repeat=1, warmup=0) / steps)
    result["eager_ms"] = 1e3 * statistics.median(eager_times)
    if compiled_times:
        result["compiled_ms"] = 1e3 * statistics.median(compiled_times)
    return result


def main() -> None:
    def extra(parser):
        parser.add_argument("--batch", type=int, default=1024)
        parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
        parser.add_argument("--hidden", default=",".join(map(str, TrainConfig.hidden)), help="MLP sizes, e.g. 256,128")
        parser.add_argument("--models", default=",".join(MODELS))

    # --smoke: one model, small: compiling is most of its time (inductor's cache makes a rerun faster).
    args = parse_args(__doc__.splitlines()[0], extra,
                      smoke={"batch": 64, "steps": 2, "hidden": "16", "models": "wide_deep", "repeat": 1})
    hidden = tuple(int(x) for x in args.hidden.split(",") if x)
    results = [measure(name, args.batch, hidden, args.steps, args.repeat) for name in args.models.split(",")]

    ratios, metrics, rows = {}, {"batch": args.batch, "threads": torch.get_num_threads(), "hidden": list(hidden)}, []
    for r in results:
        name = r["model"]
        metrics[f"dense_params@{name}"] = r["params"]
        metrics[f"eager_ms_per_step@{name}"] = r["eager_ms"]
        if "compiled_ms" in r:
            ratios[f"compiled_vs_eager@{name}"] = r["eager_ms"] / r["compiled_ms"]
            metrics[f"compiled_ms_per_step@{name}"] = r["compiled_ms"]
            metrics[f"compile_seconds@{name}"] = r["compile_seconds"]
            metrics[f"graphs@{name}"], metrics[f"graph_breaks@{name}"] = r["graphs"], r["graph_breaks"]
            rows.append([name, f"{r['eager_ms']:.2f}", f"{r['compiled_ms']:.2f}",
                         f"{ratios[f'compiled_vs_eager@{name}']:.2f}", f"{r['compile_seconds']:.1f}",
                         r["graphs"], r["graph_breaks"]])
        else:
            metrics[f"compile_error@{name}"] = r["compile_error"]
            rows.append([name, f"{r['eager_ms']:.2f}", "failed", "-", "-", "-", "-"])
            print(f"{name}: not compiled: {r['compile_error']}\n{r['compile_traceback']}")
    columns = ["model", "eager ms", "compiled ms", "ratio", "compile s", "graphs", "breaks"]
    print(f"ms per step; criteo spec, batch {args.batch}, hidden {hidden}, {torch.get_num_threads()} torch threads")
    report("dense_compile", columns, rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
