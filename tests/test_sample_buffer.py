"""Joined samples cut into mixed batches (picasso.sample_join.sample_buffer)."""

import numpy as np
import pyarrow as pa
import pytest

from picasso.sample_join.sample_buffer import SampleBuffer

SCHEMA = pa.schema([pa.field("label", pa.float32()), pa.field("i", pa.int64())])


def table(start: int, n: int, label: float) -> pa.Table:
    return pa.table({"label": pa.array(np.full(n, label, np.float32)), "i": pa.array(np.arange(start, start + n))},
                    schema=SCHEMA)


def test_bursts_of_one_kind_come_out_mixed_and_every_sample_once():
    buffer = SampleBuffer(SCHEMA, batch_rows=100, window=4)
    out = []
    for burst in range(10):  # 200 positives, then 200 negatives, and so on
        buffer.add(table(burst * 200, 200, float(burst % 2 == 0)))
        out += buffer.batches()
    assert all(batch.num_rows == 100 for batch in out) and len(out) == (2000 - 300) // 100  # until fewer than 4 batches' worth
    shares = [float(np.mean(batch.column("label").to_numpy())) for batch in out]
    assert all(0.2 < share < 0.8 for share in shares), shares  # no batch of one kind
    seen = np.concatenate([batch.column("i").to_numpy() for batch in out] + [buffer.rows.column("i").to_numpy()])
    assert sorted(seen.tolist()) == list(range(2000))


def test_a_restored_buffer_hands_out_the_same_batches():
    straight, saved = SampleBuffer(SCHEMA, 50), SampleBuffer(SCHEMA, 50)
    for k in range(8):
        part = table(k * 70, 70, float(k % 2))
        if k == 4:
            saved = SampleBuffer.from_bytes(saved.to_bytes(), SCHEMA, 50)
        straight.add(part)
        saved.add(part)
        got, want = saved.batches(), straight.batches()
        assert len(got) == len(want) and all(a.equals(b) for a, b in zip(got, want))
    assert straight.handed_out == saved.handed_out > 0 and straight.rows.equals(saved.rows)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="batch_rows > 0"):
        SampleBuffer(SCHEMA, 0)
