"""Publishing model versions: seconds per version, and full model vs delta bytes.

A local `mlflow server` (one worker, SQLite; or --tracking-uri) receives versions of a
Wide&Deep model on the 39-field Criteo spec and on a 400-field one (criteo:400, 700 MB of
embedding tables). Each publish is what `picasso daily` and `picasso stream` do for one
checkpoint: log the run (params, metrics, spec, packing plan, plots, delta) and the pyfunc
model with pinned requirements, register the version, alias it candidate and promote it.
Between two publishes the model trains one streaming cycle (--cycle-events events);
full_vs_delta is the serving weights' bytes over the delta's, after such a cycle that
touched under 20% of the embedding rows (the rows-touched share is reported too).

Baseline: shipping the full weights each version (full_vs_delta); the publish-time target
is 3 s for the 39-field model (target_over_publish_s@39 >= 1 meets it).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

from benchmarks.harness import parse_args, report
from picasso.batch import pack
from picasso.builtin_specs import builtin_spec
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.serving.publishing.contract import MLflowTarget, PublishRequest
from picasso.serving.publishing.publication import publish
from picasso.connectors.testing.mlflow_server import MlflowServer
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel
from picasso.trainer import TrainConfig, Trainer

TARGET_S_39 = 3.0
BATCH = 2048


class Cycles:
    """A trainer on a spec, trained one streaming cycle of planted events at a time."""

    def __init__(self, spec_name: str, events: int):
        self.spec = builtin_spec(spec_name)
        self.trainer = Trainer(self.spec, TrainConfig(device="cpu", log_every=0))
        self.plan = PackingPlan.from_spec(self.spec)
        self.decoder = RecordDecoder(self.spec)
        self.planted = PlantedModel(self.spec)
        self.events = events
        self.cycle = 0

    def train_cycle(self, checkpoints: Path) -> Path:
        table, _ = self.planted.sample(self.events, stream=self.cycle)
        decoded = self.decoder.decode_table(table, f"cycle-{self.cycle}").table
        source = f"events/{self.cycle}"
        batches = [pack(decoded.slice(start, BATCH), self.spec, self.plan, {source: min(start + BATCH, self.events)})
                   for start in range(0, decoded.num_rows, BATCH)]
        self.cycle += 1
        self.trainer.train(batches)
        return self.trainer.save_checkpoint(checkpoints)


def measure(spec_name: str, uri: str, work: Path, events: int, repeat: int) -> dict:
    """Publish a first version, then `repeat` versions each one cycle later; timings of the latter."""
    cycles = Cycles(spec_name, events)
    name = f"bench-{spec_name.replace(':', '-')}-{uuid.uuid4().hex[:6]}"
    target = MLflowTarget(uri, experiment=name, model_name=name)
    checkpoints, workspace = work / name / "checkpoints", work / name / "publish"

    def publish_next() -> tuple[float, object]:
        checkpoint = cycles.train_cycle(checkpoints)
        request = PublishRequest(str(checkpoint), {"auc": 0.75, "logloss": 0.5, "calibration": 1.0,
                                                    "samples": cycles.trainer.samples})
        started = time.perf_counter()
        version = publish(request, target, workspace=workspace)
        return time.perf_counter() - started, version

    first_s, _ = publish_next()  # the first version has no delta, and creates the experiment and model
    timed = [publish_next() for _ in range(repeat)]
    last = timed[-1][1]
    return {
        "spec": spec_name, "fields": len(cycles.spec.sparse), "first_s": first_s,
        "publish_s": statistics.median(t for t, _ in timed), "full_bytes": last.full_bytes,
        "delta_bytes": last.delta_bytes, "touched_share": _touched_share(last, cycles, uri, work),
    }


def _touched_share(version, cycles: Cycles, uri: str, work: Path) -> float:
    """The share of embedding-table rows the last delta ships (the rows its cycle moved)."""
    from mlflow.tracking import MlflowClient

    from picasso.serving.publishing.delta_store import download_delta
    from picasso.serving.publishing.model_delta import load_delta

    client = MlflowClient(uri)
    delta = load_delta(download_delta(client, client.get_model_version(version.model_name, version.version),
                                      work / f"delta-{uuid.uuid4().hex[:6]}"))
    tables = {k: v.shape[0] for k, v in cycles.trainer.model.state_dict().items() if ".table_" in k}
    touched = sum(int(r["ids"].numel()) for key, r in delta["rows"].items() if key in tables)
    touched += sum(tables[key] for key in delta["whole"] if key in tables)
    return touched / sum(tables.values())


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: (
        p.add_argument("--tracking-uri", default=None, help="an MLflow server to publish to (default: start one)"),
        p.add_argument("--cycle-events", type=int, default=10_000,
                       help="events trained between two publishes (10,000 touch about 12%% of the 39-field rows)"),
        p.add_argument("--repeat-400", type=int, default=1, help="timed publishes of the 400-field model"),
        p.add_argument("--skip-400", action="store_true", help="only the 39-field model")),
        smoke={"cycle_events": 2048, "repeat": 1, "skip_400": True})
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-publish-")))
        uri = args.tracking_uri or stack.enter_context(MlflowServer(work / "server"))
        runs = [measure("criteo", uri, work, args.cycle_events, args.repeat)]
        if not args.skip_400:
            runs.append(measure("criteo:400", uri, work, args.cycle_events, args.repeat_400))

    small = runs[0]
    metrics = {}
    for run in runs:
        suffix = "@39" if run["spec"] == "criteo" else "@400"  # 13 dense + 26 sparse, and 400 sparse fields
        metrics |= {f"publish_s{suffix}": run["publish_s"], f"first_publish_s{suffix}": run["first_s"],
                    f"full_bytes{suffix}": run["full_bytes"], f"delta_bytes{suffix}": run["delta_bytes"],
                    f"rows_touched_share{suffix}": run["touched_share"]}
    metrics |= {"cycle_events": args.cycle_events, "timed_publishes@39": args.repeat,
                "timed_publishes@400": 0 if args.skip_400 else args.repeat_400}
    ratios = {"full_vs_delta": small["full_bytes"] / small["delta_bytes"],
              "target_over_publish_s@39": TARGET_S_39 / small["publish_s"]}
    rows = [[r["spec"], r["fields"], r["publish_s"], r["first_s"], r["full_bytes"] / 2**20, r["delta_bytes"] / 2**20,
             f"{100 * r['touched_share']:.1f}%"] for r in runs]
    report("publish", ["spec", "sparse fields", "publish s (median)", "first publish s", "full MB", "delta MB",
                       "rows touched"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
