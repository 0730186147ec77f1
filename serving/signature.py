"""The pyfunc's MLflow signature, derived from the FeatureSpec.

The signature has no input schema, on purpose. MLflow enforces an input schema before
the model sees a request, and its enforcement loses rows: a request whose rows carry no
column of the schema (only unknown fields, or `{}`) reaches the model as a frame of no
rows, and the answer has fewer predictions than the request had rows. Typed columns
would also refuse what raw events legitimately carry (int64 counts in a double column,
integer ids in a hashed field declared string). The decoder checks every value, with
training's rules, and answers every row (serving/request_decoding.py).

What the model reads is stated in its metadata instead (input_fields): each dense and
sparse field, never the label, with its kind. The output is one click probability per
row; the `on_bad_row` param (error|default) says what a refused row gets.

The metadata also carries built_from_sha256: one hash of everything but the weights that
the pyfunc is built from (the spec, the model config, the pyfunc's file). Two versions with
the same one differ in their weights alone, which is what lets `picasso serve` take a new
version as the served one plus a delta, reading neither file (serving/versions.py).
"""

from __future__ import annotations

import hashlib

from mlflow.models.signature import ModelSignature
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

from picasso.spec import FeatureSpec

INPUT_FIELDS, BUILT_FROM = "input_fields", "built_from_sha256"  # keys of the model's metadata


def serving_signature() -> ModelSignature:
    return ModelSignature(
        inputs=None,
        outputs=Schema([ColSpec("double", "probability")]),
        params=ParamSchema([ParamSpec("on_bad_row", "string", "error")]),
    )


def input_fields(spec: FeatureSpec) -> dict[str, str]:
    """Field name -> what it takes, for the model's metadata: every field is optional."""
    fields = {f.name: "number" for f in spec.dense}
    for f in spec.sparse:
        ids = "integer or string ids" if f.takes_strings else f"integer ids in [0, {f.vocab_size})"
        fields[f.name] = f"{ids}, a list of at most {f.max_len}" if f.max_len > 1 else ids
    return fields


def built_from_sha256(spec: bytes, model_config: bytes, pyfunc_code: bytes) -> str:
    """One hash of the three files' contents, each length-prefixed so that no two triples
    of files hash alike by shifting bytes from one to the next."""
    digest = hashlib.sha256()
    for content in (spec, model_config, pyfunc_code):
        digest.update(len(content).to_bytes(8, "little"))
        digest.update(content)
    return digest.hexdigest()
