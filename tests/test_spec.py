"""FeatureSpec: validation names the culprit field, YAML round trips, built-ins, packing plan."""

from __future__ import annotations

import copy

import pytest
import yaml

from picasso.builtin_specs import CRITEO_DENSE, CRITEO_SPARSE, MAX_SCALED_FIELDS
from picasso.packing import PackingPlan
from picasso.spec import DenseField, FeatureSpec, SparseField, SpecError, parse_spec
from picasso.spec_refs import load_spec

from helpers import small_spec

VALID = {
    "name": "valid",
    "label": "click",
    "dense": ["age", {"name": "count", "transform": "log1p"}],
    "sparse": [
        {"name": "user", "embedding_dim": 8, "hash_buckets": 1000},
        {"name": "country", "embedding_dim": 4, "vocab_size": 200},
        {"name": "recent", "embedding_dim": 8, "hash_buckets": 500, "max_len": 5, "pooling": "mean"},
    ],
}


def _apply(entry: dict, changes: dict) -> None:
    for key, value in changes.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value


def spec_with(**changes) -> dict:
    """A deep copy of VALID with top-level keys replaced (None deletes the key)."""
    raw = copy.deepcopy(VALID)
    _apply(raw, changes)
    return raw


def sparse_with(index: int, **changes) -> dict:
    """VALID with sparse field #index changed (None deletes the key)."""
    raw = copy.deepcopy(VALID)
    _apply(raw["sparse"][index], changes)
    return raw


def problems_of(raw) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    err = info.value
    assert isinstance(err, ValueError)  # callers may catch either
    assert err.problems, "a SpecError must list its problems"
    for problem in err.problems:  # every problem appears in the message itself
        assert problem in str(err)
    return err.problems


def only_problem(raw) -> str:
    problems = problems_of(raw)
    assert len(problems) == 1, problems
    return problems[0]


# -- a valid spec -------------------------------------------------------------------------


def test_valid_spec_parses_with_defaults():
    spec = parse_spec(VALID)
    assert spec.name == "valid"
    assert spec.label == "click"
    assert spec.dense == (DenseField("age"), DenseField("count", transform="log1p"))
    assert spec.dense_names == ["age", "count"]
    assert spec.sparse_names == ["user", "country", "recent"]
    user, country, recent = spec.sparse
    assert user == SparseField("user", embedding_dim=8, hash_buckets=1000)
    assert user.pooling == "sum" and user.max_len == 1 and user.group is None
    assert user.hashed and not user.multi_hot and user.num_rows == 1000
    assert not country.hashed and country.num_rows == 200
    assert recent.multi_hot and recent.pooling == "mean"
    assert spec.sparse_field("country") is country
    with pytest.raises(KeyError):
        spec.sparse_field("nope")


# -- each mistake names its field ---------------------------------------------------------


def test_unknown_top_level_key():
    problem = only_problem(spec_with(sparse_feilds=[]))
    assert "unknown key 'sparse_feilds'" in problem
    assert problem.startswith("spec")


def test_unknown_key_in_sparse_field_names_the_field():
    problem = only_problem(sparse_with(1, buckets=7))
    assert "'country'" in problem and "unknown key 'buckets'" in problem


def test_unknown_key_in_dense_field_names_the_field():
    raw = spec_with(dense=[{"name": "age", "scale": 2.0}])
    problem = only_problem(raw)
    assert "'age'" in problem and "unknown key 'scale'" in problem


def test_bad_dense_transform_names_the_field():
    problem = only_problem(spec_with(dense=[{"name": "age", "transform": "sqrt"}]))
    assert "'age'" in problem and "transform" in problem and "sqrt" in problem


@pytest.mark.parametrize("label", [None, "", 3])
def test_missing_label(label):
    raw = spec_with(label=None)
    if label is not None:
        raw["label"] = label
    problem = only_problem(raw)
    assert "label" in problem


@pytest.mark.parametrize(
    "dense, sparse_name, duplicate",
    [
        (["age", "age"], "user", "age"),  # two dense fields
        (["age"], "age", "age"),  # a dense and a sparse field
        (["click"], "user", "click"),  # the label and a dense field
        ([], "click", "click"),  # the label and a sparse field
    ],
)
def test_duplicate_names(dense, sparse_name, duplicate):
    raw = spec_with(dense=dense)
    raw["sparse"][0]["name"] = sparse_name
    problem = only_problem(raw)
    assert f"'{duplicate}'" in problem and "duplicate" in problem


def test_two_sparse_fields_with_the_same_name():
    raw = copy.deepcopy(VALID)
    raw["sparse"][2]["name"] = "user"
    problem = only_problem(raw)
    assert "'user'" in problem and "duplicate" in problem


@pytest.mark.parametrize("key", ["embedding_dim", "hash_buckets", "max_len"])
@pytest.mark.parametrize("value", [0, -3, 2.5, "8", True])
def test_non_positive_or_non_integer_sizes(key, value):
    problem = only_problem(sparse_with(0, **{key: value}))
    assert "'user'" in problem and key in problem and repr(value) in problem


@pytest.mark.parametrize("value", [0, -1, 1.0])
def test_non_positive_vocab_size(value):
    problem = only_problem(sparse_with(1, vocab_size=value))
    assert "'country'" in problem and "vocab_size" in problem


def test_missing_embedding_dim():
    problem = only_problem(sparse_with(0, embedding_dim=None))
    assert "'user'" in problem and "embedding_dim" in problem


@pytest.mark.parametrize("pooling", ["max", "SUM", "", 1])
def test_bad_pooling_mode(pooling):
    problem = only_problem(sparse_with(2, pooling=pooling))
    assert "'recent'" in problem and "pooling" in problem and repr(pooling) in problem


def test_neither_hash_buckets_nor_vocab_size():
    problem = only_problem(sparse_with(0, hash_buckets=None))
    assert "'user'" in problem and "hash_buckets" in problem and "vocab_size" in problem


def test_both_hash_buckets_and_vocab_size():
    problem = only_problem(sparse_with(0, vocab_size=10))
    assert "'user'" in problem and "hash_buckets" in problem and "vocab_size" in problem


def test_group_must_be_an_identifier():
    problem = only_problem(sparse_with(0, group="not an identifier"))
    assert "'user'" in problem and "group" in problem


def test_sparse_field_without_a_name():
    problem = only_problem(spec_with(sparse=VALID["sparse"] + [{"embedding_dim": 4, "hash_buckets": 3}]))
    assert "sparse field #3" in problem and "name" in problem


def test_dense_field_without_a_name():
    problem = only_problem(spec_with(dense=["age", {"transform": "log1p"}]))
    assert "dense field #1" in problem and "name" in problem


def test_no_sparse_fields():
    problem = only_problem(spec_with(sparse=[]))
    assert "sparse" in problem


@pytest.mark.parametrize("raw", [[], "criteo", 3, None])
def test_spec_must_be_a_mapping(raw):
    assert "mapping" in only_problem(raw)


def test_every_problem_is_reported_at_once():
    raw = {
        "label": "click",
        "colour": "blue",  # unknown top-level key
        "dense": ["age", {"name": "age"}],  # duplicate
        "sparse": [
            {"name": "user", "embedding_dim": 0, "hash_buckets": 10},  # bad dim
            {"name": "item", "embedding_dim": 8},  # no vocabulary
            {"name": "tags", "embedding_dim": 8, "vocab_size": 5, "pooling": "max"},  # bad pooling
            {"name": "geo", "embedding_dim": 8, "hash_buckets": -1, "colour": 1},  # two problems
        ],
    }
    problems = problems_of(raw)
    text = "\n".join(problems)
    for expected in ("colour", "'age'", "'user'", "'item'", "'tags'", "'geo'"):
        assert expected in text, f"{expected} missing from {problems}"
    assert len(problems) >= 7
    geo = [p for p in problems if "'geo'" in p]
    assert any("hash_buckets" in p for p in geo) and any("colour" in p for p in geo)


# -- YAML ---------------------------------------------------------------------------------


def full_spec() -> FeatureSpec:
    return parse_spec(
        {
            "name": "round-trip",
            "label": "clicked",
            "dense": ["a", {"name": "b", "transform": "log1p"}],
            "sparse": [
                {"name": "u", "embedding_dim": 8, "hash_buckets": 1000},
                {"name": "yes", "embedding_dim": 8, "vocab_size": 12, "group": "shared"},  # YAML-ish name
                {"name": "t", "embedding_dim": 16, "hash_buckets": 7, "max_len": 4, "pooling": "mean"},
            ],
        }
    )


@pytest.mark.parametrize("make", [full_spec, small_spec, lambda: load_spec("criteo"), lambda: load_spec("criteo:37")])
def test_yaml_round_trip(make, tmp_path):
    spec = make()
    path = tmp_path / "spec.yaml"
    path.write_text(spec.to_yaml())
    again = load_spec(path)
    assert again == spec
    assert load_spec(str(path)) == spec
    spec.save(tmp_path / "saved.yaml")
    assert load_spec(tmp_path / "saved.yaml") == spec
    # the YAML is plain data that parse_spec accepts directly
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec


def test_to_dict_leaves_out_defaults():
    raw = small_spec().to_dict()
    h = raw["sparse"][0]
    assert h == {"name": "h", "embedding_dim": 4, "hash_buckets": 100}
    assert raw["dense"][0] == {"name": "d1"}


def test_load_spec_passes_a_spec_through():
    spec = small_spec()
    assert load_spec(spec) is spec


def test_load_spec_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec(missing)
    assert str(missing) in str(info.value)


def test_load_spec_invalid_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("label: [unclosed\nsparse: {")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "YAML" in str(info.value) and str(path) in str(info.value)


def test_load_spec_empty_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(SpecError):
        load_spec(path)


def test_load_spec_reports_field_errors_from_a_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(sparse_with(2, pooling="max")))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "'recent'" in str(info.value) and "pooling" in str(info.value)


# -- built-ins ----------------------------------------------------------------------------


def test_builtin_criteo():
    spec = load_spec("criteo")
    assert spec.label == "label"
    assert len(spec.dense) == CRITEO_DENSE == 13
    assert len(spec.sparse) == CRITEO_SPARSE == 26
    assert spec.dense_names == [f"I{i}" for i in range(1, 14)]
    assert spec.sparse_names == [f"C{i}" for i in range(1, 27)]
    assert all(f.transform == "log1p" for f in spec.dense)
    assert all(f.hashed and f.hash_buckets > 0 and not f.multi_hot for f in spec.sparse)
    names = [spec.label, *spec.dense_names, *spec.sparse_names]
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("n", [1, 2, 10, 26, 400, MAX_SCALED_FIELDS])
def test_builtin_scaled_criteo(n):
    spec = load_spec(f"criteo:{n}")
    assert spec.name == f"criteo:{n}"
    assert spec.label == "label" and len(spec.dense) == 13
    assert len(spec.sparse) == n
    assert len(set(spec.sparse_names)) == n
    assert all(f.embedding_dim in (8, 16, 32, 64) for f in spec.sparse)
    if n >= 10:
        assert any(f.multi_hot for f in spec.sparse)
    for f in spec.sparse:
        if f.multi_hot:
            assert f.max_len > 1 and f.pooling in ("sum", "mean")
    # a pure function of N: the same name gives the same fields
    assert load_spec(f"criteo:{n}") == spec
    # valid enough to pack
    plan = PackingPlan.from_spec(spec)
    assert sum(g.num_fields for g in plan.groups) == n


def test_scaled_criteo_mixes_all_dims_and_some_multi_hot():
    spec = load_spec("criteo:1000")
    assert {f.embedding_dim for f in spec.sparse} == {8, 16, 32, 64}
    multi = sum(f.multi_hot for f in spec.sparse)
    assert 0 < multi < 1000


def test_scaled_criteo_is_a_prefix_family():
    small, large = load_spec("criteo:30"), load_spec("criteo:300")
    assert large.sparse[:30] == small.sparse


@pytest.mark.parametrize("ref", ["criteo:0", f"criteo:{MAX_SCALED_FIELDS + 1}"])
def test_builtin_scaled_criteo_out_of_range_is_a_spec_error(ref):
    # A bad spec reference must fail like every other bad spec: a SpecError, so a caller
    # (the command line) that reports SpecErrors reports this one too.
    with pytest.raises(SpecError) as info:
        load_spec(ref)
    assert "1000" in str(info.value)


def test_unknown_builtin_is_a_spec_error():
    with pytest.raises(SpecError) as info:
        load_spec("criteo:lots")
    assert "criteo:lots" in str(info.value)


# -- packing plan -------------------------------------------------------------------------


def test_plan_groups_fields_by_dim_with_contiguous_row_offsets():
    spec = parse_spec(VALID)
    plan = PackingPlan.from_spec(spec)
    by_name = {g.name: g for g in plan.groups}
    assert set(by_name) == {"dim8", "dim4"}
    dim8, dim4 = by_name["dim8"], by_name["dim4"]
    assert dim8.embedding_dim == 8 and dim8.fields == ("user", "recent")
    assert dim8.row_offsets == (0, 1000) and dim8.num_rows == 1500
    assert dim8.mean_pooled == (False, True)
    assert dim4.fields == ("country",) and dim4.row_offsets == (0,) and dim4.num_rows == 200


@pytest.mark.parametrize("ref", ["criteo", "criteo:100", "criteo:1000"])
def test_plan_covers_every_field_once_with_contiguous_ranges(ref):
    spec = load_spec(ref)
    plan = PackingPlan.from_spec(spec)
    seen = [name for g in plan.groups for name in g.fields]
    assert sorted(seen) == sorted(spec.sparse_names)
    assert len({g.name for g in plan.groups}) == len(plan.groups)
    for g in plan.groups:
        fields = [spec.sparse_field(name) for name in g.fields]
        assert {f.embedding_dim for f in fields} == {g.embedding_dim}
        assert g.row_offsets[0] == 0
        for k in range(1, len(fields)):
            assert g.row_offsets[k] == g.row_offsets[k - 1] + fields[k - 1].num_rows
        assert g.num_rows == g.row_offsets[-1] + fields[-1].num_rows
        assert g.mean_pooled == tuple(f.pooling == "mean" for f in fields)
        # fields keep spec order within a group
        order = [spec.sparse_names.index(name) for name in g.fields]
        assert order == sorted(order)


def test_explicit_group_overrides_dim_grouping():
    raw = copy.deepcopy(VALID)
    raw["sparse"][0]["group"] = "users"
    plan = PackingPlan.from_spec(parse_spec(raw))
    by_name = {g.name: g for g in plan.groups}
    assert by_name["users"].fields == ("user",)
    assert by_name["dim8"].fields == ("recent",)
    assert by_name["dim8"].row_offsets == (0,) and by_name["dim8"].num_rows == 500


def test_explicit_group_of_same_dim_packs_fields_together():
    raw = copy.deepcopy(VALID)
    raw["sparse"].append({"name": "item", "embedding_dim": 16, "hash_buckets": 30, "group": "shared"})
    raw["sparse"].append({"name": "shop", "embedding_dim": 16, "vocab_size": 9, "group": "shared"})
    plan = PackingPlan.from_spec(parse_spec(raw))
    shared = {g.name: g for g in plan.groups}["shared"]
    assert shared.fields == ("item", "shop") and shared.row_offsets == (0, 30) and shared.num_rows == 39


def test_explicit_group_mixing_dims_is_a_spec_error():
    raw = copy.deepcopy(VALID)
    raw["sparse"][0]["group"] = "mixed"  # dim 8
    raw["sparse"][1]["group"] = "mixed"  # dim 4
    spec = parse_spec(raw)  # each field is fine on its own
    with pytest.raises(SpecError) as info:
        PackingPlan.from_spec(spec)
    message = str(info.value)
    assert "'mixed'" in message and "4" in message and "8" in message


def test_sparse_optimizer_must_be_known_and_shared_within_a_group():
    with pytest.raises(SpecError, match="sparse field 'a': optimizer must be one of"):
        parse_spec({"label": "y", "sparse": [{"name": "a", "hash_buckets": 5, "embedding_dim": 4, "optimizer": "rmsprop"}]})
    spec = parse_spec({"label": "y", "sparse": [
        {"name": "a", "hash_buckets": 5, "embedding_dim": 4, "group": "g"},
        {"name": "b", "hash_buckets": 5, "embedding_dim": 4, "group": "g", "optimizer": "adam"},
    ]})
    with pytest.raises(SpecError, match="group 'g': its fields mix sparse optimizers"):
        PackingPlan.from_spec(spec)
