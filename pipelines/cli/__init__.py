"""The `picasso` command line (main.py) and the flags its commands share.

Light on purpose: picasso.pipelines imports cli.process_exit first thing, before anything
heavy is loaded. The one thing done here is to silence the libraries' noise (noise.py)
before any command module imports Beam, whichever entry point runs it."""

from picasso.pipelines.cli import noise

noise.silence()
