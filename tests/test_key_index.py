"""KeyIndex: the kernel's open-addressing table against the dict it replaces, call for call."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picasso import kernels
from picasso.key_index import KeyIndex, _DictIndex, _TableIndex
from picasso.kernels.id_map_reference import EMPTY_KEY

# Few distinct keys, so that calls repeat, re-add and remove the same ones; EMPTY_KEY (the
# table's empty mark) and the extremes among them.
KEYS = st.sampled_from([0, 1, -1, 7, 2**62, EMPTY_KEY, 2**63 - 1, *range(100, 140)])
CALLS = st.lists(st.tuples(st.sampled_from(["get", "add", "assign", "remove"]),
                           st.lists(KEYS, max_size=12)), max_size=40)


def both() -> tuple[KeyIndex, KeyIndex]:
    return _TableIndex(kernels.host_backend().key_index), _DictIndex()


@settings(max_examples=150, deadline=None)
@given(CALLS)
def test_the_table_answers_every_call_as_the_dict_does(calls):
    table, reference = both()
    for step, (name, keys) in enumerate(calls):
        keys = np.array(keys, np.int64)
        values = np.arange(len(keys), dtype=np.int64) + 1000 * step
        outcomes = []
        for index in (table, reference):
            try:
                outcome = getattr(index, name)(keys, *(() if name in ("get", "remove") else (values,)))
            except KeyError:
                outcome = "KeyError"
            outcomes.append(outcome)
        if isinstance(outcomes[0], np.ndarray):
            assert np.array_equal(outcomes[0], outcomes[1]), (name, keys, outcomes)
        else:
            assert outcomes[0] == outcomes[1], (name, keys, outcomes)
        if any(isinstance(outcome, str) for outcome in outcomes):  # a failed call may have done part of its work: start over alike
            table, reference = both()
        assert len(table) == len(reference)
    everything = np.array([0, 1, -1, 7, 2**62, EMPTY_KEY, 2**63 - 1, *range(100, 140)], np.int64)
    assert np.array_equal(table.get(everything), reference.get(everything))


def test_it_grows_past_a_million_keys_and_shrinks_when_emptied():
    index = _TableIndex(kernels.host_backend().key_index)
    keys = np.random.default_rng(0).integers(0, 2**64, 1_200_000, dtype=np.uint64)  # the join's hashes
    keys = np.unique(keys)
    held = index.add(keys, np.arange(len(keys)))
    assert not held.any() and len(index) == len(keys)
    assert 2 * len(keys) <= index.nbytes // 16 < 4 * 2 * len(keys)  # at most half full, 16 bytes a slot
    assert np.array_equal(index.get(keys), np.arange(len(keys)))
    assert index.add(keys[:5], np.zeros(5, np.int64)).all()  # held already: values stay
    assert np.array_equal(index.get(keys[:5]), np.arange(5))
    index.remove(keys[: len(keys) - 10])
    assert len(index) == 10 and index.nbytes < 1 << 20
    assert np.array_equal(index.get(keys[-10:]), np.arange(len(keys) - 10, len(keys)))
    assert (index.get(keys[:100]) == -1).all()


def test_a_copy_answers_as_the_original_and_changes_alone():
    for index in both():
        index.add(np.array([1, 2]), np.array([10, 20]))
        copy = pickle.loads(pickle.dumps(index))
        copy.add(np.array([3]), np.array([30]))
        assert copy.get(np.array([1, 2, 3])).tolist() == [10, 20, 30]
        assert index.get(np.array([1, 2, 3])).tolist() == [10, 20, -1]


def test_a_key_not_held_is_a_key_error_naming_it():
    for index in both():
        index.add(np.array([5]), np.array([50]))
        with pytest.raises(KeyError, match="key 6 is not held"):
            index.remove(np.array([6]))
        with pytest.raises(KeyError, match="key 8 is not held"):
            index.assign(np.array([8]), np.array([1]))
        assert index.get(np.array([5, 6])).tolist() == [50, -1]


def test_without_the_cpp_kernels_the_index_is_the_dict(monkeypatch):
    monkeypatch.setenv("PICASSO_KERNELS", "reference")
    assert isinstance(KeyIndex.new(), _DictIndex)
    monkeypatch.delenv("PICASSO_KERNELS")
    assert isinstance(KeyIndex.new(), _TableIndex)
