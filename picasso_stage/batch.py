"""PackedBatch: N samples in one Arrow RecordBatch, ready for the embedding layer.

Columns (all N rows long):
- `label`: float32.
- `dense`: fixed_size_list<float32>[num_dense]; absent when the spec has no dense fields.
- per packing group g:
  - `g.ids`: list<int64>; a sample's ids for all of g's fields, field after field, already
    offset into g's table (a dynamic field's are its keys, which the trainer maps to
    rows: picasso.dynamic_rows). Flattened, it is the flat id array of the group.
  - `g.offsets`: fixed_size_list<int32>[fields of g]; where each (sample, field) bag starts
    in the flat ids. Flattened, it is the CSR offsets over samples × fields.
Source positions travel in the schema metadata, so the batch alone (an Arrow IPC message,
say) says which part of its source it covers: per source the next position after it and,
where the reader knows it, its first one, which makes the batch's [start, end) range (a
parameter server trains a range at most once). So do the batch's event time, where its
source knows one (the newest of its rows', in epoch ms: a Kafka span's newest message, a
joined table's newest impression, the start of a day-file partition), and a joined
stream's late-label share.

A joined stream's samples are a set of impressions, not a range: such a batch carries each
row's identity (the source and position it is trained under, picasso.sample_identity) in
two more columns, which nothing packed reads, and its ranges are those positions' runs.
It may also name positions it settles (SETTLES_KEY): ones that will train nothing more,
which the parameter server records untrained; a batch may carry those and no rows.

Packing is vectorised (Arrow and numpy over whole columns; no loop over rows), and the
batch crosses into torch without copying.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from picasso import kernels
from picasso.kernels.group_ids import GroupIds
from picasso.packing import PackedGroup, PackingPlan
from picasso.sample_identity import Range, held_mask, identity_of, spans_of
from picasso.spec import FeatureSpec

# Arrow buffers are read-only and torch warns when it wraps one; the tensors made here are
# inputs that are never written to.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

POSITIONS_KEY = b"picasso.positions"
STARTS_KEY = b"picasso.starts"
LATE_SHARE_KEY = b"picasso.late_share"
EVENT_TIME_KEY = b"picasso.event_time_ms"
SETTLES_KEY = b"picasso.settles"
IDENTITY_SOURCES_KEY = b"picasso.identity_sources"  # the sources the identity column indexes
IDENTITY_SOURCE_COLUMN = "picasso.identity_source"  # int32: an index into IDENTITY_SOURCES_KEY
IDENTITY_POSITION_COLUMN = "picasso.identity_position"  # int64


@dataclass(frozen=True)
class TorchBatch:
    label: torch.Tensor  # (N,) float32
    dense: torch.Tensor  # (N, num_dense) float32
    ids: dict[str, torch.Tensor]  # group -> flat int64 ids
    offsets: dict[str, torch.Tensor]  # group -> (N * fields,) int32 bag starts
    # A joined stream's d̂ when its loss weights late labels (picasso.sample_join.delayed_feedback).
    late_share: float | None = None
    # The newest event time of the batch's rows, epoch ms, where its source knows it: the
    # clock of dynamic tables that evict by event time (picasso.dynamic_rows).
    event_time_ms: int | None = None

    @property
    def num_samples(self) -> int:
        return self.label.shape[0]

    def to(self, device: torch.device) -> "TorchBatch":
        if device.type == "cpu":
            return self
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return TorchBatch(
            label=move(self.label),
            dense=move(self.dense),
            ids={k: move(v) for k, v in self.ids.items()},
            offsets={k: move(v) for k, v in self.offsets.items()},
            late_share=self.late_share,
            event_time_ms=self.event_time_ms,
        )


@dataclass(frozen=True)
class PackedBatch:
    data: pa.RecordBatch

    @property
    def num_samples(self) -> int:
        return self.data.num_rows

    @property
    def positions(self) -> dict[str, int]:
        metadata = self.data.schema.metadata or {}
        return json.loads(metadata.get(POSITIONS_KEY, b"{}"))

    @property
    def ranges(self) -> dict[str, tuple[int, int] | list[Range]]:
        """Per source whose start the batch knows, [start, end) of the positions it covers;
        for a batch whose rows carry identities, their runs per source."""
        identities = self.row_identities()
        if identities is not None:
            return identity_of(identities)
        metadata = self.data.schema.metadata or {}
        starts, ends = json.loads(metadata.get(STARTS_KEY, b"{}")), self.positions
        return {source: (start, ends[source]) for source, start in starts.items() if source in ends}

    def row_identities(self) -> list[tuple[str, int]] | None:
        """Each row's (source, position), where the rows carry them (with_identities)."""
        if IDENTITY_POSITION_COLUMN not in self.data.schema.names:
            return None
        sources = json.loads(self.data.schema.metadata[IDENTITY_SOURCES_KEY])
        index = self.data.column(IDENTITY_SOURCE_COLUMN).to_pylist()
        return [(sources[i], p) for i, p in zip(index, self.data.column(IDENTITY_POSITION_COLUMN).to_pylist())]

    def with_identities(self, sources: list[str], positions: np.ndarray) -> "PackedBatch":
        """This batch, row i trained under (sources[i], positions[i])."""
        names = sorted(set(sources))
        index = {name: i for i, name in enumerate(names)}
        data = self.data.append_column(IDENTITY_SOURCE_COLUMN, pa.array([index[s] for s in sources], pa.int32()))
        data = data.append_column(IDENTITY_POSITION_COLUMN, pa.array(np.asarray(positions, np.int64)))
        return PackedBatch(data.replace_schema_metadata(
            {**(self.data.schema.metadata or {}), IDENTITY_SOURCES_KEY: json.dumps(names).encode()}))

    def without_held(self, held: dict[str, list[Range]]) -> "PackedBatch":
        """This batch less the rows whose identity is in `held` (ranges per source)."""
        identities = self.row_identities()
        if not identities or not held:
            return self
        keep = np.ones(len(identities), bool)
        sources = np.array([source for source, _ in identities], dtype=object)
        positions = np.array([position for _, position in identities], np.int64)
        for source, spans in held.items():
            mine = sources == source
            keep[mine] &= ~held_mask(sorted(spans_of(spans)), positions[mine])
        return self if keep.all() else PackedBatch(self.data.filter(pa.array(keep)))

    @property
    def settles(self) -> dict[str, list[Range]]:
        """Positions this batch says will train nothing more (module docstring)."""
        metadata = self.data.schema.metadata or {}
        return {source: spans_of(spans) for source, spans in json.loads(metadata.get(SETTLES_KEY, b"{}")).items()}

    def with_settles(self, settles: dict[str, list[Range]]) -> "PackedBatch":
        if not settles:
            return self
        return self._with_metadata(SETTLES_KEY, json.dumps(settles, sort_keys=True).encode())

    @property
    def late_share(self) -> float | None:
        metadata = self.data.schema.metadata or {}
        return float(metadata[LATE_SHARE_KEY]) if LATE_SHARE_KEY in metadata else None

    def with_late_share(self, share: float) -> "PackedBatch":
        """This batch, its loss weighted for late labels with d̂ = share (delayed_feedback)."""
        return self._with_metadata(LATE_SHARE_KEY, repr(float(share)).encode())

    @property
    def event_time_ms(self) -> int | None:
        metadata = self.data.schema.metadata or {}
        return int(metadata[EVENT_TIME_KEY]) if EVENT_TIME_KEY in metadata else None

    def with_event_time(self, event_time_ms: int | None) -> "PackedBatch":
        """This batch, carrying the newest event time of its rows (None: unknown, as is)."""
        if event_time_ms is None:
            return self
        return self._with_metadata(EVENT_TIME_KEY, str(int(event_time_ms)).encode())

    def _with_metadata(self, key: bytes, value: bytes) -> "PackedBatch":
        return PackedBatch(self.data.replace_schema_metadata({**(self.data.schema.metadata or {}), key: value}))

    def to_torch(self) -> TorchBatch:
        """Views of the Arrow buffers as tensors: nothing is copied."""
        data = self.data
        n = data.num_rows
        if "dense" in data.schema.names:
            width = data.schema.field("dense").type.list_size
            dense = torch.from_numpy(_numpy(data.column("dense").flatten())).view(n, width)
        else:  # a spec without dense fields (Arrow has no fixed-size list of size 0)
            dense = torch.zeros(n, 0)
        ids, offsets = {}, {}
        for name in data.schema.names:
            if name.endswith(".ids"):
                group = name[: -len(".ids")]
                ids_column = data.column(name)
                bag_starts = _numpy(data.column(f"{group}.offsets").flatten())
                base = ids_column.offsets[0].as_py()  # non-zero only for a sliced batch
                ids[group] = torch.from_numpy(_numpy(ids_column.flatten()))
                offsets[group] = torch.from_numpy(bag_starts - base if base else bag_starts)
        return TorchBatch(
            label=torch.from_numpy(_numpy(data.column("label"))),
            dense=dense,
            ids=ids,
            offsets=offsets,
            late_share=self.late_share,
            event_time_ms=self.event_time_ms,
        )


def _numpy(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=True)


def _list_array(column: pa.Array | pa.ChunkedArray) -> pa.ListArray:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _pack_group(columns: dict[str, pa.ChunkedArray], n: int, group: PackedGroup) -> GroupIds:
    # One kernel call for the whole group (picasso.kernels.pack_group: C++ over the Arrow
    # buffers where it is built, else its numpy reference): at hundreds of fields, a few
    # numpy calls per field cost more than the ids. The arrays stay referenced here, as the
    # kernel reads their buffers in place.
    arrays = [_list_array(columns[name]) for name in group.fields]
    return kernels.pack_group(arrays, group.id_offsets, n)


def _group_columns(packed: GroupIds, num_fields: int) -> tuple[pa.Array, pa.Array]:
    """A group's `g.ids` and `g.offsets` columns, on the packed arrays' memory."""
    bag_starts = packed.bag_starts
    sample_offsets = pa.array(bag_starts[::num_fields])
    ids_column = pa.ListArray.from_arrays(sample_offsets, pa.array(packed.ids))
    offsets_column = pa.FixedSizeListArray.from_arrays(pa.array(bag_starts[:-1]), num_fields)
    return ids_column, offsets_column


def pack(table: pa.Table, spec: FeatureSpec, plan: PackingPlan, positions: dict[str, int] | None = None,
         starts: dict[str, int] | None = None) -> PackedBatch:
    """Pack a canonical table (see connectors.decoding.validation) into one PackedBatch; positions:
    per source, the next position after it; starts: its first."""
    dense_names = spec.dense_names
    label = table.column("label").to_numpy().astype(np.float32, copy=False)
    dense = None
    if dense_names:
        dense = np.stack([table.column(name).to_numpy() for name in dense_names], axis=1).astype(np.float32)
    # By name once: Table.column(name) looks the name up in the schema, a microsecond and
    # more per field.
    by_name = dict(zip(table.column_names, table.columns))
    groups = [_pack_group(by_name, table.num_rows, group) for group in plan.groups]
    return packed_batch(label, dense, plan, groups, positions, starts)


def packed_batch(label: np.ndarray, dense: np.ndarray | None, plan: PackingPlan, groups: list[GroupIds],
                 positions: dict[str, int] | None = None, starts: dict[str, int] | None = None) -> PackedBatch:
    """The PackedBatch of packed arrays (label float32 (n,), dense float32 (n, fields) or
    None for a spec without dense fields, and each of plan's groups' ids), on their memory:
    what pack makes of a canonical table, and the one-pass decode
    (connectors.decoding.packed_decode) of a raw batch."""
    columns = {"label": pa.array(label)}
    if dense is not None:
        columns["dense"] = pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), dense.shape[1])
    for group, packed in zip(plan.groups, groups):
        columns[f"{group.name}.ids"], columns[f"{group.name}.offsets"] = _group_columns(packed, group.num_fields)
    metadata = {POSITIONS_KEY: json.dumps(positions or {}, sort_keys=True).encode()}
    if starts:
        metadata[STARTS_KEY] = json.dumps(starts, sort_keys=True).encode()
    return PackedBatch(pa.RecordBatch.from_pydict(columns, metadata=metadata))
