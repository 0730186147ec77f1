"""Shared helpers for the spec, decoder, packing and trainer tests (no fixtures here:
conftest.py belongs to someone else)."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from picasso.batch import pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec, parse_spec
from picasso.connectors.synthetic.planted import PlantedModel


def small_spec(label: str = "label", name: str = "small") -> FeatureSpec:
    """Two dense fields (one log1p), hashed and vocab fields, one-hot and multi-hot, two dims."""
    return parse_spec(
        {
            "name": name,
            "label": label,
            "dense": ["d1", {"name": "d2", "transform": "log1p"}],
            "sparse": [
                {"name": "h", "embedding_dim": 4, "hash_buckets": 100},
                {"name": "v", "embedding_dim": 4, "vocab_size": 10},
                {"name": "bag", "embedding_dim": 8, "hash_buckets": 50, "max_len": 3, "pooling": "mean"},
                {"name": "vbag", "embedding_dim": 8, "vocab_size": 20, "max_len": 3},
            ],
        }
    )


def canonical_table(spec: FeatureSpec, rows: int, seed: int, empty_rate: float = 0.2) -> pa.Table:
    """A random table in the decoders' canonical schema: row indices already in range,
    multi-hot bags of 0..max_len ids (some empty), one-hot bags of one id (or none)."""
    rng = np.random.default_rng(seed)
    columns = {"label": pa.array(rng.integers(0, 2, rows).astype(np.float32))}
    for f in spec.dense:
        columns[f.name] = pa.array(rng.normal(size=rows).astype(np.float32))
    for f in spec.sparse:
        bags = []
        for _ in range(rows):
            if rng.random() < empty_rate:
                bags.append([])
            else:
                length = int(rng.integers(1, f.max_len + 1))
                bags.append([int(x) for x in rng.integers(0, f.num_rows, length)])
        columns[f.name] = pa.array(bags, pa.list_(pa.int64()))
    return pa.table(columns)


def reference_pack(table: pa.Table, spec: FeatureSpec, plan: PackingPlan) -> dict:
    """The packing contract, one row at a time in plain Python.

    Per group: flat ids (each field's ids shifted by its row offset, field after field
    within a sample, sample after sample) and the start of every (sample, field) bag.
    """
    rows = table.to_pylist()
    out = {
        "label": [float(r["label"]) for r in rows],
        "dense": [[float(r[name]) for name in spec.dense_names] for r in rows],
        "ids": {},
        "offsets": {},
        "per_sample_ids": {},
    }
    for group in plan.groups:
        flat, starts, per_sample = [], [], []
        for r in rows:
            sample = []
            for field_name, row_offset in zip(group.fields, group.row_offsets):
                starts.append(len(flat))
                bag = [v + row_offset for v in (r[field_name] or [])]
                flat.extend(bag)
                sample.extend(bag)
            per_sample.append(sample)
        out["ids"][group.name] = flat
        out["offsets"][group.name] = starts
        out["per_sample_ids"][group.name] = per_sample
    return out


def reference_pool(table: pa.Table, spec: FeatureSpec, plan: PackingPlan, weights: dict[str, torch.Tensor]) -> dict:
    """Pooled embeddings per group, (N, fields, dim), computed bag by bag."""
    rows = table.to_pylist()
    out = {}
    for group in plan.groups:
        if group.name not in weights:
            continue
        weight = weights[group.name]
        pooled = torch.zeros(len(rows), group.num_fields, weight.shape[1], dtype=weight.dtype)
        for i, r in enumerate(rows):
            for j, (field_name, row_offset) in enumerate(zip(group.fields, group.row_offsets)):
                bag = r[field_name] or []
                if not bag:
                    continue
                total = sum(weight[v + row_offset] for v in bag)
                if spec.sparse_field(field_name).pooling == "mean":
                    total = total / len(bag)
                pooled[i, j] = total
        out[group.name] = pooled
    return out


def brute_force_auc(labels, scores) -> float:
    """P(score of a random positive > score of a random negative), ties count one half."""
    positives = [s for y, s in zip(labels, scores) if y > 0.5]
    negatives = [s for y, s in zip(labels, scores) if y <= 0.5]
    wins = 0.0
    for p in positives:
        for n in negatives:
            wins += 1.0 if p > n else 0.5 if p == n else 0.0
    return wins / (len(positives) * len(negatives))


def planted_batches(spec, rows: int, batch_size: int, stream: int = 0, source: str = "day-0"):
    """Rows from the planted model, decoded and packed like the pipeline does, with the
    position after each batch."""
    table, probabilities = PlantedModel(spec).sample(rows, stream)
    decoded = RecordDecoder(spec).decode_table(table, source)
    assert decoded.dead_letters == []
    plan = PackingPlan.from_spec(spec)
    batches = [
        pack(decoded.table.slice(start, batch_size), spec, plan, {source: min(start + batch_size, rows)})
        for start in range(0, rows, batch_size)
    ]
    return batches, probabilities


def venv_seeing_these_packages(path: Path, env: dict | None = None, timeout: float = 600) -> None:
    """A virtual environment at `path` (without pip of its own) that sees the packages of the
    interpreter running the tests after its own, as system site-packages.

    --system-site-packages alone sees the base interpreter's, which are not these when the
    tests run inside a venv themselves. A .pth then adds this venv's site-packages twice over:
    - a path line, which pip's build isolation also reads, and so hides it as it hides
      system site-packages (its sitecustomize re-reads their .pth files with known_paths of
      its own and drops every path they add): a build sees torch only where picasso's
      setup.py undoes the isolation, as on a worker;
    - site.addsitedir, which reads this venv's own .pth files (an editable install's)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)],
                   check=True, timeout=timeout, env=env)
    if sys.prefix == sys.base_prefix:
        return
    (inner,) = Path(path).glob("lib/python*/site-packages")
    outer = [p for p in site.getsitepackages() if p.startswith(sys.prefix)]
    (inner / "_outer_environment.pth").write_text(
        "".join(f"{p}\nimport site; site.addsitedir({p!r})\n" for p in outer))


CLI_PROCESS = [sys.executable, "-m", "picasso.pipelines.cli"]


def refusal_in_process(command: list, capsys) -> tuple[int, str]:
    """A `picasso` command that is refused before it does any work (bad flags), run by
    this process rather than a new one, which would spend seconds importing what this one
    has: (the exit status, stderr). The status is main's, which its process leaves with
    (run_command: tests/test_process_exit.py). `command` may start as CLI_PROCESS does."""
    from picasso.pipelines.cli import main as cli

    argv = [str(arg) for arg in command]
    if argv[:len(CLI_PROCESS)] == CLI_PROCESS:
        argv = argv[len(CLI_PROCESS):]
    capsys.readouterr()  # only this command's output
    try:
        status = cli.main(argv)
    except SystemExit as stop:  # argparse's own refusals
        status = stop.code
    return status, capsys.readouterr().err
