"""The fixed id hash. Training, serving and every decoder use these functions, so a raw id
maps to the same embedding row everywhere and in every version.

- String ids: FNV-1a 64 over the UTF-8 bytes.
- Integer ids: the splitmix64 finaliser of the id as an unsigned 64-bit integer.
- Bucket: the 64-bit hash modulo the field's hash_buckets.

A string "123" and an integer 123 are different ids. The vectorised forms below are
tested to agree with the scalar ones, which are the documentation.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & _MASK
    return h


def splitmix64(value: int) -> int:
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def bucket_of(raw_id: str | int, buckets: int) -> int:
    """The row a raw id lands in, for a field with `buckets` hash buckets."""
    h = fnv1a64(raw_id.encode()) if isinstance(raw_id, str) else splitmix64(raw_id & _MASK)
    return h % buckets


def _fnv1a64_strings(arr: pa.Array) -> np.ndarray:
    """FNV-1a over each string of a (large_)string or binary array without nulls, read
    straight from its Arrow buffers."""
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offset_type = np.int64 if large else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=offset_type)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    h = np.full(len(arr), FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(FNV_PRIME)
    width = int(lengths[0]) if len(lengths) else 0
    if len(lengths) and (lengths == width).all():
        # Ids of one width (hex tokens, say): the bytes form an (n, width) matrix.
        columns = np.ascontiguousarray(data[offsets[0] : offsets[-1]].reshape(len(arr), width).T)
        for pos in range(width):
            h ^= columns[pos]
            h *= prime
        return h
    # One pass per byte position, across all strings at once: ids are short, rows many.
    for pos in range(int(lengths.max(initial=0))):
        live = np.flatnonzero(lengths > pos)
        h[live] = (h[live] ^ data[starts[live] + pos]) * prime
    return h


def splitmix64_array(values: np.ndarray) -> np.ndarray:
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash_to_buckets(values: pa.Array, buckets: int) -> np.ndarray:
    """Bucket every element of a null-free string or integer array; returns int64 rows.

    A dictionary-encoded array (Parquet keeps low-cardinality columns so) hashes only its
    distinct strings.
    """
    with np.errstate(over="ignore"):
        if pa.types.is_integer(values.type):
            h = splitmix64_array(values.to_numpy(zero_copy_only=False))
        elif pa.types.is_dictionary(values.type) and not pa.types.is_integer(values.type.value_type):
            distinct = _fnv1a64_strings(values.dictionary)
            h = distinct[values.indices.to_numpy(zero_copy_only=False)]
        elif pa.types.is_dictionary(values.type):
            h = splitmix64_array(values.dictionary_decode().to_numpy(zero_copy_only=False))
        else:
            h = _fnv1a64_strings(values)
    return (h % np.uint64(buckets)).astype(np.int64)
