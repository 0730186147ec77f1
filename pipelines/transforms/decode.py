"""DecodeRecords: raw chunks in; decoded train and holdout chunks and dead letters out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from picasso.connectors.day_files import RawChunk, UnreadableFile
from picasso.connectors.dead_letters import DeadLetter
from picasso.connectors.decoders import DecodeOptions, RecordDecoder
from picasso.hashing import hash_bytes, splitmix64_array
from picasso.spec import FeatureSpec

TRAIN, HOLDOUT, DEAD_LETTERS = "train", "holdout", "dead_letters"


@dataclass(frozen=True)
class DecodedChunk:
    table: pa.Table  # canonical rows (see connectors.decoders)
    positions: dict[str, int]  # source -> next row/offset after this chunk
    starts: dict[str, int] = field(default_factory=dict)  # source -> its first row/offset


def holdout_mask(source: str, first_row: int, num_rows: int, fraction: float) -> np.ndarray:
    """Which rows are held out: a fixed hash of (partition/file name, row), so reruns hold
    out the same rows whatever the chunking and wherever the data root is."""
    if fraction <= 0:
        return np.zeros(num_rows, dtype=bool)
    name = f"{Path(source).parent.name}/{Path(source).name}"
    salt = np.uint64(hash_bytes(name.encode()) & 0x7FFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        h = splitmix64_array(np.arange(first_row, first_row + num_rows, dtype=np.uint64) + salt)
    return (h % np.uint64(1_000_000)) < np.uint64(round(fraction * 1_000_000))


def _select(records: pa.Table | list[bytes], mask: np.ndarray):
    if isinstance(records, list):
        return [record for record, keep in zip(records, mask) if keep]
    return records.filter(pa.array(mask))


class _DecodeDoFn(beam.DoFn):
    def __init__(self, spec: FeatureSpec, options: DecodeOptions, holdout_fraction: float):
        self.spec = spec
        self.options = options
        self.holdout_fraction = holdout_fraction

    def setup(self):
        self.decoder = RecordDecoder(self.spec, self.options)
        self.rows_in = Metrics.counter("picasso", "rows_in")
        self.dead = Metrics.counter("picasso", "dead_letters")
        self.train_rows = Metrics.counter("picasso", "train_rows")
        self.holdout_rows = Metrics.counter("picasso", "holdout_rows")

    def _decode(self, chunk: RawChunk, mask: np.ndarray):
        records = _select(chunk.records, mask)
        positions = chunk.first_row + np.flatnonzero(mask)
        decode = {
            "parquet": self.decoder.decode_table, "jsonl": self.decoder.decode_json, "tsv": self.decoder.decode_tsv
        }[chunk.format]
        return decode(records, chunk.source, positions=positions)

    def process(self, chunk: RawChunk | UnreadableFile):
        if isinstance(chunk, UnreadableFile):  # one dead letter for what could not be read
            self.dead.inc(1)
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, DeadLetter(chunk.source, chunk.first_row, "", chunk.reason))
            return
        held = holdout_mask(chunk.source, chunk.first_row, chunk.num_rows, self.holdout_fraction)
        positions = {chunk.source: chunk.first_row + chunk.num_rows}
        self.rows_in.inc(chunk.num_rows)
        for tag, mask, counter in ((TRAIN, ~held, self.train_rows), (HOLDOUT, held, self.holdout_rows)):
            if tag == HOLDOUT and not mask.any():
                continue
            result = self._decode(chunk, mask)
            counter.inc(result.table.num_rows)
            self.dead.inc(len(result.dead_letters))
            for letter in result.dead_letters:
                yield beam.pvalue.TaggedOutput(DEAD_LETTERS, letter)
            yield beam.pvalue.TaggedOutput(tag, DecodedChunk(result.table, positions, {chunk.source: chunk.first_row}))


class DecodeRecords(beam.PTransform):
    """Validate raw chunks against the spec (an UnreadableFile becomes one dead letter).

    Outputs (tagged): `train` and `holdout` DecodedChunks (holdout_fraction of the rows,
    chosen by a fixed hash of their position), and `dead_letters`: one DeadLetter per
    refused record, with its reason. The caller decides where dead letters go.
    """

    def __init__(self, spec: FeatureSpec, options: DecodeOptions = DecodeOptions(), holdout_fraction: float = 0.0):
        super().__init__()
        self.spec = spec
        self.options = options
        self.holdout_fraction = holdout_fraction

    def expand(self, chunks):
        return chunks | "Decode" >> beam.ParDo(
            _DecodeDoFn(self.spec, self.options, self.holdout_fraction)
        ).with_outputs(TRAIN, HOLDOUT, DEAD_LETTERS)
