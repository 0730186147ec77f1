"""Beam transforms (PackFeatures, PicassoTrain, ...) and the runnable pipelines."""

# First: its exit handler must be registered before those of the modules picasso loads.
from picasso.pipelines.cli import process_exit  # noqa: F401
from picasso import storage


def _beam_files():
    from picasso.connectors.beam_files import BeamFiles  # imports Beam: only once a URL is used

    return BeamFiles()


# Every process that runs picasso's pipelines (the driver and each Beam worker) serves
# picasso's URLs through Beam's filesystems. Their settings come from the pipeline options
# (Beam sets them up on workers; the commands on the driver: connectors/beam_files.py) or
# the filesystem's own environment (e.g. AWS_ENDPOINT_URL_S3 for boto3).
storage.register_remote(_beam_files)
