"""serve_urls_through_beam: picasso's URLs (picasso.storage) served by Beam's filesystems
(connectors/beam_files.py), registered at no cost: Beam (0.7 s of start-up) is imported
when this process first reads or writes a URL, not before. So every command can call it
where it starts, and one that touches only local paths (`picasso --help`, `generate --out
./data`, a daily run before its pipeline) never loads Beam for it.

Every process that runs picasso's work serves its URLs this way, by an explicit call where
that work starts (importing picasso registers nothing):
- the driver of a pipeline: beam_files.use_beam_filesystems, with the run's pipeline
  options (pipelines/runs/daily.py, pipelines/runs/stream.py);
- the `picasso` command, whatever it runs (pipelines/cli/main.py: main), and the parameter
  server's own processes (pipelines/cli/distributed.py: main): serve_urls_through_beam;
- a Beam worker, which imports only the modules of the DoFns it runs: each step that reads
  or writes a picasso URL calls serve_urls_through_beam before it does (a DoFn's setup, or
  the function a Map calls): ReadDayFiles (connectors/day_files.py), PicassoTrain's engines
  (pipelines/transforms/train_handlers.py: TrainHandler.acquire), EvaluateCheckpoint
  (pipelines/transforms/train.py), PublishToMLflow (serving/publishing/transform.py) and
  the daily run's record (pipelines/runs/daily.py).
"""

from __future__ import annotations

from picasso import storage


def serve_urls_through_beam() -> None:
    """Serve picasso's URLs through Beam's filesystems in this process, unless a backend
    serves them already (the driver's, set up by use_beam_filesystems, or a test's). Cheap,
    and the same however often it is called: call it before any work that may read or write
    a URL."""
    if not storage.serves_urls():
        storage.register_remote(_beam_files)


def _beam_files():
    from picasso.connectors.beam_files import BeamFiles  # Beam: once a URL is touched (the module docstring)

    return BeamFiles()
