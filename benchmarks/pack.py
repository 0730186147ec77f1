"""Records → PackedBatch: picasso's vectorised decode + pack against a per-row Python loop.

Both sides start from the same raw records (string ids, missing dense values) and end
with the same PackedBatch arrays; the run checks that they agree before timing.
- picasso: RecordDecoder.decode_table + pack on Arrow record batches, as the pipelines do.
- baseline: a loop over row dicts that validates each value, hashes each id (through a
  memo dict, which favours the baseline: ids repeat), and appends to per-group lists.
  Turning Arrow rows into dicts is not counted against the baseline.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from benchmarks.harness import median_seconds, parse_args, report
from picasso.batch import PackedBatch, pack
from picasso.builtin_specs import builtin_spec
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels.hashing import bucket_of
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec
from picasso.connectors.synthetic.planted import PlantedModel


def picasso_pack(spec: FeatureSpec, plan: PackingPlan, decoder: RecordDecoder, batches: list[pa.RecordBatch]) -> list[PackedBatch]:
    return [pack(decoder.decode_table(batch, "bench").table, spec, plan) for batch in batches]


def python_rows_pack(spec: FeatureSpec, plan: PackingPlan, rows: list[dict], memo: dict) -> dict[str, np.ndarray]:
    """The per-row loop: one batch's arrays, as a plain Python data loader builds them."""
    labels, dense = [], []
    ids = {g.name: [] for g in plan.groups}
    offsets = {g.name: [] for g in plan.groups}
    fields = {f.name: f for f in spec.sparse}
    for row in rows:
        label = row[spec.label]
        if not isinstance(label, (int, float)) or not 0 <= label <= 1:
            continue
        values = []
        for f in spec.dense:
            x = row.get(f.name)
            x = 0.0 if x is None else float(x)
            values.append(math.copysign(math.log1p(abs(x)), x) if f.transform == "log1p" else x)
        labels.append(float(label))
        dense.append(values)
        for g in plan.groups:
            group_ids, group_offsets = ids[g.name], offsets[g.name]
            for name, row_offset in zip(g.fields, g.row_offsets):
                group_offsets.append(len(group_ids))
                value = row.get(name)
                bag = [] if value is None else value if isinstance(value, list) else [value]
                for raw in bag:
                    key = (name, raw)
                    bucket = memo.get(key)
                    if bucket is None:
                        bucket = memo[key] = bucket_of(raw, fields[name].hash_buckets)
                    group_ids.append(bucket + row_offset)
    out = {"label": np.array(labels, np.float32), "dense": np.array(dense, np.float32).reshape(-1)}
    for g in plan.groups:
        out[f"{g.name}.ids"] = np.array(ids[g.name], np.int64)
        out[f"{g.name}.offsets"] = np.array(offsets[g.name], np.int32)
    return out


def _flat(batch: PackedBatch) -> dict[str, np.ndarray]:
    return {name: batch.data.column(name).flatten().to_numpy() if name != "label" else batch.data.column(name).to_numpy()
            for name in batch.data.schema.names}


def measure(spec_name: str, rows: int, batch_rows: int, repeat: int) -> dict:
    spec = builtin_spec(spec_name)
    plan = PackingPlan.from_spec(spec)
    decoder = RecordDecoder(spec)
    table, _ = PlantedModel(spec).sample(rows, stream=0)
    batches = table.to_batches(max_chunksize=batch_rows)
    row_batches = [batch.to_pylist() for batch in batches]

    # Same input, same output: check one batch before timing anything.
    reference = python_rows_pack(spec, plan, row_batches[0], {})
    packed = _flat(picasso_pack(spec, plan, decoder, batches[:1])[0])
    for name, values in reference.items():
        np.testing.assert_allclose(packed[name], values, rtol=1e-6, err_msg=name)

    picasso_s = median_seconds(lambda: picasso_pack(spec, plan, decoder, batches), repeat)
    memo: dict = {}
    python_s = median_seconds(lambda: [python_rows_pack(spec, plan, rows_, memo) for rows_ in row_batches], repeat)
    return {"spec": spec_name, "fields": len(spec.sparse), "picasso_rows_per_s": rows / picasso_s,
            "python_rows_per_s": rows / python_s}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], lambda p: p.add_argument("--rows", type=int, default=65_536),
                      smoke={"rows": 4096, "repeat": 1})
    results = [measure("criteo", args.rows, 4096, args.repeat), measure("criteo:100", args.rows // 4, 4096, args.repeat)]
    ratios = {"vs_python_rows": results[0]["picasso_rows_per_s"] / results[0]["python_rows_per_s"],
              "vs_python_rows@100": results[1]["picasso_rows_per_s"] / results[1]["python_rows_per_s"]}
    metrics = {f"{key}@{r['fields']}": r[key] for r in results for key in ("picasso_rows_per_s", "python_rows_per_s")}
    rows = [[r["spec"], r["fields"], r["picasso_rows_per_s"], r["python_rows_per_s"],
             r["picasso_rows_per_s"] / r["python_rows_per_s"]] for r in results]
    report("pack", ["spec", "sparse fields", "picasso rows/s", "python rows/s", "ratio"], rows, ratios, metrics, args.json)


if __name__ == "__main__":
    main()
