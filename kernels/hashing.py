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
  That bound holds for ids that are random with respect to the hash, not for chosen ones.
  The hash is unkeyed and splitmix64 is invertible, so anyone who can choose ids can make
  two share a hash, and a key, at will: 'aaaaaaaabbbbbbbb' and 'WnSYpkMCpr|VGy6A' do.
  Where a collision must not matter, compare the ids themselves: the sample join finds a
  record by hash and then compares the join keys exactly (picasso.sample_join.join_rules.join_ids).

A string "123" and an integer 123 are different ids. The vectorised forms below are
tested to agree with the scalar ones, which are the definition.

- Cross (a feature cross of m fields, the spec's `crosses:`): each field's ids become keys
  (key_of, keyed by the cross's own hash_seed when it is dynamic and has one, else the
  fixed hash, whatever the field itself does). A row's bag of crosses is every
  combination of one id per field, in bag order with the first field outermost, cut to
  the cross's max_len; a row missing any of the fields has none. A combination of keys
  k_1..k_m hashes as
      h = m ^ s (s: 0, or the seed's string word: _KeyWords);  h = splitmix64(h ^ k_i) in turn;
  a hashed cross's row is h modulo its hash_buckets, a dynamic cross's key is h. Keys
  rather than rows: a field's hash buckets (or collisions) do not limit its crosses.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

_MASK = (1 << 64) - 1
_WORD = 8


def splitmix64(value: int) -> int:
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def hash_bytes(data: bytes, start: int = 0) -> int:
    """The string hash of `data`. `start` is XORed into the initial state (the byte
    length): 0 gives the fixed hash; a keyed hash starts from its secret word."""
    padded = data + b"\0" * ((-len(data) % _WORD) or (_WORD if not data else 0))
    h = len(data) ^ start
    for offset in range(0, len(padded), _WORD):
        h = splitmix64(h ^ int.from_bytes(padded[offset : offset + _WORD], "little"))
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


def _hash_strings(arr: pa.Array, start: int = 0) -> np.ndarray:
    """hash_bytes(s, start) of every string s of a null-free string or binary array, from
    its Arrow buffers."""
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
        h = np.full(n, length ^ start, dtype=np.uint64)
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
    h = lengths.astype(np.uint64) ^ np.uint64(start)
    for k in range(matrix.shape[1]):
        live = words > k
        h[live] = splitmix64_array(h[live] ^ matrix[live, k])
    return h


def hash_seed_problem(seed: object) -> str | None:
    """Why `seed` cannot key a dynamic field's hash, or None when it can: an integer in
    [1, 2^64). 0 is refused because it is the placeholder a spec is most likely to carry,
    and a seed anyone can guess keys nothing."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        return f"hash_seed must be an integer in [1, 2^64), got {seed!r} ({type(seed).__name__})"
    if not 0 < seed < 1 << 64:
        return f"hash_seed must be an integer in [1, 2^64), got {seed}"
    return None


@dataclass(frozen=True)
class _KeyWords:
    """A keyed hash's two secret words, both drawn from its seed by splitmix64: where the
    string hash starts, and what an integer id is XORed with before its one mix. Two
    words, not one: with a single word K, the integer n (splitmix64(n ^ K)) and a one-word
    string w of length L (splitmix64(L ^ K ^ w)) would share a key whenever n = L ^ w,
    whatever the seed."""

    strings: int
    integers: int


def _key_words(seed: int | None) -> _KeyWords | None:
    """The words of a seed (None: the fixed hash); ValueError naming a bad seed."""
    if seed is None:
        return None
    if problem := hash_seed_problem(seed):
        raise ValueError(problem)
    return _derived_words(seed)


@functools.lru_cache(maxsize=64)  # row_of keys bag ids one at a time
def _derived_words(seed: int) -> _KeyWords:
    strings = splitmix64(seed)
    return _KeyWords(strings, splitmix64(strings))


def key_words(seed: int | None) -> tuple[int, int] | None:
    """The (strings, integers) words of a seed (_KeyWords), None for the fixed hash: what
    the compiled decoder (picasso.kernels.decode_ids) computes key_of from."""
    words = _key_words(seed)
    return None if words is None else (words.strings, words.integers)


def key_of(raw_id: str | int, seed: int | None = None) -> int:
    """A dynamic field's key of a raw id, as a signed 64-bit integer (its bits unsigned).

    Without a seed (the fixed hash): an integer id is its own key, a string id its
    hash_bytes. With one (the field's `hash_seed`, spec.DynamicTable), both are keyed by
    the seed's secret words (_KeyWords): a string's hash starts from one,
    hash_bytes(s, words.strings), and an integer id n becomes
    splitmix64(n ^ words.integers). Both stay one pass of the same mixes; integers still
    never share a key (splitmix64 is a bijection of 64-bit words), and whoever does not
    know the seed can neither craft two strings with one key nor predict any id's key
    (so neither its row nor its slot in the map's index)."""
    words = _key_words(seed)
    if isinstance(raw_id, str):
        key = hash_bytes(raw_id.encode(), words.strings if words else 0)
    else:
        key = raw_id & _MASK if words is None else splitmix64((raw_id & _MASK) ^ words.integers)
    return key - (1 << 64) if key >= 1 << 63 else key


def cross_start(fields: int, seed: int | None = None) -> int:
    """Where a cross of `fields` fields starts hashing its keys (see the module's docstring)."""
    words = _key_words(seed)
    return fields ^ (words.strings if words else 0)


def cross_hash(keys: list[int], seed: int | None = None) -> int:
    """The 64-bit hash (unsigned) of one combination of a cross's keys, in field order."""
    h = cross_start(len(keys), seed)
    for key in keys:
        h = splitmix64(h ^ (key & _MASK))
    return h


def cross_ids(bags: list[list[str | int]], max_len: int, buckets: int | None = None,
              seed: int | None = None) -> list[int]:
    """A row's bag of crosses, from each field's bag of raw ids (the definition): rows in
    [0, buckets) for a hashed cross, signed 64-bit keys for a dynamic one (buckets None)."""
    out = []
    for combination in itertools.islice(itertools.product(*bags), max_len):
        h = cross_hash([key_of(raw_id, seed) for raw_id in combination], seed)
        out.append(h % buckets if buckets is not None else h - (1 << 64) if h >= 1 << 63 else h)
    return out


def _hashed(values: pa.Array, integers, start: int = 0) -> np.ndarray:
    """uint64 per element of a null-free string or integer array: `integers` of the
    integer values, or the strings' hash (from `start`: hash_bytes). A dictionary-encoded
    string array (Parquet keeps low-cardinality columns so) hashes only its distinct
    strings."""
    if pa.types.is_dictionary(values.type):
        if pa.types.is_integer(values.type.value_type):
            values = values.dictionary_decode()
        else:
            return _hash_strings(values.dictionary, start)[values.indices.to_numpy(zero_copy_only=False)]
    if pa.types.is_integer(values.type):
        return integers(values.to_numpy(zero_copy_only=False))
    return _hash_strings(values, start)


def hash_to_buckets(values: pa.Array, buckets: int) -> np.ndarray:
    """Bucket every element of a null-free string or integer array; returns int64 rows."""
    return (_hashed(values, splitmix64_array) % np.uint64(buckets)).astype(np.int64)


def keys_of(values: pa.Array, seed: int | None = None) -> np.ndarray:
    """key_of(v, seed) of every element v of a null-free string or integer array
    (integers in [0, 2^64)), as int64."""
    words = _key_words(seed)
    if words is None:
        return _hashed(values, lambda ints: ints.astype(np.uint64)).view(np.int64)
    mask = np.uint64(words.integers)
    return _hashed(values, lambda ints: splitmix64_array(ints.astype(np.uint64) ^ mask), words.strings).view(np.int64)
