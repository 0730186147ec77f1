"""The join policy of picasso.sample_join.join_state as a competent dict join: benchmarks.join's baseline.

The reference join (picasso.sample_join.reference) turns every impression's features into
a Python row dict and every sample back into Arrow, and that conversion is most of its
time. A user who writes a dict join with care leaves the rows where they came: a record
holds the call's Arrow table and its row there, and a call's samples are taken from those
tables in one Arrow take. The policy, the per-event loop over dicts and heaps, and the
exact keys are the reference's own (this is a subclass of it), so the two emit the same
samples.

A table stays alive while any of its records may still emit its row: a positive, a
negative under `drop` and a correction need it no more, and let it go. `arrow_bytes` is
what the tables held cost (tracemalloc does not see Arrow's memory).
"""

from __future__ import annotations

from itertools import repeat

import pyarrow as pa

from picasso.sample_join.join_rules import Impressions
from picasso.sample_join.join_state import as_samples, sample_schema
from picasso.sample_join.reference import DictJoin


class ArrowDictJoin(DictJoin):
    def _rows(self, impressions: Impressions):
        """Each impression's record holds (its call's table, its row there)."""
        table = impressions.rows
        return zip(repeat(table), range(table.num_rows))

    def _sample(self, record, label: int, correction: bool, delay: int):
        sample = (record.row, label, int(correction), delay, record.key)
        if label == 1 or self.policy.late_labels == "drop":
            record.row = None  # no later sample of it: its table may go once no record holds it
        return sample

    def _table(self, samples: list) -> pa.Table:
        """The samples' rows in one take from the tables they come from, in emission order."""
        if not samples:
            return sample_schema(self.schema).empty_table()
        rows, labels, corrections, delays, keys = zip(*samples)
        tables, starts, index = [], {}, []
        size = 0
        for table, row in rows:
            start = starts.get(id(table))
            if start is None:
                start = starts[id(table)] = size
                tables.append(table)
                size += table.num_rows
            index.append(start + row)
        taken = pa.concat_tables(tables).take(pa.array(index, pa.int64()))
        return as_samples(taken, labels, corrections, delays, keys)

    @property
    def arrow_bytes(self) -> int:
        """Bytes of the Arrow tables the records hold."""
        tables = {id(record.row[0]): record.row[0] for record in self.records.values() if record.row is not None}
        return sum(table.nbytes for table in tables.values())
