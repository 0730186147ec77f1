"""The rows valid raw ids pack as: a hashed field's bucket, a dynamic field's 64-bit key
(both by the hash of picasso.kernels.hashing, which serving uses too; a dynamic field's keyed by
its spec's hash_seed, if any), or a vocab field's id itself. Only ids the validator
accepts reach here."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from picasso.kernels.hashing import bucket_of, hash_to_buckets, key_of, keys_of
from picasso.spec import SparseField


def string_id_rows(f: SparseField, ids: pa.Array) -> np.ndarray:
    """The rows of a null-free array of a hashed or dynamic field's ids."""
    return hash_to_buckets(ids, f.hash_buckets) if f.hashed else keys_of(ids, f.dynamic.hash_seed)


def row_of(value: int | str, f: SparseField) -> int:
    """The id a valid raw id packs as: its bucket, its dynamic key, or the vocab id itself."""
    if f.hashed:
        return bucket_of(value, f.hash_buckets)
    return key_of(value, f.dynamic.hash_seed) if f.dynamic is not None else value
