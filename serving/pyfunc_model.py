"""The MLflow pyfunc model: raw feature columns in, one click probability per row out.

It carries the spec and decodes with the same decoder and hash as training, so serving
needs no other preprocessing. It scores in the precision its checkpoint trained and was
evaluated in (TrainConfig.precision, which the model config records), so the AUC that
promoted a version is the served model's. Ids never seen in training still hash to a row (a dynamic
field's take its default row); missing
fields take their defaults. A row the decoder refuses fails the request with the reason
(HTTP 400), or with `params: {"on_bad_row": "default"}` is scored on its good fields:
see serving/request_decoding.py. A request of more than PICASSO_SERVING_MAX_ROWS rows
(default 100,000) is refused.
"""

from __future__ import annotations

import copy
import json
import os

import mlflow.models
import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from picasso.batch import pack
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.models import build_model
from picasso.packing import PackingPlan
from picasso.precision import DENSE_PRECISIONS, check_precision
from picasso.serving.request_decoding import BadRows, decode_request, on_bad_row_problem
from picasso.serving.weights import is_training_only
from picasso.spec_refs import load_spec

ARTIFACT_WEIGHTS = "weights"
ARTIFACT_SPEC = "spec"
ARTIFACT_CONFIG = "model_config"
MAX_ROWS_VARIABLE = "PICASSO_SERVING_MAX_ROWS"
DEFAULT_MAX_ROWS = 100_000
# Versions logged before the model config carried a precision were served in fp32, as were
# the checkpoints made before TrainConfig had one trained.
UNRECORDED_PRECISION = "fp32"


def model_config(train_config: dict) -> dict:
    """What serving builds the model from, out of a checkpoint's TrainConfig (as a dict):
    its architecture, and the precision it trained and was evaluated in (checked here, so
    that no version is logged that could not load)."""
    precision = train_config.get("precision", UNRECORDED_PRECISION)
    check_precision(precision, DENSE_PRECISIONS)
    return {"model": train_config["model"], "hidden": list(train_config["hidden"]), "precision": precision}


class CtrModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context):
        self.spec = load_spec(context.artifacts[ARTIFACT_SPEC])
        with open(context.artifacts[ARTIFACT_CONFIG]) as f:
            config = json.load(f)
        self.plan = PackingPlan.from_spec(self.spec)
        # In the precision the version trained and was evaluated in, so that the AUC that
        # promoted it is this model's (bf16: the dense part under autocast, models.common).
        self.model = build_model(config["model"], self.spec, self.plan, tuple(config["hidden"]),
                                 precision=config.get("precision", UNRECORDED_PRECISION))
        self._take_weights(torch.load(context.artifacts[ARTIFACT_WEIGHTS], weights_only=True, map_location="cpu"))
        self.decoder = RecordDecoder(self.spec, DecodeOptions(require_label=False))
        self.max_rows = int(os.environ.get(MAX_ROWS_VARIABLE, DEFAULT_MAX_ROWS))
        self._warm_up()

    def with_weights(self, weights: dict[str, torch.Tensor]) -> "CtrModel":
        """This model with other weights of the same architecture (a version taken as this
        one plus a delta, serving/versions.py), loaded and warm: the spec, plan and decoder
        are shared, the module is a copy. This one keeps answering meanwhile, unchanged."""
        twin = copy.copy(self)
        twin.model = copy.deepcopy(self.model)
        twin._take_weights(weights)
        twin._warm_up()
        return twin

    def serving_weights(self) -> dict[str, torch.Tensor]:
        """The module's tensors that its version's weights file holds (serving/weights.py),
        the module's own, not copies: what a delta from this version applies to."""
        return {key: value for key, value in self.model.state_dict().items() if not is_training_only(key)}

    def _take_weights(self, weights: dict[str, torch.Tensor]) -> None:
        # Serving weights leave out what only training reads (serving/weights.py); any
        # other missing or unexpected tensor means weights of another model.
        result = self.model.load_state_dict(weights, strict=False)
        missing = [key for key in result.missing_keys if not is_training_only(key)]
        if missing or result.unexpected_keys:
            raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {result.unexpected_keys}")
        if "dynamic_rows" in self.model._modules:  # the weights carry each row's key, not the index
            self.model.dynamic_rows.rebuild_index()
        self.model.eval()

    def _warm_up(self) -> None:
        # The first scoring loads the kernels (and builds them where this environment has
        # not), which would otherwise land on the first request. The row has every field,
        # so every decoding and hashing path runs once too.
        self.predict(None, _row_of_every_field(self.spec))

    # The hint is what MLflow asks for (it warns at class creation without one): a DataFrame
    # hint asks for no validation and infers no signature, the logged one stands (publication.py).
    def predict(self, context, model_input: pd.DataFrame, params=None):
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        on_bad_row = (params or {}).get("on_bad_row", "error")
        if problem := on_bad_row_problem(on_bad_row):
            raise MlflowException(problem, error_code=INVALID_PARAMETER_VALUE)
        if len(frame) > self.max_rows:
            raise MlflowException(f"a request of {len(frame)} rows is over this server's limit of {self.max_rows} "
                                  f"({MAX_ROWS_VARIABLE})", error_code=INVALID_PARAMETER_VALUE)
        try:
            decoded = decode_request(self.decoder, frame, on_bad_row)
        except BadRows as bad:
            raise MlflowException(str(bad), error_code=INVALID_PARAMETER_VALUE,
                                  refused_rows=[{"row": r.row, "reason": r.reason} for r in bad.refused]) from None
        probabilities = self._probabilities(decoded.table)
        if on_bad_row == "default":
            # object, not pandas' string dtype, which turns None into NaN (and JSON into NaN)
            refused = pd.Series([decoded.refused.get(i) for i in range(len(frame))], dtype=object)
            return pd.DataFrame({"probability": probabilities, "refused": refused})
        return probabilities

    def _probabilities(self, table) -> np.ndarray:
        if not table.num_rows:
            return np.zeros(0, dtype=np.float64)
        with torch.no_grad():
            batch = self.model.resolve(pack(table, self.spec, self.plan).to_torch())[0]  # ids never seen: default rows
            logits = self.model(batch)
        return torch.sigmoid(logits).double().numpy()


def _row_of_every_field(spec) -> pd.DataFrame:
    row = {f.name: 0.0 for f in spec.dense}
    for f in spec.sparse:
        one = "warm-up" if f.takes_strings else 0
        row[f.name] = [one] if f.max_len > 1 else one
    return pd.DataFrame([row])


# Models from code: MLflow loads this file and takes the model set here, instead of
# unpickling an object.
mlflow.models.set_model(CtrModel())
