"""A dynamic field's keyed hash (`hash_seed`): a crafted pair of string ids that shares a
key under the fixed hash gets two keys, and so two rows; the seed travels with the spec
into checkpoints and published versions, where serving decodes with it; a bad seed is
refused by name; and a spec without one keeps the fixed hash, as checkpoints made before
seeds existed were trained with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pytest
from publish_helpers import CheckpointMaker, fresh_target, request
from test_dynamic_serving import dynamic_spec, last_rows, trainer_scores
from test_dynamic_tables import batch_of, item_map, live_keys, make_spec, rows_of, stream

from picasso.batch import pack
from picasso.checkpoint import load_checkpoint
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.serving.publishing.publication import publish
from picasso.kernels.hashing import hash_to_buckets, key_of, keys_of
from picasso.serving.request_decoding import decode_request
from picasso.spec import FeatureSpec, SpecError, parse_spec
from picasso.spec_refs import load_spec
from picasso.trainer import TrainConfig, Trainer

# Two 16-byte strings with one key under the fixed hash (picasso.kernels.hashing).
CRAFTED = ("aaaaaaaabbbbbbbb", "WnSYpkMCpr|VGy6A")
SEED = 0x9E3779B97F4A7C15 ^ 0x0123456789ABCDEF


def with_seed(spec: FeatureSpec, seed: int | None, field: str = "item") -> FeatureSpec:
    """The spec with `field`'s dynamic table keyed by `seed` (None: the fixed hash)."""
    sparse = tuple(dataclasses.replace(f, dynamic=dataclasses.replace(f.dynamic, hash_seed=seed))
                   if f.name == field else f for f in spec.sparse)
    return dataclasses.replace(spec, sparse=sparse)


# -- the hash itself -------------------------------------------------------------------


def test_the_crafted_pair_shares_a_key_and_a_bucket_only_without_a_seed():
    a, b = CRAFTED
    assert key_of(a) == key_of(b)  # what makes the test mean something
    assert hash_to_buckets(pa.array([a, b]), 1000).tolist()[0] == hash_to_buckets(pa.array([b]), 1000)[0]
    assert key_of(a, SEED) != key_of(b, SEED)
    assert len(set(keys_of(pa.array(list(CRAFTED)), SEED).tolist())) == 2


def test_a_seed_keys_strings_and_integers_and_each_seed_its_own_way():
    ids = ["a", "abcdefgh", 0, 12345]
    for seed in (1, SEED):
        keyed = [key_of(v, seed) for v in ids]
        assert all(k != key_of(v) for k, v in zip(keyed, ids))
    assert [key_of(v, 1) for v in ids] != [key_of(v, 2) for v in ids]
    # The integer n and the one-word string of bytes n ^ length would share a key if both
    # were keyed by one word: they do not.
    assert key_of(1 ^ int.from_bytes(b"a", "little"), SEED) != key_of("a", SEED)


def test_keyed_keys_of_agrees_with_key_of_on_every_path():
    same_length = ["abcdefgh", "12345678", CRAFTED[0][:8]]
    mixed = ["", "a", "abcdefghi", "ünïcode", *CRAFTED]
    for values in (same_length, mixed):
        expected = [key_of(v, SEED) for v in values]
        assert keys_of(pa.array(values), SEED).tolist() == expected
        assert keys_of(pa.array(values).dictionary_encode(), SEED).tolist() == expected
        assert keys_of(pa.array(values, pa.large_string()), SEED).tolist() == expected
    integers = np.array([0, 1, 7, 2**63 - 1], dtype=np.int64)
    keyed = keys_of(pa.array(integers), SEED).tolist()
    assert keyed == [key_of(int(v), SEED) for v in integers]
    assert len(set(keyed)) == len(keyed)  # a bijection: integers never share a key
    assert keys_of(pa.array(np.array([2**64 - 1], np.uint64)), SEED).tolist() == [key_of(2**64 - 1, SEED)]


@pytest.mark.parametrize("seed, words", [
    (0, "got 0"),
    (-1, "got -1"),
    (2**64, "got 18446744073709551616"),
    (True, "got True (bool)"),
    (1.5, "got 1.5 (float)"),
    ("secret", "got 'secret' (str)"),
])
def test_a_bad_seed_is_refused_by_the_hash_and_by_the_spec(seed, words):
    for call in (lambda: key_of("a", seed), lambda: keys_of(pa.array(["a"]), seed)):
        with pytest.raises(ValueError, match=r"hash_seed must be an integer in \[1, 2\^64\)") as error:
            call()
        assert words in str(error.value)
    raw = dynamic_spec().to_dict()
    raw["sparse"][-1]["dynamic"]["hash_seed"] = seed
    with pytest.raises(SpecError) as error:
        parse_spec(raw)
    (problem,) = error.value.problems
    assert problem.startswith("sparse field 'item': dynamic: hash_seed must be an integer in [1, 2^64)")
    assert words in problem and "secrets.randbits(64)" in problem


def test_the_spec_carries_the_seed_and_a_spec_without_one_is_written_as_before(tmp_path):
    keyed = with_seed(dynamic_spec(), SEED)
    assert f"hash_seed: {SEED}" in keyed.to_yaml()
    assert parse_spec(keyed.to_dict()) == keyed
    assert "hash_seed" not in dynamic_spec().to_yaml()  # the YAML specs and checkpoints had
    path = tmp_path / "spec.yaml"  # YAML's hex integers are taken too
    text = dynamic_spec().to_yaml().replace("evict_after_steps: 1", f"evict_after_steps: 1\n    hash_seed: {SEED:#x}")
    path.write_text(text)
    assert load_spec(path) == keyed


# -- training --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [None, SEED])
def test_the_crafted_pair_shares_a_row_only_without_a_seed(seed):
    spec = make_spec({"capacity": 8, **({"hash_seed": seed} if seed else {})})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    trainer.train_step(batch_of(spec, [*CRAFTED, *CRAFTED], 1))
    first, second = rows_of(trainer, list(CRAFTED))
    if seed is None:
        assert first == second and set(live_keys(item_map(trainer))) == {key_of(CRAFTED[0])}
    else:
        assert first != second and set(live_keys(item_map(trainer))) == {key_of(v, seed) for v in CRAFTED}


def test_a_checkpoint_keeps_the_seed_and_refuses_a_run_without_it(tmp_path):
    spec = make_spec({"capacity": 40, "hash_seed": SEED})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    batches = stream(spec, batches=4)
    trainer.train(batches)
    assert set(live_keys(item_map(trainer))) <= {key_of(i, SEED) for i in range(200)}  # stream()'s ids, keyed
    path = trainer.save_checkpoint(tmp_path)
    assert load_checkpoint(path).spec.sparse_field("item").dynamic.hash_seed == SEED
    restored = Trainer(spec, TrainConfig(hidden=(8,)))
    restored.restore(path)
    assert live_keys(item_map(restored)) == live_keys(item_map(trainer))
    probe = batch_of(spec, [3, 50, 10**12], 99)  # ids with rows, and one without
    np.testing.assert_array_equal(restored.predict(probe), trainer.predict(probe))
    # Its rows are keyed: a run with another hash would read every id's row wrong.
    for other in (None, SEED + 1):
        with pytest.raises(ValueError, match="trained on another spec"):
            Trainer(with_seed(spec, other), TrainConfig(hidden=(8,))).restore(path)


def test_a_checkpoint_without_a_seed_loads_with_the_fixed_hash(tmp_path):
    # A spec without hash_seed is written exactly as before seeds existed (see above), so
    # this is what such a checkpoint holds: keys by the fixed hash.
    spec = make_spec({"capacity": 40})
    trainer = Trainer(spec, TrainConfig(hidden=(8,)))
    trainer.train(stream(spec, batches=2))
    path = trainer.save_checkpoint(tmp_path)
    assert "hash_seed" not in (Path(path) / "spec.yaml").read_text()
    checkpoint = load_checkpoint(path)
    assert checkpoint.spec == spec and checkpoint.spec.sparse_field("item").dynamic.hash_seed is None
    restored = Trainer(spec, TrainConfig(hidden=(8,)))
    restored.restore(path)
    live = live_keys(item_map(restored))
    assert live and set(live) <= {key_of(i) for i in range(200)}  # stream()'s integer ids, as their own keys


# -- serving ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_version(mlflow_server, tmp_path_factory):
    maker = CheckpointMaker(tmp_path_factory.mktemp("keyed-publish"), spec=with_seed(dynamic_spec(), SEED))
    target = fresh_target(mlflow_server)
    publish(request(maker.next(), 0.7), target)
    return target, maker


def test_serving_a_keyed_version_scores_as_the_trainer(keyed_version, mlflow_server):
    target, maker = keyed_version
    mlflow.set_tracking_uri(mlflow_server)
    model = mlflow.pyfunc.load_model(f"models:/{target.model_name}/1")
    events = last_rows(maker).head(40)
    live = set(live_keys(item_map(maker.trainer)))
    assert any(key_of(item, SEED) in live for item in events["item"])  # rows of their own, by keyed keys
    assert not any(key_of(item) in live for item in events["item"])
    served = np.asarray(model.predict(events), dtype=np.float64)
    np.testing.assert_allclose(served, trainer_scores(maker, events), rtol=1e-6)
    # Decoded with the fixed hash, the same rows would find none of their ids' rows:
    unkeyed = decode_request(RecordDecoder(dynamic_spec(), DecodeOptions(require_label=False)), events, "error")
    fixed_scores = maker.trainer.predict(pack(unkeyed.table, maker.spec, maker.trainer.plan))
    assert not np.allclose(served, fixed_scores, rtol=1e-6)
