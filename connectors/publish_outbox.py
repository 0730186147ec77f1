"""The publish outbox: checkpoints waiting to become model versions, kept on disk.

A publish request is written under WORKSPACE/pending/ before MLflow is called, with the
checkpoint's files hard-linked next to it (pruning the checkpoint directory then frees
nothing the request needs). It leaves the outbox only once its version exists, and is
recorded in WORKSPACE/published.jsonl. So if MLflow is down longer than the retries
last, the request waits there, and the next flush (the next publish, the next daily run,
or `picasso publish-pending`) publishes it: nothing is lost, and since publish() is
idempotent per checkpoint, nothing is published twice.

Requests are published oldest first, and a failure stops the flush: each version's delta
is made against the version before it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from picasso.connectors.mlflow_registry import MLflowTarget, ModelVersionRef, PublishRequest, publish
from picasso.connectors.publish_policy import PublishPolicy

log = logging.getLogger(__name__)
PUBLISHED, PENDING = "published", "pending"


@dataclass(frozen=True)
class PublishOutcome:
    status: str  # published | pending
    checkpoint_path: str
    version: ModelVersionRef | None = None
    error: str | None = None  # why it is still pending


def _link_tree(source: Path, destination: Path) -> None:
    destination.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file():
            try:
                os.link(item, destination / item.name)
            except OSError:  # another filesystem
                shutil.copy2(item, destination / item.name)


class PublishOutbox:
    def __init__(self, workspace: str | Path):
        self.root = Path(workspace)
        self.pending_dir = self.root / "pending"
        self.log_path = self.root / "published.jsonl"

    def pending(self) -> list[Path]:
        """Pending entries, oldest first."""
        if not self.pending_dir.is_dir():
            return []
        return sorted(p for p in self.pending_dir.iterdir() if p.is_dir() and not p.name.startswith("."))

    def _request(self, entry: Path) -> PublishRequest:
        return PublishRequest.from_dict(json.loads((entry / "request.json").read_text()))

    def add(self, request: PublishRequest) -> Path:
        """Queue request (once: the same checkpoint queued again is the same entry)."""
        for entry in self.pending():
            if self._request(entry).checkpoint_path == request.checkpoint_path:
                return entry
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{Path(request.checkpoint_path).name}"
        tmp = self.pending_dir / f".tmp-{name}-{uuid.uuid4().hex[:6]}"
        _link_tree(Path(request.checkpoint_path), tmp / "checkpoint")
        (tmp / "request.json").write_text(json.dumps(request.to_dict()))
        os.rename(tmp, self.pending_dir / name)  # the entry appears whole or not at all
        return self.pending_dir / name

    def _done(self, entry: Path, version: ModelVersionRef) -> None:
        record = {"checkpoint_path": self._request(entry).checkpoint_path, "version": version.version,
                  "model_uri": version.model_uri, "run_id": version.run_id, "champion": version.champion,
                  "promotion_reason": version.promotion_reason, "created": version.created, "published_ms": int(time.time() * 1000)}
        with open(self.log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        shutil.rmtree(entry)

    def published(self, checkpoint_path: str) -> dict | None:
        """The record of the checkpoint's publish, if it was published through this outbox."""
        if not self.log_path.exists():
            return None
        records = [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]
        return next((r for r in reversed(records) if r["checkpoint_path"] == checkpoint_path), None)

    def flush(self, target: MLflowTarget, policy: PublishPolicy = PublishPolicy(), sleep=time.sleep,
              on_stage=lambda stage: None, on_published=lambda outcome: None) -> list[PublishOutcome]:
        """Publish every pending request, oldest first, until one fails (it and the ones
        after it stay pending).

        on_published(outcome) is called for each version before its entry leaves the
        outbox: a caller that keeps its own record of versions then loses none to a kill
        during a later entry. A kill between the two calls it again for the same version
        on the next flush, so such a record must take a version once."""
        outcomes = []
        entries = self.pending()
        for i, entry in enumerate(entries):
            request = self._request(entry)
            try:
                version = publish(request, target, policy, workspace=self.root, checkpoint_dir=str(entry / "checkpoint"),
                                  on_stage=on_stage, sleep=sleep)
            except Exception as err:  # noqa: BLE001 - whatever MLflow did, the request waits
                reason = f"{type(err).__name__}: {str(err).splitlines()[0][:500] if str(err) else ''}"
                log.warning("publish of %s failed after %d attempts; it stays pending in %s (%s)",
                            request.checkpoint_path, policy.retry.attempts, self.pending_dir, reason)
                outcomes += [PublishOutcome(PENDING, self._request(e).checkpoint_path, error=reason)
                             for e in entries[i:]]
                break
            outcome = PublishOutcome(PUBLISHED, request.checkpoint_path, version)
            on_published(outcome)
            self._done(entry, version)
            outcomes.append(outcome)
        return outcomes

    def submit(self, request: PublishRequest, target: MLflowTarget, policy: PublishPolicy = PublishPolicy(),
               sleep=time.sleep) -> PublishOutcome:
        """Queue request, flush, and say what became of it."""
        self.add(request)
        outcomes = self.flush(target, policy, sleep)
        return next(o for o in outcomes if o.checkpoint_path == request.checkpoint_path)
