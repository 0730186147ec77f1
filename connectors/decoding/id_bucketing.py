"""The rows valid raw ids pack as: a hashed field's bucket, a dynamic field's 64-bit key
(both by the hash of picasso.hashing, which serving uses too; a dynamic field's keyed by
its spec's hash_seed, if any), or a vocab field's id itself. Only ids the validator
accepts reach here."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from picasso.connectors.decoding.columns import has_negative
from picasso.hashing import bucket_of, hash_many, hash_to_buckets, key_of, keys_of
from picasso.spec import SparseField


def plain_hashed_bags(fields: Sequence[SparseField], columns: dict[str, object], n: int) -> dict[str, pa.ListArray]:
    """Bags of the hashed (and dynamic) fields whose column holds exactly one id per row
    (a string or integer Arrow array without nulls: the usual shape of JSON events),
    hashed together. No row of such a column can be refused, and one hash call over all of
    them costs about what one call per field costs in overhead alone."""
    plain: dict[pa.DataType, list[tuple[SparseField, pa.Array]]] = {}
    for f in fields:
        arr = columns.get(f.name) if f.takes_strings else None
        if (isinstance(arr, pa.Array) and arr.null_count == 0 and len(arr) == n
                and (pa.types.is_integer(arr.type) and not has_negative(arr)
                     or pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type))):
            plain.setdefault(arr.type, []).append((f, arr))
    if not plain:
        return {}
    offsets = pa.array(np.arange(n + 1, dtype=np.int32))
    out = {}
    for same_type in plain.values():
        hashed = [(f, arr) for f, arr in same_type if f.hashed]
        rows = hash_many([arr for _, arr in hashed], [f.hash_buckets for f, _ in hashed]) if hashed else []
        ids = dict(zip((f.name for f, _ in hashed), rows))
        ids.update({f.name: keys_of(arr, f.dynamic.hash_seed) for f, arr in same_type if not f.hashed})
        for f, _ in same_type:
            out[f.name] = pa.ListArray.from_arrays(offsets, pa.array(ids[f.name]))
    return out


def string_id_rows(f: SparseField, ids: pa.Array) -> np.ndarray:
    """The rows of a null-free array of a hashed or dynamic field's ids."""
    return hash_to_buckets(ids, f.hash_buckets) if f.hashed else keys_of(ids, f.dynamic.hash_seed)


def row_of(value: int | str, f: SparseField) -> int:
    """The id a valid raw id packs as: its bucket, its dynamic key, or the vocab id itself."""
    if f.hashed:
        return bucket_of(value, f.hash_buckets)
    return key_of(value, f.dynamic.hash_seed) if f.dynamic is not None else value
