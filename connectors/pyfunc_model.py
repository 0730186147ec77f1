"""The MLflow pyfunc model: raw feature columns in, click probabilities out.

It carries the spec and decodes with the same decoder and hash as training, so serving
needs no other preprocessing. Ids never seen in training still hash to a row; missing
fields take their defaults; a row that cannot be decoded (a wrong type, say) scores NaN
rather than failing the whole request.
"""

from __future__ import annotations

import json

import mlflow.models
import mlflow.pyfunc
import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from picasso.batch import pack
from picasso.connectors.decoders import DecodeOptions, RecordDecoder
from picasso.connectors.serving_weights import is_optimizer_slot
from picasso.models import build_model
from picasso.packing import PackingPlan
from picasso.spec import load_spec

ARTIFACT_WEIGHTS = "weights"
ARTIFACT_SPEC = "spec"
ARTIFACT_CONFIG = "model_config"


class CtrModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.spec = load_spec(context.artifacts[ARTIFACT_SPEC])
        with open(context.artifacts[ARTIFACT_CONFIG]) as f:
            config = json.load(f)
        self.plan = PackingPlan.from_spec(self.spec)
        self.model = build_model(config["model"], self.spec, self.plan, tuple(config["hidden"]))
        weights = torch.load(context.artifacts[ARTIFACT_WEIGHTS], weights_only=True, map_location="cpu")
        # Serving weights leave out the sparse optimizer's slots (serving_weights.py); any
        # other missing or unexpected tensor means weights of another model.
        result = self.model.load_state_dict(weights, strict=False)
        missing = [key for key in result.missing_keys if not is_optimizer_slot(key)]
        if missing or result.unexpected_keys:
            raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {result.unexpected_keys}")
        self.model.eval()
        self.decoder = RecordDecoder(self.spec, DecodeOptions(require_label=False))

    def predict(self, context, model_input, params=None):
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        columns = {str(name): _column(frame[name]) for name in frame.columns}
        decoded = self.decoder.decode_columns(columns, len(frame), source="serving")
        probabilities = np.full(len(frame), np.nan, dtype=np.float64)
        if decoded.table.num_rows:
            with torch.no_grad():
                logits = self.model(pack(decoded.table, self.spec, self.plan).to_torch())
            probabilities[decoded.valid_mask] = torch.sigmoid(logits).numpy()
        return probabilities


def _column(series: pd.Series) -> pa.Array | list:
    """An Arrow array, or for a column of mixed values a list the decoder checks one by
    one (so one bad value fails one row, not the request)."""
    if series.dtype.kind == "f" and series.hasnans:
        # pandas (and JSON parsed into a DataFrame) turns an integer column with a missing
        # value into floats with NaN: give integer ids back their type, missing as null.
        present = series.dropna()
        if ((present == np.floor(present)) & (present.abs() < 2**53)).all():
            series = series.astype("Int64")
    try:
        return pa.array(series, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return [None if _missing(value) else value for value in series.tolist()]


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


# Models from code: MLflow loads this file and takes the model set here, instead of
# unpickling an object.
mlflow.models.set_model(CtrModel())
