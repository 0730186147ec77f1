"""DecodeRecords and DecodeMessages: day-file chunks or Kafka polls in; decoded chunks and
dead letters out.

Both decode with a RecordDecoder made once per DoFn instance, count the records that come
in and those refused, and send every dead letter to the one DEAD_LETTERS output
(DecodeDoFn). They differ where their sources differ:
- day files: an unreadable file becomes one dead letter, and a fixed fraction of the rows
  is held out for evaluation (the HOLDOUT output);
- Kafka: a topic's format is json, arrow (many rows per message) or tsv (see
  connectors.decoding.message_formats), a dead letter keeps the message's original bytes,
  and every chunk carries its MessageSpan (pipelines.transforms.message_spans). There is
  no holdout split: a stream is evaluated prequentially (each batch is scored before it
  is trained on).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from picasso.connectors.day_files import RawChunk, UnreadableFile
from picasso.connectors.dead_letters.letters import DeadLetter, reason_kind
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.message_formats import FORMATS, decode_messages
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.connectors.dead_letters.topic import DeadLetterProducer
from picasso.connectors.kafka_source import Messages
from picasso.kernels.hashing import hash_bytes, splitmix64_array
from picasso.pipelines.transforms.message_spans import DecodedMessageChunk, MessageSpan
from picasso.pipelines.transforms.process_counts import DEAD_LETTER_KIND_COUNTER, PROCESS_COUNTS
from picasso.pipelines.transforms.row_profile import RowProfile
from picasso.spec import FeatureSpec

TRAIN, HOLDOUT, DEAD_LETTERS = "train", "holdout", "dead_letters"


# -- what every decode shares -----------------------------------------------------------

class DecodeDoFn(beam.DoFn):
    """The counters and the dead-letter output of every decode. Subclasses make their
    decoder in setup, after super().setup()."""

    def setup(self):
        self.counters: dict[str, object] = {}

    def count(self, name: str, n: int) -> None:
        """Add n to the "picasso" counter of that name, made on first use (the names of
        dead-letter kinds and absent fields are known only as they come), and to this
        process's tally (process_counts.py: what a running endless job's metrics read)."""
        counter = self.counters.get(name)
        if counter is None:
            counter = self.counters[name] = Metrics.counter("picasso", name)
        counter.inc(n)
        PROCESS_COUNTS.add(name, n)

    def count_profile(self, table: pa.Table, absent: dict[str, int]) -> RowProfile:
        """Count the valid rows' profile (transforms/row_profile.py) in Beam counters, for
        the run-health gate of a run that reads them back (a stream's cycle)."""
        profile = RowProfile.of_table(table, absent)
        for name, n in profile.counters().items():
            self.count(name, n)
        return profile

    def dead_letters(self, letters: Iterable, refused: int | None = None):
        """Count the refused records (one per letter unless told: an Arrow message's
        letter names all its refused rows) and send their letters to DEAD_LETTERS."""
        letters = list(letters)
        self.count_refused(letters, refused)
        for letter in letters:
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, letter)

    def count_refused(self, letters: list, refused: int | None) -> None:
        """The refused records, in all and by their reason's kind (dead_letters.reason_kind;
        counter dead_letters.KIND, for the stream's metrics): each letter's records count
        under its first reason's kind."""
        self.count("dead_letters", len(letters) if refused is None else refused)
        for letter in letters:
            self.count(f"{DEAD_LETTER_KIND_COUNTER}{reason_kind(letter.reason)}", getattr(letter, "records", 1))


class _SpecDecodeDoFn(DecodeDoFn):
    """A decode with one RecordDecoder of a spec and options. (A joined stream's decode,
    pipelines.runs.join_cycle, holds two decoders of its own, so it derives from
    DecodePollDoFn alone.)"""

    def __init__(self, spec: FeatureSpec, options: DecodeOptions):
        self.spec = spec
        self.options = options

    def setup(self):
        super().setup()
        self.decoder = RecordDecoder(self.spec, self.options)


# -- day files ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DecodedChunk:
    table: pa.Table  # canonical rows (see connectors.decoding.validation)
    positions: dict[str, int]  # source -> next row/offset after this chunk
    starts: dict[str, int] = field(default_factory=dict)  # source -> its first row/offset
    profile: RowProfile = RowProfile()  # what the rows held, for the run-health gate


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


class _DecodeChunkDoFn(_SpecDecodeDoFn):
    def __init__(self, spec: FeatureSpec, options: DecodeOptions, holdout_fraction: float):
        super().__init__(spec, options)
        self.holdout_fraction = holdout_fraction

    def _decode(self, chunk: RawChunk, mask: np.ndarray):
        records = _select(chunk.records, mask)
        positions = chunk.first_row + np.flatnonzero(mask)
        decode = {
            "parquet": self.decoder.decode_table, "jsonl": self.decoder.decode_json, "tsv": self.decoder.decode_tsv
        }[chunk.format]
        return decode(records, chunk.source, positions=positions)

    def process(self, chunk: RawChunk | UnreadableFile):
        if isinstance(chunk, UnreadableFile):  # one dead letter for what could not be read
            yield from self.dead_letters([DeadLetter(chunk.source, chunk.first_row, "", chunk.reason)])
            return
        held = holdout_mask(chunk.source, chunk.first_row, chunk.num_rows, self.holdout_fraction)
        positions = {chunk.source: chunk.first_row + chunk.num_rows}
        self.count("rows_in", chunk.num_rows)
        for tag, mask in ((TRAIN, ~held), (HOLDOUT, held)):
            if tag == HOLDOUT and not mask.any():
                continue
            result = self._decode(chunk, mask)
            self.count(f"{tag}_rows", result.table.num_rows)
            profile = self.count_profile(result.table, result.absent)
            yield from self.dead_letters(result.dead_letters)
            yield beam.pvalue.TaggedOutput(
                tag, DecodedChunk(result.table, positions, {chunk.source: chunk.first_row}, profile))


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
            _DecodeChunkDoFn(self.spec, self.options, self.holdout_fraction)
        ).with_outputs(TRAIN, HOLDOUT, DEAD_LETTERS)


# -- Kafka polls -------------------------------------------------------------------------

class DecodePollDoFn(DecodeDoFn):
    """What every decode of a Kafka poll does around its decoder: count the messages,
    records and refusals, send the dead letters to the tagged output (or write them to
    `letters`, a DeadLetterProducer, when a subclass sets one), and make the poll's
    MessageSpan. Subclasses decode (decode) and make the main element (chunk)."""

    letters: DeadLetterProducer | None = None

    def setup(self):
        super().setup()
        if self.letters is not None:
            self.letters.open()

    def teardown(self):
        if self.letters is not None:
            self.letters.close()

    def dead_letters(self, letters: Iterable, refused: int | None = None):
        if self.letters is None:
            yield from super().dead_letters(letters, refused)
            return
        # Written and acknowledged before the poll's chunk is yielded: nothing after this
        # step (training, the server's positions) can move past a message whose letter is
        # not in the topic.
        letters = list(letters)
        self.count_refused(letters, refused)
        for letter in letters:
            self.letters.send(letter)
        self.letters.confirm()

    def decode(self, messages: Messages):
        raise NotImplementedError

    def chunk(self, messages: Messages, decoded, span: MessageSpan):
        raise NotImplementedError

    def process(self, messages: Messages):
        decoded = self.decode(messages)
        self.count("messages_in", len(messages))
        self.count("rows_in", decoded.records_in)
        yield from self.dead_letters(decoded.dead_letters, decoded.records_refused)
        yield self.chunk(messages, decoded, MessageSpan.of_poll(messages, decoded.records_in, decoded.records_refused))


class _DecodeMessagesDoFn(DecodePollDoFn, _SpecDecodeDoFn):
    def __init__(self, spec: FeatureSpec, formats: dict[str, str], options: DecodeOptions,
                 letters: DeadLetterProducer | None = None):
        super().__init__(spec, options)
        self.formats = formats
        self.letters = letters

    def decode(self, messages: Messages):
        return decode_messages(self.decoder, self.formats[messages.topic], messages)

    def chunk(self, messages: Messages, decoded, span: MessageSpan) -> DecodedMessageChunk:
        self.count_profile(decoded.table, decoded.absent)
        return DecodedMessageChunk(decoded.table, span)


class DecodeMessages(beam.PTransform):
    """Messages in. Main output: DecodedMessageChunks (valid rows + span); tagged output
    `dead_letters`: one MessageDeadLetter per message with any refused record.

    letters_to (a DeadLetterProducer): write each poll's letters there instead, and have the
    broker acknowledge them before the poll's chunk goes on (the `dead_letters` output
    stays empty). An endless job needs that order: its training moves the server's
    positions as it goes, and a bundle that failed after its training but before its
    letters were confirmed would lose them for good."""

    def __init__(self, spec: FeatureSpec, formats: dict[str, str], options: DecodeOptions = DecodeOptions(),
                 letters_to: DeadLetterProducer | None = None):
        super().__init__()
        self.letters_to = letters_to
        bad = {topic: fmt for topic, fmt in formats.items() if fmt not in FORMATS}
        if bad:
            raise ValueError(f"unknown message format(s) {bad}: expected one of {', '.join(FORMATS)}")
        self.spec = spec
        self.formats = dict(formats)
        self.options = options

    def expand(self, messages):
        return messages | "Decode" >> beam.ParDo(
            _DecodeMessagesDoFn(self.spec, self.formats, self.options, self.letters_to)
        ).with_output_types(DecodedMessageChunk).with_outputs(DEAD_LETTERS, main="chunks")
