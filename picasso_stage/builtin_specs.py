"""Built-in specs: Criteo's shape, the same shape scaled to many sparse fields, and the
churn data set's (picasso.connectors.synthetic.churn), whose item field is a dynamic table."""

from __future__ import annotations

import re

from picasso.spec import DenseField, DynamicTable, FeatureSpec, SparseField, SpecError

CRITEO_DENSE = 13
CRITEO_SPARSE = 26
MAX_SCALED_FIELDS = 1000

# Criteo's real vocabularies span 3 to tens of millions of ids. These buckets keep that
# spread (small, medium and large fields) at a size a CPU trains in minutes.
_CRITEO_BUCKETS = (
    1_000, 500, 50_000, 20_000, 300, 30, 10_000, 600, 3, 30_000,
    5_000, 40_000, 3_000, 30, 10_000, 40_000, 10, 5_000, 2_000, 4,
    40_000, 20, 15, 30_000, 100, 20_000,
)


def criteo_spec(embedding_dim: int = 16) -> FeatureSpec:
    """Criteo's schema: a label, I1..I13 (counts, log1p) and C1..C26 (hashed string ids)."""
    return FeatureSpec(
        name="criteo",
        label="label",
        dense=tuple(DenseField(f"I{i + 1}", transform="log1p") for i in range(CRITEO_DENSE)),
        sparse=tuple(
            SparseField(f"C{i + 1}", embedding_dim=embedding_dim, hash_buckets=buckets)
            for i, buckets in enumerate(_CRITEO_BUCKETS)
        ),
    )


def scaled_spec(num_sparse: int, rows_per_field: int = 20_000) -> FeatureSpec:
    """Criteo's dense fields with `num_sparse` sparse fields, for packing at scale.

    Dims cycle through 8/16/32/64 weighted towards 16 (the common choice), and every
    tenth field is a multi-hot bag (max_len 5, mean pooling), like a user's recent items.
    The layout is a pure function of `num_sparse`, so a spec name like criteo:400 names
    the same fields everywhere.
    """
    if not 1 <= num_sparse <= MAX_SCALED_FIELDS:
        raise ValueError(f"num_sparse must be in 1..{MAX_SCALED_FIELDS}, got {num_sparse}")
    dims = (16, 8, 16, 32, 16, 64, 16, 8)
    fields = []
    for i in range(num_sparse):
        multi_hot = i % 10 == 9
        fields.append(
            SparseField(
                f"C{i + 1}",
                embedding_dim=dims[i % len(dims)],
                hash_buckets=rows_per_field,
                pooling="mean" if multi_hot else "sum",
                max_len=5 if multi_hot else 1,
            )
        )
    base = criteo_spec()
    return FeatureSpec(name=f"criteo:{num_sparse}", label=base.label, dense=base.dense, sparse=tuple(fields))


# The churn spec's item table, sized for picasso.connectors.synthetic.churn.ChurnConfig's defaults at
# 10 days of 100,000 rows: about 2,500 items are alive at a time (95% of the churning
# impressions, ChurnConfig.alive_items) while 23,600 pass through. 6,000 rows hold the
# live items twice over, so the ones admitted but not yet evicted fit beside them, and are
# about a quarter of the ids a table that never forgets would need.
CHURN_CAPACITY = 6_000
# Eviction: at the daily batch of 2,048 rows, 8 steps are 16,384 rows. A new item expects
# an impression every 900 rows or so, and gaps of 16,384 rows about 3 lifetimes (e^2.9)
# later, when it has left the alive ones; any 16,384 rows see about 3,050 items, so the
# table seldom fills.
CHURN_EVICT_AFTER_STEPS = 8


def churn_spec(capacity: int = CHURN_CAPACITY, hashed: bool = False) -> FeatureSpec:
    """The churn data set's schema: a label, two count fields, a user segment and a page
    context (hashed, Zipf-drawn) and the churning `item`: a dynamic table of `capacity`
    rows that admits an id at its second impression (a one-off id never takes a row), or,
    with hashed, a fixed table of capacity + 1 buckets, the same rows as the dynamic
    table and its default row (the baseline to compare it with)."""
    if hashed:
        item = SparseField("item", embedding_dim=16, hash_buckets=capacity + 1)
    else:
        item = SparseField("item", embedding_dim=16, dynamic=DynamicTable(
            capacity=capacity, admit_after=2, evict_after_steps=CHURN_EVICT_AFTER_STEPS))
    return FeatureSpec(
        name="churn:hashed" if hashed else "churn",
        label="label",
        dense=(DenseField("user_activity", transform="log1p"), DenseField("page_depth", transform="log1p")),
        sparse=(
            SparseField("segment", embedding_dim=8, hash_buckets=2_000),
            SparseField("context", embedding_dim=8, hash_buckets=100),
            item,
        ),
    )


def builtin_spec(name: str) -> FeatureSpec | None:
    if name == "criteo":
        return criteo_spec()
    if name in ("churn", "churn:hashed"):
        return churn_spec(hashed=name == "churn:hashed")
    match = re.fullmatch(r"criteo:(\d+)", name)
    if match:
        try:
            return scaled_spec(int(match.group(1)))
        except ValueError as err:
            raise SpecError([f"spec '{name}': {err}"]) from err
    return None
