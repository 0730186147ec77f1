"""One registered version made ready to serve: downloaded whole and loaded by MLflow's own
pyfunc loader, or built in memory from the version being served plus its delta.

A version's folder is the logged model's artifacts as MLflow lays them out (MLmodel, the
pyfunc's file, the code it carries, artifacts/weights.pt, spec and model config). The
delta path reads, of the new version, only its MLmodel and its delta. The MLmodel's
metadata says what the pyfunc is built from besides the weights (built_from_sha256, over
the spec, model config and pyfunc file: serving/signature.py); where that is the served
version's, the new version is the served one with other weights, so the delta is applied
to a copy of the served model's tensors, checked against the SHA-256 of both ends (the
served weights, and the new version's weights file as it would be saved), and loaded into
a copy of the served model; no file is written, and MLflow's loader (its YAML, its model
build) does not run. The tables are the full model's bit for bit. Whatever does not fit
(no delta, a delta from another base, another spec or code, a served model loaded some
other way) loads in full.

Loading never touches the version being served: a failure leaves it serving, and says why
in a VersionFailure whose kind the metrics count.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import mlflow.pyfunc
import yaml
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.tracking import MlflowClient

from picasso.serving import old_names
from picasso.serving.publishing import registry_tags as tags
from picasso.serving.publishing.delta_store import download_delta, model_version_location
from picasso.serving.publishing.mlflow_env import pyfunc_with, python_model_of, tracking_uri
from picasso.serving.publishing.model_delta import apply_delta, load_delta
from picasso.serving.signature import BUILT_FROM, INPUT_FIELDS, built_from_sha256
from picasso.serving.weights import file_sha256, weights_sha256

WEIGHTS = "artifacts/weights.pt"
# What must be the same in two versions for the delta path, in built_from_sha256's order:
# the spec, the architecture and precision, the pyfunc's file. MLmodel changes (its model
# id) and is always taken new.
SAME_FOR_A_DELTA = ("artifacts/spec.yaml", "artifacts/model_config.json", "pyfunc_model.py")
MLMODEL = "MLmodel"
FULL, DELTA = "full", "delta"  # LoadedVersion.loaded_by


@dataclass(frozen=True)
class LoadedVersion:
    """A version ready to answer requests: the pyfunc and what the server says of it."""

    model: mlflow.pyfunc.PyFuncModel
    folder: Path | None  # its files, for a version loaded in full (one built in memory has none)
    version: str  # the registry's version number ("" for a runs:/ or a local model)
    model_uri: str
    loaded_by: str  # FULL or DELTA
    bytes_read: int  # from the artifact store, to load it
    load_s: float
    weights_sha256: str | None = None  # of its weights, checked: what a delta from it must name as its base
    built_from: str | None = None  # built_from_sha256 of its spec, model config and pyfunc file
    newest_event_ms: int | None = None  # of the newest event it trained on (stream versions)
    input_fields: tuple[str, ...] = ()  # the request's columns (the spec's fields), from its MLmodel

    @property
    def input_schema(self):
        return self.model.metadata.get_input_schema()


@dataclass(frozen=True)
class VersionFailure(Exception):
    """Why a version did not load. kind: registry (unreachable; tried again), artifact (a
    file missing or broken), spec (another request contract than the one served), model
    (the pyfunc failed to load)."""

    version: str
    kind: str
    reason: str
    at: float = field(default_factory=time.time)

    def __str__(self) -> str:
        return f"version {self.version}: {self.kind}: {self.reason}"


REGISTRY, ARTIFACT, SPEC, MODEL = "registry", "artifact", "spec", "model"
log = logging.getLogger("picasso.serve")


def is_unreachable(err: BaseException) -> bool:
    """An error that says the registry or its artifact store could not be reached, rather
    than what it holds: tried again at the next poll."""
    if isinstance(err, (ConnectionError, TimeoutError, OSError)) and not isinstance(err, FileNotFoundError):
        return True
    if isinstance(err, MlflowException):
        text = str(err)
        return err.error_code in ("TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR") or "Max retries" in text \
            or "Connection" in text
    return type(err).__module__.startswith(("requests", "urllib3"))


class VersionLoader:
    """Loads versions: in full into folders under `cache` (kept while the version is
    served), or by delta from the served version, in memory."""

    def __init__(self, client: MlflowClient, cache: Path):
        self.client = client
        self.cache = cache
        cache.mkdir(parents=True, exist_ok=True)

    def load_version(self, name: str, version, served: LoadedVersion | None) -> LoadedVersion:
        """Version entity `version` of registered model `name`: by delta from `served` where
        its delta applies to it, else in full. Raises VersionFailure."""
        number = str(version.version)
        try:
            location = model_version_location(self.client, version)
        except Exception as err:  # noqa: BLE001 - no logged model behind the version, or no registry
            raise VersionFailure(number, REGISTRY if is_unreachable(err) else ARTIFACT, _one_line(err)) from err
        facts = dict(version=number, model_uri=f"models:/{name}/{number}",
                     weights_sha256=version.tags.get(tags.WEIGHTS_SHA),
                     newest_event_ms=_int_or_none(version.tags.get(tags.NEWEST_EVENT_MS)))
        if served is not None and served.version and version.tags.get(tags.DELTA_BASE) == served.version:
            loaded = self._by_delta(location, version, served, facts)
            if loaded is not None:
                return loaded
        return self._in_full(location, facts, served)

    def load_uri(self, model_uri: str) -> LoadedVersion:
        """A pinned model (runs:/..., a local folder): in full, once."""
        return self._in_full(model_uri, dict(version="", model_uri=model_uri), None)

    def _in_full(self, location: str, facts: dict, served: LoadedVersion | None) -> LoadedVersion:
        started = time.monotonic()
        folder = self._new_folder(facts["version"])
        try:
            # Into a folder named after the location's last part, which is then renamed.
            got = mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(folder.parent / "download"),
                                                      tracking_uri=tracking_uri(self.client))
            os.replace(got, folder)
        except Exception as err:  # noqa: BLE001 - said as a failure of this version, kind by cause
            _remove(folder)
            raise VersionFailure(facts["version"], REGISTRY if is_unreachable(err) else ARTIFACT,
                                 f"cannot download its files from {location}: {_one_line(err)}") from err
        finally:
            shutil.rmtree(folder.parent / "download", ignore_errors=True)
        if not (folder / MLMODEL).is_file():  # MLflow downloads a source with no files as an empty folder
            _remove(folder)
            raise VersionFailure(facts["version"], ARTIFACT, f"there is no model at {location}: it holds no "
                                 f"{MLMODEL} file, so MLflow cannot load it either")
        return self._loaded(folder, facts, served, _folder_bytes(folder), started)

    def _by_delta(self, location: str, version, served: LoadedVersion, facts: dict) -> LoadedVersion | None:
        """The new version as the served one plus the delta, in memory; None where it cannot
        be (then it loads in full)."""
        served_model = python_model_of(served.model)
        if not hasattr(served_model, "with_weights") or served.built_from is None or served.weights_sha256 is None:
            return None  # loaded by another pyfunc than this picasso's, or without its facts
        started = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix="picasso-delta-", dir=self.cache) as tmp:
                folder = Path(tmp)
                read = self._download(location, MLMODEL, folder)
                meta = _read_mlmodel(folder)
                built_from = (meta.get("metadata") or {}).get(BUILT_FROM)
                if built_from is None:  # logged before versions said it: from the files themselves
                    read += sum(self._download(location, name, folder) for name in SAME_FOR_A_DELTA)
                    built_from = _built_from(folder)
                if built_from != served.built_from:
                    return None  # another spec, model or pyfunc: only a full load tells what it is
                delta_file = download_delta(self.client, version, folder)
                read += delta_file.stat().st_size
                delta = load_delta(delta_file)
        except Exception as err:  # noqa: BLE001
            if is_unreachable(err):
                raise VersionFailure(facts["version"], REGISTRY, _one_line(err)) from err
            return None  # a delta artifact missing or broken: the full model may still be good
        if delta.get("base_sha256") != served.weights_sha256:
            return None  # made from other weights than the served ones: a full load is right
        try:
            weights = apply_delta(served_model.serving_weights(), delta)
            if weights_sha256(weights) != delta["target_sha256"]:
                return None  # not the version's weights after all: its file is the truth
            model = pyfunc_with(served.model, served_model.with_weights(weights), Model.from_dict(meta))
        except Exception as err:  # noqa: BLE001 - the served model could not take them: a full load says why
            log.info("picasso serve: version %s by delta failed (%s); loading it in full", facts["version"],
                     _one_line(err))
            return None
        return LoadedVersion(model=model, folder=None, loaded_by=DELTA, bytes_read=read,
                             load_s=time.monotonic() - started, built_from=built_from,
                             input_fields=_fields_of(meta), **{**facts, "weights_sha256": delta["target_sha256"]})

    def _download(self, location: str, name: str, folder: Path) -> int:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"{location}/{name}", dst_path=str(target.parent),
                                                       tracking_uri=tracking_uri(self.client)))
        if got != target:
            os.replace(got, target)
        return target.stat().st_size

    def _loaded(self, folder: Path, facts: dict, served: LoadedVersion | None, read: int,
                started: float) -> LoadedVersion:
        try:
            fields = _fields_of(_read_mlmodel(folder))
            # Of the files themselves: what a delta from this version must name as its base.
            facts = {**facts, "weights_sha256": file_sha256(folder / WEIGHTS) if (folder / WEIGHTS).exists() else None}
            built_from = _built_from(folder) if all((folder / name).exists() for name in SAME_FOR_A_DELTA) else None
        except Exception as err:  # noqa: BLE001 - no MLmodel, or not one MLflow reads
            _remove(folder)
            raise VersionFailure(facts["version"], ARTIFACT, _one_line(err)) from err
        if served is not None and served.input_fields and fields != served.input_fields:
            _remove(folder)
            added, removed = sorted(set(fields) - set(served.input_fields)), sorted(set(served.input_fields) - set(fields))
            raise VersionFailure(facts["version"], SPEC,
                                 f"it takes other request fields than version {served.version or served.model_uri} "
                                 f"(added {added or 'none'}, removed {removed or 'none'}): clients would break; "
                                 "serve it with a new `picasso serve`")
        try:
            old_names.install()  # a version logged earlier imports modules by their names then
            model = mlflow.pyfunc.load_model(str(folder))
        except Exception as err:  # noqa: BLE001
            _remove(folder)
            raise VersionFailure(facts["version"], MODEL, _one_line(err)) from err
        return LoadedVersion(model=model, folder=folder, loaded_by=FULL, bytes_read=read,
                             load_s=time.monotonic() - started, input_fields=fields, built_from=built_from, **facts)

    def _new_folder(self, version: str) -> Path:
        """CACHE/vN-xxxx/model, not made yet: the model's files go there."""
        return Path(tempfile.mkdtemp(prefix=f"v{version or 'pinned'}-", dir=self.cache)) / "model"

    def forget(self, loaded: LoadedVersion) -> None:
        """Remove a version's files once nothing serves it."""
        if loaded.folder is not None:
            _remove(loaded.folder)


def _remove(folder: Path) -> None:
    """A version's folder, and the one _new_folder made around it."""
    shutil.rmtree(folder.parent, ignore_errors=True)


def _read_mlmodel(folder: Path) -> dict:
    """A version's MLmodel, as a dict. Read with libyaml where PyYAML has it: the
    pure-Python parser holds the GIL for tens of milliseconds on a 400-field model, while
    requests wait."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((folder / MLMODEL).read_text(), Loader=loader)


def _fields_of(mlmodel: dict) -> tuple[str, ...]:
    """The request's columns the version documents (serving/signature.py puts them in its
    MLmodel's metadata)."""
    return tuple(sorted((mlmodel.get("metadata") or {}).get(INPUT_FIELDS, {})))


def _built_from(folder: Path) -> str:
    return built_from_sha256(*((folder / name).read_bytes() for name in SAME_FOR_A_DELTA))


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def describe(loaded: LoadedVersion) -> dict:
    """What /version and the log say of a loaded version."""
    return {"version": loaded.version, "model_uri": loaded.model_uri, "loaded_by": loaded.loaded_by,
            "bytes_read": loaded.bytes_read, "load_s": round(loaded.load_s, 3),
            "weights_sha256": loaded.weights_sha256, "newest_event_ms": loaded.newest_event_ms}

