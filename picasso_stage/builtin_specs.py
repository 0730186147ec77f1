"""Built-in specs: Criteo's shape, and the same shape scaled to many sparse fields."""

from __future__ import annotations

import re

from picasso.spec import DenseField, FeatureSpec, SparseField, SpecError

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


def builtin_spec(name: str) -> FeatureSpec | None:
    if name == "criteo":
        return criteo_spec()
    match = re.fullmatch(r"criteo:(\d+)", name)
    if match:
        try:
            return scaled_spec(int(match.group(1)))
        except ValueError as err:
            raise SpecError([f"spec '{name}': {err}"]) from err
    return None
