"""What publishing takes and gives: the MLflow target, a publish request, the version it
became, and the outbox's outcome for it. Plain frozen dataclasses, so that a request can
wait on disk (to_dict/from_dict) and every result can cross a Beam boundary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from picasso import storage
from picasso.serving.publishing.local_store import ensure_sqlite_store

PUBLISHED, PENDING = "published", "pending"  # PublishOutcome.status


@dataclass(frozen=True)
class MLflowTarget:
    tracking_uri: str
    experiment: str = "picasso"
    model_name: str = "picasso-ctr"
    # Where a new experiment keeps its artifacts; None lets the server decide.
    artifact_location: str | None = None

    @classmethod
    def for_workdir(cls, workdir: str | Path, tracking_uri: str | None = None, experiment: str = "picasso",
                    model_name: str = "picasso-ctr", make_store: bool = True) -> "MLflowTarget":
        """The given server, or by default a local store in workdir: sqlite:///WORKDIR/mlflow.db
        with artifacts under WORKDIR/mlartifacts.

        Every command that talks to MLflow gets its target here, before anything opens the
        store, so this is where a SQLite store (the default one, or a sqlite:/// URI given)
        is made complete, in one step (make_store). It raises HalfMadeStoreError for a
        half-made store that holds data, and ValueError for a workdir at a URL without a
        tracking URI: SQLite cannot live on an object store.

        make_store=False leaves the store to the first client of it (registry.client_for):
        a run that may publish nothing (a daily partition too small to score) then never
        loads MLflow, whose import and schema take seconds."""
        if storage.is_url(workdir) and not tracking_uri:
            raise ValueError(f"the work folder {workdir} is not on a local disk, so it cannot hold the default "
                             "SQLite MLflow store: give an MLflow server (--mlflow-uri or $MLFLOW_TRACKING_URI)")
        workdir = Path(workdir).resolve() if not storage.is_url(workdir) else workdir
        target = cls(
            tracking_uri=tracking_uri or f"sqlite:///{workdir / 'mlflow.db'}",
            experiment=experiment,
            model_name=model_name,
            artifact_location=None if tracking_uri else (workdir / "mlartifacts").as_uri(),
        )
        if make_store:
            target.make_store()
        return target

    def make_store(self) -> None:
        """A sqlite:/// store made complete, in one step (serving/publishing/local_store.py:
        ensure_sqlite_store, which imports MLflow); other URIs: nothing to do."""
        ensure_sqlite_store(self.tracking_uri, self.artifact_location)


@dataclass(frozen=True)
class PublishRequest:
    checkpoint_path: str
    metrics: dict[str, float]  # evaluation and data counts: auc, logloss, calibration, samples, ...
    params: dict[str, str] = field(default_factory=dict)
    run_name: str | None = None
    tags: dict[str, str] = field(default_factory=dict)  # extra version tags (the date, data counts)
    # Per-step series, {name: [[step, value], ...]}: logged with their steps, e.g. the hot
    # cache's hit rate. Series under the checkpoint's metrics["step_metrics"] are logged too.
    step_metrics: dict[str, list] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)  # plots/<name>: SVG text, e.g. a joined stream's label delays

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "PublishRequest":
        return cls(**data)


@dataclass(frozen=True)
class ModelVersionRef:
    model_name: str
    version: str
    model_uri: str  # models:/NAME/VERSION
    run_id: str
    created: bool = True  # False: this checkpoint had been published before
    champion: bool = False  # promoted by this publish (or earlier, for created=False)
    promotion_reason: str = ""
    delta_base: str | None = None  # the version the delta artifact applies to
    full_bytes: int = 0  # serving weights
    delta_bytes: int | None = None


@dataclass(frozen=True)
class PublishOutcome:
    status: str  # PUBLISHED | PENDING
    checkpoint_path: str
    version: ModelVersionRef | None = None
    error: str | None = None  # why it is still pending
