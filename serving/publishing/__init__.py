"""Publishing checkpoints to MLflow as evaluated, gated, idempotent model versions.

A publish request (contract.py) goes through the outbox on disk (outbox.py), which hands
it to publish() (publication.py): one run with the metrics, artifacts and the pyfunc model
(picasso.serving.model_code stages the code it ships: only the picasso modules the pyfunc
needs, none of this package's), one registered version tagged with the checkpoint
(registry_tags.py, registry.py), with its delta against the previous version
(delta_store.py over model_delta.py), aliased `candidate` and promoted to `champion` by
the policy (policy.py); a warm start finds the champion's checkpoint (champion.py). All of
MLflow's process-wide state that a publish sets and puts back lives in mlflow_env.py, and
transform.py is the Beam face of it all (PublishToMLflow). Nothing is imported here: each
caller imports the module it needs.
"""
