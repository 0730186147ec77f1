"""The embedded MLflow store (a SQLite file), made in one step a kill cannot leave half-done.

MLflow creates a SQLite store's schema on first use: it creates the initial tables, then
runs some hundred alembic migrations, each committed on its own, which takes seconds. A
process killed in between (a SIGKILLed `picasso stream`) leaves a file with some of the
tables and an alembic revision that does not match them, and every later use fails (`table
mcp_servers already exists`), so every publish after it stays pending.

So picasso never lets MLflow create the store in place. ensure_sqlite_store() builds it in
a temporary file next to the store, lets MLflow create the whole schema there, and renames
it into place (os.replace is atomic): the store is there complete or not at all. A lock
(flock, which the kernel releases when its holder dies) keeps two processes from building
the same store at once.

A store found half-made (made before this existed, or by another program) is rebuilt,
with a warning, only when it holds nothing: no runs, no registered or logged models, no
traces, no experiment beyond MLflow's Default. One that holds anything is never touched;
the error names the file and what to do.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

# MLflow, alembic and SQLAlchemy are imported in the functions that use them: every command
# imports this module (HalfMadeStoreError), and they cost seconds of start-up.

log = logging.getLogger(__name__)

SQLITE_PREFIX = "sqlite:///"
# Tables whose rows are somebody's work; the Default experiment (id 0) is MLflow's own.
USER_TABLES = ("runs", "registered_models", "logged_models", "trace_info")
DEFAULT_EXPERIMENT_ID = 0


class HalfMadeStoreError(RuntimeError):
    """A store whose schema is incomplete and that holds data: picasso will not touch it."""


@dataclass(frozen=True)
class StoreCheck:
    """What a store file holds, against what this MLflow expects."""

    path: Path
    revision: str | None  # alembic's, None when the file has none
    head: str  # the revision this MLflow's schema is at
    known_revision: bool  # False: a revision this MLflow has no migration for (a newer MLflow's)
    missing_tables: tuple[str, ...]
    user_rows: dict[str, int] = field(default_factory=dict)  # table -> rows of somebody's work

    @property
    def complete(self) -> bool:
        return self.revision == self.head and not self.missing_tables

    @property
    def holds_data(self) -> bool:
        return any(self.user_rows.values())

    def describe(self) -> str:
        missing = f", {len(self.missing_tables)} tables missing" if self.missing_tables else ""
        return f"schema at revision {self.revision or 'none'}, this MLflow's is {self.head}{missing}"


def sqlite_path(tracking_uri: str) -> Path | None:
    """The file of a sqlite:/// tracking URI (relative to the working directory, as MLflow
    reads it); None for any other store, or an in-memory one."""
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    path = unquote(tracking_uri[len(SQLITE_PREFIX):].split("?", 1)[0])
    return Path(path).resolve() if path and path != ":memory:" else None


def _schema_modules():
    """MLflow's schema helpers, and every table of its ORM registered in Base.metadata
    (the registry's models live in a module of their own). Imported late: seconds."""
    import mlflow.store.model_registry.dbmodels.models  # noqa: F401 - registers the registry's tables
    import mlflow.store.tracking.dbmodels.models  # noqa: F401 - registers the tracking tables
    from mlflow.store.db import utils
    from mlflow.store.db.base_sql_model import Base

    return utils, Base


def _is_known_revision(utils, revision: str) -> bool:
    from alembic.script import ScriptDirectory

    try:
        return ScriptDirectory.from_config(utils._get_alembic_config("")).get_revision(revision) is not None
    except Exception:  # noqa: BLE001 - alembic raises several kinds for a revision it lacks
        return False


def _count_user_rows(connection, tables: set[str]) -> dict[str, int]:
    import sqlalchemy

    rows = {name: connection.execute(sqlalchemy.text(f"SELECT COUNT(*) FROM {name}")).scalar()
            for name in USER_TABLES if name in tables}
    if "experiments" in tables:
        rows["experiments"] = connection.execute(sqlalchemy.text(
            f"SELECT COUNT(*) FROM experiments WHERE experiment_id != {DEFAULT_EXPERIMENT_ID}")).scalar()
    return rows


def check_store(path: Path) -> StoreCheck:
    """Inspect an existing store file (a read-write connection: SQLite rolls back the hot
    journal a killed writer left, so what is read is what was committed)."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    utils, base = _schema_modules()
    engine = sqlalchemy.create_engine(f"{SQLITE_PREFIX}{path}", poolclass=NullPool)
    try:
        tables = set(sqlalchemy.inspect(engine).get_table_names())
        revision = utils._get_schema_version(engine) if "alembic_version" in tables else None
        with engine.connect() as connection:
            user_rows = _count_user_rows(connection, tables)
    except sqlalchemy.exc.DatabaseError as err:
        raise HalfMadeStoreError(f"{path} is not an SQLite database ({err.orig}); move it aside and picasso "
                                 "makes a fresh MLflow store there") from err
    finally:
        engine.dispose()
    head = utils._get_latest_schema_revision()
    return StoreCheck(path=path, revision=revision, head=head,
                      known_revision=revision is None or revision == head or _is_known_revision(utils, revision),
                      missing_tables=tuple(sorted(set(base.metadata.tables) - tables)), user_rows=user_rows)


@contextmanager
def _store_lock(path: Path):
    """One builder per store at a time, across processes."""
    fd = os.open(path.with_name(f"{path.name}.lock"), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def _remove_leftovers(path: Path) -> None:
    """Temporary stores of builders that died (only ever called under the lock, so none of
    them is being built now), with their SQLite journals."""
    for leftover in path.parent.glob(f"{_temporary_prefix(path)}*"):
        leftover.unlink(missing_ok=True)


def _remove_sidecars(path: Path) -> None:
    """SQLite's journal files of the store being replaced: left next to the new file, they
    would be rolled back into it."""
    for suffix in ("-journal", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def _build(path: Path, artifact_root: str | None) -> None:
    """A complete store at path, made in a temporary file and renamed into place."""
    # MLflow, imported when a store is built: every command imports this module.
    from picasso.serving.publishing.mlflow_env import create_sqlite_schema

    _remove_leftovers(path)
    fd, temporary = tempfile.mkstemp(prefix=_temporary_prefix(path), dir=path.parent)
    os.close(fd)  # SQLite takes an empty file for an empty database
    uri = f"{SQLITE_PREFIX}{temporary}"
    try:
        create_sqlite_schema(uri, artifact_root)  # its engine must not outlive the temporary name
    except BaseException:
        _remove_leftovers(path)  # a kill leaves them to the next builder; an error cleans up now
        raise
    _remove_sidecars(path)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a crash
    finally:
        os.close(directory)


def _refusal(check: StoreCheck) -> str:
    uri = f"{SQLITE_PREFIX}{check.path}"
    held = ", ".join(f"{table}: {count}" for table, count in check.user_rows.items() if count)
    if not check.known_revision:
        return (f"{check.path} is an MLflow store at a schema revision this MLflow does not know "
                f"({check.describe()}), probably made by a newer MLflow; use that MLflow, or move the "
                "file aside to start a fresh store")
    return (f"{check.path} is a half-made MLflow store ({check.describe()}) that holds data ({held}), so "
            f"picasso leaves it alone. Back it up, then complete its schema with `mlflow db upgrade {uri}`, "
            "or move the file aside to start a fresh store")


def ensure_sqlite_store(tracking_uri: str, artifact_root: str | None = None) -> None:
    """Make sure a sqlite:/// store is complete before anything uses it: build it when it is
    missing, rebuild it when it is half-made and holds nothing, raise HalfMadeStoreError when
    it is half-made and holds data (or is not ours to rebuild). Other URIs: nothing to do.

    artifact_root: where the Default experiment keeps artifacts in a store built here
    (MLflow's default, ./mlruns, when None)."""
    path = sqlite_path(tracking_uri)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with _store_lock(path):
        if not path.exists():
            _build(path, artifact_root)
            return
        check = check_store(path)
        if check.complete:
            return
        if check.holds_data or not check.known_revision:
            raise HalfMadeStoreError(_refusal(check))
        log.warning("%s is a half-made MLflow store (%s; an earlier process was probably killed while "
                    "MLflow created it) and holds nothing: rebuilding it", path, check.describe())
        _build(path, artifact_root)
