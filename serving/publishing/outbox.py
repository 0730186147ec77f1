"""The publish outbox: checkpoints waiting to become model versions, kept on disk.

A publish request is written under WORKSPACE/pending/ before MLflow is called, with the
checkpoint's files next to it (hard links on a local disk, server-side copies on an object
store), so that pruning the checkpoint folder frees nothing the request needs. It leaves
the outbox only once its version exists, and is recorded in WORKSPACE/published.jsonl. So if MLflow is down longer than the retries
last, the request waits there, and the next flush (the next publish, the next daily run,
or `picasso publish-pending`) publishes it: nothing is lost, and since publish() is
idempotent per checkpoint (publication.py), nothing is published twice.

Requests are published oldest first, and a failure stops the flush: each version's delta
is made against the version before it.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path

from picasso import storage
from picasso.serving.publishing.contract import (PENDING, PUBLISHED, MLflowTarget, ModelVersionRef,
                                                    PublishOutcome, PublishRequest)
from picasso.serving.publishing.policy import PublishPolicy

log = logging.getLogger(__name__)
_REQUEST = "request.json"


class PublishOutbox:
    """The outbox under workspace, a local path or a URL (picasso.storage). An entry is
    committed by its request.json, written last: on a local disk the entry's folder is
    also built under a temporary name and renamed; on an object store, an entry without
    its request.json is a copy a crash cut short, and is neither listed nor published."""

    def __init__(self, workspace: str | Path):
        self.root = str(workspace)
        self.pending_dir = storage.join(self.root, "pending")
        self.log_path = storage.join(self.root, "published.jsonl")

    def pending(self) -> list[str]:
        """Pending entries, oldest first."""
        entries = [storage.join(self.pending_dir, name) for name in storage.children(self.pending_dir)
                   if not name.startswith(".")]
        return [entry for entry in entries if storage.exists(storage.join(entry, _REQUEST))]

    def pending_requests(self) -> list[PublishRequest]:
        """The pending entries' requests, oldest first."""
        return [self._request(entry) for entry in self.pending()]

    def _request(self, entry: str) -> PublishRequest:
        return PublishRequest.from_dict(json.loads(storage.read_text(storage.join(entry, _REQUEST))))

    def add(self, request: PublishRequest) -> str:
        """Queue request (once: the same checkpoint queued again is the same entry)."""
        for entry in self.pending():
            if self._request(entry).checkpoint_path == request.checkpoint_path:
                return entry
        self._clean()
        name = f"{time.time_ns():020d}-{storage.name(request.checkpoint_path)}"
        entry = storage.join(self.pending_dir, name)
        building = entry if storage.is_url(self.root) else storage.join(self.pending_dir,
                                                                          f".tmp-{name}-{uuid.uuid4().hex[:6]}")
        storage.copy_tree(request.checkpoint_path, storage.join(building, "checkpoint"))
        storage.write_text(storage.join(building, _REQUEST), json.dumps(request.to_dict()))  # last: the commit
        if building != entry:
            os.rename(building, entry)  # locally the entry appears whole or not at all
        return entry

    def _clean(self) -> None:
        """Remove entries a crash left half-built (no request.json). One writer per outbox."""
        for name in storage.children(self.pending_dir):
            entry = storage.join(self.pending_dir, name)
            if name.startswith(".tmp-") or not storage.exists(storage.join(entry, _REQUEST)):
                storage.delete_tree(entry)

    def _done(self, entry: str, version: ModelVersionRef) -> None:
        record = {"checkpoint_path": self._request(entry).checkpoint_path, "version": version.version,
                  "model_uri": version.model_uri, "run_id": version.run_id, "champion": version.champion,
                  "promotion_reason": version.promotion_reason, "created": version.created, "published_ms": int(time.time() * 1000)}
        storage.append_line(self.log_path, json.dumps(record))
        # The request first: an entry without it is not pending any more, whatever of its
        # checkpoint copy a kill leaves behind.
        storage.delete(storage.join(entry, _REQUEST))
        storage.delete_tree(entry)

    def holds(self, checkpoint_path: str) -> bool:
        """Whether the checkpoint was queued here: pending, or published since."""
        return (any(self._request(entry).checkpoint_path == checkpoint_path for entry in self.pending())
                or self.published(checkpoint_path) is not None)

    def published(self, checkpoint_path: str) -> dict | None:
        """The record of the checkpoint's publish, if it was published through this outbox."""
        if not storage.exists(self.log_path):
            return None
        records = [json.loads(line) for line in storage.read_text(self.log_path).splitlines() if line.strip()]
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
        if not entries:
            return outcomes
        # MLflow, for a flush that publishes: adding to the outbox and reading it (a run that
        # made no version, a count of what is pending) never loads it.
        from picasso.serving.publishing.publication import publish

        for i, entry in enumerate(entries):
            request = self._request(entry)
            try:
                version = publish(request, target, policy, workspace=self.root,
                                  checkpoint_dir=storage.join(entry, "checkpoint"),
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
