"""Names of the tags picasso puts on MLflow runs and model versions."""

CHECKPOINT_ID = "picasso.checkpoint_id"
CHECKPOINT_PATH = "picasso.checkpoint_path"
MODEL_NAME = "picasso.model_name"  # on the run: the registered model it publishes to
MODEL_ID = "picasso.model_id"  # on the run, once its model is logged
VERSION = "picasso.version"  # on the run, once registered
AUC = "picasso.auc"
# How the AUC was measured: holdout, day=PARTITION (a later partition) or progressive (a stream).
EVALUATION = "picasso.evaluation"
WEIGHTS_SHA = "picasso.weights_sha256"  # of the serving weights (artifacts/weights.pt of the model)
DELTA_BYTES = "picasso.delta_bytes"  # of delta/delta.pt
FULL_BYTES = "picasso.full_bytes"  # of the serving weights
# The event time (ms) of the newest event a stream's version trained on: serving's freshness.
NEWEST_EVENT_MS = "picasso.newest_event_ms"
DELTA_BASE = "picasso.delta_base"  # the version the run's delta/ artifact applies to, or "none"
PROMOTION = "picasso.promotion"  # promoted | not_promoted; set last: the version is complete
PROMOTION_REASON = "picasso.promotion_reason"
# Lineage: the checkpoint of the version this one's model was trained on from (given by the
# run; "" for a model from scratch), that version's number (found by publishing), and
# what it trained since: its partitions, or a stream's offsets.
PARENT_CHECKPOINT = "picasso.parent_checkpoint"
PARENT_VERSION = "picasso.parent_version"  # a number, "none" (from scratch) or "unknown"
ORIGIN = "picasso.origin"
