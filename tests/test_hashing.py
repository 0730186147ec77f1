"""The fixed id hash: pinned reference values, and the vectorised form agrees with the
scalar one (which is the documentation) for every kind of id."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from picasso.kernels.hashing import bucket_of, hash_bytes, hash_to_buckets, splitmix64

# -- pinned values: changing any of these re-maps every trained embedding row ----------


def _word(chunk: bytes) -> int:
    return int.from_bytes(chunk.ljust(8, b"\0"), "little")


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0xE220A8397B1DCDAF),  # one zero word: splitmix64(0)
        (b"a", 0x6232969000262121),
        (b"68fd1e64", 0x9CB6CEB10933FAEA),  # a Criteo-like token: exactly one word
        (b"foobar123", 0x921AF4F86005EC90),  # two words
    ],
)
def test_string_hash_reference_values(data, expected):
    assert hash_bytes(data) == expected


def test_string_hash_follows_its_definition():
    # h = byte length; then h = splitmix64(h ^ word) for each zero-padded 8-byte word.
    assert hash_bytes(b"a") == splitmix64(1 ^ _word(b"a"))
    assert hash_bytes(b"foobar123") == splitmix64(splitmix64(9 ^ _word(b"foobar12")) ^ _word(b"3"))
    # The length is mixed in, so zero padding cannot make two ids equal.
    assert hash_bytes(b"a") != hash_bytes(b"a\0")
    assert hash_bytes(b"") != hash_bytes(b"\0")


@pytest.mark.parametrize(
    "value, expected",
    [
        (0, 0xE220A8397B1DCDAF),  # splitmix64's first output from state 0
        (1, 0x910A2DEC89025CC1),  # ... and from state 1
    ],
)
def test_splitmix64_reference_values(value, expected):
    assert splitmix64(value) == expected


def test_bucket_of_pinned_values():
    assert bucket_of("", 1 << 62) == 0xE220A8397B1DCDAF % (1 << 62)
    assert bucket_of("a", 1000) == 0x6232969000262121 % 1000
    assert bucket_of(0, 1000) == 0xE220A8397B1DCDAF % 1000
    assert bucket_of(-1, 97) == splitmix64((1 << 64) - 1) % 97  # negatives wrap as unsigned 64-bit


def test_string_and_integer_ids_differ():
    # "123" and 123 are different ids: the string's bytes are hashed, the integer mixed.
    assert bucket_of("123", 1 << 40) != bucket_of(123, 1 << 40)
    assert hash_to_buckets(pa.array(["123"]), 1 << 40)[0] != hash_to_buckets(pa.array([123]), 1 << 40)[0]


def test_unicode_strings_hash_their_utf8_bytes():
    assert bucket_of("é", 1 << 62) == hash_bytes("é".encode("utf-8")) % (1 << 62)
    assert hash_bytes("é".encode("utf-8")) != hash_bytes("é".encode("latin-1"))


# -- vectorised == scalar -----------------------------------------------------------------

STRINGS = [
    "",
    "a",
    "b",
    "foobar",
    "68fd1e64",
    "é",
    "naïve café",
    "日本語のトークン",
    "🙂🙃",
    "\x00",
    "tab\tnew\nline",
    "x" * 1000,
    "y" * 37,
    "a",  # repeated ids
    "",
]

BUCKETS = [1, 2, 7, 1000, 2**31 - 1, 2**40 + 3, 1 << 62]


@pytest.mark.parametrize("buckets", BUCKETS)
def test_vectorised_strings_match_scalar(buckets):
    rows = hash_to_buckets(pa.array(STRINGS), buckets)
    assert rows.dtype == np.int64
    assert rows.tolist() == [bucket_of(s, buckets) for s in STRINGS]
    assert ((rows >= 0) & (rows < buckets)).all()


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string()])
def test_vectorised_strings_match_scalar_for_string_types(arrow_type):
    rows = hash_to_buckets(pa.array(STRINGS, arrow_type), 1009)
    assert rows.tolist() == [bucket_of(s, 1009) for s in STRINGS]


def test_vectorised_strings_of_a_sliced_array():
    array = pa.array(STRINGS)
    for start in (1, 5, 11):
        rows = hash_to_buckets(array.slice(start, 3), 1 << 50)
        assert rows.tolist() == [bucket_of(s, 1 << 50) for s in STRINGS[start : start + 3]]


def test_vectorised_strings_only_empty():
    assert hash_to_buckets(pa.array(["", ""]), 1000).tolist() == [bucket_of("", 1000)] * 2


def test_vectorised_random_strings_match_scalar():
    rng = np.random.default_rng(7)
    alphabet = list("abcdefghijklmnopqrstuvwxyz0123456789äß漢字🙂")
    strings = ["".join(rng.choice(alphabet, int(rng.integers(0, 40)))) for _ in range(500)]
    rows = hash_to_buckets(pa.array(strings), 99_991)
    assert rows.tolist() == [bucket_of(s, 99_991) for s in strings]


def test_vectorised_empty_array():
    assert hash_to_buckets(pa.array([], pa.string()), 10).tolist() == []
    assert hash_to_buckets(pa.array([], pa.int64()), 10).tolist() == []


INTS = [0, 1, -1, 2, 42, -42, 123456789, 2**31 - 1, -(2**31), 2**32, 2**53 + 1, 2**63 - 1, -(2**63)]


@pytest.mark.parametrize("buckets", BUCKETS)
def test_vectorised_int64_match_scalar(buckets):
    rows = hash_to_buckets(pa.array(INTS, pa.int64()), buckets)
    assert rows.dtype == np.int64
    assert rows.tolist() == [bucket_of(v, buckets) for v in INTS]
    assert ((rows >= 0) & (rows < buckets)).all()


@pytest.mark.parametrize(
    "arrow_type, values",
    [
        (pa.int8(), [-128, -1, 0, 1, 127]),
        (pa.int16(), [-32768, -5, 0, 300, 32767]),
        (pa.int32(), [-(2**31), -7, 0, 7, 2**31 - 1]),
        (pa.uint8(), [0, 1, 255]),
        (pa.uint32(), [0, 2**32 - 1]),
        (pa.uint64(), [0, 2**63, 2**64 - 1]),
    ],
)
def test_vectorised_narrow_and_unsigned_ints_match_scalar(arrow_type, values):
    rows = hash_to_buckets(pa.array(values, arrow_type), 10_007)
    assert rows.tolist() == [bucket_of(v, 10_007) for v in values]


def test_vectorised_random_ints_match_scalar():
    rng = np.random.default_rng(3)
    values = rng.integers(-(2**63), 2**63 - 1, 2000, dtype=np.int64)
    rows = hash_to_buckets(pa.array(values), 65_537)
    assert rows.tolist() == [bucket_of(int(v), 65_537) for v in values]


def test_buckets_spread():
    # not a constant or a tiny range: 5000 distinct ids over 100 buckets touch almost all
    strings = hash_to_buckets(pa.array([f"id{i}" for i in range(5000)]), 100)
    ints = hash_to_buckets(pa.array(np.arange(5000)), 100)
    assert len(set(strings.tolist())) >= 95
    assert len(set(ints.tolist())) >= 95


def test_vectorised_dictionary_encoded_strings_match_scalar():
    encoded = pa.array(STRINGS).dictionary_encode()
    assert hash_to_buckets(encoded, 1009).tolist() == [bucket_of(s, 1009) for s in STRINGS]
    for start, length in ((1, 4), (9, 6)):
        rows = hash_to_buckets(encoded.slice(start, length), 1 << 50)
        assert rows.tolist() == [bucket_of(s, 1 << 50) for s in STRINGS[start : start + length]]

