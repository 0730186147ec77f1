"""The spec's `crosses:` section: each mistake refused naming the cross, a spec written
out and read back unchanged, crosses packed by the part of the model they feed, and the
README's MovieLens example the spec benchmarks.movielens builds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from picasso.packing import PackingPlan
from picasso.spec import SpecError, parse_spec
from picasso.spec_refs import load_spec

REPO = Path(__file__).resolve().parents[1]
FIELDS = {
    "label": "click",
    "dense": ["price"],
    "sparse": [{"name": "item", "embedding_dim": 8, "hash_buckets": 100},
               {"name": "gender", "embedding_dim": 8, "vocab_size": 3},
               {"name": "genres", "embedding_dim": 8, "hash_buckets": 30, "max_len": 4}],
}


def with_crosses(*crosses) -> dict:
    return {**FIELDS, "crosses": list(crosses)}


def cross(name="item_x_gender", fields=("item", "gender"), **settings) -> dict:
    return {"name": name, "fields": list(fields), **({"hash_buckets": 1000} | settings)}


@pytest.mark.parametrize("crosses, problem", [
    ([cross(fields=("item", "nope"))], "cross 'item_x_gender': unknown field 'nope'"),
    ([cross(fields=("item",))], "cross 'item_x_gender': a cross takes two or more fields, got 1"),
    ([{"name": "item_x_gender", "fields": "item", "hash_buckets": 5}],
     "cross 'item_x_gender': fields must be a list of sparse field names, got 'item'"),
    ([cross(fields=("item", "price"))], "cross 'item_x_gender': 'price' is a dense field; a cross takes sparse fields"),
    ([cross(fields=("item", "click"))], "cross 'item_x_gender': 'click' is the label; a cross takes sparse fields"),
    ([cross(fields=("item", "item"))], "cross 'item_x_gender': field 'item' is listed more than once"),
    ([cross(fields=("item", "other")), cross("other")], "cross 'item_x_gender': 'other' is a cross; a cross takes "
                                                        "sparse fields"),
    ([cross(name="item")], "cross 'item': its name is taken by a sparse field"),
    ([cross(name="price")], "cross 'price': its name is taken by a dense field"),
    ([cross(name="click")], "cross 'click': its name is taken by the label"),
    ([cross(), cross()], "cross 'item_x_gender': its name is taken by another cross"),
    ([cross(hash_buckets=None, vocab_size=10)], "cross 'item_x_gender': needs exactly one of 'hash_buckets' or "
                                                "'dynamic'"),
    ([cross(hash_buckets=0)], "cross 'item_x_gender': hash_buckets must be a positive integer, got 0"),
    ([cross(part="deep")], "cross 'item_x_gender': embedding_dim is needed where a cross feeds the deep part "
                           "(part: deep)"),
    ([cross(part="middle")], "cross 'item_x_gender': part must be one of ('wide', 'deep', 'both'), got 'middle'"),
    ([cross(max_len=0)], "cross 'item_x_gender': max_len must be a positive integer, got 0"),
    ([cross(pooling="max")], "cross 'item_x_gender': pooling must be one of ('sum', 'mean'), got 'max'"),
    ([{"fields": ["item", "gender"], "hash_buckets": 10}], "cross #0: needs a 'name'"),
])
def test_every_mistake_in_a_cross_is_refused_naming_it(crosses, problem):
    with pytest.raises(SpecError) as refused:
        parse_spec(with_crosses(*crosses))
    assert problem in refused.value.problems, refused.value.problems


def test_crosses_must_be_a_list():
    with pytest.raises(SpecError, match="'crosses' must be a list of crosses"):
        parse_spec({**FIELDS, "crosses": {"name": "x"}})


def test_a_cross_of_unknown_keys_names_the_allowed_ones():
    with pytest.raises(SpecError) as refused:
        parse_spec(with_crosses(cross(vocab_size=3)))
    assert any(p.startswith("cross 'item_x_gender': unknown key 'vocab_size' (allowed: dynamic, embedding_dim, "
                            "fields, group") for p in refused.value.problems)


def test_a_cross_reads_its_defaults_and_writes_back_as_given():
    spec = parse_spec(with_crosses(
        cross(),
        cross("gender_x_genres", ("gender", "genres"), part="both", embedding_dim=8, pooling="mean"),
        cross("genres_x_item", ("genres", "item"), max_len=2, hash_buckets=None,
              dynamic={"capacity": 50, "hash_seed": 12345}),
        cross("deep_one", ("item", "genres"), part="deep", embedding_dim=4),
    ))
    wide, both, dynamic, deep = spec.crosses
    assert (wide.part, wide.embedding_dim, wide.max_len, wide.cross_of) == ("wide", 1, 1, ("item", "gender"))
    assert (both.part, both.embedding_dim, both.max_len) == ("both", 8, 4)  # 1 x 4 combinations kept by default
    assert (dynamic.max_len, dynamic.dynamic.hash_seed, dynamic.hashed) == (2, 12345, False)
    assert (deep.part, deep.embedding_dim) == ("deep", 4)
    assert [f.name for f in spec.id_features] == ["item", "gender", "genres", "item_x_gender", "gender_x_genres",
                                                  "genres_x_item", "deep_one"]
    assert spec.sparse_field("genres_x_item") is dynamic and spec.dynamic_fields == [dynamic]
    assert parse_spec(yaml.safe_load(spec.to_yaml())) == spec
    written = yaml.safe_load(spec.to_yaml())["crosses"][0]
    assert written == {"name": "item_x_gender", "fields": ["item", "gender"], "hash_buckets": 1000}


def test_a_wide_cross_ignores_an_embedding_dim():
    """Switching a cross from both to wide needs no other edit."""
    spec = parse_spec(with_crosses(cross(embedding_dim=32)))
    assert spec.crosses[0].embedding_dim == 1


def test_a_spec_without_crosses_reads_and_writes_as_before():
    spec = parse_spec(FIELDS)
    assert spec.crosses == () and spec.id_features == spec.sparse
    assert "crosses" not in yaml.safe_load(spec.to_yaml())


def test_crosses_pack_with_the_fields_that_feed_the_same_parts():
    spec = parse_spec(with_crosses(cross(), cross("g_x_g", ("gender", "genres"), part="both", embedding_dim=8),
                                   cross("deep_one", ("item", "genres"), part="deep", embedding_dim=4)))
    plan = PackingPlan.from_spec(spec)
    groups = {g.name: (g.part, g.fields) for g in plan.groups}
    assert groups == {"dim8": ("both", ("item", "gender", "genres", "g_x_g")),
                      "wide_crosses": ("wide", ("item_x_gender",)),
                      "deep_crosses_dim4": ("deep", ("deep_one",))}
    assert [g.name for g in plan.for_part("deep").groups] == ["deep_crosses_dim4", "dim8"]
    assert [g.name for g in plan.for_part("wide").groups] == ["dim8", "wide_crosses"]
    assert plan.for_part("wide") is plan.for_part("wide") and plan.for_part("wide").root is plan
    plain = PackingPlan.from_spec(parse_spec(FIELDS))
    assert plain.for_part("deep") is plain  # no one-part groups: the plan itself


def test_a_group_that_mixes_parts_is_refused():
    spec = parse_spec(with_crosses(cross(group="shared")) | {"sparse": [
        {**FIELDS["sparse"][0], "group": "shared"}, *FIELDS["sparse"][1:]]})
    with pytest.raises(SpecError, match=r"group 'shared': its fields and crosses feed different parts"):
        PackingPlan.from_spec(spec)


def test_the_readme_movielens_example_is_the_spec_the_benchmark_builds():
    from benchmarks.movielens import CROSS_SETS, SPEC_PATH
    from benchmarks.movielens_crosses import cross_spec

    readme = (REPO / "README.md").read_text()
    example = re.search(r"```yaml\n(  crosses:\n.*?)```", readme, re.S).group(1)
    spec = load_spec(SPEC_PATH)
    documented = parse_spec({**spec.to_dict(), **yaml.safe_load(example.replace("\n  ", "\n"))})
    assert documented == cross_spec(spec, CROSS_SETS["item x gender, item x age, user x genre"], "both")
