"""PublishToMLflow: publishing as a Beam transform, each request through the outbox."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam

from picasso.connectors.beam_urls import serve_urls_through_beam
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
        return requests | "Publish" >> beam.ParDo(_PublishDoFn(self.target, self.workspace, self.policy))


class _PublishDoFn(beam.DoFn):
    def __init__(self, target: MLflowTarget, workspace: str, policy: PublishPolicy):
        self.target, self.workspace, self.policy = target, workspace, policy

    def setup(self):
        # The outbox and the checkpoints it publishes may be URLs, and a worker process
        # imports only the modules of the DoFns it runs: nothing else has set up reading them.
        serve_urls_through_beam()

    def process(self, request):
        yield PublishOutbox(self.workspace).submit(request, self.target, self.policy)
