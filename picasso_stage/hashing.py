"""The fixed id hash. Training, serving and every decoder use these functions, so a raw id
maps to the same embedding row everywhere and in every version.

- Integer ids: splitmix64(id as an unsigned 64-bit integer), the splitmix64 finaliser.
- String ids: their UTF-8 bytes, zero-padded to a whole number of 8-byte words (at least
  one), read as little-endian uint64 words w_0..w_k; then
      h = byte length;  h = splitmix64(h ^ w_i) for each word in turn.
  Word at a time rather than byte at a time (FNV, say), because ids are short and rows
  many: an 8-byte id costs one mix, and whole columns hash with a few numpy passes.
- Bucket: the 64-bit hash modulo the field's hash_buckets.
- Key (a dynamic field's, picasso.dynamic_rows): an integer id is its own key (as an
  unsigned 64-bit integer); a string id is its 64-bit hash. Integer ids therefore never
  share a key. Two distinct strings, or a string and an integer, share one with
  probability 2^-64 a pair: among n distinct string ids the chance that any two share a
  key is at most n^2 / 2^65 (about 3e-8 at a million ids, 3e-4 at a hundred million).

A string "123" and an integer 123 are different ids. The vectorised forms below are
tested to agree with the scalar ones, which are the definition.

hash_many buckets many id columns in few calls of hash_to_buckets. Each call has a fixed
cost of a dozen numpy passes, which for a poll of 1,000 JSON events is most of the work:
one call per sparse field cost about 1 µs per event for Criteo's 26 fields. The columns
are concatenated and hashed once, modulo a common multiple L of their bucket counts;
since (h mod L) mod b == h mod b whenever b divides L, reducing each field's part modulo
its own bucket count gives exactly the rows of one call per field. Long columns (a table
of many Arrow messages) gain nothing from that and would pay for the copy and the second
modulo, so they keep one call each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_MASK = (1 << 64) - 1
_WORD = 8
# hash_to_buckets returns int64 rows: a common multiple must stay below 2**63.
_LARGEST_MULTIPLE = 2**62
# Ids per combined call of hash_many: past this, a call's fixed cost is small next to its work.
_COMBINE_UP_TO = 1 << 16


def splitmix64(value: int) -> int:
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def hash_bytes(data: bytes) -> int:
    padded = data + b"\0" * ((-len(data) % _WORD) or (_WORD if not data else 0))
    h = len(data)
    for start in range(0, len(padded), _WORD):
        h = splitmix64(h ^ int.from_bytes(padded[start : start + _WORD], "little"))
    return h


def bucket_of(raw_id: str | int, buckets: int) -> int:
    """The row a raw id lands in, for a field with `buckets` hash buckets."""
    h = hash_bytes(raw_id.encode()) if isinstance(raw_id, str) else splitmix64(raw_id & _MASK)
    return h % buckets


def splitmix64_array(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def _hash_strings(arr: pa.Array) -> np.ndarray:
    """Hash every string of a null-free string or binary array, from its Arrow buffers."""
    if len(arr) == 0:
        return np.zeros(0, dtype=np.uint64)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] is not None else np.zeros(8, np.uint8)
    n = len(arr)
    lengths = np.diff(offsets)
    length = int(lengths[0])
    if (lengths == length).all():
        # Ids of one length (hex tokens, say): the bytes already form an (n, length) matrix.
        block = data[offsets[0] : offsets[-1]].reshape(n, length)
        width = max(_WORD, -(-length // _WORD) * _WORD)
        if width != length:
            block = np.concatenate([block, np.zeros((n, width - length), np.uint8)], axis=1)
        matrix = np.ascontiguousarray(block).view(np.uint64)
        h = np.full(n, length, dtype=np.uint64)
        for k in range(matrix.shape[1]):
            h = splitmix64_array(h ^ matrix[:, k])
        return h
    # Mixed lengths: zero-padded rows of the longest one's width; each string stops
    # mixing after its own last word.
    words = np.maximum(1, -(-lengths // _WORD))
    columns = np.arange(int(words.max()) * _WORD)
    index = np.minimum(offsets[:-1, None].astype(np.int64) + columns, max(len(data) - 1, 0))
    padded = np.where(columns < lengths[:, None], data[index], 0).astype(np.uint8)
    matrix = padded.view(np.uint64)
    h = lengths.astype(np.uint64)
    for k in range(matrix.shape[1]):
        live = words > k
        h[live] = splitmix64_array(h[live] ^ matrix[live, k])
    return h


def key_of(raw_id: str | int) -> int:
    """A dynamic field's key of a raw id, as a signed 64-bit integer (its bits unsigned)."""
    key = hash_bytes(raw_id.encode()) if isinstance(raw_id, str) else raw_id & _MASK
    return key - (1 << 64) if key >= 1 << 63 else key


def _hashed(values: pa.Array, integers) -> np.ndarray:
    """uint64 per element of a null-free string or integer array: `integers` of the
    integer values, or the strings' hash. A dictionary-encoded string array (Parquet keeps
    low-cardinality columns so) hashes only its distinct strings."""
    if pa.types.is_dictionary(values.type):
        if pa.types.is_integer(values.type.value_type):
            values = values.dictionary_decode()
        else:
            return _hash_strings(values.dictionary)[values.indices.to_numpy(zero_copy_only=False)]
    if pa.types.is_integer(values.type):
        return integers(values.to_numpy(zero_copy_only=False))
    return _hash_strings(values)


def hash_to_buckets(values: pa.Array, buckets: int) -> np.ndarray:
    """Bucket every element of a null-free string or integer array; returns int64 rows."""
    return (_hashed(values, splitmix64_array) % np.uint64(buckets)).astype(np.int64)


def keys_of(values: pa.Array) -> np.ndarray:
    """key_of every element of a null-free string or integer array (integers in
    [0, 2^64)), as int64."""
    return _hashed(values, lambda ints: ints.astype(np.uint64)).view(np.int64)


def hash_many(arrays: Sequence[pa.Array], buckets: Sequence[int]) -> list[np.ndarray]:
    """hash_to_buckets(arrays[i], buckets[i]) for every i. The arrays are null-free and
    share one Arrow type."""
    out: list[np.ndarray] = []
    per_group = max(1, _COMBINE_UP_TO // max(1, max(map(len, arrays), default=1)))
    for group in _groups(buckets, per_group):
        combined = pa.concat_arrays([arrays[i] for i in group]) if len(group) > 1 else arrays[group[0]]
        multiple = math.lcm(*(buckets[i] for i in group))
        rows = hash_to_buckets(combined, multiple)
        if len(group) == 1:
            out.append(rows)
            continue
        # Each part modulo its own bucket count, in one numpy pass.
        lengths = [len(arrays[i]) for i in group]
        rows %= np.repeat(np.array([buckets[i] for i in group], dtype=np.int64), lengths)
        out += np.split(rows, np.cumsum(lengths)[:-1])
    return out


def _groups(buckets: Sequence[int], most: int) -> list[list[int]]:
    """Runs of at most `most` consecutive fields whose bucket counts have a common
    multiple below the limit."""
    groups: list[list[int]] = []
    multiple = _LARGEST_MULTIPLE + 1
    for i, b in enumerate(buckets):
        candidate = math.lcm(multiple, b) if groups else _LARGEST_MULTIPLE + 1
        if groups and candidate <= _LARGEST_MULTIPLE and len(groups[-1]) < most:
            groups[-1].append(i)
            multiple = candidate
        else:
            groups.append([i])
            multiple = b
    return groups
