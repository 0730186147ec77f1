"""`python -m picasso.pipelines.cli COMMAND ...`: the `picasso` console script."""

from picasso.pipelines.cli.main import main
from picasso.pipelines.cli.process_exit import run_command

run_command(main)
