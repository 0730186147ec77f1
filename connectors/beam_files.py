"""Beam's filesystems as picasso's backend for URLs (picasso.storage).

Why Beam's and not fsspec: Beam's filesystems are set up by the pipeline options the user
already passes (`--s3_endpoint_url`, `--s3_region_name`, GCS credentials, HDFS hosts), and
Beam applies them on the driver and on every worker, so one setting covers the pipeline's
reads and picasso's state alike, with no second set of packages (s3fs, gcsfs) or settings.
What Beam's API does not fit stays local on purpose: memory-mapped big-tier files
(`--big-tier-dir` is the worker's scratch disk) and the kernel build cache.

Where each process registers them, at no cost until a URL is touched:
connectors/beam_urls.py (serve_urls_through_beam); use_beam_filesystems, below, is the
driver's, set up by its pipeline options.
"""

from __future__ import annotations

import logging
from typing import BinaryIO

from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from picasso import storage

log = logging.getLogger(__name__)


class BeamFiles:
    def __init__(self):
        # A process that ran no pipeline yet (`picasso generate --out s3://...`) has given
        # Beam no options, and Beam's S3 filesystem refuses to start without them: default
        # ones leave its client to boto3's own settings (AWS_ENDPOINT_URL_S3, AWS_*). Set
        # options (the driver's, or those Beam gives a worker) are never replaced.
        if getattr(FileSystems, "_pipeline_options", None) is None:
            FileSystems.set_options(PipelineOptions([]))

    def read(self, url: str) -> bytes:
        with FileSystems.open(url) as f:
            return f.read()

    def open(self, url: str) -> BinaryIO:
        # Uncompressed: a day file's name (.parquet, .jsonl) says its format, not a codec.
        return FileSystems.open(url, compression_type=CompressionTypes.UNCOMPRESSED)

    def write(self, url: str, data: bytes) -> None:
        # Object stores make the object visible when the upload completes: all or nothing.
        with FileSystems.create(url) as f:
            f.write(data)

    def exists(self, url: str) -> bool:
        return FileSystems.exists(url)

    def list(self, prefix: str) -> list[str]:
        try:
            matched = FileSystems.match([prefix + "**"])[0]
        except BeamIOError:  # nothing under it
            return []
        return [m.path for m in matched.metadata_list]

    def delete(self, urls: list[str]) -> None:
        FileSystems.delete(urls)

    def copy(self, sources: list[str], destinations: list[str]) -> None:
        FileSystems.copy(sources, destinations)


# Runners whose workers share the driver's machine, and so its disk.
LOCAL_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner", "PrismRunner")


def use_beam_filesystems(options: PipelineOptions, **state_paths: str) -> None:
    """Serve picasso's URLs through Beam's filesystems, set up by `options` (on the driver,
    before the pipeline exists; Beam sets them up on workers itself). `state_paths` (the
    data root, the workdir, by name) are checked: a local path on a runner whose workers are
    other machines is one they cannot see, and is warned of."""
    FileSystems.set_options(options)
    storage.register_remote(BeamFiles)
    runner = options.view_as(StandardOptions).runner or ""
    if runner.rsplit(".", 1)[-1] not in LOCAL_RUNNERS:
        for what, path in state_paths.items():
            if not storage.is_url(path):
                log.warning("--%s %s is a local path, but the %s's workers may run on other machines, which do "
                            "not see this disk: give a URL they all reach (gs://, s3://, hdfs://)", what, path, runner)
