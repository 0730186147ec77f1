"""The `picasso` command line (main.py) and the flags its commands share.

Light on purpose. Every entry point of the command imports this package before anything
else (main.py's console_main, the `picasso` console script; `python -m picasso.pipelines.cli`;
`python -m picasso.pipelines.cli.distributed`, the parameter server's shards), so the two
things every command needs before its modules load are done here, in this order:
- the exit handler is registered (process_exit.py): first, so that it runs after every
  other handler, the logging module's included, which noise.py imports;
- the libraries' noise is silenced (noise.py), before any command module imports Beam."""

from picasso.pipelines.cli import process_exit  # noqa: F401 - registers the exit handler: first
from picasso.pipelines.cli import noise

noise.silence()
