"""Day files: date partitions of Parquet, JSONL or Criteo TSV parts.

Layout: ROOT/date=YYYY-MM-DD/part-NNNNN.{parquet,jsonl,tsv}, or with hours
ROOT/date=YYYY-MM-DD/hour=HH/part-… (connectors.partitions names them); ROOT is a local
path or a URL (picasso.storage). A part is written whole at once (a temporary name and a rename on a
local disk, one put on an object store), so a reader never sees half a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from picasso import storage
from picasso.connectors.beam_urls import serve_urls_through_beam
from picasso.connectors.partitions import partition_path

FORMATS = {"parquet": ".parquet", "jsonl": ".jsonl", "tsv": ".tsv"}


@dataclass(frozen=True)
class RawChunk:
    """Consecutive raw records of one file: rows of a table, or lines of text."""

    source: str  # the file's path
    first_row: int
    format: str  # parquet | jsonl | tsv
    records: pa.Table | list[bytes]

    @property
    def num_rows(self) -> int:
        return len(self.records) if isinstance(self.records, list) else self.records.num_rows


@dataclass(frozen=True)
class UnreadableFile:
    """The rest of a file the reader gave up on (a corrupt Parquet footer or page, an
    I/O error): from first_row on, and why. It becomes one dead letter; the other files
    of the day, and the rows read before it failed, still train."""

    source: str
    first_row: int
    reason: str


def partition_dir(root: str | Path, partition: str) -> str:
    """The folder of a partition: a date (YYYY-MM-DD) or a date and hour (YYYY-MM-DDTHH)."""
    return storage.join(root, *partition_path(partition).split("/"))


def format_of(path: str | Path) -> str:
    for name, suffix in FORMATS.items():
        if str(path).endswith(suffix):
            return name
    raise ValueError(f"{path}: unknown day-file format (expected one of {', '.join(FORMATS.values())})")


def list_day_files(root: str | Path, date: str) -> list[str]:
    directory = partition_dir(root, date)
    if not storage.exists(directory):
        raise FileNotFoundError(f"no partition for {date}: {directory} does not exist")
    children = storage.children(directory)
    files = [storage.join(directory, name) for name in children
             if name.startswith("part-") and name.endswith(tuple(FORMATS.values()))]
    if not files:
        hours = sorted(name for name in children if name.startswith("hour="))
        split = f" but hourly partitions ({hours[0]} .. {hours[-1]}): name them, e.g. --hours 0..23" if hours else ""
        raise FileNotFoundError(f"partition {directory} holds no part files{split}")
    return files


def _text_lines(table: pa.Table, fmt: str) -> bytes:
    if fmt == "jsonl":
        return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in table.to_pylist()).encode()
    # TSV: multi-hot bags are comma-joined; missing values are empty.
    columns = [
        pc.binary_join(column, ",") if pa.types.is_list(column.type) else column for column in table.columns
    ]
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(
        pa.table(columns, names=table.column_names),
        sink,
        pa_csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"),
    )
    return sink.getvalue().to_pybytes()


def write_part(table: pa.Table, path: str | Path) -> None:
    fmt = format_of(path)
    if fmt == "parquet":
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
    else:
        data = _text_lines(table, fmt)
    storage.write_bytes(path, data)


def read_chunks(path: str, chunk_rows: int) -> Iterator[RawChunk | UnreadableFile]:
    """A file's records in chunks of at most chunk_rows, in order; if the file cannot be
    read to its end, an UnreadableFile for the rest."""
    fmt = format_of(path)
    chunks = _parquet_chunks(path, chunk_rows) if fmt == "parquet" else _text_chunks(path, fmt, chunk_rows)
    first = 0
    try:
        for chunk in chunks:
            yield chunk
            first += chunk.num_rows
    except (OSError, pa.ArrowException) as err:
        problem = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        yield UnreadableFile(path, first, f"unreadable {fmt} file {path} from row {first}: {problem}")


def _parquet_chunks(path: str, chunk_rows: int) -> Iterator[RawChunk]:
    first = 0
    with storage.open_read(path) as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=chunk_rows):
            yield RawChunk(path, first, "parquet", pa.Table.from_batches([batch]))
            first += batch.num_rows


def _text_chunks(path: str, fmt: str, chunk_rows: int) -> Iterator[RawChunk]:
    first = 0
    with storage.open_read(path) as f:
        lines: list[bytes] = []
        for line in f:
            lines.append(line.rstrip(b"\r\n"))
            if len(lines) == chunk_rows:
                yield RawChunk(path, first, fmt, lines)
                first, lines = first + len(lines), []
        if lines:
            yield RawChunk(path, first, fmt, lines)


class ReadDayFiles(beam.PTransform):
    """The raw chunks of every part of one date partition (and an UnreadableFile for
    each file that could not be read to its end).

    Files are listed at construction and become one element each, so the work is split up
    front (several local workers drop self-checkpointed remainders; see FACTS.md).
    """

    def __init__(self, root: str | Path, date: str, chunk_rows: int = 4096):
        super().__init__()
        self.files = list_day_files(root, date)
        self.chunk_rows = chunk_rows

    def expand(self, pbegin):
        return (
            pbegin
            | "ListFiles" >> beam.Create(self.files)
            | "ReadChunks" >> beam.ParDo(_ReadChunks(self.chunk_rows))
        )


class _ReadChunks(beam.DoFn):
    """read_chunks of each file, on a worker that reads URLs through Beam's filesystems."""

    def __init__(self, chunk_rows: int):
        self.chunk_rows = chunk_rows

    def setup(self):
        # A worker process imports only the modules of the DoFns it runs: nothing else has
        # set up how it reads the day's URLs.
        serve_urls_through_beam()

    def process(self, path: str):
        yield from read_chunks(path, self.chunk_rows)
