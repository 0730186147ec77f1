"""The feature rows a join holds, by record slot, in a few tables of rows.

picasso.sample_join.join_state keeps its records (keys, times, states) in numpy arrays and their
canonical feature rows here. Rows come in a table per call and leave one by one (a record
emitted for good needs its row no more), and a join of a million pending impressions must
neither copy them all again and again nor take from hundreds of small tables:
- a new table is merged with the table before it while the two hold few rows (MERGE_ROWS),
  so there are a few dozen tables at a million rows, and each row is copied a few times;
- a table is rewritten with only its rows still held once half of them have gone, and
  dropped when none is left. Rows leave roughly in arrival order, so old tables empty and
  go; each rewrite halves a table, so a row is copied at most about twice more.
Rows keep their slots' order everywhere, so a take of ascending slots is ascending in
every table. The tables are numpy arrays (picasso.sample_join.feature_arrays): rows come in and leave as
Arrow tables, but a take from Arrow costs a kernel call per column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from picasso.sample_join.feature_arrays import FeatureArrays, FeatureLayout

MERGE_ROWS = 65_536


@dataclass
class _Table:
    first: int  # the row id of its first row; its rows are first, first + 1, ...
    rows: FeatureArrays
    owners: np.ndarray  # the slot of each row (-1: a slot renumbered away)
    held: int  # rows still held


class HeldFeatures:
    def __init__(self, schema: pa.Schema, merge_rows: int = MERGE_ROWS):
        self.schema = schema
        self.layout = FeatureLayout(schema)
        self.merge_rows = merge_rows
        self.row_of = np.zeros(0, np.int64)  # per slot: its row id, -1 when it holds none
        self._tables: list[_Table] = []
        self._starts = np.zeros(0, np.int64)
        self._next_row = 0

    @property
    def held(self) -> int:
        return sum(t.held for t in self._tables)

    @property
    def nbytes(self) -> int:
        return sum(t.rows.nbytes + t.owners.nbytes for t in self._tables) + self.row_of.nbytes

    def reserve(self, slots: int) -> None:
        """Room for slots [0, slots)."""
        if slots > len(self.row_of):
            grown = np.full(max(slots, 2 * len(self.row_of)), -1, np.int64)
            grown[:len(self.row_of)] = self.row_of
            self.row_of = grown

    def add(self, slots: np.ndarray, rows: pa.Table) -> None:
        """The rows of these (new, ascending) slots."""
        n = len(slots)
        if not n:
            return
        self.reserve(int(slots[-1]) + 1)
        self.row_of[slots] = np.arange(self._next_row, self._next_row + n)
        self._tables.append(_Table(self._next_row, self.layout.from_arrow(rows), np.asarray(slots, np.int64).copy(), n))
        self._next_row += n
        while len(self._tables) >= 2 and self._tables[-2].held + self._tables[-1].held <= self.merge_rows:
            self._rewrite(len(self._tables) - 2, merge_next=True)
        self._index()

    def take(self, slots: np.ndarray) -> pa.Table:
        """The rows of these ascending slots, each holding one."""
        if not len(slots):
            return self.schema.empty_table()
        ids = self.row_of[slots]
        table = np.searchsorted(self._starts, ids, side="right") - 1
        bounds = np.searchsorted(table, np.arange(len(self._tables) + 1))
        parts = []
        for t, (lo, hi) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
            if hi > lo:
                part = self._tables[t]
                parts.append(part.rows.take(ids[lo:hi] - part.first))
        return self.layout.to_arrow(FeatureArrays.concat(parts))

    def release(self, slots: np.ndarray) -> None:
        """These slots' rows are needed no more (slots without one are skipped)."""
        slots = slots[self.row_of[slots] >= 0]
        if not len(slots):
            return
        table = np.searchsorted(self._starts, self.row_of[slots], side="right") - 1
        self.row_of[slots] = -1
        gone = np.bincount(table, minlength=len(self._tables))
        for t in np.flatnonzero(gone).tolist():
            self._tables[t].held -= int(gone[t])
        emptied = [t for t in np.flatnonzero(gone).tolist()
                   if self._tables[t].held * 2 < len(self._tables[t].rows)]
        for t in sorted(emptied, reverse=True):  # from the back: the indices before stay put
            self._rewrite(t)
        if emptied:
            self._index()

    def renumber(self, remap: np.ndarray, size: int) -> None:
        """Slots moved: old slot s is now remap[s] (-1: gone, and holding no row)."""
        row_of = np.full(max(size, 1), -1, np.int64)
        kept = remap >= 0
        row_of[remap[kept]] = self.row_of[:len(remap)][kept]
        self.row_of = row_of
        for table in self._tables:
            table.owners = np.where(table.owners >= 0, remap[table.owners.clip(0)], -1)

    def _rewrite(self, t: int, merge_next: bool = False) -> None:
        """Table t with only its rows still held (and table t + 1's after them, merged);
        dropped when nothing is left."""
        parts = self._tables[t:t + 2] if merge_next else [self._tables[t]]
        first = parts[0].first
        kept_rows, kept_owners = [], []
        for part in parts:
            owners = part.owners
            held = np.flatnonzero((owners >= 0) & (self.row_of[owners.clip(0)] == part.first + np.arange(len(owners))))
            kept_rows.append(part.rows.take(held) if len(held) < len(part.rows) else part.rows)
            kept_owners.append(owners[held])
        owners = np.concatenate(kept_owners)
        replaced = slice(t, t + len(parts))
        if not len(owners):
            self._tables[replaced] = []
            return
        rows = FeatureArrays.concat(kept_rows)
        self.row_of[owners] = first + np.arange(len(owners))
        self._tables[replaced] = [_Table(first, rows, owners, len(owners))]

    def _index(self) -> None:
        self._starts = np.array([t.first for t in self._tables], dtype=np.int64)
