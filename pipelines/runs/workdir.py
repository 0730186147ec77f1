"""The work folder's layout, in one place: every run (daily, a range, stream, the
parameter server and sync workers, publish-pending) finds its folders through Workdir.

  WORKDIR/checkpoints/step-N-K/           model, optimizer, positions (picasso.checkpoint)
  WORKDIR/publish/                        the publish outbox (versions MLflow has not taken yet)
  WORKDIR/runs/daily-PARTITION.json       the record that a partition is done, and its result
  WORKDIR/runs/stream-versions.jsonl      every version a stream published, with freshness facts
  WORKDIR/dead_letters/date=D[/hour=H]/   a daily run's refused records, as JSON lines
  WORKDIR/data/                           the days `picasso demo` generates

The folder is a local path or a URL (picasso.storage), and so is each folder under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from picasso import storage
from picasso.connectors.partitions import partition_path


@dataclass(frozen=True)
class Workdir:
    root: str

    @property
    def checkpoints(self) -> str:
        return storage.join(self.root, "checkpoints")

    @property
    def publish(self) -> str:
        return storage.join(self.root, "publish")

    def daily_record(self, partition: str) -> str:
        return storage.join(self.root, "runs", f"daily-{partition}.json")

    @property
    def stream_versions(self) -> str:
        return storage.join(self.root, "runs", "stream-versions.jsonl")

    def dead_letters(self, partition: str) -> str:
        return storage.join(self.root, "dead_letters", *partition_path(partition).split("/"))

    @property
    def demo_data(self) -> str:
        return storage.join(self.root, "data")
