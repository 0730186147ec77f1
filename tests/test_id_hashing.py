"""hash_many buckets many columns exactly as one hash_to_buckets call per column would."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from picasso.hashing import _groups, hash_many, hash_to_buckets


@pytest.mark.parametrize("buckets", [
    [1_000, 500, 50_000, 3, 30, 7],  # a small common multiple: one call
    [2**31 - 1, 2**31 - 19, 1_000_003, 999_983, 10],  # large primes: several calls
    [2**62 + 1, 5],  # a bucket count over the limit stands alone
], ids=["one-group", "several-groups", "huge"])
@pytest.mark.parametrize("kind", ["string", "int"])
def test_hash_many_matches_one_call_per_column(buckets, kind):
    rng = np.random.default_rng(3)
    if kind == "string":
        arrays = [pa.array([f"id-{v}" * int(1 + v % 3) for v in rng.integers(0, 10**6, 200)]) for _ in buckets]
    else:
        arrays = [pa.array(rng.integers(-10**12, 10**12, 200)) for _ in buckets]
    arrays[0] = arrays[0].slice(50, 100)  # a sliced array hashes from its own offset
    got = hash_many(arrays, buckets)
    for arr, b, rows in zip(arrays, buckets, got):
        assert rows.dtype == np.int64
        np.testing.assert_array_equal(rows, hash_to_buckets(arr, b))


def test_groups_keep_common_multiples_in_range():
    assert _groups([4, 6, 10], most=100) == [[0, 1, 2]]
    assert _groups([4, 6, 10], most=2) == [[0, 1], [2]]
    for group in _groups([2**31 - 1, 2**31 - 19, 1_000_003, 999_983, 10], most=100):
        assert np.lcm.reduce([[2**31 - 1, 2**31 - 19, 1_000_003, 999_983, 10][i] for i in group], dtype=object) <= 2**62
