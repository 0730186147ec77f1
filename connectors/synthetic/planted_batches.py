"""Planted data as the pipelines would make it: rows of the planted model's stream, decoded
and packed, each batch with its position. The distributed commands train on it, and so do
the GBA and sync tests and benchmarks."""

from __future__ import annotations

from picasso.batch import pack
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.packing import PackingPlan
from picasso.connectors.synthetic.planted import PlantedModel


def planted_source(stream: int) -> str:
    return f"planted-{stream}"


def planted_batches(spec, rows: int, batch_size: int, stream: int, start: int = 0):
    """Rows [start, start + rows) of the planted model's stream, decoded and packed like the
    pipelines do, each batch with its position (the next row) in the stream."""
    # Sampled and decoded now, packed batch by batch as they are read: a run that times its
    # training calls this first, so planting the data is not timed (packing is, as in the
    # pipelines).
    # A planted sample is not a prefix of a longer one: a reader resuming at `start` draws
    # start + rows rows and trains on those past start, so positions stay exact (rows are
    # fresh draws of the same planted model, never ones trained before).
    plan = PackingPlan.from_spec(spec)
    table, _ = PlantedModel(spec).sample(start + rows, stream)
    source = planted_source(stream)
    decoded = RecordDecoder(spec).decode_table(table, source).table
    end = start + rows
    return (pack(decoded.slice(at, batch_size), spec, plan, {source: min(at + batch_size, end)}, {source: at})
            for at in range(start, end, batch_size))
