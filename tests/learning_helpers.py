"""What the learning tests share: the planted rows every mode trains on, in the order each
can read them, the held-out rows they are scored on, and the two questions asked of a
trained model (did every embedding row it looks up train, and how well does it rank).

The signal is in the sparse fields alone: the spec has no dense field, so the planted
logit is the fields' token weights and their interactions, and a model that trains only
its dense part (the MLP over its initial, random rows) ranks the held-out rows at about
0.53 AUC, where the trained one reaches 0.66 and the true probabilities 0.70.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from picasso.batch import pack
from picasso.checkpoint import load_checkpoint
from picasso.connectors.day_files import partition_dir, write_part
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.metrics import auc
from picasso.packing import PackingPlan
from picasso.spec import FeatureSpec, parse_spec
from picasso.connectors.synthetic.planted import PlantedModel, SyntheticConfig
from picasso.connectors.synthetic.events import EventStream, EventStreamConfig, make_event_stream
from picasso.trainer import TrainConfig, Trainer

HIDDEN = (16, 8)
LR_DENSE, LR_SPARSE = 0.01, 0.1  # Adam's on the dense part; row-wise Adagrad's (the default) on the embeddings
# The same model and learning rates in every mode, as flags.
MODEL_FLAGS = ["--hidden", ",".join(map(str, HIDDEN)), "--lr-dense", str(LR_DENSE), "--lr-sparse", str(LR_SPARSE)]

# Two planted streams of ROWS_PER_STREAM rows, interleaved BLOCK rows at a time: a sync or
# GBA rank r reads stream STREAMS[r] in local batches of BLOCK rows, so that a global batch
# of 2 x BLOCK rows is the same rows as a daily or stream batch of BATCH. Trained in another
# order (one stream after the other, or mixed by a joined stream's shuffle buffer), the
# same 16,000 rows score a held-out AUC 0.0008 away (sd over six pairs of streams, 0.0015
# at most); 8,000 rows moved by 0.0025 (0.006 at most), too near a tolerance of 0.01.
STREAMS = (100, 101)
ROWS_PER_STREAM = 8_000
BLOCK = 250
BATCH = 2 * BLOCK
TRAINING_ROWS = len(STREAMS) * ROWS_PER_STREAM
HELD_OUT_STREAM, HELD_OUT_ROWS = 999, 10_000


def learning_spec(dynamic: bool = False, crosses: bool = False) -> FeatureSpec:
    """Four sparse fields (hashed, vocabulary, multi-hot) in two packed tables, no dense
    field. With `dynamic`, field `a` is a dynamic table of 49 rows and its default row:
    the planted model draws its tokens from a field's row count, so both specs plant the
    very same rows (the fixed table hashes them into 50 buckets, the dynamic one gives
    each admitted token a row of its own). With `crosses`, two feature crosses as well (b x
    c in the wide part alone, a x tags, a bag of up to 3, in both): the planted model reads
    the fields alone, so it plants the same rows again."""
    a = {"dynamic": {"capacity": 49}} if dynamic else {"hash_buckets": 50}
    more = {"crosses": [{"name": "b_x_c", "fields": ["b", "c"], "hash_buckets": 1_000},
                        {"name": "a_x_tags", "fields": ["a", "tags"], "hash_buckets": 2_500, "part": "both",
                         "embedding_dim": 4}]} if crosses else {}
    return parse_spec({
        **more,
        "name": "learns-dynamic" if dynamic else "learns-crosses" if crosses else "learns",
        "label": "click",
        "sparse": [
            {"name": "a", "embedding_dim": 8, **a},
            {"name": "b", "embedding_dim": 8, "hash_buckets": 50},
            {"name": "c", "embedding_dim": 4, "vocab_size": 20},
            {"name": "tags", "embedding_dim": 4, "hash_buckets": 50, "max_len": 3, "pooling": "mean"},
        ],
    })


def training_rows(spec: FeatureSpec) -> pa.Table:
    """The planted rows of STREAMS, interleaved by BLOCK: what daily and the streams read in
    this order, and sync (and GBA, as its timing allows) reads one stream per rank."""
    planted = PlantedModel(spec)
    streams = [planted.sample(ROWS_PER_STREAM, stream)[0] for stream in STREAMS]
    blocks = [rows.slice(at, BLOCK) for at in range(0, ROWS_PER_STREAM, BLOCK) for rows in streams]
    return pa.concat_tables(blocks).combine_chunks()


def planted_rows(spec: FeatureSpec, rows: int, stream: int) -> tuple[pa.Table, np.ndarray]:
    return PlantedModel(spec).sample(rows, stream)


def write_day(root: Path, date: str, rows: pa.Table) -> None:
    """One Parquet file: a daily run reads it in order, in chunks of its batch size."""
    write_part(rows, Path(partition_dir(root, date)) / "part-00000.parquet")


def packed(spec: FeatureSpec, rows: pa.Table, batch: int = 2_000) -> list:
    """Rows decoded and packed as the pipelines do."""
    decoded = RecordDecoder(spec).decode_table(rows, "rows")
    assert decoded.dead_letters == []
    plan = PackingPlan.from_spec(spec)
    return [pack(decoded.table.slice(at, batch), spec, plan, {}) for at in range(0, rows.num_rows, batch)]


def held_out_rows(spec: FeatureSpec) -> tuple[pa.Table, np.ndarray]:
    """Rows of a stream no mode trains on, and their true click probabilities."""
    return planted_rows(spec, HELD_OUT_ROWS, HELD_OUT_STREAM)


def ceiling(spec: FeatureSpec) -> float:
    """The held-out AUC of the planted model's true probabilities."""
    rows, probabilities = held_out_rows(spec)
    return auc(rows.column(spec.label).to_numpy(), probabilities)


def trained_model(spec: FeatureSpec, checkpoint) -> Trainer:
    """The checkpoint in a Trainer of its own precision (the MLP sizes are HIDDEN)."""
    saved = load_checkpoint(checkpoint).state.get("config", {})
    trainer = Trainer(spec, TrainConfig(hidden=HIDDEN, device="cpu", precision=saved.get("precision", "fp32")))
    trainer.restore(checkpoint)
    return trainer


def held_out_auc(spec: FeatureSpec, checkpoint) -> float:
    rows, _ = held_out_rows(spec)
    return trained_model(spec, checkpoint).evaluate(packed(spec, rows)).auc


def held_out_predictions(spec: FeatureSpec, checkpoint) -> np.ndarray:
    """The checkpoint's click probability of each held-out row, in their order."""
    rows, _ = held_out_rows(spec)
    return trained_model(spec, checkpoint).predict(packed(spec, rows, HELD_OUT_ROWS)[0])


def untrained_rows(spec: FeatureSpec, checkpoint, rows: pa.Table) -> dict[str, str]:
    """Per embedding table and optimizer slot (the deep and the wide embeddings'), how many
    of the rows that `rows` look up still hold their initial value (a fresh model's of the
    same seed) or a zero slot. Empty when every one trained.

    The rows looked up are found through the trained model: a dynamic field's ids map to
    rows only there. A dynamic row starts from values of its own when its id is admitted
    (picasso.dynamic_rows), so for it the slot, zeroed then, is what says it trained.
    """
    trainer = trained_model(spec, checkpoint)
    initial = Trainer(spec, TrainConfig(hidden=HIDDEN, device="cpu")).model.state_dict()
    looked_up = rows_looked_up(trainer, rows)
    problems, checked = {}, set()
    for name, values in trainer.model.state_dict().items():
        kind, group = _embedding_buffer(name)
        if kind is None:
            continue
        used = looked_up[group]
        untrained = initial[name][used] if kind == "table" else torch.zeros_like(values[used])
        still = (values[used] == untrained).reshape(len(used), -1).all(dim=1)
        checked.add(kind)
        if still.any():
            problems[name] = f"{int(still.sum())} of {len(used)} rows looked up"
    assert checked == {"table", "slot"}, f"found only {checked} to check"  # Adagrad keeps a slot per row
    return problems


def rows_looked_up(trainer: Trainer, rows: pa.Table) -> dict[str, torch.Tensor]:
    """Per packed table, the distinct rows the model reads for these rows."""
    looked_up: dict[str, list[torch.Tensor]] = {}
    for batch in packed(trainer.spec, rows):
        for group, ids in trainer.model.resolve(batch.to_torch())[0].ids.items():
            looked_up.setdefault(group, []).append(ids)
    return {group: torch.cat(ids).unique() for group, ids in looked_up.items()}


def _embedding_buffer(name: str) -> tuple[str | None, str | None]:
    """("table" or "slot", its packed table) for an embedding's state, e.g.
    wide_embedding.slot0_dim8; (None, None) for the rest of the model."""
    kind, _, group = name.rpartition(".")[2].partition("_")
    if kind == "table" or kind.startswith("slot"):
        return kind.rstrip("0123456789"), group
    return None, None


class _FixedRows:
    """The planted model's interface (its spec, its config, sample) over rows already
    drawn, so that make_event_stream times these rows rather than draws of its own."""

    def __init__(self, spec: FeatureSpec, rows: pa.Table, probabilities: np.ndarray):
        self.spec, self.config = spec, SyntheticConfig()  # the planted model's own
        self._rows, self._probabilities = rows, probabilities

    def sample(self, rows: int, stream: int) -> tuple[pa.Table, np.ndarray]:
        assert rows == self._rows.num_rows
        return self._rows, self._probabilities


def timed_events(spec: FeatureSpec, rows: pa.Table, config: EventStreamConfig) -> EventStream:
    """These rows as impressions in their order, and their clicks: a click for every row
    whose planted label is 1, delayed as config says. (The truth's probabilities are NaN:
    the tests score held-out rows instead.)"""
    unknown = np.full(rows.num_rows, np.nan)
    return make_event_stream(_FixedRows(spec, rows, unknown), rows.num_rows, 0, config)
