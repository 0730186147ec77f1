"""The pyfunc's MLflow signature, derived from the FeatureSpec.

Inputs are the spec's dense and sparse fields (never the label), each optional: the
decoder gives a missing dense value 0 and a missing sparse field an empty bag. The
output is one click probability per row.

Column types are AnyType, or an Array of AnyType for multi-hot fields, on purpose.
MLflow's schema enforcement runs before the model sees a row, and it refuses what raw
events legitimately carry: int64 counts in a dense column declared double ("can not
safely convert int64 to float64"), integer ids in a hashed field declared string, a
vocabulary id column turned float64 by one missing value. The decoder already checks
every value and scores a bad row NaN instead of failing the request, so the signature
states names, optionality and shape, and leaves the value checks to the decoder.
"""

from __future__ import annotations

from mlflow.models.signature import ModelSignature
from mlflow.types.schema import AnyType, Array, ColSpec, Schema

from picasso.spec import FeatureSpec


def signature_for(spec: FeatureSpec) -> ModelSignature:
    columns = [ColSpec(AnyType(), f.name, required=False) for f in spec.dense]
    for f in spec.sparse:
        kind = Array(AnyType()) if f.max_len > 1 else AnyType()
        columns.append(ColSpec(kind, f.name, required=False))
    return ModelSignature(inputs=Schema(columns), outputs=Schema([ColSpec("double", "probability")]))
