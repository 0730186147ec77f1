"""`python -m picasso.pipelines.cli COMMAND ...`: the `picasso` console script.

Its package (cli/__init__.py) has registered the exit handler before this runs, and main
sets up the rest (cli/main.py)."""

from picasso.pipelines.cli.main import console_main

console_main()
