"""A dynamic table in the spec, the packing plan and the decoders: settings checked by
name, ids decoded to 64-bit keys on every path, bad ids refused with the reason."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import yaml

from picasso.batch import pack
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.kernels.hashing import key_of, keys_of
from picasso.packing import PackingPlan
from picasso.spec import DynamicTable, SpecError, parse_spec


def spec_with(dynamic, **field) -> dict:
    return {"label": "y", "sparse": [{"name": "item", "embedding_dim": 16, "dynamic": dynamic, **field},
                                     {"name": "c", "embedding_dim": 16, "hash_buckets": 10}]}


def problems(raw) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(raw)
    return caught.value.problems


def test_a_dynamic_field_parses_with_defaults_and_round_trips():
    spec = parse_spec(spec_with({"capacity": 1000}))
    item = spec.sparse_field("item")
    assert item.dynamic == DynamicTable(capacity=1000)
    assert item.num_rows == 1001  # the capacity and the default row
    assert item.takes_strings and not item.hashed
    assert spec.dynamic_fields == [item]
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec
    assert spec.to_dict()["sparse"][0]["dynamic"] == {"capacity": 1000}


def test_eviction_in_event_time_reads_a_duration_and_round_trips():
    spec = parse_spec(spec_with({"capacity": 100, "evict_after": "1d12h"}))
    table = spec.sparse_field("item").dynamic
    assert table.evicts_by_event_time and table.evict_after_ms == 36 * 3_600_000 and table.evict_after_steps is None
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec
    assert not parse_spec(spec_with({"capacity": 100, "evict_after_steps": 4})).sparse_field("item").dynamic \
        .evicts_by_event_time


def test_a_capacity_in_bytes_counts_rows_of_row_values():
    spec = parse_spec(spec_with({"capacity": "1MiB", "admit_after": 3, "evict_after_steps": 50,
                                 "when_full": "refuse", "keep_rows": 10}))
    assert spec.sparse_field("item").dynamic == DynamicTable(capacity=2**20 // 64, admit_after=3,
                                                             evict_after_steps=50, when_full="refuse", keep_rows=10)


@pytest.mark.parametrize("dynamic, words", [
    ({"capacity": 0}, "capacity must be a positive number of rows"),
    ({"capacity": "12 apples"}, "got '12 apples'"),
    ({"capacity": "1b"}, "capacity must be"),  # less than one row
    ({"capacity": True}, "capacity must be"),
    ({}, "capacity must be"),
    ({"capacity": 10, "admit_after": 0}, "admit_after must be a positive integer"),
    ({"capacity": 10, "keep_rows": -1}, "keep_rows must be an integer >= 0"),
    ({"capacity": 10, "keep_rows": 11}, "keep_rows 11 is more than the capacity of 10 rows"),
    ({"capacity": 10, "evict_after_steps": 0}, "evict_after_steps must be a positive integer"),
    ({"capacity": 10, "evict_after": "7"}, "evict_after: duration '7' has no unit"),
    ({"capacity": 10, "evict_after": 7}, "evict_after: expected a duration with a unit"),
    ({"capacity": 10, "evict_after": "0h"}, "evict_after must be a positive duration"),
    ({"capacity": 10, "evict_after": "1d", "evict_after_steps": 5}, "evict_after_steps (steps) or evict_after"),
    ({"capacity": 10, "when_full": "random"}, "when_full must be one of ('lfu', 'refuse')"),
    ({"capacity": 10, "expire": 5}, "unknown key 'expire'"),
    (5, "dynamic must be a mapping"),
])
def test_bad_dynamic_settings_name_the_field(dynamic, words):
    found = problems(spec_with(dynamic))
    assert len(found) == 1 and found[0].startswith("sparse field 'item': dynamic") and words in found[0], found


def test_dynamic_and_a_fixed_vocabulary_together_are_refused():
    found = problems(spec_with({"capacity": 10}, hash_buckets=10))
    assert found == ["sparse field 'item': needs exactly one of 'hash_buckets', 'vocab_size' or 'dynamic'"]


def test_packing_leaves_dynamic_ids_as_keys_and_offsets_the_fixed_ones():
    spec = parse_spec(spec_with({"capacity": 5}))
    plan = PackingPlan.from_spec(spec)
    (group,) = plan.groups  # one dim: a group of a dynamic and a fixed field
    assert group.fields == ("item", "c") and group.dynamic == (True, False)
    assert group.row_offsets == (0, 6) and group.id_offsets == (0, 6) and group.num_rows == 16
    keys = [key_of("x"), 2**40]
    table = pa.table({"label": pa.array([1.0, 0.0], pa.float32()),
                      "item": pa.array([[keys[0]], [keys[1]]]), "c": pa.array([[3], [9]])})
    ids = pack(table, spec, plan).to_torch().ids[group.name].tolist()
    assert ids == [keys[0], 6 + 3, keys[1], 6 + 9]


RAW = [{"y": 1, "item": "abc", "c": "x"}, {"y": 0, "item": 12345, "c": 3}, {"y": 0, "item": 2**64 - 1, "c": 3}]
KEYS = [key_of("abc"), 12345, -1]  # the unsigned id 2^64 - 1 is the int64 key -1


def test_dynamic_ids_decode_to_their_keys_on_every_path():
    spec = parse_spec(spec_with({"capacity": 5}))
    decoder = RecordDecoder(spec, DecodeOptions())
    from_json = decoder.decode_json([json.dumps(r).encode() for r in RAW], "s")
    assert from_json.dead_letters == []
    assert [bag for bag in from_json.table.column("item").to_pylist()] == [[k] for k in KEYS]
    # One Arrow type per column (the plain fast path), one id each:
    strings = decoder.decode_table(pa.table({"y": [1, 0], "item": ["abc", "zz"], "c": ["x", "y"]}), "s")
    assert strings.table.column("item").to_pylist() == [[key_of("abc")], [key_of("zz")]]
    integers = decoder.decode_table(pa.table({"y": [1, 0], "item": pa.array([5, 2**64 - 1], pa.uint64()),
                                              "c": ["x", "y"]}), "s")
    assert integers.table.column("item").to_pylist() == [[5], [-1]]
    # Bags, and a TSV line:
    bags = parse_spec(spec_with({"capacity": 5}, max_len=3))
    decoded = RecordDecoder(bags).decode_json([json.dumps({"y": 1, "item": ["abc", 7], "c": 1}).encode()], "s")
    assert decoded.table.column("item").to_pylist() == [[key_of("abc"), 7]]
    tsv = RecordDecoder(spec).decode_tsv(["1\tabc\tx"], "s")
    assert tsv.table.column("item").to_pylist() == [[key_of("abc")]]


def test_keys_of_agrees_with_key_of():
    values = ["", "a", "abcdefgh", "abcdefghi", "ünïcode"]
    assert keys_of(pa.array(values)).tolist() == [key_of(v) for v in values]
    assert keys_of(pa.array(values).dictionary_encode()).tolist() == [key_of(v) for v in values]
    integers = np.array([0, 1, 2**63 - 1], dtype=np.int64)
    assert keys_of(pa.array(integers)).tolist() == integers.tolist()  # integer ids are their own keys


@pytest.mark.parametrize("value, reason", [
    (-5, "integer id -5 is outside [0, 2^64) (dynamic ids are unsigned 64-bit)"),
    (2**64, "integer id 18446744073709551616 is outside [0, 2^64)"),
    (1.5, "expected integer or string ids, got float 1.5"),
    (True, "expected integer or string ids, got"),
    ({"id": 1}, "expected integer or string ids, got"),
])
def test_bad_dynamic_ids_become_dead_letters_with_the_reason(value, reason):
    spec = parse_spec(spec_with({"capacity": 5}))
    records = [json.dumps({"y": 1, "item": value, "c": 1}).encode(), json.dumps({"y": 0, "item": 4, "c": 1}).encode()]
    decoded = RecordDecoder(spec).decode_json(records, "s")
    assert decoded.table.column("item").to_pylist() == [[4]]  # the good row goes on
    (letter,) = decoded.dead_letters
    assert letter.reason.startswith("field 'item': ") and reason in letter.reason, letter.reason
