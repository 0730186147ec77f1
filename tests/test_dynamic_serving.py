"""A model version with a dynamic table: the pyfunc resolves ids through the map the
version carries (ids it never saw take the default row), scores as the trainer does,
and each version's delta names the ids it added and evicted, and still rebuilds the
version bit for bit."""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import pytest
from helpers import small_spec
from mlflow.tracking import MlflowClient
from publish_helpers import CheckpointMaker, fresh_target, request

from picasso.batch import pack
from picasso.checkpoint import load_checkpoint
from picasso.connectors.decoding.contracts import DecodeOptions
from picasso.connectors.decoding.record_decoder import RecordDecoder
from picasso.serving.publishing.delta_store import download_delta, download_weights, rebuild_version
from picasso.serving.publishing.model_delta import load_delta
from picasso.serving.publishing.publication import publish
from picasso.kernels.hashing import key_of
from picasso.kernels.id_map_reference import EMPTY_KEY
from picasso.serving.request_decoding import decode_request
from picasso.serving.weights import file_sha256, serving_state
from picasso.spec import FeatureSpec, parse_spec
from picasso.connectors.synthetic.planted import PlantedModel

ITEM_KEYS = "dynamic_rows.maps.0.row_keys"


def dynamic_spec() -> FeatureSpec:
    """small_spec with a dynamic field beside its fixed ones: rows expire after a batch, so
    consecutive versions hold other ids."""
    raw = small_spec(name="dynamic-publish").to_dict()
    raw["sparse"].append({"name": "item", "embedding_dim": 4,
                          "dynamic": {"capacity": 60, "admit_after": 2, "evict_after_steps": 1}})
    return parse_spec(raw)


@pytest.fixture(scope="module")
def versions(mlflow_server, tmp_path_factory):
    maker = CheckpointMaker(tmp_path_factory.mktemp("dynamic-publish"), spec=dynamic_spec())
    target = fresh_target(mlflow_server)
    checkpoints = [maker.next(), maker.next()]
    refs = [publish(request(checkpoint, 0.7 + i / 100), target) for i, checkpoint in enumerate(checkpoints)]
    return target, maker, checkpoints, refs


def last_rows(maker: CheckpointMaker) -> pd.DataFrame:
    """Raw rows of the stream the maker trained on last, as a request would carry them."""
    table, _ = PlantedModel(maker.spec).sample(maker.rows, maker.stream - 1)
    return table.drop_columns([maker.spec.label]).to_pandas()


def trainer_scores(maker: CheckpointMaker, events: pd.DataFrame) -> np.ndarray:
    """The trainer's own scores of a request's rows, decoded as serving decodes them."""
    decoder = RecordDecoder(maker.spec, DecodeOptions(require_label=False))
    table = decode_request(decoder, events, "error").table
    return maker.trainer.predict(pack(table, maker.spec, maker.trainer.plan))


def test_the_pyfunc_scores_as_the_trainer_and_unseen_ids_take_the_default_row(versions, mlflow_server):
    target, maker, _, _ = versions
    mlflow.set_tracking_uri(mlflow_server)
    model = mlflow.pyfunc.load_model(f"models:/{target.model_name}/2")
    events = last_rows(maker).head(40)
    live = set(maker.trainer.model.dynamic_rows.maps[0].row_keys.tolist())
    assert any(key_of(item) in live for item in events["item"])  # ids with rows of their own
    unseen = pd.concat([events.head(1)] * 3, ignore_index=True)
    unseen["item"] = ["never-seen-1", "never-seen-2", 10**15]  # the same row, with ids it never met
    events = pd.concat([events, unseen], ignore_index=True)
    served = np.asarray(model.predict(events), dtype=np.float64)
    np.testing.assert_allclose(served, trainer_scores(maker, events), rtol=1e-6)
    assert served[-3] == served[-2] == served[-1]  # one default row for every id without one
    assert len(set(np.round(served[:40], 6))) > 1


def test_deltas_name_added_and_evicted_ids_and_rebuild_the_version(versions, mlflow_server, tmp_path):
    target, _, checkpoints, refs = versions
    client = MlflowClient(mlflow_server)
    assert refs[1].delta_base == "1"
    done = rebuild_version(client, target.model_name, "2", tmp_path / "rebuilt.pt")
    served = download_weights(client, client.get_model_version(target.model_name, "2"), tmp_path / "served")
    assert done["sha256"] == file_sha256(served)
    first, second = (serving_state(load_checkpoint(c).state["model"]) for c in checkpoints)
    assert not any("index" in key or "last_seen" in key for key in second)  # serving keeps row keys only
    delta = load_delta(download_delta(client, client.get_model_version(target.model_name, "2"), tmp_path / "d"))
    changes = delta["ids"][ITEM_KEYS]
    before, after = (set(state[ITEM_KEYS].tolist()) - {EMPTY_KEY} for state in (first, second))
    assert set(changes["added"].tolist()) == after - before and changes["added"].numel()
    assert set(changes["tombstones"].tolist()) == before - after and changes["tombstones"].numel()
    run = client.get_run(client.get_model_version(target.model_name, "2").run_id)
    metrics = run.data.metrics
    assert metrics["delta_new_ids"] == len(after - before) and metrics["delta_tombstones"] == len(before - after)
    # The version's own counts: what the training since the version before admitted.
    assert metrics["train.dynamic_item_admitted"] >= len(after - before) > 0
    evicted = metrics["train.dynamic_item_evicted_by_age"] + metrics["train.dynamic_item_evicted_when_full"]
    assert evicted >= len(before - after) > 0
    assert metrics["train.dynamic_item_live_rows"] == len(after) and 0 < metrics["train.dynamic_item_fill"] <= 1
