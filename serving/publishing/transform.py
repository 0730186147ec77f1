"""PublishToMLflow: publishing as a Beam transform, each request through the outbox."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam

from picasso.serving.publishing.contract import MLflowTarget
from picasso.serving.publishing.outbox import PublishOutbox
from picasso.serving.publishing.policy import PublishPolicy


class PublishToMLflow(beam.PTransform):
    """PublishRequests in, PublishOutcomes out: each request goes through the outbox under
    workspace, so a request MLflow could not take stays pending there (status "pending")
    and is published by the next flush."""

    def __init__(self, target: MLflowTarget, workspace: str | Path, policy: PublishPolicy = PublishPolicy()):
        super().__init__()
        self.target, self.workspace, self.policy = target, str(workspace), policy

    def expand(self, requests):
        target, workspace, policy = self.target, self.workspace, self.policy
        return requests | "Publish" >> beam.Map(lambda request: PublishOutbox(workspace).submit(request, target, policy))
